"""Closed-loop load: C clients, each sending its next request as soon as its last one ends,
until the shared request list is drained.

The run's wall time spans from the first send to the last end, so throughput = completion
tokens / wall time. `peak_in_flight` is the most requests open at once (C, unless there are fewer
requests); `mean_in_flight` = sum of request e2e times / wall time (Little's law).
"""

import asyncio
import time
from dataclasses import dataclass, replace
from typing import Callable, Sequence

import httpx

from tandem.bench.serve.client import RequestRecord, stream_chat

CONNECT_TIMEOUT_S = 10.0
READ_TIMEOUT_S = 600.0  # a queued request on a one-at-a-time server waits this long for a byte


@dataclass(frozen=True, slots=True)
class LoadItem:
    prompt_id: str
    category: str
    payload: dict


@dataclass(frozen=True, slots=True)
class LoadResult:
    concurrency: int
    records: tuple[RequestRecord, ...]  # in request-list order
    wall_s: float
    peak_in_flight: int

    @property
    def mean_in_flight(self) -> float | None:
        busy = sum(r.e2e_s or 0.0 for r in self.records)
        return busy / self.wall_s if self.wall_s else None


class _InFlight:
    """Open-request counter with its high-water mark."""

    def __init__(self):
        self.now = 0
        self.peak = 0

    def enter(self) -> None:
        self.now += 1
        self.peak = max(self.peak, self.now)

    def leave(self) -> None:
        self.now -= 1


async def run_closed_loop(url: str, items: Sequence[LoadItem], concurrency: int,
                          on_done: Callable[[RequestRecord], None] | None = None) -> LoadResult:
    """Send every item to `url` with `concurrency` clients; `on_done` sees each finished record."""
    if concurrency < 1:
        raise ValueError(f"concurrency must be at least 1, got {concurrency}")
    pending = iter(enumerate(items))  # shared by the clients: each takes the next item
    records: list[RequestRecord | None] = [None] * len(items)
    gauge = _InFlight()
    timeout = httpx.Timeout(READ_TIMEOUT_S, connect=CONNECT_TIMEOUT_S)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=timeout, limits=limits) as client:

        async def client_loop() -> None:
            for index, item in pending:
                gauge.enter()
                sent_s = time.perf_counter() - start
                try:
                    record = await stream_chat(client, url, item.payload, item.prompt_id, item.category)
                    records[index] = replace(record, sent_s=sent_s)
                finally:
                    gauge.leave()
                if on_done is not None:
                    on_done(records[index])

        start = time.perf_counter()
        await asyncio.gather(*(client_loop() for _ in range(concurrency)))
        wall = time.perf_counter() - start
    return LoadResult(concurrency, tuple(records), wall, gauge.peak)


def run_load(url: str, items: Sequence[LoadItem], concurrency: int,
             on_done: Callable[[RequestRecord], None] | None = None) -> LoadResult:
    """`run_closed_loop` from synchronous code, on a fresh event loop."""
    return asyncio.run(run_closed_loop(url, items, concurrency, on_done))
