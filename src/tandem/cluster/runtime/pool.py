"""The router's view of its workers: which are alive, what they hold, how to restart them.

A worker that dies is marked dead at once (its requests are re-submitted by the router) and
a replacement is started in the background with the same placement; it rejoins when its first
`info` call answers, and one that dies before it answers is replaced again. Restarts are bounded
per worker. When a worker comes up, the round trip to it is measured (a few calls that do
nothing but travel) and reported with the worker's state (the depth planner prices network time
from the cluster file's latencies).
"""

import time
from dataclasses import dataclass, field
from typing import Callable

from tandem.cluster.runtime.endpoints import Endpoint, Pending, WorkerDiedError
from tandem.models.cost import CostModel, CostView

MAX_RESTARTS = 5
RTT_SAMPLES = 3  # calls timed to learn a worker's round trip


@dataclass
class Worker:
    name: str
    role: str  # "verify" | "draft"
    start: Callable[[], Endpoint] | None  # (re)creates the worker where its placement says (None: not ours to restart)
    rtt_ms: float = 0.0  # round trip from the router: the cluster file's until measured at start-up
    endpoint: Endpoint | None = None
    alive: bool = False
    restarts: int = 0
    max_slots: int = 1
    context_length: int = 4096
    cost: CostView = field(default_factory=lambda: CostView(CostModel()))  # replaced whole on (re)start
    pid: int | None = None
    sequences: set[str] = field(default_factory=set)  # placed here (a verifier) or drafted for here
    group: str = "local"  # the cluster file's network group
    carries_state: bool = False  # a replica whose sequences move with their KV state
    start_error: str | None = None  # why its last start failed, where the worker said
    _starting: Pending | None = None

    def launch(self) -> None:
        self.endpoint = self.start()
        self._starting = self.endpoint.call("info")

    def wait_ready(self) -> bool:
        """Block until the worker answers (at start-up)."""
        return self._take_info()

    def poll_ready(self) -> bool:
        """Non-blocking: has a (re)starting worker come up? A replacement that died while starting
        (a model that failed to load, a process killed) is replaced again while restarts remain."""
        if self._starting is None or not self._starting.ready():
            return False
        if self._take_info():
            return True
        self._restart()
        return False

    def _take_info(self) -> bool:
        try:
            info = self._starting.result()
        except WorkerDiedError as error:
            self._starting, self.start_error = None, error.reason
            return False
        self._starting = None
        self.pid = info["pid"]
        self.max_slots = info.get("max_slots", self.max_slots)
        self.carries_state = info.get("carries_state", False)
        self.context_length = info.get("context_length", self.context_length)
        self.cost = CostView(CostModel.from_wire(info["cost_ms"]))
        self._measure_round_trip()
        self.alive = True  # last: placement reads it
        return True

    def _measure_round_trip(self) -> None:
        """Time RTT_SAMPLES calls that do nothing but travel; keep the fastest (the network and
        Ray, without queueing behind other work). The depth planner adds it to every step."""
        samples = []
        for _ in range(RTT_SAMPLES):
            start = time.perf_counter()
            try:
                self.endpoint.call("ping").result()
            except WorkerDiedError:
                return  # noticed by the next real call
            samples.append((time.perf_counter() - start) * 1000)
        self.rtt_ms = min(samples)

    def mark_dead(self) -> set[str]:
        """Forget the worker's sequences (returned) and start a replacement if allowed."""
        orphans, self.sequences = self.sequences, set()
        self.alive = False
        self._restart()
        return orphans

    def _restart(self) -> None:
        if self.start is not None and self.restarts < MAX_RESTARTS:
            self.restarts += 1
            self.launch()

    @property
    def restarting(self) -> bool:
        return not self.alive and self._starting is not None

    def state(self) -> dict:
        return {"name": self.name, "role": self.role, "alive": self.alive, "restarting": self.restarting,
                "pid": self.pid, "sequences": len(self.sequences), "restarts": self.restarts, "rtt_ms": self.rtt_ms}
