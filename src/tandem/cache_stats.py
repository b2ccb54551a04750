"""Counters shared by the serving caches (response cache, n-gram store).

Terms: a *hit* is a lookup that found something, a *miss* one that did not (a lookup that could
not reach its backend is also a miss), and an *error* is any operation, lookup or write, that
its backend failed to serve. `CacheStats` is a frozen snapshot; `StatsCounter` is the
thread-safe tally behind it.
"""

import threading
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class CacheStats:
    hits: int = 0
    misses: int = 0
    errors: int = 0


class StatsCounter:
    """Thread-safe hit/miss tally; errors are counted by whoever talks to the backend."""

    def __init__(self):
        self._lock = threading.Lock()
        self._hits = 0
        self._misses = 0

    def lookup(self, hit: bool) -> None:
        with self._lock:
            if hit:
                self._hits += 1
            else:
                self._misses += 1

    def snapshot(self, errors: int = 0) -> CacheStats:
        with self._lock:
            return CacheStats(self._hits, self._misses, errors)
