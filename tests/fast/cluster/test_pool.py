"""The router's workers (cluster/runtime/pool.py): restarts, bounded, and what the log says."""

import logging
import time

from tandem.cluster.runtime.endpoints import LocalEndpoint
from tandem.cluster.runtime.health import transition_message
from tandem.cluster.runtime.pool import MAX_RESTARTS, Worker
from tandem.models.cost import CostModel


class Answering:
    """A worker process's two calls a restart waits on."""

    def info(self) -> dict:
        return {"pid": 7, "cost_ms": CostModel().to_wire()}

    def ping(self) -> None:
        return None


def starts(*dead_on_arrival: bool):
    """A `start` whose n-th endpoint is dead before its first call where dead_on_arrival[n] says."""
    made = []

    def start():
        endpoint = LocalEndpoint(f"w{len(made)}", Answering())
        endpoint.dead = dead_on_arrival[len(made)]
        made.append(endpoint)
        return endpoint

    return start, made


def wait_polled(worker: Worker) -> bool:
    for _ in range(500):
        if worker._starting is None or worker._starting.ready():
            return worker.poll_ready()
        time.sleep(0.01)
    raise AssertionError("the worker's start never answered")


def test_a_replacement_that_dies_while_starting_is_replaced_again():
    """A restart whose process died before it answered left the worker down for good with restarts
    to spare (and the log said all of them were used)."""
    start, made = starts(False, True, False)
    worker = Worker("verify-0", "verify", start)
    worker.launch()
    assert worker.wait_ready()
    worker.mark_dead()  # restart 1: its process is dead on arrival
    assert worker.restarting and not wait_polled(worker)
    assert worker.restarting and worker.restarts == 2 and len(made) == 3  # restart 2 under way
    assert wait_polled(worker) and worker.alive
    assert transition_message(worker) == ("cluster worker verify-0 is up again (pid 7, restart 2 of 5)",
                                          logging.WARNING)


def test_restarts_stop_at_the_bound_and_the_log_says_why():
    start, made = starts(False, *[True] * MAX_RESTARTS)
    worker = Worker("draft-0", "draft", start)
    worker.launch()
    assert worker.wait_ready()
    worker.mark_dead()
    while worker.restarting:
        wait_polled(worker)
    assert worker.restarts == MAX_RESTARTS and len(made) == MAX_RESTARTS + 1 and not worker.alive
    assert transition_message(worker) == (
        "cluster worker draft-0 is down and will not be restarted: all 5 restarts are used", logging.ERROR)
    outside = Worker("verify-1", "verify", None)  # joined, not started here
    assert transition_message(outside)[0].endswith("it was not started by this server")


def test_a_worker_that_fails_in_its_constructor_says_why():
    """Ray reports a constructor's exception under its traceback; the launch error quotes its
    last line (it said only "failed to start (see the Ray logs)")."""
    from ray.exceptions import ActorDiedError, RayTaskError

    from tandem.cluster.runtime.endpoints import WorkerDiedError, start_failure
    from tandem.errors import TandemError

    cause = TandemError("torch device 'cuda' is not available here")
    trace = ("Traceback (most recent call last):\n  File \"replica.py\", line 40, in __init__\n"
             f"tandem.errors.TandemError: {cause}")
    died = ActorDiedError(RayTaskError("VerifyReplica.__init__", trace, cause))
    assert start_failure(died) == "TandemError: torch device 'cuda' is not available here"
    assert start_failure(ActorDiedError()) is None  # died otherwise: nothing to quote
    assert start_failure(RuntimeError("x")) is None

    class Failing(Answering):  # the pool keeps what the worker's death said
        def info(self) -> dict:
            raise WorkerDiedError("w0 died: ActorDiedError", "TandemError: no such model")

    worker = Worker("w", "verify", lambda: LocalEndpoint("w0", Failing()))
    worker.launch()
    assert not worker.wait_ready() and worker.start_error == "TandemError: no such model"
