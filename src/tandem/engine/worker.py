"""The engine thread: runs a batching engine off the event loop, behind queues.

`submit` (any thread, usually the event loop) hands a request to the engine thread and returns a
`RequestHandle` from which the caller reads `SequenceUpdate`s, asynchronously (from the loop it
was submitted on, each step's updates for that loop in one wake-up) or synchronously. `cancel`
(a client went away) frees the sequence and its KV cache at the start of the next engine step.
Capacity is bounded: past `max_running + max_waiting` requests in flight, `submit` raises
`QueueFullError`, never queues without limit. `shutdown` stops admitting, lets in-flight requests
finish for a grace period, then cancels the rest, so every handle always gets a final update.

When updates are handed over: an engine with an `on_model_call` hook (BatchEngine) has a step's
updates handed over as its next step calls a model (where the engine has nothing more to do, at
once), and a loop is woken by a thread of its own (`tandem-handover`), never by the engine's: a
wake-up is a write that lets go of the interpreter, and the woken loop kept it for its whole
turn (detokenizing, writing the streams) while the engine waited to plan its next step. So the
loop's turn runs while the kernels do.
"""

import asyncio
import contextlib
import itertools
import logging
import math
import queue
import statistics
import threading
import time
from collections import deque
from typing import Callable, Iterable, Protocol, Sequence

from tandem.engine.events import SequenceUpdate, SpeculationOptions, StepReport, checked_options
from tandem.engine.request import GenerationRequest
from tandem.errors import TandemError, client_message
from tandem.models.openmp import release_openmp_threads
from tandem.numbers import is_int, is_number

log = logging.getLogger(__name__)
IDLE_WAIT_SECONDS = 0.05  # how long the idle engine thread sleeps between command checks
DEFAULT_MAX_WAITING = 64


FINISHES_REMEMBERED = 16  # the recent request finishes a queue-full answer's Retry-After is read from
RETRY_AFTER_MAX_SECONDS = 60


def retry_after_seconds(finish_times: Sequence[float]) -> int:
    """When a request refused at capacity should try again: a place frees when one in flight
    finishes, so the median interval between the recent finishes (monotonic seconds, oldest
    first; the median, so that an idle hour before a burst does not count), rounded up; 1 s
    before two finishes are seen, at most a minute."""
    if len(finish_times) < 2:
        return 1
    interval = statistics.median(later - earlier for earlier, later in zip(finish_times, list(finish_times)[1:]))
    return max(1, min(RETRY_AFTER_MAX_SECONDS, math.ceil(interval)))


class QueueFullError(TandemError):
    """More requests in flight than the worker holds (its engine's max_running plus max_waiting):
    try again after `retry_after_seconds` (read from recent finishes; the server's Retry-After)."""

    def __init__(self, in_flight: int, retry_after_seconds: int = 1):
        super().__init__(f"the server is at capacity ({in_flight} request{'' if in_flight == 1 else 's'} in flight); "
                         "retry later")
        self.retry_after_seconds = retry_after_seconds


class EngineStoppedError(TandemError):
    """The worker was shut down (or never held its engine): it takes no requests."""

    def __init__(self, message: str = "the engine is shutting down and accepts no new requests"):
        super().__init__(message)


class EngineUnavailableError(EngineStoppedError):
    """The engine cannot serve anything now (e.g. no verifier left in the cluster): a 503."""


class BatchingEngine(Protocol):
    """What the worker needs from an engine (see engine/batch_engine.py)."""

    max_running: int
    context_length: int  # the target's

    @property
    def has_work(self) -> bool: ...

    @property
    def num_running(self) -> int: ...

    @property
    def num_waiting(self) -> int: ...

    def validate(self, request: GenerationRequest, options: SpeculationOptions) -> None:
        """Raise TandemError for a request this engine can never run (checked on submit)."""
        ...

    def add(self, seq_id: str, request: GenerationRequest, options: SpeculationOptions) -> None: ...

    def cancel(self, seq_id: str) -> SequenceUpdate | None: ...

    def step(self) -> tuple[list[SequenceUpdate], StepReport | None]:
        """One step's updates and report (None: no work was done, e.g. a cluster router whose
        replicas finished no step while it waited)."""
        ...


StepObserver = Callable[[StepReport], None]
QueueObserver = Callable[[int, int], None]  # (running, waiting) where they changed between steps


class RequestHandle:
    """The caller's end of one request: a stream of updates ending with a finished one."""

    def __init__(self, seq_id: str, worker: "EngineWorker", loop: asyncio.AbstractEventLoop | None):
        self.seq_id = seq_id
        self._worker = worker
        self._loop = loop
        # updates: an asyncio queue read on the submitting loop, or a plain one read by a thread
        self._queue: asyncio.Queue | queue.SimpleQueue = asyncio.Queue() if loop else queue.SimpleQueue()
        self.finished = False

    async def next_update(self) -> SequenceUpdate:
        """The next update, on the loop the request was submitted from."""
        if self._loop is None:
            raise TandemError("this request was submitted from a thread without an event loop: read it with "
                              "handle.next_update_sync()")
        if asyncio.get_running_loop() is not self._loop:  # its updates go to the loop it came from
            raise TandemError("this request was submitted from another event loop: read it on that loop")
        self._check_unfinished()
        update = await self._queue.get()
        self.finished = update.finished
        return update

    def next_update_sync(self, timeout: float | None = None) -> SequenceUpdate:
        """The next update, for a request submitted outside an event loop; TimeoutError after
        `timeout` seconds without one."""
        if self._loop is not None:
            raise TandemError("this request was submitted from an event loop: read it there with "
                              "`await handle.next_update()`")
        self._check_unfinished()
        if timeout is not None and not (is_number(timeout) and timeout >= 0):
            raise TandemError(f"timeout must be a number of seconds, 0 or more (or None), got {timeout!r}")
        if timeout is not None and timeout > threading.TIMEOUT_MAX:  # inf: wait as long as it takes
            timeout = None
        try:
            update = self._queue.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"no update of request {self.seq_id} within {timeout:g} s") from None
        self.finished = update.finished
        return update

    def _check_unfinished(self) -> None:
        if self.finished:  # its last update was read: another read would wait for ever
            raise TandemError(f"request {self.seq_id} has finished: its last update was already read")

    def cancel(self) -> None:
        if not self.finished:
            self._worker.cancel(self.seq_id)


class EngineWorker:
    """Runs an engine on a thread of its own (`start`), so that many requests from any threads or
    event loops share it: `submit` queues one and returns its RequestHandle, `shutdown` finishes
    what is in flight (up to a grace period) and closes the engine."""

    def __init__(
        self,
        engine: BatchingEngine,
        max_waiting: int = DEFAULT_MAX_WAITING,
        observers: Iterable[StepObserver] = (),
        queue_observers: Iterable[QueueObserver] = (),
    ):
        """observers: called with every step's report. queue_observers: called with the engine's
        running and waiting counts where a command (a cancel, a new request) changed them between
        steps, so that an idle engine's gauges do not keep the last step's counts."""
        if not (is_int(max_waiting) and max_waiting >= 0):
            raise TandemError(f"max_waiting must be an integer, 0 or more, got {max_waiting!r}")
        self.engine = engine
        self.capacity = engine.max_running + max_waiting
        self.observers = list(observers)
        self.queue_observers = list(queue_observers)
        self._queue_told = (0, 0)  # the (running, waiting) observers last heard, by a report or directly
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._handles: dict[str, RequestHandle] = {}
        self._finish_times: deque[float] = deque(maxlen=FINISHES_REMEMBERED)  # monotonic, for Retry-After
        self._lock = threading.Lock()
        self._ids = itertools.count()
        self._adds_queued = 0  # submitted, not yet taken by the engine thread (under the lock)
        self._accepting = True
        self._drain_deadline: float | None = None
        self._closed = False  # engine.close() called (once, by whichever shutdown gets there first)
        self._thread = threading.Thread(target=self._run, name="tandem-engine", daemon=True)
        self._holding_engine = threading.Event()  # set once the engine thread holds the engine, or cannot
        self._start_error: TandemError | None = None
        self._wake_ups: queue.SimpleQueue = queue.SimpleQueue()  # (loop, its deliveries); None: stop
        self._waker = threading.Thread(target=self._wake_loops, name="tandem-handover", daemon=True)
        self.last_report: StepReport | None = None
        self._held: list[SequenceUpdate] = []  # the last step's updates, until the next step calls a model
        self._holds = hasattr(engine, "on_model_call")
        if self._holds:
            engine.on_model_call = self._hand_over_held

    @property
    def in_flight(self) -> int:
        with self._lock:
            return len(self._handles)

    @property
    def num_waiting(self) -> int:
        """Requests not running yet: the engine's waiting ones and those submitted since its step
        began (the engine takes them between steps; a long step hid them from /health)."""
        with self._lock:
            return self.engine.num_waiting + self._adds_queued

    def start(self) -> "EngineWorker":
        """Start the engine thread; it holds the engine until shutdown (another thread's use of it
        meanwhile is a TandemError). Returns the worker."""
        if self._thread.is_alive() or self._thread.ident is not None or not self._accepting:
            raise EngineStoppedError("this worker was already started (a shut-down worker is not restarted: make a "
                                     "new EngineWorker for the engine)")
        release_openmp_threads()  # the models' work on this thread is done: one OpenMP team left
        self._waker.start()  # first: the engine's first updates already go through it
        self._thread.start()
        self._holding_engine.wait()
        if self._start_error is not None:  # another thread uses the engine: this worker never had it
            with self._lock:
                self._accepting, self._closed = False, True  # so its shutdown closes nothing
            self._wake_ups.put(None)
            raise self._start_error
        return self

    def submit(self, request: GenerationRequest, options: SpeculationOptions | None = None,
               on_created: Callable[[str], None] | None = None) -> RequestHandle:
        """Queue a request (`options` None: the engine's drafter and depth). Raises TandemError
        for a request the engine can never run (a client error), QueueFullError past capacity,
        EngineStoppedError (or EngineUnavailableError) when nothing can be served.
        `on_created(seq_id)` runs before the engine thread can see it (where it raises, the
        request is not queued and its error is raised here)."""
        options = checked_options(options)
        self.engine.validate(request, options)
        reason = getattr(self.engine, "unavailable_reason", None)
        if reason:
            raise EngineUnavailableError(reason)
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        with self._lock:
            if not self._accepting:
                raise EngineStoppedError()
            if len(self._handles) >= self.capacity:
                raise QueueFullError(len(self._handles), retry_after_seconds(self._finish_times))
            seq_id = f"seq-{next(self._ids)}"
            handle = RequestHandle(seq_id, self, loop)
            self._handles[seq_id] = handle
            self._adds_queued += 1
        if on_created is not None:
            try:
                on_created(seq_id)
            except BaseException:  # its place in the queue is given back
                with self._lock:  # a drain may have ended the handle meanwhile
                    self._handles.pop(seq_id, None)
                    self._adds_queued -= 1
                raise
        self._commands.put(("add", seq_id, request, options))
        return handle

    def cancel(self, seq_id: str) -> None:
        self._commands.put(("cancel", seq_id, None, None))

    def shutdown(self, grace_seconds: float = 10.0) -> None:
        """Stop admitting; finish in-flight requests for up to `grace_seconds`, cancel the rest."""
        with self._lock:
            self._accepting = False
        self._commands.put(("drain", None, grace_seconds, None))
        if self._thread.is_alive():
            self._thread.join(timeout=min(grace_seconds + 30, threading.TIMEOUT_MAX))
        if self._thread.is_alive():
            return  # still inside a step: closing the engine under it would race with it
        if self._waker.is_alive():  # the last updates reach their loops first
            self._wake_ups.put(None)
            self._waker.join(timeout=5)
        with self._lock:
            if self._closed:
                return  # a second shutdown (a drain, then the server's own close) closes nothing
            self._closed = True
        if self._holds and self.engine.on_model_call == self._hand_over_held:
            self.engine.on_model_call = None  # the engine may outlive this worker (a library's next one)
        close = getattr(self.engine, "close", None)
        if close is not None:
            close()

    def cut_grace(self) -> None:
        """During a drain (`shutdown`), cancel what is still in flight now instead of at the end
        of the grace period."""
        self._commands.put(("drain", None, 0.0, None))

    # -- engine thread --------------------------------------------------------------------------

    def _run(self) -> None:
        """The engine thread: holds the engine (BatchEngine.exclusive) for its whole life."""
        exclusive = getattr(self.engine, "exclusive", None)  # a cluster router has none: it steps no model
        with contextlib.ExitStack() as holding:
            try:
                if exclusive is not None:
                    holding.enter_context(exclusive())
            except TandemError as error:  # in use on another thread: `start` raises it
                self._start_error = error
                return
            finally:
                self._holding_engine.set()
            self._loop()

    def _loop(self) -> None:
        while True:
            if not self.engine.has_work:
                self._hand_over_held()
            self._take_commands(block=not self.engine.has_work)
            self._tell_queue()
            if self._drain_deadline is not None:
                if not self.engine.has_work or time.monotonic() > self._drain_deadline:
                    self._cancel_all()
                    return
            if self.engine.has_work:
                self._step()

    def _take_commands(self, block: bool) -> None:
        try:
            command = self._commands.get(timeout=IDLE_WAIT_SECONDS) if block else self._commands.get_nowait()
        except queue.Empty:
            return
        while True:
            self._apply(*command)
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return

    def _apply(self, kind: str, seq_id: str | None, payload, options) -> None:
        if kind == "add":
            with self._lock:
                self._adds_queued -= 1
            try:
                self.engine.add(seq_id, payload, options)
            except Exception as error:  # this request alone fails; the engine thread goes on
                if not isinstance(error, TandemError):
                    log.exception("engine failed to add request %s", seq_id)
                self._dispatch([SequenceUpdate(seq_id, (), finished=True, finish_reason="error",
                                               error=str(error) if isinstance(error, TandemError) else client_message(error))])
        elif kind == "cancel":
            update = self.engine.cancel(seq_id)
            if update is not None:
                self._dispatch([update])
        elif kind == "drain":  # the earliest deadline asked holds (a cut grace queued before the drain)
            deadline = time.monotonic() + payload
            self._drain_deadline = deadline if self._drain_deadline is None else min(self._drain_deadline, deadline)

    def _step(self) -> None:
        try:
            updates, report = self.engine.step()
        except Exception as error:  # a bug or a device failure: fail the batch, keep serving
            log.exception("engine step failed")
            self._fail_all(f"engine step failed: {client_message(error)}")  # the trace stays in the log
            return
        if self._holds:
            self._hand_over_held()  # where the step called no model
            self._held = updates
        else:
            self._dispatch(updates)
        if report is None:
            return
        self.last_report = report
        self._queue_told = (report.running, report.waiting)
        for observer in self.observers:
            try:
                observer(report)
            except Exception:
                log.exception("step observer failed")

    def _tell_queue(self) -> None:
        counts = (self.engine.num_running, self.engine.num_waiting)
        if counts == self._queue_told or not self.queue_observers:
            return
        self._queue_told = counts
        for observer in self.queue_observers:
            try:
                observer(*counts)
            except Exception:
                log.exception("queue observer failed")

    def _hand_over_held(self) -> None:
        held, self._held = self._held, []
        if held:
            self._deliver(held)

    def _dispatch(self, updates: list[SequenceUpdate]) -> None:
        """Hand over the updates now, after any held ones (each stream's stay in order)."""
        self._hand_over_held()
        self._deliver(updates)

    def _deliver(self, updates: list[SequenceUpdate]) -> None:
        """Hand each update to its handle: a thread's queue directly, a loop's in one callback per
        loop and step (each wake-up of a loop is a write to its pipe, and a thread switch)."""
        on_loops: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Queue, SequenceUpdate]]] = {}
        for update in updates:
            with self._lock:
                handle = self._handles.pop(update.seq_id, None) if update.finished else self._handles.get(update.seq_id)
                if handle is not None and update.finished:
                    self._finish_times.append(time.monotonic())
            if handle is None:
                continue
            if handle._loop is None:
                handle._queue.put(update)
            else:
                on_loops.setdefault(handle._loop, []).append((handle._queue, update))
        for loop, deliveries in on_loops.items():
            if self._waker.is_alive():
                self._wake_ups.put((loop, deliveries))
            else:  # not started (a test drives the engine's loop by hand) or stopped
                _wake(loop, deliveries)

    def _wake_loops(self) -> None:  # the handover thread
        while (wake_up := self._wake_ups.get()) is not None:
            _wake(*wake_up)

    def _cancel_all(self) -> None:
        self._hand_over_held()
        with self._lock:
            seq_ids = list(self._handles)
        for seq_id in seq_ids:
            update = self.engine.cancel(seq_id)
            self._dispatch([update or SequenceUpdate(seq_id, (), finished=True, finish_reason="cancelled")])

    def _fail_all(self, message: str) -> None:
        with self._lock:
            seq_ids = list(self._handles)
        for seq_id in seq_ids:
            self.engine.cancel(seq_id)
            self._dispatch([SequenceUpdate(seq_id, (), finished=True, finish_reason="error", error=message)])


def _wake(loop: asyncio.AbstractEventLoop, deliveries: list[tuple[asyncio.Queue, SequenceUpdate]]) -> None:
    try:
        loop.call_soon_threadsafe(_put_all, deliveries)
    except RuntimeError:  # the loop is closed: nobody is listening any more
        pass


def _put_all(deliveries: list[tuple[asyncio.Queue, SequenceUpdate]]) -> None:  # on their loop
    for updates, update in deliveries:
        updates.put_nowait(update)
