"""What one round costs and how deep it drafts, as the engine plans it (speculation/batch_depth.py).

The simulator reuses the engine's BatchDepthPlanner unchanged: it gets cost views of the
simulated devices, its per-step overhead is the step's bookkeeping, and a model draft's call
pays the round trip to the drafter (`draft_call_ms`), as a replica sets them
(cluster/runtime/replica.py), so a long round trip makes deeper drafts pay. It learns
acceptance from the rounds it sees, like the engine.

Planning is most of a simulation's time (the walk prices every candidate draft token), and most
steps plan the same batch again, so `MemoPlanner` remembers plans by their candidates and their
acceptance rounded to ACCEPTANCE_DIGITS decimals; tests check it agrees with the engine's.
"""

from dataclasses import dataclass, field

from tandem.cluster.sim.config import Device, SimDepth, SimDrafter
from tandem.cluster.sim.state import SimSequence
from tandem.models.cost import CostView, catch_up_ms, fed_singly
from tandem.speculation.batch_depth import BatchDepthPlanner, DraftCandidate

ACCEPTANCE_DIGITS = 3
MEMO_SIZE = 4096  # plans kept per replica before the memo starts over


@dataclass
class MemoPlanner(BatchDepthPlanner):
    """The engine's planner with its best-plan walk memoised (probing is left as it is)."""

    memo: dict = field(default_factory=dict, repr=False)

    def _best_plan(self, candidates: list[DraftCandidate], alphas: list[float]) -> list[int]:
        key = (tuple(candidates), tuple(round(a, ACCEPTANCE_DIGITS) for a in alphas), self.overhead_ms)
        if key not in self.memo:
            if len(self.memo) >= MEMO_SIZE:
                self.memo.clear()
            self.memo[key] = tuple(super()._best_plan(candidates, alphas))
        return list(self.memo[key])


def make_planner(target: Device, drafter: SimDrafter | None, depth: SimDepth, overhead_ms: float,
                 memo: bool = True) -> BatchDepthPlanner:
    draft = CostView(drafter.device.cost, drafter.device.fused) if drafter and drafter.device else None
    kind = MemoPlanner if memo else BatchDepthPlanner
    return kind(CostView(target.cost, target.fused), draft, k_max=depth.k_max, overhead_ms=overhead_ms)


def candidate(seq: SimSequence, drafter: SimDrafter | None, depth: SimDepth) -> DraftCandidate:
    """What seq could draft this round: at most k_max, and one token fewer than its request may
    still take (the engine knows the cap, not where the answer stops)."""
    cap = max(0, min(depth.k_max, seq.room - 1))
    if drafter is None or cap == 0:
        return DraftCandidate("none", 0, False, fixed_k=0)
    fixed = None if depth.fixed_k is None else min(depth.fixed_k, cap)
    if not drafter.uses_model:
        return DraftCandidate(drafter.source, cap, False, fixed_k=fixed)
    setup = catch_up_ms(drafter.device.cost, seq.unseen_by_drafter())
    return DraftCandidate(drafter.source, cap, True, setup, fixed)


def levels(ks: list[int]) -> list[int]:
    """n_j: how many sequences draft a j-th token, for j = 1 .. max k."""
    return [sum(1 for k in ks if k >= j) for j in range(1, max(ks, default=0) + 1)]


def draft_call_ms(device: Device, unseen: list[int], ks: list[int]) -> float:
    """A draft model's lock-step call (speculation/drafters/lockstep.py): the first forward feeds every
    sequence's unseen tokens and drafts its first token; each later forward drafts one more. One
    sequence's unseen tokens go a token per call where its curve prices that lower, as there."""
    first = device.prompt_ms(unseen)
    if len(unseen) == 1 and fed_singly(device.cost, unseen[0]):
        first = min(first, unseen[0] * device.forward_ms([1]))
    return first + device.lockstep_draft_ms(levels(ks)[1:])


def verify_ms(device: Device, ks: list[int], prompt_parts: list[int] = (), context: float | None = None) -> float:
    """One batched call: every round scores its last committed token plus its k drafts, and the
    prompt tokens scored beside them (rests of prompts, chunks). A fused device scores them all
    in one forward, priced on its verify curve by the call's tokens, less a logits row for each
    prompt token (the curve asks one at every token; the engine asks none of a prompt part, which
    is also why the prompt curve, from an empty cache, prices such a part short: its tokens attend
    to the context the call holds). Timed directly (smollm2, one llama.cpp thread, AMD EPYC Zen 5,
    `scripts/mixed_call_cost.py`), 3 rounds at 150 cached tokens beside a part of 16-300 prompt
    tokens took what the rounds and the part took alone (within 2-4%), and 1.11-1.28x that with
    logits at every row; traced in a Zen 5 cluster run, the fast replica's prompt-bearing steps
    took a median 0.71-0.90x the price with the rows and 0.78-1.00x without, by shape, where its
    plain steps took 0.83-0.99x (docs/cluster.md). Prompts alone (no
    round in the call) on the prompt curve, which is measured that way. A serial device runs the
    rounds, then each prompt part as a prefill. Calls with rounds are read at `context`, the mean
    of what the call's sequences hold (None: the curve's base), as the engine reads its step;
    prompts alone from an empty cache."""
    rounds = [k + 1 for k in ks]
    parts = [n for n in prompt_parts if n > 0]
    if device.fused and rounds and parts:
        return device.forward_ms(rounds + parts, context) - device.logits_row_ms * sum(parts)
    return device.forward_ms(rounds, context) + device.prompt_ms(parts)
