"""Predict one verifier replica's engine step from cost curves.

A verifier replica runs continuous batching: each step verifies B sequences that each carry k
draft tokens, after the drafter proposed them. With `a` the drafter's acceptance:

    step_ms   = verify(B sequences x (k + 1) tokens)            the target's forward call
              + k x share x draft(B sequences x 1 token)       lock-step drafting with the model
              + rtt(verifier group, drafter group)             one round trip, remote model drafters
              + overhead                                       engine bookkeeping
    tokens    = B x E(k),   E(k) = (1 - a^(k+1)) / (1 - a)
    tokens/s  = 1000 x tokens / step_ms          (at saturation: all B slots always busy)
    latency   = step_ms / E(k)                   ms per generated token, seen by each sequence

`share` is the share of draft tokens that cost a draft-model step (the drafter table,
speculation/drafters/registry.py). The drafter is busy `draft_ms / step_ms` of the time, which
bounds how many verifier replicas one draft replica can serve. Costs are the worker's profile times its `slowdown` (emulation) and
divided by `1 - utilization` (the share of the device left to us).
"""

from dataclasses import dataclass

from tandem.cluster.config.cluster_spec import WorkerSpec
from tandem.cluster.planning.acceptance import expected_tokens
from tandem.cluster.profiles.profile import DeviceProfile
from tandem.speculation.drafters.registry import DrafterSpec


@dataclass(frozen=True, slots=True)
class WorkerCost:
    """What one forward call of one model costs on one worker's replica."""

    worker: str
    model: str
    profile: DeviceProfile
    factor: float = 1.0  # slowdown / (1 - utilization)

    @classmethod
    def of(cls, worker: WorkerSpec, model: str, profile: DeviceProfile) -> "WorkerCost":
        return cls(worker.name, model, profile, worker.slowdown / (1.0 - worker.utilization))

    def forward_ms(self, batch: int, tokens_per_sequence: int, context: int) -> float:
        return self.profile.step_ms(batch, tokens_per_sequence, context) * self.factor


IN_REPLICA = "in-replica"  # a copy drafter's `where`: it drafts from the context inside the replica, no worker


@dataclass(frozen=True, slots=True)
class DraftSource:
    """Where a verifier's drafts come from: nothing, n-gram copies, or a draft model."""

    kind: DrafterSpec
    acceptance: float
    where: str  # "none", IN_REPLICA (copies from the context), "colocated" (its own draft model) or a worker name
    cost: WorkerCost | None = None  # the draft model's cost; None when no model drafts
    rtt_ms: float = 0.0  # round trip between verifier and drafter

    @property
    def remote(self) -> bool:
        return self.where not in ("none", IN_REPLICA, "colocated")


@dataclass(frozen=True, slots=True)
class StepPrediction:
    batch: int
    k: int
    acceptance: float
    verify_ms: float
    draft_ms: float
    network_ms: float
    overhead_ms: float

    @property
    def step_ms(self) -> float:
        return self.verify_ms + self.draft_ms + self.network_ms + self.overhead_ms

    @property
    def tokens_per_sequence(self) -> float:
        return expected_tokens(self.acceptance, self.k)

    @property
    def tokens_per_s(self) -> float:
        return 1000.0 * self.batch * self.tokens_per_sequence / self.step_ms

    @property
    def latency_ms(self) -> float:
        """ms per generated token, as each of the batch's sequences sees it."""
        return self.step_ms / self.tokens_per_sequence

    @property
    def drafter_share(self) -> float:
        """Share of one draft replica's time this verifier replica keeps busy."""
        return self.draft_ms / self.step_ms


def predict_step(verifier: WorkerCost, source: DraftSource, k: int, batch: int, context: int,
                 overhead_ms: float) -> StepPrediction:
    k = k if source.kind.drafts else 0
    verify = verifier.forward_ms(batch, k + 1, context)
    draft, network = 0.0, 0.0
    if k and source.cost is not None:
        draft = k * source.kind.model_share * source.cost.forward_ms(batch, 1, context)
        network = source.rtt_ms
    return StepPrediction(batch, k, source.acceptance if k else 0.0, verify, draft, network, overhead_ms)
