"""Saved KV states as bytes in host memory, written once and read in place.

A slot's saved state (the prompt cache's host tier keeps it: megabytes a slot) lands in new
memory, whose pages the kernel faults in one by one as they are first written: the cost of a
save is mostly the passes over new memory, not the copy itself. So a runner writes a state
straight into the bytes object that is kept (`new_bytes`: made unwritten, then filled before
anyone else sees it), and a restore reads those bytes where they lie (`bytes_address`), with no
writable copy in between.
"""

import ctypes

_bytes_from_size = ctypes.pythonapi.PyBytes_FromStringAndSize
_bytes_from_size.restype = ctypes.py_object
_bytes_from_size.argtypes = (ctypes.c_char_p, ctypes.c_ssize_t)


def new_bytes(size: int) -> bytes:
    """A bytes object of `size` bytes left unwritten (the C API's PyBytes_FromStringAndSize(NULL,
    size), whose caller fills it before anyone else sees it): no zeroing pass over new memory."""
    return _bytes_from_size(None, size)


def bytes_address(data: bytes) -> int:
    """Where a bytes object's own buffer starts (no copy). Valid while `data` lives; write there
    only into bytes from `new_bytes` that nobody else has seen yet."""
    return ctypes.cast(ctypes.c_char_p(data), ctypes.c_void_p).value


def bytes_buffer(data: bytes) -> ctypes.Array:
    """A ctypes array over `data`'s own buffer (no copy), for numpy or torch to view; it keeps
    no reference to `data`, so the caller holds `data` while the view is in use."""
    return (ctypes.c_uint8 * len(data)).from_address(bytes_address(data))
