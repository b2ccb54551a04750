"""Processes a block started, stopped when the block fails.

A SIGTERM while `ray.init` starts a local cluster ends the process from inside it (Ray's own
handler exits there). Ray's shutdown then stops the GCS and the raylet, but the raylet's agents
(`DashboardAgent`, `RuntimeEnvAgent`, ~85 MB each) outlive it, parented to init, and only a
SIGKILL ends them. `stopping_what_it_started` takes every process started under this one during
the block, found while the raylet that started the agents still lives, and stops them once Ray's own
shutdown (given as `shutdown`) has run.
"""

import contextlib
import logging
from typing import Callable

import psutil

log = logging.getLogger(__name__)

GRACE_S = 3.0  # between SIGTERM and SIGKILL


@contextlib.contextmanager
def stopping_what_it_started(shutdown: Callable[[], None] | None = None):
    """On a failure, `shutdown` first (Ray's own, while the processes it talks to still live: a
    driver whose GCS was killed under it crashes at exit), then whatever of the block's processes
    outlived it."""
    me = psutil.Process()
    before = {child.pid for child in me.children(recursive=True)}
    try:
        yield
    except BaseException:
        started = [child for child in _children(me) if child.pid not in before]
        if shutdown is not None:
            with contextlib.suppress(Exception):
                shutdown()
        started = [child for child in started if _alive(child)]
        if started:
            log.warning("stopping %d processes a failed start left", len(started))
            stop_processes(started)
        raise


def stop_processes(processes: list[psutil.Process], grace_s: float = GRACE_S) -> None:
    for process in processes:
        with contextlib.suppress(psutil.Error):
            process.terminate()
    _, alive = psutil.wait_procs(processes, timeout=grace_s)
    for process in alive:
        with contextlib.suppress(psutil.Error):
            process.kill()
    psutil.wait_procs(alive, timeout=grace_s)


def _children(process: psutil.Process) -> list[psutil.Process]:
    try:
        return process.children(recursive=True)
    except psutil.Error:
        return []


def _alive(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
