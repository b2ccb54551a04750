"""The host tier of the prompt cache (engine/host_cache.py): the longest cached prefix found
through the block-hash index equals a brute-force scan's, the byte budget is never exceeded
(least recently used entries go first), dropped entries' memory is handed back to the system
every RELEASE_EVERY_BYTES, and another model's key never hits."""

import random

import pytest

from tandem.engine import host_cache
from tandem.engine.host_cache import BLOCK, HostEntry, HostPromptCache, parse_cache_ram
from tandem import heap
from tandem.heap import release_freed
from tandem.errors import TandemError
from tandem.token_ids import common_prefix

KEY = "target.gguf|draft.gguf"


def entry(tokens, nbytes=100) -> HostEntry:
    return HostEntry(tuple(tokens), b"t" * nbytes)


def brute_force(entries, tokens) -> int:
    """The slow reference: the longest common prefix with any entry (0 below a block)."""
    best = max((common_prefix(e.tokens, tokens) for e in entries), default=0)
    return best if best >= BLOCK else 0


def test_lookup_finds_the_longest_prefix_a_brute_force_scan_finds():
    rng = random.Random(3)
    trunk = [rng.randrange(50) for _ in range(200)]
    cache = HostPromptCache(1 << 30, KEY)
    stored = []
    for _ in range(40):  # conversations branching off a shared trunk at random points
        cut = rng.randrange(0, 200)
        tokens = trunk[:cut] + [rng.randrange(50) for _ in range(rng.randrange(0, 60))]
        if len(tokens) >= BLOCK and cache.put(entry(tokens), KEY):
            extended = max(stored, key=lambda e: common_prefix(e.tokens, tokens), default=None)
            if extended is not None and common_prefix(extended.tokens, tokens) == len(extended.tokens) >= BLOCK:
                stored.remove(extended)  # the entry the new one extends is replaced
            stored.append(entry(tokens))
    assert len(cache) == len(stored)
    for _ in range(300):
        cut = rng.randrange(0, 200)
        query = trunk[:cut] + [rng.randrange(50) for _ in range(rng.randrange(0, 40))]
        match = cache.lookup(query, KEY)
        assert (match.common if match else 0) == brute_force(stored, query)
        if match:
            assert match.entry.tokens[:match.common] == tuple(query[:match.common])


def test_the_byte_budget_is_never_exceeded_and_the_least_recently_used_go_first():
    cache = HostPromptCache(1000, KEY)
    for i in range(10):
        assert cache.put(entry([i] * 40, nbytes=300), KEY)
        assert cache.nbytes <= cache.capacity_bytes
    assert len(cache) == 3 and cache.evicted == 7
    assert cache.lookup([7] * 40, KEY) is not None  # used: now the most recent
    cache.put(entry([99] * 40, nbytes=300), KEY)
    assert cache.lookup([8] * 40, KEY) is None  # the least recently used went
    assert cache.lookup([7] * 40, KEY) is not None and cache.lookup([9] * 40, KEY) is not None
    assert not cache.put(entry([5] * 40, nbytes=1001), KEY)  # larger than the whole budget
    assert cache.nbytes <= cache.capacity_bytes


def test_dropped_entries_memory_is_handed_back_every_release_every_bytes(monkeypatch):
    releases = []
    monkeypatch.setattr(host_cache, "release_freed", lambda: releases.append(1) or True)
    monkeypatch.setattr(host_cache, "RELEASE_EVERY_BYTES", 250)
    cache = HostPromptCache(300, KEY)
    for i in range(3):  # 300 bytes fit: nothing dropped
        assert cache.put(entry(range(i * 100, i * 100 + BLOCK)), KEY)
    assert releases == [] and cache.dropped_bytes == 0
    for i in range(3, 5):  # two entries dropped, 200 bytes: not yet
        cache.put(entry(range(i * 100, i * 100 + BLOCK)), KEY)
    assert releases == [] and cache.dropped_bytes == 200
    cache.put(entry(range(500, 500 + BLOCK)), KEY)  # the third: 300 >= 250
    assert releases == [1] and cache.dropped_bytes == 0
    cache.clear()  # whatever was dropped goes back at once
    assert releases == [1, 1] and cache.dropped_bytes == 0 and cache.nbytes == 0


def test_freed_memory_can_be_handed_back_on_this_machines_c_library():
    assert heap._malloc_trim() is not None  # glibc's malloc_trim, found and callable
    assert release_freed() in (True, False)  # True where it gave pages back


def test_a_longer_history_replaces_the_entry_it_extends():
    cache = HostPromptCache(1 << 20, KEY)
    turn1 = list(range(40))
    cache.put(entry(turn1), KEY)
    cache.put(entry(turn1 + list(range(100, 140))), KEY)
    assert len(cache) == 1 and cache.nbytes == 100
    assert cache.lookup(turn1 + [5], KEY).common == 40


def test_another_model_never_hits_and_is_never_stored():
    cache = HostPromptCache(1 << 20, KEY)
    cache.put(entry(range(64)), KEY)
    assert cache.lookup(list(range(64)), "other.gguf|draft.gguf") is None
    assert not cache.put(entry(range(100, 164)), "other.gguf|draft.gguf")
    assert cache.lookup(list(range(64)), KEY).common == 64


def test_short_prompts_are_not_kept():
    cache = HostPromptCache(1 << 20, KEY)
    assert not cache.put(entry(range(BLOCK - 1)), KEY)
    assert len(cache) == 0


@pytest.mark.parametrize("text, expected", [("8G", 8 << 30), ("512M", 512 << 20), ("2GiB", 2 << 30),
                                            ("1024", 1 << 30), ("0", 0), ("1.5", 3 << 19), ("0.5", 1 << 19),
                                            ("1e3", 1000 << 20), ("2T", 2 << 40), ("4096B", 4096)])
def test_cache_ram_sizes(text, expected):
    """A plain number is MiB, decimals too: '1.5' was read as 1 byte (the tier off), '0.5' refused
    as not positive."""
    assert parse_cache_ram(text) == expected


@pytest.mark.parametrize("text", ["lots", "-1", "nan", "inf", "G", "1e-9"])
def test_bad_cache_ram_sizes_say_how_to_write_them(text):
    with pytest.raises(TandemError):
        parse_cache_ram(text)


def test_the_start_up_line_names_the_tiers_that_are_on(tmp_path):
    """`tandem serve` prints the prompt cache's tiers at start-up; an empty tier (every one at
    start-up) has length 0, and the line once read that as 'off'."""
    from types import SimpleNamespace

    from tandem.engine.disk_cache import DiskPromptCache
    from tandem.engine.prompt_cache import PromptCache

    runner = SimpleNamespace(max_slots=4, save_state=lambda slot: b"")  # a runner that saves slot states
    host, disk = HostPromptCache(64 << 20, "tiny"), DiskPromptCache(tmp_path, 1 << 30, "tiny")
    assert len(host) == 0 and len(disk) == 0
    line = PromptCache(runner, None, host, disk).describe()
    assert "host tier 64" in line and "disk tier 1.0 GiB" in line and "(0 entries" in line, line
    assert "4 slots" in line and "host tier off" in PromptCache(runner, None, None).describe()
    one_slot = SimpleNamespace(max_slots=1, save_state=lambda slot: b"")
    small = PromptCache(one_slot, None, HostPromptCache(int(1.5 * 2**20), "tiny")).describe()
    assert "1 slot," in small and "host tier 1.5 MiB" in small, small  # it said "1 slots" and "2 MiB"
    disk.close()


def test_a_budget_smaller_than_every_state_is_said_once_and_zero_is_off_without_a_word(caplog):
    """`--cache-ram 1K` started, kept nothing and said nothing."""
    small = HostPromptCache(1000, "m")
    assert not small.put(entry(range(BLOCK), nbytes=2000), "m") and not small.put(entry(range(1, BLOCK + 1), nbytes=3000), "m")
    assert caplog.text.count("does not fit the host tier's whole") == 1 and "give --cache-ram more" in caplog.text
    caplog.clear()
    assert not HostPromptCache(0, "m").put(entry(range(BLOCK), nbytes=2000), "m")  # --cache-ram 0: off
    assert caplog.text == ""
