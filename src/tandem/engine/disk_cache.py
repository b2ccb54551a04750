"""The disk tier of the prompt cache (`--cache-dir`): the host tier's entries written to files,
so that a restarted server finds the conversations and system prompts it had computed.

Every entry the host tier keeps is also written here, by one background thread (a request never
waits for the disk), to `<dir>/<model digest>/<tokens digest>.tkv` (format:
engine/disk_cache_format.py). Its header names the model key (the model files' SHA-256
checksums, backend and precision: engine/build.py), the tokens each state holds and the states'
SHA-256. A file is read only from its own model's folder and only when its header's key
equals the running models' key, so another model's state is never loaded; a file that cannot be
read, is truncated, or whose states do not match their checksum is ignored with a warning and
removed. Writes go to a temporary file renamed into place, so a crash never leaves half a file
that looks whole, and nothing is removed for a file until it is written: a failed write keeps the
entry it would have replaced. A disk that fills up before the budget does (ENOSPC) makes room
from this cache's own files, least recently used first, and the write is tried once more. Bounded by bytes: the files of the whole directory, other keys' folders
included (an older llama.cpp build's, another model's: every upgrade would otherwise leave a
budget's worth behind). Room is made from other keys' files first, oldest first, since this
server can never read them, then from its own, least recently used first (file times carry the
order across restarts); an entry larger than the whole budget is not written. An entry waiting
for its write is found by lookups at once (from memory), and at most `max_queued_bytes`
(MAX_QUEUED_BYTES) wait; past that a save is dropped. They are the host tier's own entries until
it evicts them: beside `--cache-ram`, at most that much more memory is held. No error of the
disk reaches a request: a file that cannot be read, written or removed is a warning. One server
process per folder: the cache holds the folder's lock (engine/folder_lock.py) until it is
closed, and a second process is refused.
"""

import contextlib
import errno
import hashlib
import logging
import os
import shutil
import threading
from collections import OrderedDict, deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import AbstractSet, Callable, Sequence

from tandem.engine.folder_lock import claim_folder, release_folder
from tandem.engine.disk_cache_format import encode_entry, read_entry
from tandem.engine.host_cache import HostEntry, TooLargeNote
from tandem.engine.prefix_index import BLOCK, PrefixIndex
from tandem.errors import TandemError
from tandem.memory_size import human_size
from tandem.said_now import SaidNow

log = logging.getLogger(__name__)

WRITE_FAILURES_SAID_EVERY_S = 60.0  # a failing write is said at once, then at most once a minute with a count
TORCH_STATE_LAYOUT = 1  # bump when FusedTorchRunner.save_state's bytes change meaning (its key, engine/build.py)
SUFFIX = ".tkv"
DEFAULT_MAX_BYTES = 16 << 30  # or a quarter of the disk's free space where that is less
MAX_QUEUED_BYTES = 1 << 30  # states waiting for the writer, held in memory


def disk_room(directory: str | Path) -> int:
    """The space on directory's disk that is free or already holds this cache's files."""
    path = Path(directory).expanduser()
    own = sum(f.stat().st_size for f in path.glob(f"*/*{SUFFIX}") if f.is_file()) if path.is_dir() else 0
    while not path.exists() and path != path.parent:
        path = path.parent
    return shutil.disk_usage(path).free + own


def default_cache_disk_bytes(directory: str | Path) -> int:
    """16 GiB, or a quarter of the disk's room for the cache (disk_room: so a restart does not
    shrink the budget by what the cache wrote)."""
    return min(DEFAULT_MAX_BYTES, disk_room(directory) // 4)


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class DiskRecord:
    """What the index knows of one file without reading its states."""
    path: Path
    tokens: tuple[int, ...]
    nbytes: int  # the file's size


@dataclass(frozen=True, slots=True)
class DiskMatch:
    record: DiskRecord
    common: int  # leading tokens the file's target state shares with the prompt looked up
    queued: HostEntry | None = None  # the entry itself, while it waits for its write


class DiskPromptCache:
    def __init__(self, directory: str | Path, capacity_bytes: int, model_key: str,
                 max_queued_bytes: int = MAX_QUEUED_BYTES):
        if capacity_bytes < 0:
            raise ValueError(f"the disk prompt cache needs a size of 0 bytes or more, got {capacity_bytes}")
        self.capacity_bytes = capacity_bytes
        self.max_queued_bytes = max_queued_bytes
        self.model_key = model_key
        self.root = Path(directory).expanduser()
        self.folder = self.root / digest(model_key)[:16]
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise TandemError(f"cannot use {directory} for the prompt cache's disk tier: {error}") from None
        claim_folder(self.root, "--cache-dir")
        self._claimed = True
        self.nbytes = 0  # files kept, and one being renamed into place
        self.foreign: deque[tuple[Path, int]] = deque()  # other keys' files and sizes, oldest first
        self.foreign_bytes = 0
        self._removals: list[Path] = []  # files taken off the books under the lock, unlinked after it
        self.written = 0  # files ever written
        self.evicted = 0  # files removed for room
        self.failed_writes = 0
        self._failures_said = SaidNow(WRITE_FAILURES_SAID_EVERY_S)
        self._lock = threading.Lock()  # the index is read by the engine, written by the writer
        self._records: OrderedDict[Path, DiskRecord] = OrderedDict()  # least recently used first
        self._index: PrefixIndex[Path] = PrefixIndex()
        self._queued: dict[Path, HostEntry] = {}  # entries waiting for the writer
        self._queued_index: PrefixIndex[Path] = PrefixIndex()
        self.queued_bytes = 0
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tandem-disk-cache")
        self._pending: list[Future] = []
        self._closed = False
        self.too_large = TooLargeNote("disk", "--cache-disk")
        self._scan()

    def __len__(self) -> int:
        return len(self._records)

    # -- the engine's side --------------------------------------------------------------------

    def lookup(self, tokens: Sequence[int], model_key: str) -> DiskMatch | None:
        """The file sharing the longest prefix (at least one block) with tokens, or None."""
        if model_key != self.model_key:
            return None
        with self._lock:
            best = self._index.longest(tokens)
            queued = self._queued_index.longest(tokens)
            if queued is not None and (best is None or queued[1] > best[1]):
                entry = self._queued[queued[0]]
                return DiskMatch(DiskRecord(queued[0], entry.tokens, 0), queued[1], entry)
            return None if best is None else DiskMatch(self._records[best[0]], best[1])

    def holds(self, tokens: Sequence[int], model_key: str) -> bool:
        match = self.lookup(tokens, model_key)
        return match is not None and match.common == len(tokens)

    def load(self, match: DiskMatch) -> HostEntry | None:
        """The entry in match's file, or None (with a warning, the file removed) where it is gone,
        damaged or another model's."""
        if match.queued is not None:
            return match.queued
        path = match.record.path
        try:
            with path.open("rb") as f:
                entry = read_entry(f, self.model_key, with_states=True)
            if entry.tokens != match.record.tokens:  # replaced since it was indexed
                raise ValueError("it holds other tokens than when it was indexed")
        except (OSError, ValueError) as error:
            if not isinstance(error, FileNotFoundError):  # (gone: evicted since the lookup, or removed)
                log.warning("prompt cache: ignoring %s: %s", path, error)
            with self._lock:
                if path in self._records:
                    self._drop(path)
            self._unlink_removed()
            return None
        with contextlib.suppress(OSError):
            os.utime(path)  # the least recently used order, across restarts
        with self._lock:
            if path in self._records:
                self._records.move_to_end(path)
        return entry

    def put(self, entry: HostEntry, model_key: str) -> bool:
        """Write entry in the background; False where it cannot be kept (too large, too short,
        another model's)."""
        if self._closed or model_key != self.model_key or len(entry.tokens) < BLOCK:
            return False
        if entry.nbytes > self.capacity_bytes:
            self.too_large.tell(entry.nbytes, self.capacity_bytes)
            return False
        path = self._path(entry)
        with self._lock:
            if self.queued_bytes + entry.nbytes > self.max_queued_bytes or path in self._queued:
                return False
            self._queued[path] = entry
            self._queued_index.add(path, entry.tokens)
            self.queued_bytes += entry.nbytes
        self._pending = [f for f in self._pending if not f.done()]
        self._pending.append(self._writer.submit(self._write, entry, path))
        return True

    def flush(self) -> None:
        """Wait for the writes under way."""
        for future in self._pending:
            future.result()
        self._pending = []

    def clear(self) -> None:
        """Remove every file of this model."""
        self.flush()
        with self._lock:
            for path in list(self._records):
                self._drop(path)
        self._unlink_removed()

    def close(self) -> None:
        """Finish the writes under way; later puts are refused (a second close does nothing)."""
        self._closed = True
        self.flush()
        self._writer.shutdown(wait=True)
        if self._claimed:
            self._claimed = False
            release_folder(self.root)

    # -- the writer's side --------------------------------------------------------------------

    def _path(self, entry: HostEntry) -> Path:
        return self.folder / f"{digest(repr(entry.tokens))[:32]}{SUFFIX}"

    def _write(self, entry: HostEntry, path: Path) -> None:
        try:
            self._store(entry, path)
        finally:
            with self._lock:
                self._queued.pop(path, None)
                self._queued_index.remove(path)
                self.queued_bytes -= entry.nbytes

    def _store(self, entry: HostEntry, path: Path) -> None:
        data = encode_entry(entry, self.model_key)
        if len(data) > self.capacity_bytes:  # its header takes it past the whole budget: nothing is evicted for it
            self.too_large.tell(len(data), self.capacity_bytes)
            return
        with self._lock:  # room first, so the folder never holds more than the budget, its file being written
            replaced = {self._index.extended_by(entry.tokens), path} & set(self._records)
            self._evict_for(len(data), keep=replaced)
            self.nbytes += len(data)  # reserved until it is renamed into place and indexed, or fails
        self._unlink_removed()
        tmp = path.with_name(f"{path.stem}.{os.getpid()}.tmp")
        if not self._write_temporary(tmp, path, data, replaced):
            with self._lock:
                self.nbytes -= len(data)
            return
        with self._lock:  # written: what it replaces goes now
            for old in replaced & set(self._records):
                self._drop(old)
        self._unlink_removed()  # before the rename: the path itself may be among them
        try:
            os.replace(tmp, path)
        except OSError as error:
            self._write_failed(tmp, path, error)
            with self._lock:
                self.nbytes -= len(data)
            return
        with self._lock:
            self.nbytes -= len(data)
            self._add(DiskRecord(path, entry.tokens, len(data)))
            self.written += 1

    def _write_temporary(self, tmp: Path, path: Path, data: bytes, keep: set[Path]) -> bool:
        """data written to tmp (path's file to be); on a full disk, once more after making room
        from this cache's own files but those in keep. False (with a warning) where it failed."""
        for attempt in range(2):
            try:
                tmp.write_bytes(data)
                return True
            except OSError as error:
                if attempt == 0 and error.errno == errno.ENOSPC and self._free_own(len(data), keep):
                    continue
                if attempt == 0 and error.errno == errno.ENOENT and self._folder_gone():
                    continue
                self._write_failed(tmp, path, error)
                return False
        return False

    def _free_own(self, nbytes: int, keep: set[Path]) -> bool:
        """Remove other keys' files and this key's least recently used, but those in keep, until
        nbytes are freed; whether anything was."""
        with self._lock:
            freed = self._remove_until(lambda freed: freed >= nbytes, keep)
        self._unlink_removed()
        return freed > 0

    def _folder_gone(self) -> bool:
        """Where the model's folder was removed while serving (a user freeing space, a tmp
        cleaner): its files are off the books and it is made again. Whether it was (every later
        write failed, a warning each, and the size kept counting the files that were gone)."""
        if self.folder.exists():
            return False
        with self._lock:
            for path in list(self._records):
                self._drop(path)  # (their unlinks find nothing)
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
        except OSError:
            return False
        log.warning("prompt cache: %s was removed while serving; made again, empty", self.folder)
        return True

    def _write_failed(self, tmp: Path, path: Path, error: OSError) -> None:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        with self._lock:
            self.failed_writes += 1
            said = self._failures_said.event()
        if said is not None:  # a full disk failed every write, a line each (an entry larger than the disk: every eviction)
            since = f" ({said.events - 1} more failed since the last such line)" if said.events > 1 else ""
            log.warning("prompt cache: could not write %s: %s%s; further failures are said at most once a minute",
                        path, error, since)

    # -- both (under the lock, or before the writer starts) -----------------------------------

    def _scan(self) -> None:
        """Index this model's files, oldest first; damaged ones are removed with a warning, and
        what exceeds the budget goes, least recently used first."""
        interrupted = list(self.folder.glob("*.tmp"))  # writes a crash interrupted
        for tmp in interrupted:
            _remove(tmp)
        if interrupted:
            log.warning("prompt cache: removed %d unfinished write%s in %s (a crash stopped them)",
                        len(interrupted), "" if len(interrupted) == 1 else "s", self.folder)
        found = []
        for path in self.folder.glob(f"*{SUFFIX}"):
            if path.is_dir():
                continue  # not one of the cache's files, and not for it to remove
            try:
                with path.open("rb") as f:
                    entry = read_entry(f, self.model_key, with_states=False)
                stat = path.stat()
            except (OSError, ValueError) as error:
                log.warning("prompt cache: ignoring and removing %s: %s", path, error)
                _remove(path)
                continue
            found.append((stat.st_mtime_ns, DiskRecord(path, entry.tokens, stat.st_size)))
        for _, record in sorted(found, key=lambda item: item[0]):
            self._add(record)
        self._scan_foreign()
        before = self.evicted
        freed = self._evict_for(0)
        if self.evicted > before:  # a smaller budget than the folder's last run had, or other models' files
            log.warning("prompt cache: removed %d file%s (%s) from %s to fit its %s budget", self.evicted - before,
                        "" if self.evicted - before == 1 else "s", human_size(freed), self.root,
                        human_size(self.capacity_bytes))
        self._unlink_removed()

    def _scan_foreign(self) -> None:
        """Other keys' files in the directory, oldest first: they count against the budget."""
        found = []
        for path in self.root.glob(f"*/*{SUFFIX}"):
            if path.parent == self.folder:
                continue
            with contextlib.suppress(OSError):
                stat = path.stat()
                found.append((stat.st_mtime_ns, path, stat.st_size))
        for _, path, size in sorted(found):
            self.foreign.append((path, size))
            self.foreign_bytes += size

    def _evict_for(self, extra: int, keep: AbstractSet[Path] = frozenset()) -> int:
        """Remove files until `extra` more bytes fit the budget: other keys' first, oldest
        first, then this key's, least recently used first (those in keep last of all); the bytes freed."""
        fits = lambda freed: self.nbytes + self.foreign_bytes + extra <= self.capacity_bytes  # noqa: E731
        return self._remove_until(fits, keep) + self._remove_until(fits)

    def _remove_until(self, done: Callable[[int], bool], keep: AbstractSet[Path] = frozenset()) -> int:
        """Take files off the books (under the lock), other keys' oldest first, then this key's
        least recently used but those in keep, until done(bytes freed so far); the bytes freed."""
        freed = 0
        while self.foreign and not done(freed):
            path, size = self.foreign.popleft()
            self.foreign_bytes -= size
            self._removals.append(path)
            self.evicted += 1
            freed += size
        for path in [path for path in self._records if path not in keep]:
            if done(freed):
                break
            freed += self._records[path].nbytes
            self._drop(path)
            self.evicted += 1
        return freed

    def _add(self, record: DiskRecord) -> None:
        self._records[record.path] = record
        self._index.add(record.path, record.tokens)
        self.nbytes += record.nbytes

    def _drop(self, path: Path) -> None:
        self.nbytes -= self._records.pop(path).nbytes
        self._index.remove(path)
        self._removals.append(path)

    def _unlink_removed(self) -> None:
        """Unlink what was taken off the books, outside the lock (the engine's lookups take it:
        a slow disk must not hold a step); another key's folder goes with its last file."""
        with self._lock:
            removals, self._removals = self._removals, []
        for path in removals:
            _remove(path)
            if path.parent != self.folder:
                with contextlib.suppress(OSError):
                    path.parent.rmdir()


def _remove(path: Path) -> None:
    try:
        path.unlink(missing_ok=True)
    except OSError as error:
        log.warning("prompt cache: could not remove %s: %s", path, error)
