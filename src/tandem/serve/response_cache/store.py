"""The response cache as the event loop sees it: lookups and stores that never block the loop.

`serve/response_cache/cache.py` provides the cache (in memory or Redis) and its key function; both may block (a
network round trip), so every call runs on one dedicated thread, which also serialises access for
a cache that is not thread-safe. A cache failure is a miss, never an error for the client.
"""

import asyncio
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

log = logging.getLogger(__name__)

CacheKeyFn = Callable[[str, Sequence[int], dict], "str | None"]


class ResponseCache(Protocol):
    def get(self, key: str) -> dict | None: ...

    def put(self, key: str, value: dict) -> None: ...

    def close(self) -> None: ...


class ResponseStore:
    def __init__(self, cache: ResponseCache, key_fn: CacheKeyFn):
        self._cache = cache
        self._key_fn = key_fn
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tandem-cache")

    def key(self, model: str, prompt_ids: Sequence[int], params: dict) -> str | None:
        """None for a request whose answer is not deterministic (sampling without a seed)."""
        return self._key_fn(model, prompt_ids, params)

    async def get(self, key: str) -> dict | None:
        try:
            return await asyncio.get_running_loop().run_in_executor(self._thread, self._cache.get, key)
        except Exception:
            log.exception("response cache lookup failed; treating it as a miss")
            return None

    async def put(self, key: str, value: dict) -> None:
        try:
            await asyncio.get_running_loop().run_in_executor(self._thread, self._cache.put, key, value)
        except Exception:
            log.exception("response cache store failed; the response is not cached")

    def close(self) -> None:
        self._thread.shutdown(wait=True)
        self._cache.close()

    @classmethod
    def disabled(cls) -> "ResponseStore":
        """A store that caches nothing: every request is generated (no lookups are counted)."""
        return cls(_NoCache(), lambda model, prompt_ids, params: None)


class _NoCache:
    def get(self, key: str) -> dict | None:
        return None

    def put(self, key: str, value: dict) -> None:
        pass

    def close(self) -> None:
        pass
