"""Measured cost of scoring n new tokens in one forward pass.

On a CPU a forward over n tokens is far from free (llama.cpp 1.5B: 1 token 27 ms, 5 tokens
111 ms); on a GPU it nearly is. The depth controller therefore reads a measured curve, never an
assumption. The curve starts from a profile taken at load time and follows observed step times
during generation (an exponential moving average per n), so a device that slows down is noticed.
"""

import bisect
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

PROFILE_SIZES = (1, 2, 3, 4, 6, 8, 12, 16)
OBSERVATION_WEIGHT = 0.1  # weight of one new observation in the moving average


@dataclass
class CostModel:
    """latency_ms[n] for measured n; linear interpolation between, linear extrapolation past.
    Noise can make a measured n look cheaper than a smaller one; reads use the running maximum,
    since scoring more tokens never costs less. Reads are on the hot path (the depth controller
    asks dozens of times a round), so the monotone curve is cached between observations."""

    latency_ms: dict[int, float] = field(default_factory=dict)
    _curve: tuple[list[int], list[float]] | None = field(default=None, repr=False, compare=False)

    def cost_ms(self, num_tokens: int) -> float:
        if num_tokens <= 0:
            return 0.0
        if not self.latency_ms:
            return float(num_tokens)  # unmeasured: proportional, the pessimistic CPU assumption
        sizes, values = self._monotone_curve()
        if num_tokens >= sizes[-1]:
            if len(sizes) == 1:
                return values[0] * num_tokens / sizes[0]
            slope = (values[-1] - values[-2]) / (sizes[-1] - sizes[-2])
            return values[-1] + slope * (num_tokens - sizes[-1])
        i = bisect.bisect_left(sizes, num_tokens)
        if sizes[i] == num_tokens or i == 0:
            return values[i]
        fraction = (num_tokens - sizes[i - 1]) / (sizes[i] - sizes[i - 1])
        return values[i - 1] + fraction * (values[i] - values[i - 1])

    def _monotone_curve(self) -> tuple[list[int], list[float]]:
        if self._curve is None:
            sizes = sorted(self.latency_ms)
            values = np.maximum.accumulate([self.latency_ms[n] for n in sizes]).tolist()
            self._curve = (sizes, values)
        return self._curve

    def observe(self, num_tokens: int, elapsed_ms: float) -> None:
        if num_tokens <= 0:
            return
        old = self.latency_ms.get(num_tokens)
        if old is None:
            old = self.cost_ms(num_tokens) if self.latency_ms else elapsed_ms
        self.latency_ms[num_tokens] = old + OBSERVATION_WEIGHT * (elapsed_ms - old)
        self._curve = None

    def to_json(self) -> dict[str, float]:
        return {str(n): round(ms, 3) for n, ms in sorted(self.latency_ms.items())}

    @classmethod
    def from_json(cls, data: dict[str, float]) -> "CostModel":
        return cls({int(n): float(ms) for n, ms in data.items()})


def measure_cost(
    forward: Callable[[list[int]], object],
    rollback: Callable[[int], None],
    base_length: int,
    sizes: tuple[int, ...] = PROFILE_SIZES,
    repeats: int = 5,
) -> CostModel:
    """Time forward passes of n tokens on top of a cache of `base_length`; the fastest of the
    repeats, since interference from other work only ever adds time."""
    filler = [1] * max(sizes)
    forward(filler[:1])  # warm-up
    rollback(base_length)
    latency = {}
    for n in sizes:
        samples = []
        for _ in range(repeats):
            start = time.perf_counter()
            forward(filler[:n])
            samples.append((time.perf_counter() - start) * 1000)
            rollback(base_length)
        latency[n] = float(min(samples))
    return CostModel(latency)
