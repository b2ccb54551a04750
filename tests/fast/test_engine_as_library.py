"""The engine used from Python (what `tandem generate` does, by a library's user): misuse is a
TandemError, never a hang, a process abort or an engine left broken; an abandoned or cancelled
request leaves nothing behind."""

import threading

import numpy as np
import pytest
from engine_support import collect_sync, make_engine

from tandem.engine.request import GenerationRequest
from tandem.engine.run_request import generate, stream_tokens
from tandem.engine.stats import GenerationStats
from tandem.engine.worker import EngineWorker
from tandem.errors import TandemError
from tandem.models.backends import RunnerSpec

PROMPT = (5, 17, 33, 2, 9, 41, 5, 17)


@pytest.mark.parametrize("prompt_ids, says", [
    ("hello", "not text"), ((750.0, 1.5), "non-negative integers"), (("1", "2"), "non-negative integers"),
    ((750, -5), "non-negative integers"), ((True, 3), "non-negative integers"),
])
def test_prompt_ids_that_are_no_token_ids_are_refused(prompt_ids, says):
    """A float or a string reached llama.cpp's batch and failed the step of every request in it."""
    with pytest.raises(TandemError, match=says):
        GenerationRequest(prompt_ids, 8)
    with pytest.raises(TandemError, match="max tokens"):
        GenerationRequest(PROMPT, True)


def test_lists_and_numpy_arrays_of_ids_become_a_tuple_of_ints():
    """A numpy array raised numpy's own ValueError ("truth value ... is ambiguous")."""
    import numpy as np

    for ids in ([5, 17], np.array([5, 17], np.int64), (np.uint8(5), np.int32(17)), (5, np.int64(17))):
        request = GenerationRequest(ids, 4)
        assert request.prompt_ids == (5, 17) and all(type(token) is int for token in request.prompt_ids)
    with pytest.raises(TandemError, match="empty"):
        GenerationRequest(np.array([], np.int64), 4)
    with pytest.raises(TandemError, match="1-D array"):
        GenerationRequest(np.array([[5, 17]]), 4)
    with pytest.raises(TandemError, match="non-negative integers"):  # numpy's "inhomogeneous shape" before
        GenerationRequest([1, [2, 3]], 4)


def test_an_id_outside_the_vocabulary_is_refused_and_the_engine_goes_on(tiny_target, tiny_draft):
    """llama.cpp hung for ever on one."""
    engine = make_engine(tiny_target, tiny_draft, slots=1)
    with pytest.raises(TandemError, match="outside the model's vocabulary"):
        generate(engine, GenerationRequest((5, engine.target.vocab_size), 4))
    tokens, stats = generate(engine, GenerationRequest(PROMPT, 4))
    assert len(tokens) == 4 and not engine.has_work


def test_leaving_a_stream_early_cancels_its_request(tiny_target, tiny_draft):
    """Closing the iterator left the request running: it held its slot and was stepped by the
    next caller's generate."""
    engine = make_engine(tiny_target, tiny_draft, slots=1)
    tokens = stream_tokens(engine, GenerationRequest(PROMPT, 32), GenerationStats())
    next(tokens)
    tokens.close()
    assert not engine.has_work and engine.kv_slots_in_use == 0


def test_cancelling_a_streamed_request_ends_its_stream(tiny_target, tiny_draft):
    """The cancel's update went to whoever called cancel: the stream stepped on for ever."""
    engine = make_engine(tiny_target, tiny_draft, slots=1)
    stats = GenerationStats()
    chunks = []
    for chunk in stream_tokens(engine, GenerationRequest(PROMPT, 32), stats):
        chunks.append(chunk)
        assert len(chunks) < 3, "the cancelled stream went on"
        engine.cancel(stats.seq_id)
    assert len(chunks) == 1 and stats.finish_reason == "cancelled" and not engine.has_work


def test_a_second_thread_using_a_busy_engine_gets_an_error_not_an_abort(tiny_target, tiny_draft):
    """Threads calling generate on one engine aborted the process inside llama.cpp: the second
    one's add and step ran beside the first one's model call. The first request is untouched."""
    engine = make_engine(tiny_target, tiny_draft, slots=2)
    alone, _ = generate(engine, GenerationRequest(PROMPT, 16))
    inside, release = threading.Event(), threading.Event()
    engine.on_model_call = lambda: (inside.set(), release.wait(10))
    first: list = []
    thread = threading.Thread(target=lambda: first.append(generate(engine, GenerationRequest(PROMPT, 16))[0]))
    thread.start()
    try:
        assert inside.wait(10)
        with pytest.raises(TandemError, match="in use on another thread"):
            generate(engine, GenerationRequest(PROMPT, 4))
        with pytest.raises(TandemError, match="in use on another thread"):
            engine.step()
        for touch in (lambda: engine.add("b", GenerationRequest(PROMPT, 4)), lambda: engine.cancel("b"),
                      engine.clear_caches):  # beside a model call, as racy as a step
            with pytest.raises(TandemError, match="in use on another thread"):
                touch()
    finally:
        release.set()
        thread.join(10)
    engine.on_model_call = None
    assert first == [alone] and not engine.has_work
    assert generate(engine, GenerationRequest(PROMPT, 16))[0] == alone  # let go once the first finished


def test_an_engine_worker_holds_its_engine_for_its_life(tiny_target, tiny_draft):
    engine = make_engine(tiny_target, tiny_draft, slots=1)
    worker = EngineWorker(engine).start()
    try:
        handle = worker.submit(GenerationRequest(PROMPT, 4))
        collect_sync(handle)
        with pytest.raises(TandemError, match="in use on another thread"):
            generate(engine, GenerationRequest(PROMPT, 4))
    finally:
        worker.shutdown(grace_seconds=1)
    assert len(generate(engine, GenerationRequest(PROMPT, 4))[0]) == 4  # after shutdown, this thread's


@pytest.mark.parametrize("fields, says", [
    ({"context_length": 10}, "at least 64 tokens"), ({"context_length": "4096"}, "context length"),
    ({"threads": "1"}, "threads"), ({"threads": 0}, "threads"), ({"model": None}, "catalog name"),
])
def test_a_runner_spec_that_cannot_run_is_refused_when_made(fields, says):
    """A 10-token context aborted the process inside llama.cpp (GGML_ASSERT); "1" thread failed
    deep in llama.cpp; None became the model "None"."""
    with pytest.raises(TandemError, match=says):
        RunnerSpec(**({"model": "m"} | fields))


def test_a_handle_read_the_wrong_way_or_past_its_end_says_so(tiny_target, tiny_draft):
    """Reading a loop's handle synchronously, or a thread's with await, was a raw TypeError; a
    read after the last update waited for ever; a timeout was a bare queue.Empty."""
    import asyncio

    engine = make_engine(tiny_target, tiny_draft, slots=1)
    worker = EngineWorker(engine).start()
    try:
        handle = worker.submit(GenerationRequest(PROMPT, 4))
        collect_sync(handle)
        with pytest.raises(TandemError, match="has finished"):
            handle.next_update_sync(timeout=1)
        with pytest.raises(TandemError, match="next_update_sync"):
            asyncio.run(handle.next_update())

        async def on_a_loop():
            looped = worker.submit(GenerationRequest(PROMPT, 4))
            with pytest.raises(TandemError, match="await handle.next_update"):
                looped.next_update_sync(timeout=1)
            while not looped.finished:
                await looped.next_update()

        asyncio.run(on_a_loop())
        waiting = worker.submit(GenerationRequest(PROMPT, 64))
        with pytest.raises(TimeoutError, match="within 0.001 s"):
            for _ in range(64):
                waiting.next_update_sync(timeout=0.001)
    finally:
        worker.shutdown(grace_seconds=0)
    with pytest.raises(TandemError, match="already started"):  # it left a stray handover thread
        worker.start()


def test_a_stream_closed_on_another_thread_lets_the_engine_go(tiny_target, tiny_draft):
    """An RLock taken by the streaming thread could not be released by another: closing the
    stream elsewhere (or the garbage collector doing it) raised and left the engine held."""
    engine = make_engine(tiny_target, tiny_draft, slots=1)
    tokens = stream_tokens(engine, GenerationRequest(PROMPT, 32), GenerationStats())
    next(tokens)
    closer = threading.Thread(target=tokens.close)
    closer.start()
    closer.join(10)
    assert not engine.has_work
    assert len(generate(engine, GenerationRequest(PROMPT, 4))[0]) == 4


def test_a_stream_inside_a_stream_is_refused(tiny_target, tiny_draft):
    """Each stepped the other's request and dropped its tokens."""
    engine = make_engine(tiny_target, tiny_draft, slots=2)
    outer = stream_tokens(engine, GenerationRequest(PROMPT, 16), GenerationStats())
    next(outer)
    with pytest.raises(TandemError, match="already running a stream_tokens or generate request"):
        generate(engine, GenerationRequest(PROMPT, 4))
    assert len([t for chunk in outer for t in chunk]) > 0 and not engine.has_work


def test_a_worker_whose_engine_another_thread_holds_does_not_start(tiny_target, tiny_draft):
    """start() returned, every submit was then refused as "shutting down", and its shutdown
    closed an engine the other thread was stepping."""
    engine = make_engine(tiny_target, tiny_draft, slots=1)
    tokens = stream_tokens(engine, GenerationRequest(PROMPT, 16), GenerationStats())
    next(tokens)
    worker = EngineWorker(engine)
    closed = []
    engine.close = lambda: closed.append(True)
    with pytest.raises(TandemError, match="in use on another thread"):
        worker.start()
    worker.shutdown(grace_seconds=0)
    assert not closed and [t for chunk in tokens for t in chunk]


class RaisingStop:
    """A library user's stop condition with a bug: it raises once the output holds 3 tokens."""

    def tokens_to_keep(self, output_ids):
        if len(output_ids) >= 3:
            raise KeyError("no such marker")
        return None


class WrongAnswerStop:
    """One that answers a string where a count is due."""

    def tokens_to_keep(self, output_ids):
        return "all"


@pytest.mark.parametrize("condition, says", [(RaisingStop(), "raised KeyError: 'no such marker'"),
                                             (WrongAnswerStop(), "returned 'all'")])
def test_a_failing_stop_condition_ends_its_request_alone(tiny_target, tiny_draft, condition, says):
    """It raised out of the step: the worker failed every request in the batch with it."""
    engine = make_engine(tiny_target, tiny_draft, slots=2)
    alone, _ = generate(engine, GenerationRequest(PROMPT, 12))
    worker = EngineWorker(engine).start()
    try:
        failing = worker.submit(GenerationRequest(PROMPT, 12, stop_condition=condition))
        healthy = worker.submit(GenerationRequest(PROMPT, 12))
        _, last = collect_sync(failing)
        assert last.finish_reason == "error" and says in last.error
        tokens, last = collect_sync(healthy)
        assert last.finish_reason == "length" and tokens == alone
    finally:
        worker.shutdown(grace_seconds=1)
    with pytest.raises(TandemError, match="stop condition"):
        generate(engine, GenerationRequest(PROMPT, 12, stop_condition=condition))
    assert not engine.has_work and engine.kv_slots_in_use == 0
    assert generate(engine, GenerationRequest(PROMPT, 12))[0] == alone


@pytest.mark.parametrize("fields, says", [
    ({"sampling": None}, "SamplingParams"), ({"sampling": {"temperature": 0}}, "SamplingParams"),
    ({"stop_token_ids": None}, "1-D array of token ids"), ({"stop_token_ids": 2}, "1-D array of token ids"),
    ({"stop_token_ids": np.array(3)}, "1-D array of token ids"),
    ({"stop_token_ids": ["2"]}, "non-negative integers"), ({"stop_condition": "\n\n"}, "tokens_to_keep"),
])
def test_a_request_field_of_the_wrong_kind_is_refused_when_made(fields, says):
    """sampling=None killed a worker's engine thread (every request then hung); stop_token_ids=None
    failed the step of every request beside it."""
    with pytest.raises(TandemError, match=says):
        GenerationRequest(PROMPT, 4, **fields)
    assert GenerationRequest(PROMPT, 4, stop_token_ids=[3, 4]).stop_token_ids == frozenset({3, 4})


def test_a_failure_adding_one_request_leaves_the_worker_serving(tiny_target, tiny_draft, monkeypatch):
    """Only a TandemError from engine.add was caught: anything else ended the engine thread, and
    every request in flight or sent later waited for ever."""
    engine = make_engine(tiny_target, tiny_draft, slots=1)
    worker = EngineWorker(engine).start()
    add = engine.add

    def add_failing_once(seq_id, request, options):
        if request.max_tokens == 3:
            raise AttributeError("a bug")
        return add(seq_id, request, options)

    monkeypatch.setattr(engine, "add", add_failing_once)
    try:
        tokens, last = collect_sync(worker.submit(GenerationRequest(PROMPT, 3)))
        assert tokens == [] and last.finish_reason == "error" and "a bug" in last.error
        tokens, last = collect_sync(worker.submit(GenerationRequest(PROMPT, 4)))
        assert len(tokens) == 4 and last.finish_reason == "length"
    finally:
        worker.shutdown(grace_seconds=0)


def test_options_none_is_the_engines_and_another_kind_is_refused(tiny_target, tiny_draft):
    """Library.md says None is the engine's: it was an AttributeError from deep inside."""
    from tandem.engine.events import SpeculationOptions

    engine = make_engine(tiny_target, tiny_draft, slots=1)
    assert generate(engine, GenerationRequest(PROMPT, 4), None)[0] == generate(engine, GenerationRequest(PROMPT, 4))[0]
    with pytest.raises(TandemError, match="SpeculationOptions"):
        generate(engine, GenerationRequest(PROMPT, 4), {"drafter": "ngram"})
    engine.validate(GenerationRequest(PROMPT, 4), None)  # the engine's own entry points too
    with pytest.raises(TandemError, match="SpeculationOptions"):
        engine.add("x", GenerationRequest(PROMPT, 4), "ngram")
    with pytest.raises(TandemError, match="a drafter is a name"):
        SpeculationOptions(drafter="")  # it fell back to the engine's drafter without a word
    worker = EngineWorker(engine).start()
    try:
        assert len(collect_sync(worker.submit(GenerationRequest(PROMPT, 4), None))[0]) == 4
        with pytest.raises(TandemError, match="timeout"):
            worker.submit(GenerationRequest(PROMPT, 4)).next_update_sync(timeout=-1)
    finally:
        worker.shutdown(grace_seconds=0)
    with pytest.raises(TandemError, match="max_waiting"):
        EngineWorker(engine, max_waiting=-1)


def test_an_on_created_that_raises_gives_its_place_back(tiny_target, tiny_draft):
    """Its handle stayed registered: two such submits filled a worker of capacity 2 for good."""
    worker = EngineWorker(make_engine(tiny_target, tiny_draft, slots=1), max_waiting=1)  # not started

    def fails(seq_id):
        raise RuntimeError("the caller's own bookkeeping failed")

    for _ in range(3):
        with pytest.raises(RuntimeError, match="bookkeeping"):
            worker.submit(GenerationRequest(PROMPT, 4), on_created=fails)
    assert worker.in_flight == 0 and worker.num_waiting == 0
    worker.submit(GenerationRequest(PROMPT, 4))  # room for it


def test_a_handle_read_on_another_event_loop_says_so(tiny_target, tiny_draft):
    """Its updates went to the loop it was submitted on: read on a later loop it waited for ever."""
    import asyncio

    worker = EngineWorker(make_engine(tiny_target, tiny_draft, slots=1)).start()
    try:
        async def submit():
            return worker.submit(GenerationRequest(PROMPT, 4))

        handle = asyncio.run(submit())

        async def read():
            return await asyncio.wait_for(handle.next_update(), 10)  # it waited for ever

        with pytest.raises(TandemError, match="another event loop"):
            asyncio.run(read())
    finally:
        worker.shutdown(grace_seconds=0)


def test_stop_strings_take_one_string_as_one_stop():
    """"end" was read as the three stops "e", "n" and "d"; None was a raw TypeError."""
    from tandem.text.stop_strings import StopStrings
    from tandem.text.stream import TextStream

    def decode(ids):
        return "".join(chr(96 + i) for i in ids)

    assert StopStrings(decode, "end").strings == TextStream(decode, "end").stop_strings == ["end"]
    assert StopStrings(decode, None).strings == []
    with pytest.raises(TandemError, match="a string or a list of strings"):
        StopStrings(decode, 5)
