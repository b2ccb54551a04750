"""The response cache's key (which requests are deterministic, what makes two the same) and the
in-process backend: hits, misses, LRU order, expiry on an injected clock, thread safety."""

import threading

import numpy as np
import pytest

from tandem.errors import TandemError
from tandem.serve.response_cache.cache import (
    InProcessResponseCache,
    RedisResponseCache,
    open_response_cache,
    response_cache_key,
)
from tandem.cache_stats import CacheStats

PROMPT = [1, 2, 3, 4]
GREEDY = {"max_tokens": 32, "temperature": 0.0}
SEEDED = {"max_tokens": 32, "temperature": 0.8, "top_p": 0.9, "top_k": 40, "seed": 7,
          "drafter": "hybrid", "k": 4}


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


# --- the key ---------------------------------------------------------------------------------


def test_key_is_a_stable_sha256_hex_digest():
    key = response_cache_key("m", PROMPT, GREEDY)
    assert len(key) == 64 and int(key, 16) >= 0
    assert key == response_cache_key("m", tuple(PROMPT), dict(GREEDY))
    # A golden value: if this changes, bump CACHE_KEY_VERSION so old entries are never misread.
    assert key == "24edb797215ef9a33eb248124a0f61f8bacea88177f494a63bbe53c1e08a67aa"


def test_sampling_without_a_seed_is_never_cached():
    assert response_cache_key("m", PROMPT, {"temperature": 0.7}) is None
    assert response_cache_key("m", PROMPT, {"temperature": 0.7, "seed": None}) is None
    assert response_cache_key("m", PROMPT, {"temperature": 0.7, "seed": 0}) is not None


@pytest.mark.parametrize("change", [
    {"model": "other"}, {"prompt": [1, 2, 3, 5]}, {"max_tokens": 33}, {"stop": ["\n"]},
])
def test_greedy_key_changes_with_what_changes_the_output(change):
    base = response_cache_key("m", PROMPT, GREEDY)
    params = GREEDY | {k: v for k, v in change.items() if k not in ("model", "prompt")}
    other = response_cache_key(change.get("model", "m"), change.get("prompt", PROMPT), params)
    assert other != base


def test_greedy_key_ignores_knobs_that_never_change_greedy_output():
    base = response_cache_key("m", PROMPT, GREEDY)
    knobs = {"drafter": "ngram", "k": 7, "top_p": 0.5, "top_k": 3, "seed": 11, "stream": True, "user": "u"}
    assert response_cache_key("m", PROMPT, GREEDY | knobs) == base
    assert response_cache_key("m", PROMPT, {"max_tokens": 32}) == base  # temperature defaults to 0
    assert response_cache_key("m", PROMPT, GREEDY | {"temperature": 0}) == base
    assert response_cache_key("m", PROMPT, GREEDY | {"temperature": None, "top_p": None}) == base  # JSON null


@pytest.mark.parametrize("name, value", [
    ("seed", 8), ("drafter", "ngram"), ("k", 5), ("k", "auto"), ("top_p", 0.8), ("top_k", 41),
    ("temperature", 0.9),
])
def test_seeded_key_includes_sampling_and_speculation_knobs(name, value):
    assert response_cache_key("m", PROMPT, SEEDED | {name: value}) != response_cache_key("m", PROMPT, SEEDED)


def test_stop_strings_are_canonical():
    key = response_cache_key("m", PROMPT, GREEDY | {"stop": ["b", "a"]})
    assert response_cache_key("m", PROMPT, GREEDY | {"stop": ["a", "b", "a", ""]}) == key
    assert response_cache_key("m", PROMPT, GREEDY | {"stop": "a"}) == response_cache_key(
        "m", PROMPT, GREEDY | {"stop": ["a"]})
    assert response_cache_key("m", PROMPT, GREEDY | {"stop": [""]}) == response_cache_key("m", PROMPT, GREEDY)


def test_numpy_token_ids_and_seed_give_the_same_key():
    params = SEEDED | {"seed": np.int64(7)}
    assert response_cache_key("m", np.array(PROMPT), params) == response_cache_key("m", PROMPT, SEEDED)


# --- the in-process cache --------------------------------------------------------------------


def test_hit_miss_and_stats():
    cache = InProcessResponseCache()
    assert cache.get("a") is None
    cache.put("a", {"text": "hi", "ids": [1, 2]})
    assert cache.get("a") == {"text": "hi", "ids": [1, 2]}
    assert cache.stats == CacheStats(hits=1, misses=1, errors=0)


def test_values_are_copies():
    cache = InProcessResponseCache()
    value = {"ids": [1]}
    cache.put("a", value)
    value["ids"].append(2)
    cache.get("a")["ids"].append(3)
    assert cache.get("a") == {"ids": [1]}


def test_values_must_be_json():
    with pytest.raises(TypeError):
        InProcessResponseCache().put("a", {"x": object()})


def test_least_recently_used_is_evicted():
    cache = InProcessResponseCache(max_entries=2)
    cache.put("a", {"v": 1})
    cache.put("b", {"v": 2})
    cache.get("a")  # now b is the least recently used
    cache.put("c", {"v": 3})
    assert cache.get("b") is None
    assert cache.get("a") == {"v": 1} and cache.get("c") == {"v": 3}
    assert len(cache) == 2


def test_the_stored_bytes_stay_within_the_bound_least_recently_used_first():
    """Answers grow with max_tokens, so the cache is bounded by the bytes it holds: a put past
    the bound evicts the least recently used, one larger than the whole cache is not kept (and
    evicts nothing), and an entry replaced or expired gives its bytes back."""
    import json

    size = len(json.dumps({"text": "x" * 100}))
    cache = InProcessResponseCache(max_bytes=3 * size)
    for key in "abc":
        cache.put(key, {"text": key * 100})
    cache.get("a")  # b is now the least recently used
    cache.put("d", {"text": "d" * 100})
    assert cache.get("b") is None and {k for k in "acd" if cache.get(k)} == set("acd")
    assert cache.nbytes == 3 * size <= cache.max_bytes
    cache.put("huge", {"text": "h" * 4 * size})
    assert cache.get("huge") is None and len(cache) == 3
    cache.put("a", {"text": "a" * 10})  # replaced: its old bytes are given back
    assert cache.nbytes == 2 * size + len(json.dumps({"text": "a" * 10}))
    cache.close()
    assert cache.nbytes == 0


def test_entries_expire_after_the_ttl():
    clock = FakeClock()
    cache = InProcessResponseCache(ttl_seconds=10, clock=clock)
    cache.put("a", {"v": 1})
    clock.now += 9.9
    assert cache.get("a") == {"v": 1}  # a get does not extend the TTL
    clock.now += 0.1
    assert cache.get("a") is None
    assert len(cache) == 0
    cache.put("a", {"v": 2})  # a put starts a fresh TTL
    clock.now += 9.9
    assert cache.get("a") == {"v": 2}


@pytest.mark.parametrize("kwargs", [{"max_entries": 0}, {"ttl_seconds": 0}, {"ttl_seconds": -1}])
def test_bad_settings_are_clear_errors(kwargs):
    with pytest.raises(TandemError):
        InProcessResponseCache(**kwargs)


def test_thread_safety_smoke():
    cache = InProcessResponseCache(max_entries=50)
    errors = []

    def work(seed: int):
        try:
            for i in range(2000):
                key = str((seed * 7 + i) % 80)
                if i % 3 == 0:
                    cache.put(key, {"v": key})
                else:
                    cache.get(key)
                value = cache.get(key)
                assert value is None or value == {"v": key}
        except Exception as error:  # surfaced below, in the test's thread
            errors.append(error)

    threads = [threading.Thread(target=work, args=(seed,)) for seed in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    assert len(cache) <= 50
    stats = cache.stats
    assert stats.hits + stats.misses == 6 * sum(1 + (i % 3 != 0) for i in range(2000))


# --- opening ---------------------------------------------------------------------------------


def test_open_memory_cache():
    assert isinstance(open_response_cache(None, 60), InProcessResponseCache)
    cache = open_response_cache("memory", 60)
    assert isinstance(cache, InProcessResponseCache) and cache.ttl_seconds == 60


@pytest.mark.parametrize("url", [
    "memcached://localhost:11211", "localhost:6379", "", "redis://", "redis://host:notaport",
    "redis://host:99999", "redis://host:6379/zero", "redis://[::1",
])
def test_open_bad_url_is_a_clear_error(url):
    with pytest.raises(TandemError, match="redis://host:port"):
        open_response_cache(url, 60)


def test_bad_url_error_hides_the_password():
    with pytest.raises(TandemError) as caught:
        RedisResponseCache("redis://user:s3cret@host:6379/x", 60)
    assert "s3cret" not in str(caught.value)
