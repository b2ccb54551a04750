"""One request through the batching engine, in this thread: add it, step until it finishes.

This is all `tandem generate` and `tandem bench` run (as nano-vllm's `generate` is add-request
plus step): the same engine and step as `tandem serve`, with one running sequence.
"""

import itertools
from typing import Iterator

from tandem.engine.batch_engine import BatchEngine
from tandem.engine.events import SpeculationOptions, checked_options
from tandem.engine.request import GenerationRequest
from tandem.engine.stats import GenerationStats
from tandem.errors import TandemError

_ids = itertools.count()


def stream_tokens(engine: BatchEngine, request: GenerationRequest, stats: GenerationStats,
                  options: SpeculationOptions | None = None) -> Iterator[list[int]]:
    """Yield each step's committed token ids for this request; fill `stats` as it goes (its
    `seq_id` names the request to the engine). Closing the iterator early (`.close()`, or a
    `break` out of a loop over the call itself, which drops it) or an error in a step cancels the
    request (an error of this request alone, such as its stop condition raising, is raised here
    as a TandemError), so the engine holds nothing of it; so does `engine.cancel(stats.seq_id)`, which ends
    the iteration ("cancelled"). The calling thread holds the engine until then (another thread
    using it is a TandemError), from its first `next`; one such request at a time. Share an engine
    across threads or an event loop, or run several requests at once, through EngineWorker.
    `options` None: the engine's drafter and depth."""
    options = checked_options(options)
    with engine.exclusive():
        if engine.streaming:  # each would step the other's request and drop its tokens
            raise TandemError("this engine is already running a stream_tokens or generate request: one at a time "
                              "(several requests at once go through engine/worker.py's EngineWorker)")
        engine.streaming = True
        try:
            yield from _stream(engine, request, stats, options)
        finally:
            engine.streaming = False


def _stream(engine: BatchEngine, request: GenerationRequest, stats: GenerationStats,
            options: SpeculationOptions) -> Iterator[list[int]]:
    seq_id = stats.seq_id = f"generate-{next(_ids)}"
    engine.add(seq_id, request, options)
    stats.prompt_tokens = len(request.prompt_ids)
    finished = False
    try:
        while not finished:
            updates, report = engine.step()
            stats.record_step(report, seq_id)
            for update in updates:
                if update.seq_id != seq_id:
                    continue
                finished = update.finished
                if finished:
                    stats.finish_reason = update.finish_reason
                if update.finish_reason == "error":  # e.g. the request's own stop condition failed
                    raise TandemError(update.error or "the engine failed on this request")
                stats.new_tokens += len(update.token_ids)
                if update.token_ids:
                    yield list(update.token_ids)
            if not finished and not engine.holds(seq_id):  # cancelled by the caller between steps
                finished, stats.finish_reason = True, "cancelled"
    finally:
        if not finished:
            engine.cancel(seq_id, held_by_caller=True)


def generate(engine: BatchEngine, request: GenerationRequest,
             options: SpeculationOptions | None = None) -> tuple[list[int], GenerationStats]:
    """One request to its end, in this thread: all its generated token ids and its stats (see
    stream_tokens; `options` None: the engine's drafter and depth)."""
    stats = GenerationStats()
    output = [token for chunk in stream_tokens(engine, request, stats, options) for token in chunk]
    return output, stats
