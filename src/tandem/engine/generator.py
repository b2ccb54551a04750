"""The speculative decoding loop for one sequence, on token ids.

Invariant: the target's KV cache holds every committed token but the last. A round
1. asks the drafter for k draft tokens (k from the depth policy; k = 0 is plain decoding),
2. runs one target forward over [last committed token] + drafts -> logits [k + 1, vocab],
3. applies the acceptance rule (greedy or speculative sampling),
4. applies stops (EOS, stop condition, max tokens, context) so nothing after a stop is emitted,
5. rolls the target cache back to the newly committed tokens minus the last (the invariant).
The same loop with the `none` drafter is the target-only baseline.
"""

import time
from typing import Iterator

import numpy as np

from tandem.engine.request import GenerationRequest
from tandem.engine.stats import GenerationStats
from tandem.errors import TandemError
from tandem.models.runner import ModelRunner
from tandem.spec.acceptance import AcceptResult, accept_greedy, accept_sampling
from tandem.spec.depth import DepthPolicy
from tandem.spec.drafters.base import Draft, DraftRequest, Drafter
from tandem.spec.sampling import probs_from_logits


class SpeculativeGenerator:
    def __init__(self, target: ModelRunner, drafter: Drafter, depth: DepthPolicy):
        self.target = target
        self.drafter = drafter
        self.depth = depth

    def generate(self, request: GenerationRequest) -> tuple[list[int], GenerationStats]:
        stats = GenerationStats()
        output = [token for chunk in self.stream(request, stats) for token in chunk]
        return output, stats

    def stream(self, request: GenerationRequest, stats: GenerationStats) -> Iterator[list[int]]:
        """Yield each round's emitted token ids; fill `stats` as it goes."""
        started = time.perf_counter()
        tokens = list(request.prompt_ids)
        self._check_context(tokens)
        rng = np.random.default_rng(request.sampling.seed)
        stats.prompt_tokens = len(tokens)
        self._prefill(tokens, stats)
        output: list[int] = []
        while True:
            round_start = time.perf_counter()
            model_seconds_before = stats.draft_seconds + stats.verify_seconds
            draft = self._draft(tokens, len(output), request, rng, stats)
            result = self._verify(tokens, draft, request, rng, stats)
            context_room = self.target.context_length - len(tokens)
            emitted, stop_reason = apply_stops(result.emitted(draft.token_ids), output, request, context_room)
            tokens += emitted
            self.target.rollback(len(tokens) - 1)  # the invariant, also when a stop cut the round
            output += emitted
            stats.new_tokens = len(output)
            stats.record_round(draft.source, draft.k, result.accepted)
            stats.seconds = time.perf_counter() - started
            round_seconds = time.perf_counter() - round_start
            model_seconds = stats.draft_seconds + stats.verify_seconds - model_seconds_before
            overhead_ms = max(0.0, round_seconds - model_seconds) * 1000
            self.depth.record(draft.source, draft.k, result.accepted, overhead_ms)
            if emitted:
                yield emitted
            if stop_reason:
                return

    def _check_context(self, tokens: list[int]) -> None:
        if len(tokens) >= self.target.context_length:
            raise TandemError(
                f"the prompt has {len(tokens)} tokens but {self.target.name} has a context of "
                f"{self.target.context_length}: shorten the prompt"
            )

    def _prefill(self, tokens: list[int], stats: GenerationStats) -> None:
        self.target.reset()
        start = time.perf_counter()
        self.target.forward(tokens[:-1], num_logits=0)
        stats.prefill_seconds += time.perf_counter() - start
        stats.target_forwards += 1 if len(tokens) > 1 else 0

    def _draft(self, tokens, produced, request, rng, stats) -> Draft:
        room = min(
            request.max_tokens - produced - 1,  # the round always adds one target token
            self.target.context_length - len(tokens) - 1,
        )
        start = time.perf_counter()
        draft = self.drafter.propose(tokens, DraftRequest(request.sampling, rng, self.depth, max(room, 0)))
        stats.draft_seconds += time.perf_counter() - start
        stats.draft_forwards += draft.draft_forwards
        return draft

    def _verify(self, tokens, draft: Draft, request, rng, stats) -> AcceptResult:
        start = time.perf_counter()
        logits = self.target.forward([tokens[-1]] + draft.token_ids)  # [k + 1, vocab]
        elapsed = time.perf_counter() - start
        stats.verify_seconds += elapsed
        stats.target_forwards += 1
        self.target.cost.observe(draft.k + 1, elapsed * 1000)
        if request.sampling.greedy:
            return accept_greedy(draft.token_ids, logits)
        p_target = probs_from_logits(logits, request.sampling)  # [k + 1, vocab]
        q_draft = fit_vocab(draft.q_draft, p_target.shape[-1])
        return accept_sampling(draft.token_ids, q_draft, p_target, rng)


def fit_vocab(q_draft: np.ndarray | None, vocab: int) -> np.ndarray | None:
    """Draft and target may pad their embeddings differently: q over the target's width."""
    if q_draft is None or q_draft.shape[-1] == vocab:
        return q_draft
    if q_draft.shape[-1] > vocab:
        return q_draft[:, :vocab]
    return np.pad(q_draft, ((0, 0), (0, vocab - q_draft.shape[-1])))


def apply_stops(
    emitted: list[int], output: list[int], request: GenerationRequest, context_room: int
) -> tuple[list[int], str | None]:
    """Cut a round's tokens at the first stop; nothing after it is emitted. Returns the tokens
    to emit and why generation ends: None (it goes on), "stop" (EOS or a stop condition) or
    "length" (max tokens or the context is used up)."""
    room = min(request.max_tokens - len(output), context_room)
    reason = "length" if len(emitted) >= room else None
    emitted = emitted[:room]
    for i, token in enumerate(emitted):
        if token in request.stop_token_ids:
            return emitted[:i], "stop"
    if request.stop_condition is not None:
        keep = request.stop_condition.tokens_to_keep(output + emitted)
        if keep is not None:
            return emitted[: max(0, keep - len(output))], "stop"
    return emitted, reason
