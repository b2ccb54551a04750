"""How the coordinator calls a worker: `call(method, *args)` starts the call and returns a
`Pending` whose `result()` gives the value or raises `WorkerDiedError`. `RayEndpoint` talks to
a Ray actor (calls to several actors run concurrently); `LocalEndpoint` calls a plain object in
this process (tests and the single-machine default need no Ray)."""

from typing import Any, Callable, Protocol


class WorkerDiedError(Exception):
    pass


class Pending(Protocol):
    def result(self) -> Any: ...

    def ready(self) -> bool: ...


class Endpoint(Protocol):
    name: str

    def call(self, method: str, *args) -> Pending: ...


class _Done:
    def __init__(self, compute: Callable[[], Any]):
        try:
            self._value, self._error = compute(), None
        except WorkerDiedError as error:
            self._value, self._error = None, error

    def ready(self) -> bool:
        return True

    def result(self) -> Any:
        if self._error is not None:
            raise self._error
        return self._value


class LocalEndpoint:
    """A worker object in this process; `kill()` makes later calls fail like a dead process."""

    def __init__(self, name: str, worker: Any):
        self.name = name
        self.worker = worker
        self.dead = False

    def kill(self) -> None:
        self.dead = True

    def call(self, method: str, *args) -> Pending:
        def compute():
            if self.dead:
                raise WorkerDiedError(f"{self.name} is dead")
            return getattr(self.worker, method)(*args)

        return _Done(compute)


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
            raise WorkerDiedError(f"{self._name} died: {type(error).__name__}") from None


class RayEndpoint:
    def __init__(self, name: str, actor):
        self.name = name
        self.actor = actor

    def call(self, method: str, *args) -> Pending:
        return _RayPending(self.name, getattr(self.actor, method).remote(*args))
