"""The engine used from Python (what `tandem generate` does, by a library's user): misuse is a
TandemError, never a hang, a process abort or an engine left broken; an abandoned or cancelled
request leaves nothing behind."""

import threading

import pytest
from engine_support import make_engine

from tandem.engine.request import GenerationRequest
from tandem.engine.run_request import generate, stream_tokens
from tandem.engine.stats import GenerationStats
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


def test_an_id_outside_the_vocabulary_is_refused_and_the_engine_goes_on(tiny_target, tiny_draft):
    """llama.cpp hung for ever on one."""
    engine = make_engine(tiny_target, tiny_draft, slots=1)
    with pytest.raises(TandemError, match="outside the model's vocabulary"):
        generate(engine, GenerationRequest((5, engine.vocab_size), 4))
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
        engine.cancel(next(iter(engine.running)))
    assert len(chunks) == 1 and stats.finish_reason == "cancelled" and not engine.has_work


def test_two_threads_stepping_one_engine_get_an_error_not_an_abort(tiny_target, tiny_draft):
    """Three threads calling generate on one engine aborted the process inside llama.cpp."""
    engine = make_engine(tiny_target, tiny_draft, slots=2)
    engine.add("a", GenerationRequest(PROMPT, 16))
    inside, release = threading.Event(), threading.Event()
    engine.on_model_call = lambda: (inside.set(), release.wait(10))
    stepping = threading.Thread(target=engine.step)
    stepping.start()
    try:
        assert inside.wait(10)
        with pytest.raises(TandemError, match="already running on another thread"):
            engine.step()
    finally:
        release.set()
        stepping.join(10)
    engine.on_model_call = None
    engine.step()  # the lock was let go


@pytest.mark.parametrize("fields, says", [
    ({"context_length": 10}, "at least 64 tokens"), ({"context_length": "4096"}, "context length"),
    ({"threads": "1"}, "threads"), ({"threads": 0}, "threads"), ({"model": None}, "catalog name"),
])
def test_a_runner_spec_that_cannot_run_is_refused_when_made(fields, says):
    """A 10-token context aborted the process inside llama.cpp (GGML_ASSERT); "1" thread failed
    deep in llama.cpp; None became the model "None"."""
    with pytest.raises(TandemError, match=says):
        RunnerSpec(**({"model": "m"} | fields))
