"""Heterogeneity on one CPU machine: a worker can be made slower (`slowdown`: each forward takes
slowdown x its measured compute time) and farther away (`rtt_ms`: each call to it pays one
network round trip, half on the way in, half on the way out). A replica's calls to a drafter pay
the round trip between their groups (`delayed`)."""

import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any



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

    @contextmanager
    def travel(self):
        """The round trip alone (the call's work is slowed where it computes)."""
        _sleep_ms(self.rtt_ms / 2)
        yield
        _sleep_ms(self.rtt_ms / 2)


@dataclass(slots=True)
class CallTiming:
    compute_ms: float = 0.0


class SlowedRunner:
    """A batch runner whose every forward takes `slowdown` x its time, with a cost curve that
    starts slowed to match (a fused runner's engine then learns the slowed times it sees)."""

    def __init__(self, runner, slowdown: float):
        self._runner = runner
        self._slowdown = slowdown
        runner.cost = runner.cost.scaled(slowdown)  # both curves: its engine reads the deep one at long contexts

    @classmethod
    def around(cls, runner, slowdown: float):
        return runner if slowdown == 1.0 else cls(runner, slowdown)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._runner, name)

    def forward_batch(self, items, views: bool = False):
        start = time.perf_counter()
        logits = self._runner.forward_batch(items, views=views)
        _sleep_ms((self._slowdown - 1.0) * (time.perf_counter() - start) * 1000)
        return logits


class _DelayedPending:
    def __init__(self, pending, rtt_ms: float):
        self._pending = pending
        self._rtt_ms = rtt_ms

    def ready(self) -> bool:
        return self._pending.ready()

    def result(self) -> Any:
        value = self._pending.result()
        _sleep_ms(self._rtt_ms / 2)
        return value


class _DelayedEndpoint:
    def __init__(self, endpoint, rtt_ms: float):
        self.name = endpoint.name
        self._endpoint = endpoint
        self._rtt_ms = rtt_ms

    def call(self, method: str, *args):
        _sleep_ms(self._rtt_ms / 2)
        return _DelayedPending(self._endpoint.call(method, *args), self._rtt_ms)


def delayed(endpoint, rtt_ms: float):
    """The endpoint, its calls paying rtt_ms more (half each way); itself where rtt_ms is 0."""
    return endpoint if rtt_ms <= 0 else _DelayedEndpoint(endpoint, rtt_ms)


def _sleep_ms(ms: float) -> None:
    if ms > 0:
        time.sleep(ms / 1000)
