"""How many draft tokens the target accepts: a per-token probability, or measured run lengths.

Both models draw a *run*: the number of draft tokens the target would accept in a row before
its first rejection, were the draft unbounded. A round that drafted k tokens accepts
min(run, k); the round was accepted whole, and the target's bonus token agrees with the draft's
next token, exactly when run > k (what a drafter that drafted ahead needs).
"""

from dataclasses import dataclass
from typing import Protocol

import numpy as np


class AcceptanceModel(Protocol):
    @property
    def rate(self) -> float:
        """Mean per-token acceptance (reported, and what the closed form of a round uses)."""
        ...

    def draw_run(self, rng: np.random.Generator) -> int: ...


@dataclass(frozen=True, slots=True)
class GeometricAcceptance:
    """Each draft token is accepted with probability `alpha`, independently: P(run = r) =
    alpha^r (1 - alpha), so a round of k expects 1 + alpha + ... + alpha^k tokens."""

    alpha: float

    def __post_init__(self):
        if not 0.0 <= self.alpha < 1.0:
            raise ValueError(f"per-token acceptance must be in [0, 1), got {self.alpha}")

    @property
    def rate(self) -> float:
        return self.alpha

    def draw_run(self, rng: np.random.Generator) -> int:
        return int(rng.geometric(1.0 - self.alpha)) - 1


@dataclass(frozen=True, slots=True)
class EmpiricalAcceptance:
    """Runs drawn from measured accepted lengths. Lengths measured at a fixed k are censored at
    k (a whole-accepted round reads as run = k), so do not simulate deeper than they were taken.
    `rate` is the per-token rate of the geometric model with the same mean run."""

    runs: tuple[int, ...]

    def __post_init__(self):
        if not self.runs:
            raise ValueError("empirical acceptance needs at least one accepted length")
        if min(self.runs) < 0:
            raise ValueError(f"accepted lengths must be >= 0, got {min(self.runs)}")

    @property
    def rate(self) -> float:
        mean = sum(self.runs) / len(self.runs)
        return mean / (1.0 + mean)

    def draw_run(self, rng: np.random.Generator) -> int:
        return self.runs[int(rng.integers(len(self.runs)))]
