"""Peak memory per configuration: the process's resident set size (VmRSS in /proc/self/status),
sampled by a background thread, and the peak CUDA allocation where torch uses a GPU.

Configurations share one process, so a configuration's peak RSS includes every model loaded so
far; what it tells is the memory the process needed while that configuration ran.
"""

import sys
import threading
from contextlib import contextmanager
from pathlib import Path

SAMPLE_INTERVAL_S = 0.02
STATUS_FILE = Path("/proc/self/status")


def rss_mb() -> float | None:
    """The current resident set size in MB, or None where /proc is missing."""
    try:
        for line in STATUS_FILE.read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024  # the file gives kB
    except OSError:
        return None
    return None


class PeakMemory:
    """Use as a context manager around the benchmark and `track(label)` around each run."""

    def __init__(self, interval_s: float = SAMPLE_INTERVAL_S):
        self.interval_s = interval_s
        self.peak_rss_mb: dict[str, float] = {}
        self.peak_gpu_mb: dict[str, float] = {}
        self._active: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample_loop, name="rss-sampler", daemon=True)

    def __enter__(self) -> "PeakMemory":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    @contextmanager
    def track(self, label: str):
        _reset_gpu_peak()
        self._active = label
        self._sample()
        try:
            yield
        finally:
            self._sample()
            self._active = None
            gpu = _gpu_peak_mb()
            if gpu is not None:
                self.peak_gpu_mb[label] = max(gpu, self.peak_gpu_mb.get(label, 0.0))

    def _sample_loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def _sample(self) -> None:
        label, rss = self._active, rss_mb()
        if label is not None and rss is not None:
            self.peak_rss_mb[label] = max(rss, self.peak_rss_mb.get(label, 0.0))


def _cuda():
    """torch.cuda if torch is already imported and a GPU is in use; never imports torch."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return None
    return torch.cuda


def _reset_gpu_peak() -> None:
    cuda = _cuda()
    if cuda is not None:
        cuda.reset_peak_memory_stats()


def _gpu_peak_mb() -> float | None:
    cuda = _cuda()
    return None if cuda is None else cuda.max_memory_allocated() / 2**20
