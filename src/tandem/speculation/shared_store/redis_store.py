"""The n-gram store in Redis, shared by every server process using the same namespace.

Layout: one string key per n-gram, `tandem:ngram:<quoted namespace>:` + the n-gram's bytes (see
index.py), holding its continuation's bytes and expiring `ttl_seconds` after its last
write; the most recent writer wins. Redis's own memory policy (maxmemory + an LRU policy)
bounds the size beyond the TTL.

`add` only queues the sequence (O(1) on the engine thread); a writer thread indexes it and
pipelines the SETs in chunks. A full queue drops the sequence and counts an error. A lookup is
one MGET of the context's candidate suffix keys. Every Redis failure degrades to an empty
result or a skipped write (see redis_link.py); nothing here raises for backend trouble.
"""

import logging
import queue
import threading
from itertools import islice
from typing import Iterable, Sequence
from urllib.parse import quote

from tandem.cache_stats import CacheStats, StatsCounter
from tandem.errors import TandemError
from tandem.speculation.shared_store.index import (
    DEFAULT_NGRAM_CONFIG,
    NgramConfig,
    decode_tokens,
    ngram_entries,
    suffix_keys,
)
from tandem.redis_link import RECONNECT_BACKOFF_MAX_SECONDS, RedisLink

log = logging.getLogger(__name__)
REDIS_NGRAM_PREFIX = "tandem:ngram:"
DEFAULT_NGRAM_TTL_SECONDS = 24 * 3600.0
WRITE_QUEUE_LIMIT = 256  # sequences waiting for the writer thread
PIPELINE_CHUNK = 2000  # SETs per round trip
CLOSE_TIMEOUT_SECONDS = 5.0  # how long close waits for queued writes
_STOP = object()


class RedisNgramStore:
    def __init__(self, url: str, *, namespace: str = "default", ttl_seconds: float = DEFAULT_NGRAM_TTL_SECONDS,
                 config: NgramConfig = DEFAULT_NGRAM_CONFIG, backoff_max_s: float = RECONNECT_BACKOFF_MAX_SECONDS):
        if not (isinstance(ttl_seconds, (int, float)) and ttl_seconds > 0):
            raise TandemError(f"the n-gram TTL must be a positive number of seconds, got {ttl_seconds!r}")
        if not (isinstance(namespace, str) and namespace):
            raise TandemError(f"the n-gram namespace must be a non-empty string, got {namespace!r}")
        self.config = config
        self._prefix = f"{REDIS_NGRAM_PREFIX}{quote(namespace, safe='')}:".encode()  # ':' escaped
        self._ttl_ms = max(1, round(ttl_seconds * 1000))
        self._link = RedisLink(url, backoff_max_s=backoff_max_s)
        self._counter = StatsCounter()
        self._lock = threading.Lock()
        self._dropped = 0
        self._closed = False
        self._queue: queue.Queue = queue.Queue(maxsize=WRITE_QUEUE_LIMIT)
        self._writer = threading.Thread(target=self._write_loop, name="tandem-ngram-writer", daemon=True)
        self._writer.start()
        if self._link.ping():  # an unreachable server is only logged: drafting goes on without it
            self._link.warn_if_unbounded()

    def add(self, token_ids: Sequence[int]) -> None:
        """Queue the sequence for the writer thread; visible to lookups shortly after."""
        if self._closed:
            return
        try:
            self._queue.put_nowait(tuple(self.config.indexed(token_ids)))  # only what is indexed waits
        except queue.Full:
            with self._lock:
                self._dropped += 1
                first = self._dropped == 1
            if first:
                log.warning("n-gram store writes fall behind (queue of %d full); dropping sequences",
                            WRITE_QUEUE_LIMIT)

    def continuation(self, context: Sequence[int], max_tokens: int) -> tuple[int, list[int]]:
        candidates = suffix_keys(context, self.config) if max_tokens >= 1 else []
        keys = [self._prefix + key for _, key in candidates]
        values = self._link.run(lambda client: client.mget(keys), None) if keys else None
        for (n, _), follow in zip(candidates, values or ()):
            tokens = decode_tokens(follow, max_tokens) if follow else []
            if tokens:
                self._counter.lookup(True)
                return n, tokens
        self._counter.lookup(False)
        return 0, []

    def flush(self, timeout_s: float = CLOSE_TIMEOUT_SECONDS) -> bool:
        """Wait until every earlier add is written (or given up on); False on timeout."""
        done = threading.Event()
        try:
            self._queue.put(done, timeout=timeout_s)
        except queue.Full:
            return False
        return done.wait(timeout_s)

    def close(self) -> None:
        """Write what is queued (for up to CLOSE_TIMEOUT_SECONDS), stop the writer, disconnect."""
        if self._closed:
            return
        self._closed = True
        try:
            self._queue.put(_STOP, timeout=CLOSE_TIMEOUT_SECONDS)
        except queue.Full:
            log.warning("n-gram store closing with writes still queued; they are dropped")
        self._writer.join(CLOSE_TIMEOUT_SECONDS)
        self._link.close()

    @property
    def stats(self) -> CacheStats:
        with self._lock:
            dropped = self._dropped
        return self._counter.snapshot(errors=self._link.errors + dropped)

    def _write_loop(self) -> None:
        while (item := self._queue.get()) is not _STOP:
            if isinstance(item, threading.Event):
                item.set()
            else:
                self._write_safely(item)

    def _write_safely(self, token_ids: tuple[int, ...]) -> None:
        """Redis trouble is handled by the link; anything else is a bug, logged so that the
        writer thread survives it."""
        try:
            self._write(token_ids)
        except Exception:
            log.exception("n-gram store: could not index a sequence of %d tokens", len(token_ids))

    def _write(self, token_ids: tuple[int, ...]) -> None:
        entries = iter(ngram_entries(token_ids, self.config).items())
        while chunk := list(islice(entries, PIPELINE_CHUNK)):
            self._link.run(lambda client: self._set_all(client, chunk), None)

    def _set_all(self, client, entries: Iterable[tuple[bytes, bytes]]) -> None:
        with client.pipeline(transaction=False) as pipe:
            for key, follow in entries:
                pipe.set(self._prefix + key, follow, px=self._ttl_ms)
            pipe.execute()
