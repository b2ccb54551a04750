"""The disk tier of the prompt cache (engine/disk_cache.py): what one process writes, the next one
finds (same model key only); a damaged, truncated or foreign file is ignored with a warning and
never loaded; the files never exceed the byte budget; a write that fails leaves the request alone."""

import errno
import json
import logging
import os
import random
import struct
import threading

import pytest

from tandem.engine.disk_cache import SUFFIX, DiskPromptCache
from tandem.engine.host_cache import HostEntry
from tandem.engine.prefix_index import BLOCK
from tandem.token_ids import common_prefix

KEY = "sha-of-target|llamacpp|cpu|gguf + sha-of-draft|llamacpp|cpu|gguf"


def entry(tokens, nbytes=100, draft=True) -> HostEntry:
    tokens = tuple(tokens)
    target_state = bytes((sum(tokens) + i) % 251 for i in range(nbytes))
    if not draft:
        return HostEntry(tokens, target_state)
    return HostEntry(tokens, target_state, tokens[:-3], b"d" * (nbytes // 2))


def written(cache: DiskPromptCache, *entries: HostEntry) -> DiskPromptCache:
    for e in entries:
        assert cache.put(e, cache.model_key)
    cache.flush()
    return cache


def files_bytes(cache: DiskPromptCache) -> int:
    return sum(p.stat().st_size for p in cache.folder.glob(f"*{SUFFIX}"))


def test_a_restarted_cache_finds_and_loads_what_the_last_one_wrote(tmp_path):
    saved = entry(range(3, 60))
    plain = entry(range(100, 140), draft=False)
    written(DiskPromptCache(tmp_path, 1 << 20, KEY), saved, plain).close()
    restarted = DiskPromptCache(tmp_path, 1 << 20, KEY)
    assert len(restarted) == 2
    match = restarted.lookup(list(range(3, 40)) + [999], KEY)
    assert match is not None and match.common == 37
    assert restarted.load(match) == saved  # tokens, both states and the draft's tokens, byte for byte
    assert restarted.load(restarted.lookup(list(range(100, 140)), KEY)) == plain
    assert restarted.holds(list(range(3, 60)), KEY) and not restarted.holds(list(range(3, 61)), KEY)


def test_another_model_never_sees_the_files_and_a_foreign_file_is_ignored(tmp_path, caplog):
    ours = written(DiskPromptCache(tmp_path, 1 << 20, KEY), entry(range(3, 60)))
    other = DiskPromptCache(tmp_path, 1 << 20, KEY + "|another build")
    assert other.lookup(list(range(3, 60)), other.model_key) is None
    assert ours.lookup(list(range(3, 60)), other.model_key) is None  # asked with another key
    # a file of the other model moved into our folder: its header says whose it is
    written(other, entry(range(3, 60)))
    moved = next(other.folder.glob(f"*{SUFFIX}"))
    moved.rename(ours.folder / "moved.tkv")
    with caplog.at_level(logging.WARNING):
        rescanned = DiskPromptCache(tmp_path, 1 << 20, KEY)
    assert len(rescanned) == 1 and "another model" in caplog.text
    assert not (ours.folder / "moved.tkv").exists()


@pytest.mark.parametrize("damage", ["flip a state byte", "truncate", "garbage header", "wrong field type",
                                    "deeply nested header"])
def test_a_damaged_file_is_ignored_with_a_warning_and_never_loaded(tmp_path, caplog, damage):
    cache = written(DiskPromptCache(tmp_path, 1 << 20, KEY), entry(range(3, 60)))
    path = next(cache.folder.glob(f"*{SUFFIX}"))
    data = bytearray(path.read_bytes())
    if damage == "flip a state byte":
        data[-10] ^= 0xFF
    elif damage == "truncate":
        del data[-10:]
    elif damage == "garbage header":
        data[12:20] = b"\xff" * 8
    elif damage == "deeply nested header":  # json.loads raises RecursionError on it: it stopped the server
        length = struct.unpack("<I", data[8:12])[0]
        raw = b"[" * 200_000
        data = data[:8] + struct.pack("<I", len(raw)) + raw + data[12 + length:]
    else:  # a whole, well-formed header naming a size that is not a number
        length = struct.unpack("<I", data[8:12])[0]
        header = json.loads(data[12:12 + length])
        header["target_bytes"] = "x"
        raw = json.dumps(header).encode()
        data = data[:8] + struct.pack("<I", len(raw)) + raw + data[12 + length:]
    path.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING):
        restarted = DiskPromptCache(tmp_path, 1 << 20, KEY)
        match = restarted.lookup(list(range(3, 60)), KEY)
        loaded = restarted.load(match) if match is not None else None
        # the running cache's index still names the file: loading it finds the damage too
        stale = cache.load(cache.lookup(list(range(3, 60)), KEY))
    assert loaded is None and stale is None
    assert "prompt cache: ignoring" in caplog.text
    assert not path.exists() and len(cache) == 0


def test_the_files_never_exceed_the_budget_and_the_least_recently_used_go_first(tmp_path, caplog):
    one = len(entry([1] * 40, nbytes=300).target_state) + 150 + 700  # states + a header's bound
    cache = DiskPromptCache(tmp_path, 3 * one, KEY)
    for i in range(8):
        written(cache, entry([i] * 40, nbytes=300))
        assert files_bytes(cache) == cache.nbytes <= cache.capacity_bytes
    assert len(cache) == 3 and cache.evicted == 5
    assert cache.load(cache.lookup([5] * 40, KEY)) is not None  # used: now the most recent
    written(cache, entry([99] * 40, nbytes=300))
    assert cache.lookup([6] * 40, KEY) is None and cache.lookup([5] * 40, KEY) is not None
    assert "does not fit" not in caplog.text
    assert not cache.put(entry([9] * 40, nbytes=4 * one), KEY)  # larger than the whole budget: said, once
    assert not cache.put(entry([8] * 40, nbytes=4 * one), KEY)
    assert caplog.text.count("does not fit the disk tier's whole") == 1 and "give --cache-disk more" in caplog.text
    cache.close()
    with caplog.at_level(logging.WARNING):
        smaller = DiskPromptCache(tmp_path, one, KEY)  # restarted with less room: the oldest go, said
    assert len(smaller) == 1 and files_bytes(smaller) <= one
    assert "removed 2 files" in caplog.text and "to fit its" in caplog.text
    assert smaller.lookup([99] * 40, KEY) is not None


def test_other_keys_files_count_against_the_budget_and_go_first(tmp_path):
    """Every llama.cpp upgrade or model change starts a new key's folder in the same directory;
    the budget bounds the directory, so the old keys' files (which this server can never read)
    are removed first, oldest first, and their emptied folders with them. They were left alone,
    a budget's worth each."""
    import os

    one = len(entry([1] * 40, nbytes=300).target_state) + 150 + 700
    old = written(DiskPromptCache(tmp_path, 3 * one, "an older build's key"), *(entry([i] * 40, nbytes=300)
                                                                              for i in range(3)))
    old.close()
    old_files = sorted(old.folder.glob(f"*{SUFFIX}"))
    for age, path in enumerate(old_files):  # their order on disk: the first written is the oldest
        os.utime(path, ns=(age * 10**9, age * 10**9))

    def all_bytes():
        return sum(p.stat().st_size for p in tmp_path.glob(f"*/*{SUFFIX}"))

    cache = DiskPromptCache(tmp_path, 3 * one, KEY)
    assert cache.foreign_bytes == all_bytes() <= cache.capacity_bytes  # within the budget: kept
    for i in range(4):
        written(cache, entry([10 + i] * 40, nbytes=300))
        assert all_bytes() <= cache.capacity_bytes
        kept = [path.exists() for path in old_files]
        assert kept == sorted(kept)  # the oldest go first
    assert not old.folder.exists() and cache.foreign_bytes == 0  # the old key's went, folder and all
    assert len(cache) == 3 and cache.lookup([13] * 40, KEY) is not None
    cache.close()


def test_an_entry_extending_another_replaces_its_file(tmp_path):
    cache = written(DiskPromptCache(tmp_path, 1 << 20, KEY), entry(range(3, 40)), entry(range(3, 80)))
    assert len(cache) == 1 and len(list(cache.folder.glob(f"*{SUFFIX}"))) == 1
    assert cache.lookup(list(range(3, 80)), KEY).common == 77


def test_lookup_finds_the_longest_prefix_a_brute_force_scan_finds(tmp_path):
    rng = random.Random(5)
    trunk = [rng.randrange(40) for _ in range(120)]
    cache = DiskPromptCache(tmp_path, 1 << 24, KEY)
    for _ in range(15):
        cut = rng.randrange(BLOCK, 120)
        written(cache, entry(trunk[:cut] + [rng.randrange(40) for _ in range(rng.randrange(0, 30))], nbytes=20))
    stored = [cache.load(cache.lookup(list(t), KEY)).tokens for t in cache._index.tokens.values()]
    for _ in range(100):
        query = trunk[:rng.randrange(0, 120)] + [rng.randrange(40) for _ in range(5)]
        best = max((common_prefix(t, query) for t in stored), default=0)
        match = cache.lookup(query, KEY)
        assert (match.common if match else 0) == (best if best >= BLOCK else 0)


def test_a_failed_write_is_a_warning_not_an_error(tmp_path, caplog):
    cache = DiskPromptCache(tmp_path, 1 << 20, KEY)
    cache.folder.rmdir()
    cache.folder.write_text("a file where the folder was")
    with caplog.at_level(logging.WARNING):
        written(cache, entry(range(3, 60)))
    assert cache.failed_writes == 1 and cache.nbytes == 0 and len(cache) == 0
    assert "could not write" in caplog.text


def failing_writes(monkeypatch, errno_: int, times: int) -> list[int]:
    """Make the next `times` file writes fail with errno_; the list counts the failures."""
    import pathlib

    failures, write_bytes = [], pathlib.Path.write_bytes

    def write(self, data):
        if len(failures) < times:
            failures.append(errno_)
            raise OSError(errno_, os.strerror(errno_))
        return write_bytes(self, data)

    monkeypatch.setattr(pathlib.Path, "write_bytes", write)
    return failures


def test_a_failed_write_keeps_the_entry_it_would_have_replaced(tmp_path, monkeypatch, caplog):
    """A conversation's next turn supersedes its last turn's file; the old file went before the
    new one was written, so a write that failed lost both."""
    cache = written(DiskPromptCache(tmp_path, 1 << 20, KEY), entry(range(3, 40)))
    failing_writes(monkeypatch, errno.EIO, times=1)
    with caplog.at_level(logging.WARNING):
        written(cache, entry(range(3, 80)))
    assert cache.failed_writes == 1 and "could not write" in caplog.text
    assert cache.load(cache.lookup(list(range(3, 80)), KEY)) == entry(range(3, 40))
    assert files_bytes(cache) == cache.nbytes and not list(cache.folder.glob("*.tmp"))


def test_failing_writes_are_said_once_a_minute_with_a_count(tmp_path, monkeypatch, caplog):
    """A disk smaller than one entry failed every write (every eviction and the shutdown's), one
    warning line each."""
    import tandem.engine.disk_cache as disk_cache

    clock = [100.0]
    cache = DiskPromptCache(tmp_path, 1 << 20, KEY)
    cache._failures_said.clock = lambda: clock[0]
    failing_writes(monkeypatch, errno.EIO, times=100)
    with caplog.at_level(logging.WARNING):
        for i in range(5):
            written(cache, entry([i] * 40))
        clock[0] += disk_cache.WRITE_FAILURES_SAID_EVERY_S
        written(cache, entry([9] * 40))
    lines = [r.getMessage() for r in caplog.records if "could not write" in r.getMessage()]
    assert cache.failed_writes == 6 and len(lines) == 2 and "(4 more failed since the last such line)" in lines[1]


def test_a_full_disk_makes_room_from_the_least_recently_used_and_writes(tmp_path, monkeypatch):
    """The disk filled before the budget did (ENOSPC): the cache removes its own least recently
    used files, never the one the new entry replaces, and tries once more; it failed for good."""
    cache = written(DiskPromptCache(tmp_path, 1 << 20, KEY), entry([1] * 40), entry([2] * 40, nbytes=300),
                    entry([3] * 40, nbytes=300))
    cache.load(cache.lookup([1] * 40, KEY))  # [2] * 40 is now the least recently used, and room enough
    failures = failing_writes(monkeypatch, errno.ENOSPC, times=1)
    written(cache, entry([1] * 40 + [7] * 8))
    assert failures == [errno.ENOSPC] and cache.failed_writes == 0
    assert cache.lookup([2] * 40, KEY) is None and cache.lookup([3] * 40, KEY) is not None
    assert cache.load(cache.lookup([1] * 40 + [7] * 8, KEY)) == entry([1] * 40 + [7] * 8)
    assert files_bytes(cache) == cache.nbytes and len(cache) == 2  # the old turn went once the new one was written


def test_a_folder_named_like_a_file_is_left_alone(tmp_path, caplog):
    cache = DiskPromptCache(tmp_path, 1 << 20, KEY)
    (cache.folder / f"not-a-file{SUFFIX}").mkdir()
    cache.close()
    with caplog.at_level(logging.WARNING):
        assert len(DiskPromptCache(tmp_path, 1 << 20, KEY)) == 0
    assert caplog.text == "" and (cache.folder / f"not-a-file{SUFFIX}").is_dir()


def test_an_unusable_folder_is_a_clear_error(tmp_path):
    (tmp_path / "file").write_text("")
    from tandem.errors import TandemError

    with pytest.raises(TandemError, match="cannot use"):
        DiskPromptCache(tmp_path / "file", 1 << 20, KEY)


def test_an_entry_waiting_for_its_write_is_found_at_once_and_the_queue_is_bounded(tmp_path, monkeypatch):
    """With the writer held up, a lookup right after the save finds the entry (from memory); past
    max_queued_bytes of waiting states a save is refused rather than held."""
    release = threading.Event()
    store = DiskPromptCache._store
    monkeypatch.setattr(DiskPromptCache, "_store", lambda self, *a: (release.wait(10), store(self, *a)))
    cache = DiskPromptCache(tmp_path, 1 << 20, KEY, max_queued_bytes=400)
    saved = entry(range(3, 60), nbytes=200)
    assert cache.put(saved, KEY)
    match = cache.lookup(list(range(3, 70)), KEY)
    assert match is not None and match.common == 57 and cache.load(match) == saved
    assert not cache.put(entry(range(100, 160), nbytes=200), KEY)  # 300 + 300 bytes would wait
    release.set()
    cache.flush()
    assert cache.queued_bytes == 0 and len(cache) == 1
    assert cache.load(cache.lookup(list(range(3, 60)), KEY)) == saved  # now from its file


def test_a_write_a_crash_interrupted_is_removed_and_said(tmp_path, caplog):
    written(DiskPromptCache(tmp_path, 1 << 20, KEY), entry(range(3, 60))).close()
    folder = next(p for p in tmp_path.iterdir() if p.is_dir())
    (folder / "deadbeef.4242.tmp").write_bytes(b"half a state")
    with caplog.at_level(logging.WARNING):
        restarted = DiskPromptCache(tmp_path, 1 << 20, KEY)
    assert not (folder / "deadbeef.4242.tmp").exists() and len(restarted) == 1
    assert "removed 1 unfinished write in" in caplog.text
    restarted.close()


def test_an_entry_whose_header_does_not_fit_evicts_nothing(tmp_path):
    kept = entry([1] * 40, nbytes=300)
    cache = written(DiskPromptCache(tmp_path, 2000, KEY), kept)
    states_fit = entry([2] * 40, nbytes=1300)  # 1,950 bytes of states: within 2,000, not with its header
    written(cache, states_fit)
    assert len(cache) == 1 and cache.lookup([1] * 40, KEY) is not None


def test_a_file_that_cannot_be_removed_is_a_warning(tmp_path, monkeypatch, caplog):
    cache = written(DiskPromptCache(tmp_path, 1 << 20, KEY), entry(range(3, 60)))
    path = next(cache.folder.glob(f"*{SUFFIX}"))
    path.write_bytes(b"not a cache file")
    monkeypatch.setattr(type(path), "unlink", lambda self, missing_ok=False: (_ for _ in ()).throw(PermissionError("no")))
    with caplog.at_level(logging.WARNING):
        assert cache.load(cache.lookup(list(range(3, 60)), KEY)) is None
        DiskPromptCache(tmp_path, 1 << 20, KEY)  # the scan meets it again: still no exception
    assert "could not remove" in caplog.text


def test_the_key_names_the_torch_state_layout(tmp_path, monkeypatch):
    """A source checkout's version never changes, so the fused runner's state layout is in the
    key itself: states saved under an older layout are never restored as if current."""
    from tandem.engine import build
    from tandem.engine.build import EngineConfig, disk_model_key
    from tandem.models.backends import RunnerSpec

    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "model.safetensors").write_bytes(b"weights")
    config = EngineConfig(RunnerSpec(str(tmp_path / "model"), "torch", "cpu"), None, "ngram")
    before = disk_model_key(config, with_draft=False)
    monkeypatch.setattr(build, "TORCH_STATE_LAYOUT", build.TORCH_STATE_LAYOUT + 1)
    assert disk_model_key(config, with_draft=False) != before


SECOND_PROCESS = """
import sys
from tandem.engine.disk_cache import DiskPromptCache
from tandem.errors import TandemError
from tandem.serve.settings import ServeSettings
try:
    ServeSettings(cache_dir=sys.argv[1])  # serve's check before the models load
    DiskPromptCache(sys.argv[1], 1 << 20, "key").close()
except TandemError as error:
    print(error)
    sys.exit(3)
"""


def test_a_second_process_is_refused_the_folder_until_the_first_closes_it(tmp_path):
    """Two servers on one --cache-dir each counted only their own bytes (together past the
    budget) and each start removed the other's writes under way. The folder is now one
    process's: a second is refused, naming the first, at serve's settings check already."""
    import os
    import subprocess
    import sys

    def second() -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", SECOND_PROCESS, str(tmp_path)], capture_output=True, text=True)

    cache = DiskPromptCache(tmp_path, 1 << 20, KEY)
    also = DiskPromptCache(tmp_path, 1 << 20, KEY)  # in one process the folder is shared
    also.close()
    refused = second()
    assert refused.returncode == 3 and f"in use by process {os.getpid()}" in refused.stdout, refused
    cache.close()
    cache.close()  # a second close does nothing
    assert second().returncode == 0


def test_the_key_names_another_llama_library(monkeypatch):
    """LLAMA_CPP_LIB_PATH makes llama-cpp-python's bindings load another llama.cpp (whose saved
    state format may differ, as 0.3.36's and a newer build's LLAMA_STATE_SEQ_VERSION 3 and 4 do):
    the build part of a key names it, so its states never meet the bundled library's."""
    from tandem.hardware import llama_cpp_version

    monkeypatch.delenv("LLAMA_CPP_LIB_PATH", raising=False)
    bundled = llama_cpp_version()
    monkeypatch.setenv("LLAMA_CPP_LIB_PATH", "/opt/llama.cpp/build/bin")
    assert llama_cpp_version() == bundled + " lib /opt/llama.cpp/build/bin"


def test_a_file_whose_header_names_another_prompts_tokens_is_never_loaded(tmp_path, caplog):
    """The checksum covered the states alone: two files with their headers' token lists swapped
    (their lengths kept) restored one prompt's KV for the other (a user's trial saw the other
    story's words in an answer). Now the header is summed too, and a file is checked against
    what it held when indexed."""
    a, b = entry(range(0, 40)), entry(range(100, 140))
    cache = written(DiskPromptCache(tmp_path, 1 << 20, KEY), a, b)
    paths = {cache.lookup(e.tokens, KEY).record.path: e for e in (a, b)}
    cache.close()
    blobs = {}
    for path in paths:
        data = path.read_bytes()
        length = struct.unpack("<I", data[8:12])[0]
        blobs[path] = (json.loads(data[12:12 + length]), data[12 + length:])
    (pa, (ha, sa)), (pb, (hb, sb)) = blobs.items()
    for path, header, states, other in ((pa, ha, sa, hb), (pb, hb, sb, ha)):
        swapped = json.dumps({**header, "tokens": other["tokens"], "draft_tokens": other["draft_tokens"]}).encode()
        path.write_bytes(b"TANDEMKV" + struct.pack("<I", len(swapped)) + swapped + states)
    again = DiskPromptCache(tmp_path, 1 << 20, KEY)
    with caplog.at_level(logging.WARNING):
        for e in (a, b):
            match = again.lookup(e.tokens, KEY)
            assert match is None or again.load(match) is None
    assert "do not match their checksum" in caplog.text


def test_a_file_replaced_since_it_was_indexed_is_not_loaded(tmp_path, caplog):
    a, b = entry(range(0, 40)), entry(range(100, 140))
    cache = written(DiskPromptCache(tmp_path, 1 << 20, KEY), a, b)
    pa, pb = (cache.lookup(e.tokens, KEY).record.path for e in (a, b))
    pa.write_bytes(pb.read_bytes())  # a whole, valid file of b's, under a's name
    with caplog.at_level(logging.WARNING):
        assert cache.load(cache.lookup(a.tokens, KEY)) is None
    assert "other tokens than when it was indexed" in caplog.text
    assert cache.load(cache.lookup(b.tokens, KEY)) == b


def test_the_folder_removed_while_serving_is_made_again_and_written_to(tmp_path, caplog):
    """Every later write failed (a warning each), and the size counted the files that were gone."""
    import shutil

    cache = written(DiskPromptCache(tmp_path, 1 << 20, KEY), entry(range(0, 40)), entry(range(100, 140)))
    shutil.rmtree(cache.folder)
    with caplog.at_level(logging.WARNING):
        written(cache, entry(range(200, 240)), entry(range(300, 340)))
    assert caplog.text.count("removed while serving") == 1 and "could not write" not in caplog.text
    assert len(cache) == 2 and files_bytes(cache) == cache.nbytes
    assert cache.load(cache.lookup(list(range(300, 340)), KEY)) == entry(range(300, 340))


def test_the_folder_never_holds_more_than_the_budget_while_a_file_is_written(tmp_path, monkeypatch):
    """Room was made after the new file's .tmp was written: the folder held up to 1.65x the
    budget for a moment (a trial polled it every 20 ms)."""
    from pathlib import Path

    one = len(entry([1] * 40, nbytes=300).target_state) + 150 + 700
    cache = DiskPromptCache(tmp_path, 3 * one, KEY)
    seen = []
    write_bytes = Path.write_bytes

    def measured(path, data):
        result = write_bytes(path, data)
        seen.append(sum(p.stat().st_size for p in cache.folder.iterdir() if p.is_file()))
        return result

    monkeypatch.setattr(Path, "write_bytes", measured)
    for i in range(8):
        written(cache, entry([i] * 40, nbytes=300))
    assert len(seen) == 8 and max(seen) <= cache.capacity_bytes
