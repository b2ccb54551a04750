"""The in-process n-gram store against its brute-force reference on random token streams, plus
its bounds: longest match first, most recent continuation, LRU eviction by bytes (the bytes
Python really holds for it), thread safety."""

import random
import threading
import tracemalloc

import pytest

from tandem.errors import TandemError
from tandem.speculation.shared_store.index import NgramConfig, ngram_entries, suffix_keys
from tandem.speculation.shared_store.store import (
    InProcessNgramStore,
    ReferenceNgramStore,
    entry_bytes,
    open_ngram_store,
)

UNBOUNDED = 10**9


def random_config(rng: random.Random) -> NgramConfig:
    min_ngram = rng.randrange(1, 4)
    max_ngram = rng.randrange(min_ngram, 9)
    return NgramConfig(min_ngram, max_ngram, continuation_tokens=rng.randrange(1, 17),
                       max_indexed_tokens=rng.choice([max_ngram + 1, 20, 8192]))


def random_context(rng: random.Random, sequences: list[list[int]], vocab: int) -> list[int]:
    """Half the time a slice of an added sequence (likely hits), else random tokens."""
    if sequences and rng.random() < 0.5:
        source = rng.choice(sequences)
        end = rng.randrange(len(source) + 1)
        return source[max(0, end - rng.randrange(1, 12)) : end] + [rng.randrange(vocab)] * rng.randrange(2)
    return [rng.randrange(vocab) for _ in range(rng.randrange(0, 12))]


def test_fast_store_equals_reference_on_random_streams():
    rng = random.Random(0)
    for trial in range(300):
        config = random_config(rng)
        vocab = rng.choice([2, 3, 5, 20, 50_000])
        fast, slow = InProcessNgramStore(UNBOUNDED, config), ReferenceNgramStore(config)
        sequences = []
        for _ in range(rng.randrange(1, 6)):
            tokens = [rng.randrange(vocab) for _ in range(rng.randrange(0, 40))]
            fast.add(tokens)
            slow.add(tokens)
            sequences.append(tokens)
            for _ in range(8):
                context, max_tokens = random_context(rng, sequences, vocab), rng.randrange(0, 20)
                expected = slow.continuation(context, max_tokens)
                assert fast.continuation(context, max_tokens) == expected, (trial, config, context)


def test_empty_and_short_contexts_find_nothing():
    store = InProcessNgramStore(config=NgramConfig(3, 5))
    assert store.continuation([1, 2, 3], 4) == (0, [])
    store.add([1, 2, 3, 4, 5])
    assert store.continuation([], 4) == (0, [])
    assert store.continuation([2, 3], 4) == (0, [])  # shorter than min_ngram
    assert store.continuation([1, 2, 3], 0) == (0, [])
    assert store.continuation([1, 2, 3], 4) == (3, [4, 5])
    assert store.stats.hits == 1 and store.stats.misses == 4


def test_longest_suffix_wins_and_the_most_recent_continuation_is_kept():
    store = InProcessNgramStore(config=NgramConfig(2, 4, continuation_tokens=3))
    store.add([9, 1, 2, 3, 10, 11, 12, 13])
    store.add([7, 2, 3, 20, 21])
    assert store.continuation([5, 9, 1, 2, 3], 8) == (4, [10, 11, 12])  # capped at 3 tokens
    assert store.continuation([5, 5, 2, 3], 8) == (2, [20, 21])  # the later add wins
    assert store.continuation([5, 5, 2, 3], 1) == (2, [20])


def test_least_recently_used_ngrams_are_evicted():
    config = NgramConfig(2, 2)
    one_entry = entry_bytes(bytes(8), bytes(4 * 3))  # a 2-gram's key, a continuation of <= 3 tokens
    store = InProcessNgramStore(max_bytes=3 * one_entry, config=config)
    store.add([1, 2, 3, 4, 5])  # 2-grams followed by something: 12 (345), 23 (45), 34 (5)
    assert len(store) == 3 and store.nbytes <= store.max_bytes
    assert store.continuation([1, 2], 1) == (2, [3])  # 12 is now the most recently used
    store.add([6, 7, 8])  # adds 67 (8), evicts the least recently used: 23
    assert store.continuation([2, 3], 1) == (0, [])
    assert store.continuation([1, 2], 1) == (2, [3])
    assert store.continuation([6, 7], 1) == (2, [8])


def test_only_the_indexed_tail_of_a_long_sequence_is_stored():
    config = NgramConfig(2, 2, max_indexed_tokens=4)
    store = InProcessNgramStore(config=config)
    store.add([1, 2, 3, 4, 5, 6, 7])
    assert store.continuation([1, 2], 1) == (0, [])
    assert store.continuation([5, 6], 1) == (2, [7])


def test_entries_share_one_continuation_per_position():
    entries = ngram_entries([1, 2, 3, 4, 5, 6], NgramConfig(1, 3))
    follows = {id(value) for value in entries.values()}
    assert len(follows) == 5  # one per position followed by a token, not one per n-gram
    assert len(entries) == 5 + 4 + 3


def test_lookup_candidates_are_bounded_by_max_ngram():
    config = NgramConfig(3, 8)
    assert [n for n, _ in suffix_keys(list(range(100_000)), config)] == [8, 7, 6, 5, 4, 3]
    assert [n for n, _ in suffix_keys([1, 2, 3, 4], config)] == [4, 3]


def test_the_bound_holds_for_the_memory_python_holds():
    """The bytes the store charges cover what its n-grams really occupy (tracemalloc), so
    max_bytes bounds the process's memory for it; and the charge stays within ~2x of it."""
    rng = random.Random(5)
    sequences = [[rng.randrange(150_000) for _ in range(3000)] for _ in range(12)]
    store = InProcessNgramStore(max_bytes=1 << 40)
    tracemalloc.start()
    try:
        for tokens in sequences:
            store.add(tokens)
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(store) > 100_000
    assert held <= store.nbytes <= 2 * held, (held, store.nbytes)


def test_the_byte_bound_is_kept_and_readding_does_not_count_twice():
    config = NgramConfig(3, 8)
    store = InProcessNgramStore(max_bytes=1_000_000, config=config)  # ~1.5 of the sequences
    rng = random.Random(6)
    for _ in range(30):
        tokens = [rng.randrange(1000) for _ in range(400)]
        store.add(tokens)
        store.add(tokens)  # the same n-grams again replace, not add
        assert store.nbytes <= store.max_bytes
        assert store.nbytes == sum(entry_bytes(k, v) for k, v in store._entries.items())
    assert store.continuation(tokens[:390], 4) == (8, tokens[390:394])  # the newest survives
    assert len(store) < 2 * 6 * 400  # older sequences went
    store.close()
    assert store.nbytes == 0 and len(store) == 0


def test_thread_safety_smoke():
    store = InProcessNgramStore(max_bytes=500 * entry_bytes(bytes(16), bytes(64)), config=NgramConfig(2, 4))
    errors = []

    def work(seed: int):
        rng = random.Random(seed)
        try:
            for _ in range(200):
                tokens = [rng.randrange(10) for _ in range(30)]
                store.add(tokens)
                n, follow = store.continuation(tokens[:10], 4)
                assert (n == 0) == (follow == []) and len(follow) <= 4
        except Exception as error:  # surfaced below, in the test's thread
            errors.append(error)

    threads = [threading.Thread(target=work, args=(seed,)) for seed in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors and store.nbytes <= store.max_bytes


@pytest.mark.parametrize("kwargs", [
    {"min_ngram": 0}, {"min_ngram": 4, "max_ngram": 3}, {"continuation_tokens": 0}, {"max_indexed_tokens": 8},
])
def test_bad_config_is_a_clear_error(kwargs):
    with pytest.raises(TandemError):
        NgramConfig(**kwargs)


def test_open_memory_store_and_bad_urls():
    assert isinstance(open_ngram_store(None), InProcessNgramStore)
    assert open_ngram_store("memory", max_bytes=7000).max_bytes == 7000
    for bad in [0, -1, True, 1.5]:
        with pytest.raises(TandemError, match="max_bytes"):
            InProcessNgramStore(max_bytes=bad)
    for url in ["file:///tmp/x", "redis://host:port"]:
        with pytest.raises(TandemError, match="redis://host:port"):
            open_ngram_store(url)
