"""The Redis-backed caches against a real redis-server: hits, misses, expiry, an n-gram store
shared by two "servers", and Redis killed mid-run (every call degrades to a miss, fast, without
raising) then restarted on the same port (the caches reconnect by themselves)."""

import logging
import random
import shutil
import signal
import time

import pytest
import redis
from redis_support import REDIS_SERVER, RedisProcess, free_port, until

from tandem.serve.response_cache.cache import RedisResponseCache, open_response_cache
from tandem.speculation.shared_store.index import NgramConfig
from tandem.speculation.shared_store.redis_store import RedisNgramStore
from tandem.speculation.shared_store.store import ReferenceNgramStore, open_ngram_store

DEGRADED_CALL_SECONDS = 0.5  # the bound on one call while Redis is dead (socket timeout 0.2 s)
BACKOFF_MAX_SECONDS = 0.5  # short, so the tests see the reconnect quickly
FLUSH_SECONDS = 5.0

pytestmark = [
    pytest.mark.real,
    pytest.mark.skipif(shutil.which(REDIS_SERVER) is None,
                       reason=f"redis-server not installed (looked for {REDIS_SERVER})"),
]


@pytest.fixture
def redis_server(tmp_path):
    server = RedisProcess(tmp_path, free_port())
    server.start()
    yield server
    if server.process.poll() is None:
        server.kill()


def test_hits_misses_and_expiry(redis_server):
    """Shared between two servers and expiring: the sharing on a 10 s TTL (a slow VM cannot
    expire it mid-check), the expiry on a 0.3 s one."""
    cache = open_response_cache(redis_server.url, ttl_seconds=10)
    assert isinstance(cache, RedisResponseCache)
    assert cache.get("k") is None
    cache.put("k", {"text": "hello", "ids": [1, 2]})
    assert cache.get("k") == {"text": "hello", "ids": [1, 2]}
    other = open_response_cache(redis_server.url, ttl_seconds=10)  # a second server process
    assert other.get("k") == {"text": "hello", "ids": [1, 2]}
    raw = redis.Redis(port=redis_server.port)
    assert raw.exists("tandem:response:k") and 0 < raw.pttl("tandem:response:k") <= 10_000
    short = open_response_cache(redis_server.url, ttl_seconds=0.3)
    short.put("k2", {"v": 1})
    assert 0 < raw.pttl("tandem:response:k2") <= 300 or short.get("k2") is None  # expired already: fine
    assert until(lambda: short.get("k2") is None, timeout_s=2.0)
    stats = cache.stats
    assert stats.hits >= 1 and stats.misses >= 1 and stats.errors == 0
    assert short.stats.misses >= 1 and short.stats.errors == 0
    for opened in (cache, other, short):
        opened.close()


def test_ngram_store_is_shared_between_two_servers(redis_server):
    config = NgramConfig(2, 5, continuation_tokens=6)
    first = open_ngram_store(redis_server.url, namespace="vocab-a", config=config)
    second = open_ngram_store(redis_server.url, namespace="vocab-a", config=config)
    elsewhere = open_ngram_store(redis_server.url, namespace="vocab-a:b", config=config)
    reference = ReferenceNgramStore(config)
    rng = random.Random(0)
    sequences = [[rng.randrange(6) for _ in range(40)] for _ in range(4)]
    for tokens in sequences:
        first.add(tokens)
        reference.add(tokens)
    assert first.flush(FLUSH_SECONDS)
    contexts = [tokens[s : s + w] for tokens in sequences for s, w in [(0, 3), (5, 6), (30, 9), (35, 5)]]
    for context in contexts + [[99, 98, 97]]:
        assert second.continuation(context, 6) == reference.continuation(context, 6), context
        assert elsewhere.continuation(context, 6) == (0, [])
    assert second.stats.hits >= len(contexts) and second.stats.errors == 0
    for store in (first, second, elsewhere):
        store.close()


def assert_degraded_quickly(cache, store, label: str) -> None:
    for i in range(20):
        started = time.monotonic()
        assert cache.get(f"{label}{i}") is None
        cache.put(f"{label}{i}", {"v": i})
        assert store.continuation([1, 2, 3, 4], 4) == (0, [])
        store.add([1, 2, 3, 4, 5])
        assert time.monotonic() - started < DEGRADED_CALL_SECONDS


def test_redis_killed_mid_run_degrades_then_reconnects(redis_server, caplog):
    cache = RedisResponseCache(redis_server.url, ttl_seconds=60, backoff_max_s=BACKOFF_MAX_SECONDS)
    store = RedisNgramStore(redis_server.url, backoff_max_s=BACKOFF_MAX_SECONDS)
    cache.put("warm", {"v": 0})
    assert cache.get("warm") == {"v": 0}
    store.add([1, 2, 3, 4, 5, 6])
    assert store.flush(FLUSH_SECONDS) and store.continuation([1, 2, 3, 4], 4) == (4, [5, 6])

    redis_server.kill()
    with caplog.at_level(logging.WARNING, logger="tandem.redis_link"):
        started = time.monotonic()
        assert_degraded_quickly(cache, store, "dead")
        assert store.flush(FLUSH_SECONDS)  # queued writes are given up on, not stuck
        assert time.monotonic() - started < 5.0
    assert cache.stats.errors > 0 and store.stats.errors > 0
    down = [r for r in caplog.records if "unavailable" in r.getMessage()]  # not the maxmemory advice
    assert 1 <= len(down) <= 2  # rate-limited: a warning per link, not per call

    redis_server.start()  # same port, empty
    assert until(lambda: cache.put("back", {"v": 1}) or cache.get("back") == {"v": 1}, timeout_s=5.0)

    def store_works() -> bool:
        store.add([1, 2, 3, 4, 5, 6])
        store.flush(FLUSH_SECONDS)
        return store.continuation([1, 2, 3, 4], 4) == (4, [5, 6])

    assert until(store_works, timeout_s=5.0)
    cache.close()
    store.close()


def test_unreachable_at_startup_only_warns(tmp_path, caplog):
    url = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    with caplog.at_level(logging.WARNING, logger="tandem.redis_link"):
        started = time.monotonic()
        cache = open_response_cache(url, ttl_seconds=60)
        store = open_ngram_store(url)
        assert cache.get("k") is None and store.continuation([1, 2, 3], 2) == (0, [])
        assert time.monotonic() - started < 2.0
    assert "unavailable" in caplog.text
    cache.close()
    store.close()


def test_a_hung_redis_costs_one_socket_timeout_and_no_stale_replies(redis_server):
    cache = RedisResponseCache(redis_server.url, ttl_seconds=60, backoff_max_s=BACKOFF_MAX_SECONDS)
    store = RedisNgramStore(redis_server.url, backoff_max_s=BACKOFF_MAX_SECONDS)
    cache.put("a", {"v": "a"})
    cache.put("b", {"v": "b"})
    redis_server.process.send_signal(signal.SIGSTOP)  # alive, accepting nothing: a hung server
    try:
        started = time.monotonic()
        assert cache.get("a") is None  # waits one socket timeout, then the link is down
        assert store.continuation([1, 2, 3], 2) == (0, [])
        assert cache.get("a") is None and store.continuation([1, 2, 3], 2) == (0, [])
        assert time.monotonic() - started < 2 * DEGRADED_CALL_SECONDS
    finally:
        redis_server.process.send_signal(signal.SIGCONT)
    # The reply to the timed-out GET "a" arrives late; it must never answer a later GET "b".
    def b_is_back() -> bool:
        value = cache.get("b")
        assert value in (None, {"v": "b"})
        return value is not None

    assert until(b_is_back, timeout_s=5.0)
    assert cache.get("a") == {"v": "a"}
    cache.close()
    store.close()


def test_a_redis_without_a_memory_bound_is_named_once(redis_server, caplog):
    """Redis bounds Tandem's entries there by bytes only through its own maxmemory and an
    evicting policy; a server without them (redis-server's defaults) is named at start, once
    for both caches, and one with them is not."""
    import redis as redis_client

    from tandem import redis_link

    redis_link._WARNED_UNBOUNDED.clear()
    with caplog.at_level(logging.WARNING, logger="tandem.redis_link"):
        cache, store = open_response_cache(redis_server.url, ttl_seconds=60), open_ngram_store(redis_server.url)
    assert caplog.text.count("has no memory limit") == 1
    cache.close()
    store.close()
    admin = redis_client.Redis(port=redis_server.port)
    admin.config_set("maxmemory", 64 << 20)
    for policy, says in (("noeviction", "evicts nothing"), ("allkeys-lru", None)):
        admin.config_set("maxmemory-policy", policy)
        redis_link._WARNED_UNBOUNDED.clear()
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="tandem.redis_link"):
            open_response_cache(redis_server.url, ttl_seconds=60).close()
        assert (says in caplog.text) if says else "maxmemory" not in caplog.text, policy
