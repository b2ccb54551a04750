"""One OpenMP thread team per process, so llama.cpp's CPU kernels keep spinning between ops.

llama.cpp's CPU backend runs each graph as an OpenMP parallel region (libgomp), and libgomp keeps
a team of worker threads for every thread that ever started a region. While it manages more
threads than the process has CPUs, it stops spinning at its barriers and sleeps on a futex
instead (its "throttled" spin count), and every op of a decode then pays for a wake-up. A
server starts its models on the main thread (their first decode sizes llama.cpp's buffers, a
profile may run) and then decodes on its engine thread: two teams on 2 CPUs, and a decode of the
1.5B target measured 53-65 ms instead of 39-42 (docs/vs-llama-server.md). `release_openmp_threads`
frees the calling thread's team (OpenMP 5's `omp_pause_resource_all`), so the engine thread's is
the only one left.
"""

import ctypes
import logging
import os

log = logging.getLogger(__name__)
OMP_PAUSE_HARD = 2  # omp_pause_resource_t: free the threads, not only park them


def release_openmp_threads() -> bool:
    """Free the calling thread's OpenMP workers (call it outside any parallel region, after the
    thread's last llama.cpp call). False where libgomp is not loaded or refuses."""
    try:
        gomp = ctypes.CDLL("libgomp.so.1", mode=os.RTLD_NOLOAD | os.RTLD_NOW)
    except OSError:  # not loaded: nothing in this process has started an OpenMP team
        return False
    released = gomp.omp_pause_resource_all(OMP_PAUSE_HARD) == 0
    if not released:
        log.debug("libgomp refused to release this thread's OpenMP workers")
    return released
