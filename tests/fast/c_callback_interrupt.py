"""Ctrl-C arriving while C code calls back into Python, as llama.cpp's log callback does: the
KeyboardInterrupt is raised inside the callback, where ctypes swallows it ("Exception ignored on
calling ctypes callback function"), so the interrupt is lost unless it is held to the call's end."""

import ctypes
import ctypes.util
import os
import signal

_COMPARE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int))


def ctrl_c_inside_a_c_callback() -> None:
    """libc's qsort with a Python comparator whose first call sends this process SIGINT: its
    handler runs at the comparator's next line, inside the callback."""
    sent = []

    def compare(a, b):
        if not sent:
            sent.append(os.kill(os.getpid(), signal.SIGINT))
        return a[0] - b[0]

    values = (ctypes.c_int * 64)(*range(64, 0, -1))
    ctypes.CDLL(ctypes.util.find_library("c")).qsort(values, 64, ctypes.sizeof(ctypes.c_int), _COMPARE(compare))
    assert sent
