"""A verifier replica's own loop: a thread in the coordinator's process that runs the replica's
rounds (prefill what was placed there, plan, draft, verify, commit) one after another, on the
replica's clock, so a fast replica never waits for a slow one. The round itself is the
coordinator's (`ClusterEngine.replica_round`); this is only the thread around it."""

import logging
import threading

log = logging.getLogger(__name__)
IDLE_WAIT_S = 0.05  # a loop with nothing to do sleeps until a placement, or this long


class ReplicaLoop:
    def __init__(self, engine, replica):
        self.engine = engine
        self.replica = replica
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"tandem-replica-{replica.name}", daemon=True)

    def start(self) -> "ReplicaLoop":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def join(self, timeout: float = 30.0) -> None:
        self._thread.join(timeout)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                worked = self.engine.replica_round(self.replica)
            except Exception as error:  # a bug or a device failure: fail its sequences, keep serving
                log.exception("round on %s failed", self.replica.name)
                self.engine.round_failed(self.replica, f"engine step failed: {error}")
                worked = False
            if not worked:
                self.engine.wait_for_work(self.replica, IDLE_WAIT_S)
