"""Depth control: how many draft tokens to propose each round (k).

`FixedDepth(k)` always asks for k. `AutoDepth` picks k each round to maximise expected tokens
per millisecond:

    E(k) = 1 + a + a^2 + ... + a^k          tokens emitted by a round (accepted + 1)
    T(k) = draft_cost(k) + target_cost(k + 1) + overhead

where `a` is the running acceptance estimate for the draft source and the costs are the runners'
measured curves (see models/cost.py). k = 0 (plain decoding) wins whenever verifying is too
expensive for the expected acceptance, which is what keeps llama.cpp targets from slowing down.
While a model drafter drafts, `keep_drafting` stops early once one more token is expected to
lower the round's tokens per millisecond, using the draft's own confidence in what it drafted:
once drafting pays at all, a model drafter may run up to `max_k` while it stays confident.
A source held at k = 0 is probed now and then with one draft token, so an estimate that was
unlucky early can recover; probes are spaced so their extra cost stays under PROBE_BUDGET of the
time spent decoding without drafts (rare where verifying is dear, frequent where it is cheap),
and a source that could not pay even at near-perfect acceptance is never probed.
Acceptance is tracked per source ("model", "ngram2", "ngram3", ...), with decay so it follows
the text; a policy lives as long as its pipeline, so what it learns carries across requests.
An n-gram source's prior rises with the match length (a copy that already agrees on 8 tokens
usually goes on agreeing). The latest decisions are kept in `history`.
"""

from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Protocol

from tandem.models.cost import CostModel

CostFn = Callable[[int], float]
DEFAULT_K_MAX = 16
PRIOR_ACCEPTANCE = 0.6  # for a draft model before any round is seen
PRIOR_WEIGHT = 4.0  # pseudo-observations behind the prior
HISTORY_LENGTH = 1024
DECAY = 0.97  # per-round forgetting of old acceptance evidence
PROBE_BUDGET = 0.02  # share of decoding time that probes of idle sources may cost
BEST_ACCEPTANCE = 0.99  # a source that cannot pay even at this acceptance is never probed


class DepthPolicy(Protocol):
    def choose_k(self, source: str, draft_cost: CostFn, limit: int, setup_ms: float = 0.0) -> int:
        """k for this round. `draft_cost` is the steady-state cost of drafting k tokens;
        `setup_ms` a one-time cost before the source can draft at all (a draft model catching up
        on a new prompt), which pays for itself over later rounds once drafting is worth it."""
        ...

    def max_k(self, limit: int) -> int:
        """The deepest draft a confidence-aware drafter may run to once drafting pays."""
        ...

    def keep_drafting(self, source: str, confidences: list[float], draft_cost: CostFn) -> bool: ...

    def record(self, source: str, drafted: int, accepted: int, overhead_ms: float) -> None: ...


def _history() -> deque:
    return deque(maxlen=HISTORY_LENGTH)  # (source, drafted, accepted)


def source_family(source: str) -> str:
    """"ngram5" -> "ngram", "shared3" -> "shared", "model" -> "model"."""
    return source.rstrip("0123456789")


def prior_acceptance(source: str) -> float:
    """Before evidence: a draft model 0.6; a copy after a match of length n (from the context or
    the shared store), 0.3 + 0.06 n (<= 0.8)."""
    family, length = source_family(source), source[len(source_family(source)):]
    if family in ("ngram", "shared") and length.isdigit():
        return min(0.3 + 0.06 * int(length), 0.8)
    return PRIOR_ACCEPTANCE


@dataclass
class FixedDepth:
    k: int
    history: deque = field(default_factory=_history)

    def choose_k(self, source: str, draft_cost: CostFn, limit: int, setup_ms: float = 0.0) -> int:
        return max(0, min(self.k, limit))

    def max_k(self, limit: int) -> int:
        return max(0, min(self.k, limit))

    def keep_drafting(self, source: str, confidences: list[float], draft_cost: CostFn) -> bool:
        return True

    def record(self, source: str, drafted: int, accepted: int, overhead_ms: float) -> None:
        self.history.append((source, drafted, accepted))


@dataclass
class AcceptanceEstimate:
    """Per-token acceptance probability with a prior; trials end at the first rejection."""

    accepted: float = PRIOR_ACCEPTANCE * PRIOR_WEIGHT
    trials: float = PRIOR_WEIGHT

    @classmethod
    def for_source(cls, source: str) -> "AcceptanceEstimate":
        return cls.with_prior(prior_acceptance(source))

    @classmethod
    def with_prior(cls, rate: float) -> "AcceptanceEstimate":
        return cls(rate * PRIOR_WEIGHT, PRIOR_WEIGHT)

    @property
    def rate(self) -> float:
        return min(self.accepted / self.trials, 0.99)

    def update(self, drafted: int, accepted: int) -> None:
        self.accepted = self.accepted * DECAY + accepted
        self.trials = self.trials * DECAY + accepted + (1 if accepted < drafted else 0)


@dataclass
class AutoDepth:
    target_cost: CostModel
    k_max: int = DEFAULT_K_MAX
    overhead_ms: float = 0.5
    estimates: dict[str, AcceptanceEstimate] = field(default_factory=dict)
    idle_ms: dict[str, float] = field(default_factory=dict)  # decode time since the last draft
    history: deque = field(default_factory=_history)

    def acceptance(self, source: str) -> float:
        return self._estimate(source).rate

    def _estimate(self, source: str) -> AcceptanceEstimate:
        if source not in self.estimates:
            self.estimates[source] = AcceptanceEstimate.for_source(source)
        return self.estimates[source]

    def expected_rate(self, k: int, alpha: float, draft_cost: CostFn) -> float:
        """Expected tokens per millisecond of a round drafting k tokens."""
        tokens = (1 - alpha ** (k + 1)) / (1 - alpha)  # 1 + a + ... + a^k, a < 1
        elapsed = draft_cost(k) + self.target_cost.cost_ms(k + 1) + self.overhead_ms
        return tokens / max(elapsed, 1e-6)

    def choose_k(self, source: str, draft_cost: CostFn, limit: int, setup_ms: float = 0.0) -> int:
        alpha = self.acceptance(source)
        k_cap = max(0, min(self.k_max, limit))
        k = max(range(k_cap + 1), key=lambda k: self.expected_rate(k, alpha, draft_cost))
        if k > 0 or not self._could_pay(k_cap, draft_cost):
            self.idle_ms[source] = 0.0
            return k
        idle = self.idle_ms.get(source, 0.0) + self.target_cost.cost_ms(1)
        probe_extra = setup_ms + draft_cost(1) + self.target_cost.cost_ms(2) - self.target_cost.cost_ms(1)
        if idle * PROBE_BUDGET >= probe_extra:
            k, idle = 1, 0.0
        self.idle_ms[source] = idle
        return k

    def _could_pay(self, k_cap: int, draft_cost: CostFn) -> bool:
        """Whether this source would beat plain decoding even at near-perfect acceptance; if
        not (a draft model against a CPU llama.cpp target), probing it only wastes time."""
        plain = self.expected_rate(0, BEST_ACCEPTANCE, draft_cost)
        return any(self.expected_rate(k, BEST_ACCEPTANCE, draft_cost) > plain for k in range(1, k_cap + 1))

    def max_k(self, limit: int) -> int:
        return max(0, min(self.k_max, limit))

    def keep_drafting(self, source: str, confidences: list[float], draft_cost: CostFn) -> bool:
        """Draft one more token only if it is expected to raise tokens per millisecond."""
        alpha = self.acceptance(source)
        drafted = len(confidences)
        survive, tokens = 1.0, 1.0
        for confidence in confidences:  # the draft's own P(first i drafts all accepted)
            survive *= confidence
            tokens += survive
        elapsed = draft_cost(drafted) + self.target_cost.cost_ms(drafted + 1) + self.overhead_ms
        gain = survive * alpha
        extra = (draft_cost(drafted + 1) - draft_cost(drafted)) + (
            self.target_cost.cost_ms(drafted + 2) - self.target_cost.cost_ms(drafted + 1)
        )
        return gain / max(extra, 1e-6) > tokens / max(elapsed, 1e-6)

    def record(self, source: str, drafted: int, accepted: int, overhead_ms: float) -> None:
        if drafted:
            self._estimate(source).update(drafted, accepted)
        self.overhead_ms += 0.1 * (overhead_ms - self.overhead_ms)
        self.history.append((source, drafted, accepted))


def build_depth(drafter_name: str, k: int | str, target_cost: CostModel) -> DepthPolicy:
    """The policy for a drafter and a `--k` value (an int, or "auto")."""
    if drafter_name == "none":
        return FixedDepth(0)
    return AutoDepth(target_cost) if k == "auto" else FixedDepth(int(k))
