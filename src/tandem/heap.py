"""The process's memory: how much is resident, and handing what it has freed back to the system.

glibc's malloc keeps freed chunks in its arenas for reuse and returns to the system only what is
free at the top of an arena. The prompt cache's host tier frees megabytes at a time wherever an
evicted entry lay, so without help a server's resident memory creeps past the tier's byte budget
(scripts/measure_host_tier_rss.py, a full 1 GiB tier: up to 444 MiB beyond it, 170 MiB when
handed back; docs/prompt-cache.md). `release_freed()` asks glibc to give back every whole free
page (`malloc_trim(0)`); on another C library it does nothing. Pages given back cost a fault
again when reused: ~1 ms for each 4-5 MiB entry evicted, measured in the same script.
"""

import ctypes
import ctypes.util
import functools
import os
import resource
import sys


def resident_bytes() -> int:
    """This process's resident memory now (its peak where /proc is missing: not Linux)."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if sys.platform == "darwin" else peak * 1024  # bytes on macOS, KiB elsewhere


@functools.cache
def _malloc_trim():
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None
    trim.argtypes, trim.restype = (ctypes.c_size_t,), ctypes.c_int
    return trim


def release_freed() -> bool:
    """Return the free pages of every malloc arena to the system; True where some were."""
    trim = _malloc_trim()
    return bool(trim is not None and trim(0))
