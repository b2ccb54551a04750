"""Saved KV states as bytes in host memory, written once and read in place.

A slot's saved state (the prompt cache's host tier keeps it: megabytes a slot) lands in new
memory, whose pages the kernel faults in one by one as they are first written: the cost of a
save is mostly the passes over new memory, not the copy itself. So a runner writes a state
straight into the bytes object that is kept (`new_bytes`: made unwritten, then filled before
anyone else sees it), and a restore reads those bytes where they lie (`bytes_address`), with no
writable copy in between.

The faults themselves: a 10 MB state is 2,441 pages of 4 KiB. Where Linux gives transparent huge
pages only to memory that asks (`/sys/kernel/mm/transparent_hugepage/enabled` "madvise", as on
the VMs here), a big state's buffer asks (`madvise(MADV_HUGEPAGE)`) before it is written, and is
faulted in 2 MiB at a time: filling 10 MB of new memory took 4.4 ms in pages of 4 KiB and 1.1 ms
in huge pages (AMD EPYC Zen 5 VM); inside `tandem serve` a 1.5B's state of 300-450 tokens took
15-37 ms to save.
"""

import ctypes
import sys

_bytes_from_size = ctypes.pythonapi.PyBytes_FromStringAndSize
_bytes_from_size.restype = ctypes.py_object
_bytes_from_size.argtypes = (ctypes.c_char_p, ctypes.c_ssize_t)


PAGE = 4096
HUGE_PAGE = 2 << 20
HUGE_PAGES_FROM = 2 * HUGE_PAGE  # a smaller buffer holds at most one aligned huge page: not worth asking
MADV_HUGEPAGE = 14  # Linux's value


def _madvise():
    if not sys.platform.startswith("linux"):
        return None
    try:
        call = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    call.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    call.restype = ctypes.c_int
    return call


_MADVISE = _madvise()


def new_bytes(size: int) -> bytes:
    """A bytes object of `size` bytes left unwritten (the C API's PyBytes_FromStringAndSize(NULL,
    size), whose caller fills it before anyone else sees it): no zeroing pass over new memory; a
    big one asks for huge pages before its first write."""
    data = _bytes_from_size(None, size)
    if size >= HUGE_PAGES_FROM:
        ask_huge_pages(bytes_address(data), size)
    return data


def ask_huge_pages(address: int, size: int) -> bool:
    """Ask Linux to back the whole pages of [address, address + size) with transparent huge
    pages; whether it took the advice (False: not Linux, or refused, which costs nothing)."""
    start = -(-address // PAGE) * PAGE
    end = (address + size) // PAGE * PAGE
    if _MADVISE is None or end - start < HUGE_PAGE:
        return False
    return _MADVISE(start, end - start, MADV_HUGEPAGE) == 0


def bytes_address(data: bytes) -> int:
    """Where a bytes object's own buffer starts (no copy). Valid while `data` lives; write there
    only into bytes from `new_bytes` that nobody else has seen yet."""
    return ctypes.cast(ctypes.c_char_p(data), ctypes.c_void_p).value


def bytes_buffer(data: bytes) -> ctypes.Array:
    """A ctypes array over `data`'s own buffer (no copy), for numpy or torch to view; it keeps
    no reference to `data`, so the caller holds `data` while the view is in use."""
    return (ctypes.c_uint8 * len(data)).from_address(bytes_address(data))
