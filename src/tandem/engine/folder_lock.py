"""One process per folder: an advisory lock (`flock`) on `<folder>/.lock`, held while a cache
uses the folder and released by the kernel when the process ends, however it ends.

The disk tier keeps its byte count and its index in memory, and removes temporary files it
finds at start-up, so two processes writing one folder would overrun its budget and delete each
other's writes. Within one process several users of a folder share the lock (counted).
"""

import fcntl
import os
import threading
from pathlib import Path
from typing import IO

from tandem.errors import TandemError

LOCK_NAME = ".lock"

_held: dict[Path, tuple[IO[str], int]] = {}  # folder -> (its open lock file, users in this process)
_guard = threading.Lock()


def claim_folder(folder: Path, option: str) -> None:
    """Take the folder for this process, or raise TandemError naming the process that has it."""
    folder = folder.resolve()
    with _guard:
        if folder in _held:
            handle, users = _held[folder]
            _held[folder] = (handle, users + 1)
            return
        handle = _locked(folder, option)
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        _held[folder] = (handle, 1)


def release_folder(folder: Path) -> None:
    folder = folder.resolve()
    with _guard:
        if folder not in _held:
            return
        handle, users = _held[folder]
        if users > 1:
            _held[folder] = (handle, users - 1)
            return
        del _held[folder]
        handle.close()  # closing the last descriptor drops the lock


def check_folder_free(folder: Path, option: str) -> None:
    """Raise TandemError now if another process holds the folder (a check before slow work; the
    cache claims it later)."""
    folder = folder.resolve()
    with _guard:
        if folder in _held or not folder.is_dir():
            return
        _locked(folder, option).close()


def _locked(folder: Path, option: str) -> IO[str]:
    handle = open(folder / LOCK_NAME, "a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        owner = handle.read().strip()
        handle.close()
        by = f"process {owner}" if owner.isdigit() else "another process"
        raise TandemError(f"{option} {folder} is in use by {by}: give each server a folder of its own") from None
    return handle
