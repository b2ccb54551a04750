"""The slow reference: one verifier, one sequence at a time, fixed k, per-token acceptance.

Written as plainly as possible (a loop over requests and rounds, a coin per draft token) and
sharing no code with the event simulator, so a test can hold the two against each other. Its
steady state has a closed form: a round drafts k tokens and emits E(k) tokens in T(k) ms,

    E(k) = 1 + a + a^2 + ... + a^k = (1 - a^(k + 1)) / (1 - a)
    T(k) = draft(k) + rtt + verify(k + 1) + overhead

with draft(k) = k single-token draft passes (one sequence drafts alone), so the throughput is
1000 E(k) / T(k) tokens per second. Prefill and the last, cut-short round of every request make
the simulated throughput slightly lower than the closed form; long outputs make it tend to it.
"""

import random
from dataclasses import dataclass

from tandem.models.cost import CostModel, catch_up_ms


@dataclass(frozen=True, slots=True)
class OneSequenceCase:
    target: CostModel  # ms to score n tokens on the verifier
    draft: CostModel  # ms of one draft pass over n tokens
    k: int
    alpha: float  # per-token acceptance
    rtt_ms: float = 0.0  # between the verifier replica and the drafter
    overhead_ms: float = 1.0  # per round

    def __post_init__(self):
        if self.k < 0 or not 0.0 <= self.alpha < 1.0:
            raise ValueError(f"need k >= 0 and alpha in [0, 1), got k={self.k}, alpha={self.alpha}")


def closed_form_tokens_per_s(case: OneSequenceCase) -> float:
    expected = (1 - case.alpha ** (case.k + 1)) / (1 - case.alpha)
    return 1000.0 * expected / round_ms(case, case.k)


def round_ms(case: OneSequenceCase, k: int) -> float:
    if k == 0:
        return case.target.cost_ms(1) + case.overhead_ms
    return k * case.draft.cost_ms(1) + case.rtt_ms + case.target.cost_ms(k + 1) + case.overhead_ms


def reference_tokens_per_s(case: OneSequenceCase, prompts: list[int], outputs: list[int], seed: int = 0) -> float:
    """Step by step: requests back to back, each prefilled, then drafted and verified round by
    round until it has its output length."""
    coin = random.Random(seed)
    clock_ms, tokens = 0.0, 0
    for prompt, output in zip(prompts, outputs):
        clock_ms += case.target.cost_ms(prompt - 1)  # prefill all but the last prompt token
        emitted, draft_catch_up = 0, prompt
        while emitted < output:
            k = min(case.k, output - emitted - 1)
            if k:  # the draft model first catches up on the tokens it has not seen
                clock_ms += catch_up_ms(case.draft, draft_catch_up)
            clock_ms += round_ms(case, k)
            accepted = 0
            while accepted < k and coin.random() < case.alpha:
                accepted += 1
            emitted += accepted + 1
            draft_catch_up = 1 if k else draft_catch_up + accepted + 1
        tokens += output
    return 1000.0 * tokens / clock_ms
