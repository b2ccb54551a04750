"""Re-quantizing a GGUF with llama.cpp's own quantizer (`llama_model_quantize`), for the
catalog's derived entries (catalog.py `Derivation`). Its quantizing code is plain C in ggml's
base library, outside the CPU-specific kernels, and each row is quantized on its own, so a file
comes out byte for byte the same at any thread count (checked on x86-64; on another architecture
a compiler may fuse its multiply-adds otherwise); a pull still checks the result's SHA-256. Its log
(a line per tensor) goes to a temporary file while it runs, the process's stdout and stderr with
it, and is shown only if it fails.
"""

import ctypes
import errno
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tandem.errors import TandemError
from tandem.sigterm import deferring_ctrl_c

FILE_TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q8_0", "Q4_K_M")  # quantizations a derivation may name


def requantize(source: Path, dest: Path, quantization: str, threads: int | None = None) -> None:
    """Write `source` re-quantized to `quantization` into `dest` (a new file)."""
    if quantization not in FILE_TYPES:
        raise TandemError(f"cannot re-quantize to {quantization!r}; choose one of {', '.join(FILE_TYPES)}")
    import llama_cpp  # loaded here: the catalog is read where llama.cpp is not needed

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{quantization}")
    params.allow_requantize = True  # the source is quantized already: dequantized, then quantized again
    params.nthread = threads or os.cpu_count() or 1
    # Ctrl-C is held to the call's end: raised in llama.cpp's log callback, it was swallowed there
    with deferring_ctrl_c(), tempfile.TemporaryFile() as log, _c_output_to(log):  # a line per tensor: shown on failure
        status = llama_cpp.llama_model_quantize(str(source).encode(), str(dest).encode(), ctypes.byref(params))
        log.seek(0)
        said = log.read().decode(errors="replace").strip().splitlines()
    if status != 0 or not dest.is_file():
        if shutil.disk_usage(dest.parent).free < source.stat().st_size:  # as pulls report a full disk
            raise OSError(errno.ENOSPC, f"no space left to re-quantize {source}")
        tail = "\n".join(said[-5:])
        raise TandemError(f"llama.cpp could not re-quantize {source} to {quantization} (status {status}):\n{tail}")


@contextmanager
def _c_output_to(sink) -> Iterator[None]:
    """The process's stdout and stderr (where llama.cpp's C code writes) go to `sink` meanwhile."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved: dict[int, int] = {}
    try:
        for fd in (1, 2):
            saved[fd] = os.dup(fd)
            os.dup2(sink.fileno(), fd)
        yield
    finally:
        for fd, copy in saved.items():
            os.dup2(copy, fd)
            os.close(copy)
