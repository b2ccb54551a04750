"""Live health of cluster workers: every worker is pinged on a fixed period whether or not it
has work, so a dead one is marked down (and restarted in the background) even when idle.

Each check sends a ping to every live worker that has none in flight and waits briefly for the
answers. A busy worker answers after its current call (its ping stays in flight; busy is not
dead); a dead one fails the call at once (Ray reports the actor's death on the pending call).
Checks run twice per period, so a death is seen within one period. Restarting workers are polled
and rejoin when they answer. Each transition is logged once; listeners (the server's metrics and
dashboard) get the workers' states after every check.
"""

import logging
import sys
import threading
import time
from typing import Callable

from tandem.cluster.runtime.endpoints import Pending, WorkerDiedError
from tandem.cluster.runtime.pool import MAX_RESTARTS, Worker
from tandem.errors import TandemError
from tandem.numbers import is_number

log = logging.getLogger(__name__)
DEFAULT_PERIOD_S = 2.0
ANSWER_WAIT_S = 0.2  # a check waits this long (at most) for pings to idle workers to come back


def check_period(seconds: float) -> float:
    if not is_number(seconds) or not 0 < seconds <= 3600:
        raise TandemError(f"the health check period must be in (0, 3600] seconds, got {seconds!r}")
    return float(seconds)


class HealthMonitor:
    def __init__(self, workers: list[Worker], on_dead: Callable[[Worker], None], lock, events=None,
                 period_s: float = DEFAULT_PERIOD_S, on_up: Callable[[Worker], None] | None = None):
        self.workers = workers
        self.on_dead = on_dead  # called with `lock` held
        self.on_up = on_up  # a restarted worker answered (called with `lock` held)
        self.lock = lock
        self.events = events
        self.period_s = check_period(period_s)
        self.listeners: list[Callable[[list[dict]], None]] = []
        self.checks = 0
        self._pings: dict[str, tuple[object, Pending]] = {}  # worker name -> (endpoint, ping in flight)
        self._was_up = {w.name: w.alive for w in workers}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None:
            self._stop = threading.Event()
            self._thread = threading.Thread(target=self._run, args=(self._stop,), name="tandem-health", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread = None

    def _run(self, stop: threading.Event) -> None:
        while not stop.wait(self.period_s / 2):
            if sys.is_finalizing():  # the process is exiting: restarting workers now would only fail
                return
            try:
                self.check()
            except Exception:  # never let the monitor die
                log.exception("health check failed")

    def check(self) -> None:
        """One pass: revive workers that came up, ping live ones, mark the dead down."""
        with self.lock:
            self.revive()
            for worker in self.workers:
                if worker.alive and worker.name not in self._pings:
                    self._pings[worker.name] = (worker.endpoint, worker.endpoint.call("ping"))
            pings = dict(self._pings)
        deadline = time.monotonic() + ANSWER_WAIT_S
        while time.monotonic() < deadline and not all(p.ready() for _, p in pings.values()):
            time.sleep(0.01)
        with self.lock:
            for worker in self.workers:
                self._take_ping(worker)
            self.checks += 1
            self._log_transitions()
            states = [w.state() for w in self.workers]
        for listener in self.listeners:
            listener(states)

    def revive(self) -> None:
        """Hand each restarted worker that answered to on_up (call with `lock` held)."""
        for worker in self.workers:
            if worker.restarting and worker.poll_ready() and self.on_up is not None:
                self.on_up(worker)

    def _take_ping(self, worker: Worker) -> None:
        endpoint, ping = self._pings.get(worker.name, (None, None))
        if ping is None or not ping.ready():
            return
        del self._pings[worker.name]
        if endpoint is not worker.endpoint:
            return  # a ping to a process that has since been replaced
        try:
            ping.result()
        except WorkerDiedError:
            self.on_dead(worker)

    def _log_transitions(self) -> None:
        for worker in self.workers:
            up = worker.alive
            if up != self._was_up.get(worker.name):
                self._was_up[worker.name] = up
                message, level = transition_message(worker)
                log.log(level, message)
                if self.events is not None:
                    self.events.append(message)


def transition_message(worker: Worker) -> tuple[str, int]:
    """What the log says when a worker goes down or comes back, and how loudly: a recovery as
    loudly as the loss it ends (the default log level shows warnings only), a worker lost for
    good as an error."""
    name = f"cluster worker {worker.name}"
    if worker.alive:
        return f"{name} is up again (pid {worker.pid}, restart {worker.restarts} of {MAX_RESTARTS})", logging.WARNING
    if worker.restarting:
        return f"{name} is down; restarting it (restart {worker.restarts} of {MAX_RESTARTS})", logging.WARNING
    why = (f"all {MAX_RESTARTS} restarts are used" if worker.start is not None
           else "it was not started by this server")
    return f"{name} is down and will not be restarted: {why}", logging.ERROR
