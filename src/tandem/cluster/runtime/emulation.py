"""Heterogeneity on one CPU machine: a worker can be made slower (`slowdown`: each call takes
slowdown x its measured compute time) and farther away (`rtt_ms`: each call from the coordinator
pays one network round trip, half on the way in, half on the way out)."""

import time
from contextlib import contextmanager
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Emulation:
    slowdown: float = 1.0
    rtt_ms: float = 0.0

    def __post_init__(self):
        if self.slowdown < 1.0:
            raise ValueError(f"slowdown must be >= 1.0, got {self.slowdown}")
        if self.rtt_ms < 0:
            raise ValueError(f"rtt_ms must be >= 0, got {self.rtt_ms}")

    @contextmanager
    def call(self):
        """Yields a CallTiming whose compute_ms (slowdown included, round trip excluded) is set
        when the block ends."""
        timing = CallTiming()
        _sleep_ms(self.rtt_ms / 2)
        start = time.perf_counter()
        yield timing
        _sleep_ms((self.slowdown - 1.0) * (time.perf_counter() - start) * 1000)
        timing.compute_ms = (time.perf_counter() - start) * 1000
        _sleep_ms(self.rtt_ms / 2)


@dataclass(slots=True)
class CallTiming:
    compute_ms: float = 0.0


def _sleep_ms(ms: float) -> None:
    if ms > 0:
        time.sleep(ms / 1000)
