"""The shared n-gram store: draft material from earlier requests, for cross-request drafting.

Finished sequences (prompt + output token ids) are indexed with `add`: every n-gram, n in
[min_ngram, max_ngram], maps to the tokens that followed its most recent occurrence (see
index.py). `continuation(context, max_tokens)` returns `(n, tokens)` for the longest n
whose last-n-token suffix of `context` is stored, and `(0, [])` when none is. Both run on the
engine thread: a lookup costs O(max_ngram) dictionary probes (one Redis round trip), never
anything proportional to the store's size.

Backends: `InProcessNgramStore` (an LRU per server process, bounded by bytes) and `RedisNgramStore`
(shared by server processes, see redis_store.py). `ReferenceNgramStore` is the slow,
obviously correct definition the fast ones are tested against.
"""

import threading
from collections import OrderedDict
from typing import Protocol, Sequence

from tandem.cache_stats import CacheStats, StatsCounter
from tandem.errors import TandemError
from tandem.numbers import is_int
from tandem.speculation.shared_store.index import (
    DEFAULT_NGRAM_CONFIG,
    NgramConfig,
    decode_tokens,
    ngram_entries,
    suffix_keys,
)
from tandem.redis_link import is_redis_url, redact
from tandem.speculation.shared_store.redis_store import DEFAULT_NGRAM_TTL_SECONDS, RedisNgramStore

DEFAULT_MAX_BYTES = 128 << 20  # ~470k n-grams (~6 per indexed token), ~80 MB held (charged ~1.7x that)
# What an n-gram costs beyond its key's and continuation's bytes: two bytes objects' headers and
# the ordered dict's slot and link (measured with tracemalloc: test_ngram_store.py). Charged per
# n-gram although the n-grams ending at one position share one continuation, so the bound holds
# with room to spare.
ENTRY_OVERHEAD_BYTES = 200
MEMORY_URL = "memory"
NO_CONTINUATION: tuple[int, list[int]] = (0, [])


class NgramStore(Protocol):
    """add/continuation never raise for backend trouble; a dead backend looks empty."""

    def add(self, token_ids: Sequence[int]) -> None: ...

    def continuation(self, context: Sequence[int], max_tokens: int) -> tuple[int, list[int]]: ...

    def flush(self, timeout_s: float) -> bool:
        """Wait until earlier adds are visible to lookups; False if that took past timeout_s."""
        ...

    def close(self) -> None: ...

    @property
    def stats(self) -> CacheStats: ...


def entry_bytes(key: bytes, follow: bytes) -> int:
    """What one n-gram is charged against the store's bound."""
    return len(key) + len(follow) + ENTRY_OVERHEAD_BYTES


class InProcessNgramStore:
    """At most `max_bytes` of n-grams (`entry_bytes` each), least recently added or matched
    evicted first. Thread-safe; `add` builds its entries outside the lock and inserts them
    under it."""

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES, config: NgramConfig = DEFAULT_NGRAM_CONFIG):
        if not (is_int(max_bytes) and max_bytes >= 1):
            raise TandemError(f"the n-gram store needs max_bytes >= 1, got {max_bytes!r}")
        self.max_bytes = max_bytes
        self.config = config
        self.nbytes = 0  # charged by entry_bytes
        self._lock = threading.Lock()
        self._entries: OrderedDict[bytes, bytes] = OrderedDict()  # n-gram key -> continuation
        self._counter = StatsCounter()

    def add(self, token_ids: Sequence[int]) -> None:
        entries = ngram_entries(token_ids, self.config)
        with self._lock:
            for key in reversed(entries):  # oldest occurrence first, so the newest ends up last
                follow = entries[key]
                replaced = self._entries.pop(key, None)
                if replaced is not None:
                    self.nbytes -= entry_bytes(key, replaced)
                self._entries[key] = follow
                self.nbytes += entry_bytes(key, follow)
            while self.nbytes > self.max_bytes:
                key, follow = self._entries.popitem(last=False)
                self.nbytes -= entry_bytes(key, follow)

    def continuation(self, context: Sequence[int], max_tokens: int) -> tuple[int, list[int]]:
        found = self._longest(context) if max_tokens >= 1 else None
        self._counter.lookup(found is not None)
        if found is None:
            return NO_CONTINUATION
        n, follow = found
        return n, decode_tokens(follow, max_tokens)

    def flush(self, timeout_s: float = 0.0) -> bool:
        return True  # adds are visible as soon as they return

    def close(self) -> None:
        self.clear()

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self.nbytes = 0

    @property
    def stats(self) -> CacheStats:
        return self._counter.snapshot()

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def _longest(self, context: Sequence[int]) -> tuple[int, bytes] | None:
        candidates = suffix_keys(context, self.config)
        with self._lock:
            for n, key in candidates:
                follow = self._entries.get(key)
                if follow is not None:
                    self._entries.move_to_end(key)
                    return n, follow
        return None


class ReferenceNgramStore:
    """The definition, by brute force: keep every added sequence (its indexed tail); for n from
    max_ngram down, the most recent occurrence of the context's last n tokens that some token
    follows, in the most recently added sequence that has one. No eviction."""

    def __init__(self, config: NgramConfig = DEFAULT_NGRAM_CONFIG):
        self.config = config
        self.sequences: list[list[int]] = []

    def add(self, token_ids: Sequence[int]) -> None:
        self.sequences.append(list(self.config.indexed(token_ids)))

    def continuation(self, context: Sequence[int], max_tokens: int) -> tuple[int, list[int]]:
        context = list(context)
        if max_tokens < 1:
            return NO_CONTINUATION
        limit = min(max_tokens, self.config.continuation_tokens)
        for n in range(min(self.config.max_ngram, len(context)), self.config.min_ngram - 1, -1):
            tail = context[-n:]
            for sequence in reversed(self.sequences):
                for start in range(len(sequence) - n - 1, -1, -1):
                    if sequence[start : start + n] == tail:
                        return n, sequence[start + n : start + n + limit]
        return NO_CONTINUATION


def open_ngram_store(url: str | None, *, namespace: str = "default", max_bytes: int = DEFAULT_MAX_BYTES,
                     ttl_seconds: float = DEFAULT_NGRAM_TTL_SECONDS, config: NgramConfig = DEFAULT_NGRAM_CONFIG) -> NgramStore:
    """None or "memory": in-process (max_bytes); redis://host:port[/db]: Redis, shared by every
    server using the same `namespace` (use one per vocabulary: token ids mean nothing across
    tokenizers), entries expiring after ttl_seconds. Anything else raises TandemError."""
    if url is None or url == MEMORY_URL:
        return InProcessNgramStore(max_bytes, config)
    if is_redis_url(url):
        return RedisNgramStore(url, namespace=namespace, ttl_seconds=ttl_seconds, config=config)
    raise TandemError(f"unsupported n-gram store {redact(url)!r}: use 'memory' or redis://host:port[/db]")
