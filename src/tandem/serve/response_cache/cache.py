"""The response cache: a finished response, reused for an identical deterministic request.

`response_cache_key` decides which requests may be cached and what makes two of them the same;
a `ResponseCache` stores JSON-ready dicts under those keys for `ttl_seconds`. Two backends:
in-process (an LRU per server process) and Redis (shared by server processes). Both store values
as JSON, so get returns a fresh copy and a value that works in one works in the other.

Caching is an optimisation, never a dependency: the Redis backend degrades every failure to a
miss or a no-op (see redis_link.py), and only a malformed URL is an error.
"""

import hashlib
import json
import threading
import time
from collections import OrderedDict
from typing import Callable, Protocol, Sequence

from tandem.cache_stats import CacheStats, StatsCounter
from tandem.errors import TandemError
from tandem.numbers import is_int
from tandem.redis_link import (
    RECONNECT_BACKOFF_MAX_SECONDS,
    RedisLink,
    is_redis_url,
    redact,
)
from tandem.speculation.sampling import SamplingParams

CACHE_KEY_VERSION = 1  # bump when the key's contents change, so old entries are never read
DEFAULT_MAX_ENTRIES = 1024
DEFAULT_MAX_BYTES = 64 << 20  # of stored JSON: an answer's size grows with max_tokens, so a count alone bounds nothing
DEFAULT_TTL_SECONDS = 3600.0
REDIS_RESPONSE_PREFIX = "tandem:response:"
MEMORY_URL = "memory"
SAMPLING_DEFAULTS = SamplingParams()


def response_cache_key(model: str, prompt_ids: Sequence[int], params: dict) -> str | None:
    """A stable sha256 hex digest naming the request's output, or None if it is not deterministic.

    `model` must identify the target's weights *and* backend (a Q4 GGUF and fp32 weights give
    different greedy outputs). `params` holds the effective values (server defaults applied) of
    max_tokens, temperature, top_p, top_k, seed, stop and the speculation knobs drafter and k;
    other keys (stream, user, ...) do not change the tokens and are ignored.

    - temperature > 0 without a seed: each call must be a fresh sample, so None (never cached).
    - temperature 0 (greedy): the output is the target's argmax chain. Acceptance is lossless, so
      the drafter and k only change how many tokens each round verifies, never which; top-k and
      top-p keep the argmax and no random number is drawn. The key is model, prompt, max_tokens
      and stops, so greedy requests differing only in those knobs share an entry.
    - temperature > 0 with a seed: the output follows the target distribution exactly, and each
      position's token is drawn from the seed and the position alone (the positional rule,
      speculation/acceptance.py), so the same seed gives the same tokens at any drafter or k.
      Drafter and k still join the key with the sampling parameters (a choice from before that
      rule, kept: it costs only hits between requests that differ in them).

    A cache salt (vLLM's `cache_salt`) joins the key, so a salted answer is found only by requests
    of the same salt.

    Stop strings cut the output at the first occurrence of any, so their order, duplicates and
    empty strings do not matter; a single string is one stop.
    """
    temperature = float(_param(params, "temperature", SAMPLING_DEFAULTS.temperature))
    seed = _param(params, "seed", SAMPLING_DEFAULTS.seed)
    if temperature > 0 and seed is None:
        return None
    canonical = {
        "version": CACHE_KEY_VERSION,
        "model": model,
        "prompt_ids": [int(token) for token in prompt_ids],
        "max_tokens": _param(params, "max_tokens", None),
        "stop": _canonical_stops(params.get("stop")),
        "temperature": temperature,
    }
    if params.get("cache_salt") is not None:  # answers shared only within a salt (unsalted keys as before)
        canonical["cache_salt"] = str(params["cache_salt"])
    if temperature > 0:
        canonical |= {
            "top_p": float(_param(params, "top_p", SAMPLING_DEFAULTS.top_p)),
            "top_k": int(_param(params, "top_k", SAMPLING_DEFAULTS.top_k)),
            "seed": int(seed),
            "drafter": params.get("drafter"),
            "k": None if params.get("k") is None else str(params["k"]),  # a Depth, "auto" or an int
        }
    text = json.dumps(canonical, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def _param(params: dict, name: str, default):
    """A parameter's value, the default when it is missing or null."""
    value = params.get(name)
    return default if value is None else value


def _canonical_stops(stop: str | Sequence[str] | None) -> list[str]:
    if stop is None:
        return []
    stops = [stop] if isinstance(stop, str) else list(stop)
    return sorted({s for s in stops if s})


class ResponseCache(Protocol):
    """get/put never raise for backend trouble; a value is a JSON-ready dict."""

    def get(self, key: str) -> dict | None: ...

    def put(self, key: str, value: dict) -> None: ...

    def close(self) -> None: ...

    @property
    def stats(self) -> CacheStats: ...


class InProcessResponseCache:
    """A thread-safe LRU of at most `max_entries` holding at most `max_bytes` of JSON (an entry
    larger than that is not stored), each expiring `ttl_seconds` after its put."""

    def __init__(self, max_entries: int = DEFAULT_MAX_ENTRIES, ttl_seconds: float = DEFAULT_TTL_SECONDS,
                 clock: Callable[[], float] = time.monotonic, max_bytes: int = DEFAULT_MAX_BYTES):
        if not (is_int(max_entries) and max_entries >= 1):
            raise TandemError(f"the response cache needs max_entries >= 1, got {max_entries!r}")
        if not (is_int(max_bytes) and max_bytes >= 1):
            raise TandemError(f"the response cache needs max_bytes >= 1, got {max_bytes!r}")
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.nbytes = 0  # of the stored JSON (ASCII: json.dumps escapes the rest)
        self.ttl_seconds = _checked_ttl(ttl_seconds)
        self._clock = clock
        self._lock = threading.Lock()
        self._entries: OrderedDict[str, tuple[float, str]] = OrderedDict()  # key -> (expires_at, JSON)
        self._counter = StatsCounter()

    def get(self, key: str) -> dict | None:
        with self._lock:
            text = self._live_text(key)
        self._counter.lookup(text is not None)
        return None if text is None else json.loads(text)

    def put(self, key: str, value: dict) -> None:
        text = json.dumps(value)
        with self._lock:
            self._drop(key)
            if len(text) > self.max_bytes:
                return  # larger than the whole cache: served, not kept
            self._entries[key] = (self._clock() + self.ttl_seconds, text)
            self.nbytes += len(text)
            while len(self._entries) > self.max_entries or self.nbytes > self.max_bytes:
                self._drop(next(iter(self._entries)))

    def close(self) -> None:
        with self._lock:
            self._entries.clear()
            self.nbytes = 0

    @property
    def stats(self) -> CacheStats:
        return self._counter.snapshot()

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def _live_text(self, key: str) -> str | None:
        """The entry's JSON, refreshed as most recently used; None (and dropped) once expired."""
        entry = self._entries.get(key)
        if entry is None:
            return None
        expires_at, text = entry
        if self._clock() >= expires_at:
            self._drop(key)
            return None
        self._entries.move_to_end(key)
        return text

    def _drop(self, key: str) -> None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self.nbytes -= len(entry[1])


class RedisResponseCache:
    """Entries as JSON under `tandem:response:<key>`, written with SET PX (the TTL in ms, so a
    fractional TTL holds). Redis's own memory policy bounds the size (a warning at start where
    it does not: RedisLink.warn_if_unbounded)."""

    def __init__(self, url: str, ttl_seconds: float = DEFAULT_TTL_SECONDS, *,
                 backoff_max_s: float = RECONNECT_BACKOFF_MAX_SECONDS):
        self.ttl_seconds = _checked_ttl(ttl_seconds)
        self._ttl_ms = max(1, round(self.ttl_seconds * 1000))
        self._link = RedisLink(url, backoff_max_s=backoff_max_s)
        self._counter = StatsCounter()
        if self._link.ping():  # an unreachable server is only logged: the server starts uncached
            self._link.warn_if_unbounded()

    def get(self, key: str) -> dict | None:
        raw = self._link.run(lambda client: client.get(REDIS_RESPONSE_PREFIX + key), None)
        value = _decoded(raw)
        self._counter.lookup(value is not None)
        return value

    def put(self, key: str, value: dict) -> None:
        text = json.dumps(value)
        self._link.run(lambda client: client.set(REDIS_RESPONSE_PREFIX + key, text, px=self._ttl_ms), None)

    def close(self) -> None:
        self._link.close()

    @property
    def stats(self) -> CacheStats:
        return self._counter.snapshot(errors=self._link.errors)


def _decoded(raw: bytes | None) -> dict | None:
    """A stored JSON object, or None for a missing or foreign (non-JSON, non-object) value."""
    if raw is None:
        return None
    try:
        value = json.loads(raw)
    except ValueError:  # includes UnicodeDecodeError
        return None
    return value if isinstance(value, dict) else None


def _checked_ttl(ttl_seconds: float) -> float:
    if not (isinstance(ttl_seconds, (int, float)) and ttl_seconds > 0):
        raise TandemError(f"the cache TTL must be a positive number of seconds, got {ttl_seconds!r}")
    return float(ttl_seconds)


def open_response_cache(url: str | None, ttl_seconds: float = DEFAULT_TTL_SECONDS) -> ResponseCache:
    """None or "memory": in-process; redis://host:port[/db] (or rediss://): Redis. Anything else,
    or a malformed Redis URL, raises TandemError; an unreachable Redis only logs a warning."""
    if url is None or url == MEMORY_URL:
        return InProcessResponseCache(ttl_seconds=ttl_seconds)
    if is_redis_url(url):
        return RedisResponseCache(url, ttl_seconds)
    raise TandemError(f"unsupported response cache {redact(url)!r}: use 'memory' or redis://host:port[/db]")
