"""How busy the devices are, and how much memory they hold.

Utilisation of a role is the fraction of recent wall time its model spent computing: the target's
prefill + verify seconds, the draft's draft stage in steps where a draft model ran, summed over the engine steps that ended in
the last `window_seconds` (or since the first step, if that is sooner) and divided by that span.
Memory is the process's resident set size for `cpu`, and `torch.cuda.memory_allocated(i)` for
each visible CUDA device `cuda:i` - only when torch is already imported (this module never
imports torch) and CUDA is available.
"""

import sys
from collections import deque

from tandem.heap import resident_bytes

DEFAULT_UTILIZATION_WINDOW_SECONDS = 10.0
MAX_STEPS_REMEMBERED = 20_000  # bounds memory; past 2,000 steps/s the 10 s window reads low
ROLES = ("target", "draft")


class BusyWindow:
    """Busy seconds per role over a sliding wall-clock window, kept as running sums (the engine
    thread adds a step every few milliseconds). Not thread-safe: the owner locks."""

    def __init__(self, window_seconds: float = DEFAULT_UTILIZATION_WINDOW_SECONDS):
        if window_seconds <= 0:
            raise ValueError(f"the utilisation window must be positive, got {window_seconds} s")
        self.window_seconds = window_seconds
        self._steps: deque[tuple[float, float, float]] = deque()  # (ended_at, target busy, draft busy)
        self._target = self._draft = 0.0
        self._first_start: float | None = None

    def add_step(self, started_at: float, ended_at: float, target_busy: float, draft_busy: float) -> None:
        if self._first_start is None:
            self._first_start = started_at
        self._steps.append((ended_at, target_busy, draft_busy))
        self._target += target_busy
        self._draft += draft_busy
        if len(self._steps) > MAX_STEPS_REMEMBERED:
            self._forget_oldest()

    def utilization(self, now: float) -> dict[str, float]:
        """{"target": fraction, "draft": fraction}, each clipped to [0, 1]."""
        while self._steps and self._steps[0][0] < now - self.window_seconds:
            self._forget_oldest()
        span = 0.0 if self._first_start is None else min(self.window_seconds, now - self._first_start)
        if span <= 0:
            return dict.fromkeys(ROLES, 0.0)
        return {"target": _fraction(self._target / span), "draft": _fraction(self._draft / span)}

    def _forget_oldest(self) -> None:
        _, target_busy, draft_busy = self._steps.popleft()
        self._target = max(0.0, self._target - target_busy) if self._steps else 0.0
        self._draft = max(0.0, self._draft - draft_busy) if self._steps else 0.0


def _fraction(value: float) -> float:
    return min(1.0, max(0.0, value))


def device_memory_bytes() -> dict[str, int]:
    """{"cpu": resident bytes, "cuda:0": allocated bytes, ...}."""
    memory = {"cpu": resident_bytes()}
    torch = sys.modules.get("torch")  # only if someone else imported it
    if torch is not None and torch.cuda.is_available():
        for index in range(torch.cuda.device_count()):
            memory[f"cuda:{index}"] = int(torch.cuda.memory_allocated(index))
    return memory


