"""The rolling acceptance rate over the last N drafted tokens, and the alert it drives.

Each draft token the target verified is one outcome: accepted or not. A round with k draft tokens
of which `accepted` were accepted adds `accepted` accepted outcomes and `k - accepted` rejected
ones (tokens after the first rejection count as not accepted, as in acceptance_rate = accepted /
drafted). The window keeps the newest `size` outcomes. The alert fires when the window holds at
least `min_tokens` outcomes (enough evidence) and its rate is below `threshold`; it clears as soon
as the rate is back at or above the threshold. Not thread-safe: the owner holds a lock.
"""

from collections import deque

DEFAULT_WINDOW_TOKENS = 200
DEFAULT_MIN_TOKENS = 50


class AcceptanceWindow:
    def __init__(self, threshold: float, size: int = DEFAULT_WINDOW_TOKENS,
                 min_tokens: int = DEFAULT_MIN_TOKENS):
        if not 0.0 <= threshold <= 1.0:
            raise ValueError(f"the acceptance alert threshold must lie in [0, 1], got {threshold}")
        if size < 1:
            raise ValueError(f"the acceptance window must hold at least 1 draft token, got {size}")
        if not 1 <= min_tokens <= size:
            raise ValueError(f"the alert's minimum evidence must lie in [1, {size}] draft tokens, got {min_tokens}")
        self.threshold = threshold
        self.size = size
        self.min_tokens = min_tokens
        self._outcomes: deque[bool] = deque(maxlen=size)
        self._accepted = 0

    def add_round(self, k: int, accepted: int) -> None:
        for i in range(k):
            self._add(i < accepted)

    def _add(self, accepted: bool) -> None:
        if len(self._outcomes) == self.size:
            self._accepted -= self._outcomes[0]
        self._outcomes.append(accepted)
        self._accepted += accepted

    @property
    def tokens(self) -> int:
        return len(self._outcomes)

    @property
    def rate(self) -> float | None:
        """accepted / drafted over the window; None before any draft token."""
        return self._accepted / len(self._outcomes) if self._outcomes else None

    @property
    def firing(self) -> bool:
        return self.tokens >= self.min_tokens and self.rate < self.threshold

    def state(self) -> dict:
        rate = self.rate
        return {
            "firing": self.firing,
            "threshold": self.threshold,
            "rate": None if rate is None else round(rate, 4),
            "window_tokens": self.tokens,
            "window_size": self.size,
            "min_tokens": self.min_tokens,
        }
