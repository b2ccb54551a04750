"""How the router (and a replica, its drafters) calls a worker: `call(method, *args)` starts the call and returns a
`Pending` whose `result()` gives the value or raises `WorkerDiedError`. `RayEndpoint` talks to
a Ray actor; `LocalEndpoint` calls a plain object in this process (tests need no Ray). Both run
calls as an actor does: those to one worker one at a time, in order; those to several workers
concurrently."""

import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any, Protocol


class WorkerDiedError(Exception):
    """A worker's process is gone. `reason`: why, where it is known (the error its constructor
    raised: a model that cannot load, a device that is not there)."""

    def __init__(self, message: str, reason: str | None = None):
        super().__init__(message)
        self.reason = reason


def start_failure(error: Exception) -> str | None:
    """Why a Ray actor failed in its constructor: the last line of the error Ray reports (the
    exception and its message, under the constructor's traceback), its module path dropped;
    None where it died otherwise."""
    if not getattr(error, "actor_init_failed", False):
        return None
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    if not lines:
        return None
    name, colon, message = lines[-1].partition(": ")
    if colon and " " not in name:
        return f"{name.rsplit('.', 1)[-1]}: {message}"
    return lines[-1]


class Pending(Protocol):
    def result(self) -> Any: ...

    def ready(self) -> bool: ...


class Endpoint(Protocol):
    name: str

    def call(self, method: str, *args) -> Pending: ...


class _FuturePending:
    def __init__(self, future: Future):
        self._future = future

    def ready(self) -> bool:
        return self._future.done()

    def result(self) -> Any:
        return self._future.result()


class LocalEndpoint:
    """A worker object in this process, called on its own thread (or `threads` of them, as a
    threaded actor); `kill()` makes every call not yet started, and every later one, fail like
    calls to a dead process."""

    def __init__(self, name: str, worker: Any, threads: int = 1):
        self.name = name
        self.worker = worker
        self.dead = False
        self._thread = ThreadPoolExecutor(max_workers=threads, thread_name_prefix=f"local-{name}")

    def kill(self) -> None:
        self.dead = True
        stop = getattr(self.worker, "close", None)
        if stop is not None:  # a replica's engine thread stops as a dead process's would
            stop()

    def call(self, method: str, *args) -> Pending:
        def compute():
            if self.dead:
                raise WorkerDiedError(f"{self.name} is dead")
            try:
                value = getattr(self.worker, method)(*args)
            except Exception:
                if self.dead:  # killed while the call ran (a replica's close fails its commands): as a dead process's
                    raise WorkerDiedError(f"{self.name} is dead") from None
                raise
            if self.dead:  # it died while the call ran: its answer never arrives
                raise WorkerDiedError(f"{self.name} is dead")
            return value

        if not self.dead:
            try:
                return _FuturePending(self._thread.submit(compute))
            except RuntimeError:  # the interpreter is exiting: no thread takes calls any more
                pass
        failed = Future()
        failed.set_exception(WorkerDiedError(f"{self.name} is dead"))
        return _FuturePending(failed)


class _RayPending:
    def __init__(self, name: str, ref):
        self._name = name
        self._ref = ref

    def ready(self) -> bool:
        import ray

        done, _ = ray.wait([self._ref], timeout=0)
        return bool(done)

    def result(self) -> Any:
        import ray
        from ray.exceptions import RayActorError

        try:
            return ray.get(self._ref)
        except RayActorError as error:
            raise WorkerDiedError(f"{self._name} died: {type(error).__name__}", start_failure(error)) from None


class RayEndpoint:
    def __init__(self, name: str, actor):
        self.name = name
        self.actor = actor

    def call(self, method: str, *args) -> Pending:
        return _RayPending(self.name, getattr(self.actor, method).remote(*args))


def wait_any(pendings: list[Pending], timeout_s: float) -> None:
    """Return once any of the calls has finished, or after timeout_s."""
    futures = [p._future for p in pendings if isinstance(p, _FuturePending)]
    refs = [p._ref for p in pendings if isinstance(p, _RayPending)]
    others = [p for p in pendings if not isinstance(p, (_FuturePending, _RayPending))]
    if futures and not refs and not others:
        wait(futures, timeout_s, FIRST_COMPLETED)
    elif refs and not futures and not others:
        import ray

        ray.wait(refs, num_returns=1, timeout=timeout_s)
    elif pendings:  # a mix (or wrapped calls): look now and then
        deadline = time.monotonic() + timeout_s
        while not any(p.ready() for p in pendings) and time.monotonic() < deadline:
            time.sleep(0.002)
    else:
        time.sleep(timeout_s)


def wait_all(pendings: list[Pending]) -> None:
    """Wait for every call to finish; a dead worker's fails quietly (the health monitor or the
    next call reports the death)."""
    for pending in pendings:
        try:
            pending.result()
        except WorkerDiedError:
            pass
