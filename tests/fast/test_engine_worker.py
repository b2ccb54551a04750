"""The engine thread: requests in from other threads (or an event loop), updates out, bounded
capacity, cancellation, shutdown that always ends every request."""

import asyncio
import threading

import pytest

from tandem.engine.events import SpeculationOptions
from tandem.engine.request import GenerationRequest
from tandem.engine.worker import EngineStoppedError, EngineWorker, QueueFullError, retry_after_seconds
from engine_support import MAX_TOKENS, PROMPTS, collect_sync, make_engine  # noqa: F401 (fixture)


async def collect_async(handle, timeout=30.0):
    tokens = []
    while True:
        update = await asyncio.wait_for(handle.next_update(), timeout)
        tokens += update.token_ids
        if update.finished:
            return tokens


def test_threads_submit_and_receive_full_outputs(tiny_target, tiny_draft, references):
    worker = EngineWorker(make_engine(tiny_target, tiny_draft, slots=2), max_waiting=8).start()
    handles = [worker.submit(GenerationRequest(p, max_tokens=MAX_TOKENS)) for p in PROMPTS]
    for prompt, handle in zip(PROMPTS, handles):
        tokens, last = collect_sync(handle)
        assert tokens == references[prompt] and last.finish_reason in ("stop", "length")
    worker.shutdown(grace_seconds=1)


def test_event_loop_side_gets_updates_without_blocking(tiny_target, tiny_draft, references):
    worker = EngineWorker(make_engine(tiny_target, tiny_draft, slots=2)).start()

    async def main():
        handle = worker.submit(GenerationRequest(PROMPTS[0], max_tokens=MAX_TOKENS), SpeculationOptions("ngram"))
        return await collect_async(handle)

    assert asyncio.run(main()) == references[PROMPTS[0]]
    worker.shutdown(grace_seconds=1)


def test_requests_the_engine_has_not_taken_yet_count_as_waiting(tiny_target, tiny_draft):
    """/health said running 1, waiting 0 with 4 in flight: the 3 submitted during a long step
    were in neither count."""
    engine = make_engine(tiny_target, tiny_draft, slots=1)
    worker = EngineWorker(engine, max_waiting=8)  # not started: the engine thread takes nothing
    for prompt in PROMPTS[:3]:
        worker.submit(GenerationRequest(prompt, max_tokens=4))
    assert (engine.num_waiting, worker.num_waiting, worker.in_flight) == (0, 3, 3)
    worker._take_commands(block=False)  # what the engine thread does between steps
    assert worker.num_waiting == engine.num_waiting == 3


def test_capacity_is_bounded(tiny_target, tiny_draft):
    worker = EngineWorker(make_engine(tiny_target, tiny_draft, slots=1), max_waiting=1)  # not started
    worker.submit(GenerationRequest(PROMPTS[0], max_tokens=4))
    worker.submit(GenerationRequest(PROMPTS[1], max_tokens=4))
    with pytest.raises(QueueFullError) as error:
        worker.submit(GenerationRequest(PROMPTS[2], max_tokens=4))
    assert error.value.retry_after_seconds == 1  # no request has finished yet: nothing to go by


def test_retry_after_follows_how_often_requests_finish(tiny_target, tiny_draft):
    """A 429's Retry-After is the interval at which places free (it was always 1 s, so clients
    at a slow server retried dozens of times a request)."""
    assert retry_after_seconds([]) == retry_after_seconds([5.0]) == 1
    assert retry_after_seconds([0.0, 4.0, 8.0, 12.0]) == 4
    assert retry_after_seconds([0.0, 0.1, 0.2]) == 1
    assert retry_after_seconds([0.0, 600.0]) == 60
    assert retry_after_seconds([0.0, 4.0, 8.0, 10_000.0, 10_004.0, 10_008.0]) == 4  # an idle spell is not a pace
    worker = EngineWorker(make_engine(tiny_target, tiny_draft, slots=1), max_waiting=0).start()
    for prompt in PROMPTS[:3]:  # one at a time: each finish is recorded
        collect_sync(worker.submit(GenerationRequest(prompt, max_tokens=4)))
    assert len(worker._finish_times) == 3
    last = worker._finish_times[-1]
    worker._finish_times.extend(last + 7.5 * i for i in range(1, 5))  # as if four more came 7.5 s apart
    long = worker.submit(GenerationRequest(PROMPTS[0], max_tokens=10_000))
    with pytest.raises(QueueFullError) as error:
        worker.submit(GenerationRequest(PROMPTS[1], max_tokens=4))
    assert error.value.retry_after_seconds == retry_after_seconds(worker._finish_times) == 8
    long.cancel()
    worker.shutdown(grace_seconds=1)


def test_cancel_and_shutdown_end_every_request(tiny_target, tiny_draft):
    worker = EngineWorker(make_engine(tiny_target, tiny_draft, slots=1), max_waiting=4).start()
    long = [worker.submit(GenerationRequest(p, max_tokens=10_000)) for p in PROMPTS[:3]]
    long[0].cancel()
    assert collect_sync(long[0])[1].finish_reason in ("cancelled", "length", "stop")
    worker.shutdown(grace_seconds=0.2)
    for handle in long[1:]:
        assert collect_sync(handle, timeout=5)[1].finished
    with pytest.raises(EngineStoppedError):
        worker.submit(GenerationRequest(PROMPTS[0], max_tokens=4))


def test_a_request_the_engine_can_never_run_is_refused_on_submit(tiny_target, tiny_draft):
    from tandem.errors import TandemError

    worker = EngineWorker(make_engine(tiny_target, tiny_draft, drafter="ngram", slots=1))
    with pytest.raises(TandemError, match="needs a draft model"):
        worker.submit(GenerationRequest(PROMPTS[0], max_tokens=4), SpeculationOptions("model"))
    assert worker.in_flight == 0


def test_start_frees_the_starting_threads_openmp_team_before_the_engine_thread_runs(tiny_target, tiny_draft,
                                                                                   monkeypatch):
    """The models' first work ran on this thread; the engine thread must be the only one with an
    OpenMP team, or llama.cpp's barriers stop spinning (models/openmp.py)."""
    import threading

    import tandem.engine.worker as worker_module

    calls = []
    monkeypatch.setattr(worker_module, "release_openmp_threads",
                        lambda: calls.append((threading.current_thread(), worker._thread.is_alive())))
    worker = EngineWorker(make_engine(tiny_target, tiny_draft, slots=1))
    worker.start()
    assert calls == [(threading.main_thread(), False)]
    worker.shutdown(grace_seconds=1)


def test_the_engine_is_closed_once_however_often_the_worker_shuts_down(tiny_target, tiny_draft):
    """A drain then the server's own close both shut the worker down: the engine (whose close
    writes the disk tier) is closed once."""
    engine = make_engine(tiny_target, tiny_draft, slots=2)
    closes = []
    engine.close = lambda: closes.append(1)
    worker = EngineWorker(engine, max_waiting=8).start()
    worker.shutdown(grace_seconds=1)
    worker.shutdown(grace_seconds=0)
    assert closes == [1]


def test_a_cancel_on_an_idle_engine_reaches_the_queue_observers(tiny_target, tiny_draft):
    """After the last running request is cancelled the engine takes no step, so no report says
    running 0: the worker tells its queue observers, once per change. The engine thread's loop
    is driven by hand here (the worker is not started), so the request cannot end by itself first."""
    heard = []
    worker = EngineWorker(make_engine(tiny_target, tiny_draft, slots=1),
                          queue_observers=[lambda running, waiting: heard.append((running, waiting))])
    handle = worker.submit(GenerationRequest(PROMPTS[0], max_tokens=64))

    def loop_once():  # one pass of EngineWorker._run
        worker._take_commands(block=False)
        worker._tell_queue()
        if worker.engine.has_work:
            worker._step()

    loop_once()
    assert heard == [(0, 1)] and worker.last_report.running == 1  # admitted by the step, which reports it
    loop_once()
    handle.cancel()
    loop_once()
    loop_once()
    assert heard == [(0, 1), (0, 0)] and not worker.engine.has_work
    assert collect_sync(handle, timeout=1)[1].finish_reason == "cancelled"


def test_a_steps_updates_reach_a_loop_in_one_wake_up(tiny_target, tiny_draft, references):
    """Every step's updates for the streams of one event loop arrive in one callback (each
    wake-up is a pipe write and a thread switch), each stream's in order and complete."""
    wake_ups = []

    class CountingLoop(asyncio.SelectorEventLoop):
        def call_soon_threadsafe(self, callback, *args, **kwargs):
            wake_ups.append(len(args[0]) if args and isinstance(args[0], list) else 1)
            return super().call_soon_threadsafe(callback, *args, **kwargs)

    engine = make_engine(tiny_target, tiny_draft, slots=3)
    worker = EngineWorker(engine, max_waiting=8)  # started once all three are in: they step together

    async def main():
        handles = [worker.submit(GenerationRequest(p, max_tokens=MAX_TOKENS), SpeculationOptions("none"))
                   for p in PROMPTS[:3]]
        worker.start()
        return await asyncio.gather(*(collect_async(handle) for handle in handles))

    loop = CountingLoop()
    try:
        outputs = loop.run_until_complete(main())
    finally:
        loop.close()
    worker.shutdown(grace_seconds=1)
    assert outputs == [references[p] for p in PROMPTS[:3]]
    assert max(wake_ups) == 3  # the three streams' updates of a step in one wake-up
    assert len(wake_ups) <= MAX_TOKENS + 2  # a wake-up a step, not one a stream and step


def test_loops_are_woken_by_the_handover_thread_not_the_engines(tiny_target, tiny_draft, references):
    """A wake-up lets go of the interpreter, and the woken loop kept it for its whole turn while
    the engine waited: the engine's thread never wakes a loop itself."""
    wakers = []

    class RecordingLoop(asyncio.SelectorEventLoop):
        def call_soon_threadsafe(self, callback, *args, **kwargs):
            wakers.append(threading.current_thread().name)
            return super().call_soon_threadsafe(callback, *args, **kwargs)

    worker = EngineWorker(make_engine(tiny_target, tiny_draft, slots=2), max_waiting=8).start()

    async def main():
        handles = [worker.submit(GenerationRequest(p, max_tokens=MAX_TOKENS), SpeculationOptions("none"))
                   for p in PROMPTS[:2]]
        return await asyncio.gather(*(collect_async(handle) for handle in handles))

    loop = RecordingLoop()
    try:
        outputs = loop.run_until_complete(main())
    finally:
        loop.close()
    worker.shutdown(grace_seconds=1)
    assert outputs == [references[p] for p in PROMPTS[:2]]
    assert wakers and set(wakers) == {"tandem-handover"}


def test_a_steps_updates_are_handed_over_at_the_next_model_call_or_when_idle(tiny_target, tiny_draft, references):
    """The engine's loop driven by hand: a step's updates wait while the engine has more to do,
    go as the next step calls the model (before its own updates exist), and the last ones go
    once the engine has nothing left."""
    worker = EngineWorker(make_engine(tiny_target, tiny_draft, slots=1))  # not started
    handle = worker.submit(GenerationRequest(PROMPTS[0], max_tokens=3), SpeculationOptions("none"))
    calls = []
    inner = worker.engine.target.forward_batch
    worker.engine.target.forward_batch = lambda items, views=False: (calls.append(handle._queue.qsize()), inner(items, views))[1]

    worker._take_commands(block=False)
    worker._step()  # the prompt's step: its first token is held
    assert handle._queue.qsize() == 0 and worker.engine.has_work
    worker._step()  # handed over as this step called the model
    assert calls == [0, 1] and handle._queue.qsize() == 1
    while worker.engine.has_work:
        worker._step()
    assert handle._queue.qsize() == 2  # the finishing step's update is still held ...
    worker.start()  # ... until the engine's thread finds nothing to do
    tokens, last = collect_sync(handle, timeout=5)
    worker.shutdown(grace_seconds=1)
    assert tokens == references[PROMPTS[0]][:3] and last.finished
