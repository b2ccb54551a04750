"""Server-sent events for streaming responses: `data: {json}\\n\\n` chunks, then `data: [DONE]`.

A stream is: (chat only) an opening chunk with the assistant role, one chunk per text delta, a
chunk with the finish_reason, a usage chunk when `stream_options.include_usage`, then [DONE]. An
engine failure mid-stream becomes one `data: {"error": {...}}` event before [DONE].

`ClosingStreamingResponse` closes its event generator however the response ends, so a client that
disconnects mid-stream has its sequence cancelled at once, not whenever the generator is collected
(and `on_close` covers a client that left before the generator ever started).

Deadlines (--request-timeout): the live events wait for each delta only until the deadline, then
cancel the sequence and send a timeout error event and [DONE]. A client that stops reading blocks
the response in `send` instead (the engine has long finished: its updates queue in memory, its KV
slot is free); STUCK_WRITER_GRACE_S after the deadline the response gives up and the connection
is closed.
"""

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import aclosing

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from tandem.serve.api.engine_stream import EngineFailure, GenerationRun
from tandem.serve.api.errors import request_timed_out
from tandem.serve.api.responses import ResponseShape
from tandem.text.stream import TextStream

log = logging.getLogger(__name__)
DONE = b"data: [DONE]\n\n"
STUCK_WRITER_GRACE_S = 1.0  # past the deadline, how long a response blocked on a silent reader lives
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def sse(data: dict) -> bytes:
    return f"data: {json.dumps(data, ensure_ascii=False, separators=(',', ':'))}\n\n".encode()


class ClosingStreamingResponse(StreamingResponse):
    def __init__(self, events: AsyncIterator[bytes], on_close: Iterable[Callable[[], None]] = (),
                 deadline: float | None = None):
        super().__init__(events, media_type="text/event-stream", headers=SSE_HEADERS)
        self.on_close = tuple(on_close)  # run last, also when the client left before the first event
        self.deadline = deadline  # time.perf_counter() seconds; None: none

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        left = None if self.deadline is None else self.deadline + STUCK_WRITER_GRACE_S - time.perf_counter()
        try:
            async with asyncio.timeout(left):
                await super().__call__(scope, receive, send)
        except TimeoutError:  # the client stopped reading: uvicorn closes the connection
            log.warning("closed a stream whose client stopped reading (past --request-timeout)")
        finally:
            await self.body_iterator.aclose()
            for close in self.on_close:
                close()


async def generation_events(run: GenerationRun, shape: ResponseShape,
                            on_complete: Callable[[GenerationRun], Awaitable[None]],
                            deadline: float | None = None) -> AsyncIterator[bytes]:
    """The events of a live generation; `on_complete` runs after [DONE] when it finished cleanly.
    Each delta is awaited only until `deadline` (never across a yield, which would cancel the send)."""
    opening = shape.opening_chunk()
    if opening is not None:
        yield sse(opening)
    try:
        async with aclosing(run.deltas()) as deltas:
            while True:
                left = None if deadline is None else max(0.0, deadline - time.perf_counter())
                try:
                    async with asyncio.timeout(left):
                        delta = await anext(deltas)
                except StopAsyncIteration:
                    break
                yield sse(shape.text_chunk(delta))
    except TimeoutError:  # the sequence was cancelled as the deltas stopped
        error = request_timed_out()
    except EngineFailure as failure:  # cancelled by a shutdown, or the engine failed
        error = failure.api_error()
    else:
        error = None
    if error is not None:  # the tokens generated so far are counted first: the openai client stops at the error
        if shape.include_usage:
            yield sse(shape.usage_chunk(run.usage()))
        yield sse(error.body())
        yield DONE
        return
    yield sse(shape.final_chunk(run.finish_reason))
    if shape.include_usage:
        yield sse(shape.usage_chunk(run.usage()))
    yield DONE
    await on_complete(run)


def replayed_text(token_ids: list[int], decode, stop_strings: tuple[str, ...]) -> str:
    """The text a replay of these tokens streams, token by token as `replay_events` does (what a
    live answer's text is)."""
    stream = TextStream(decode, list(stop_strings))
    return "".join(stream.push([token_id]) for token_id in token_ids) + stream.finish()


async def replay_events(cached: dict, shape: ResponseShape, decode,
                        stop_strings: tuple[str, ...]) -> AsyncIterator[bytes]:
    """A cached answer streamed token by token, with the same text deltas a live stream shows."""
    opening = shape.opening_chunk()
    if opening is not None:
        yield sse(opening)
    stream = TextStream(decode, list(stop_strings))
    for token_id in cached["token_ids"]:
        delta = stream.push([token_id])
        if delta:
            yield sse(shape.text_chunk(delta))
    tail = stream.finish()
    if tail:
        yield sse(shape.text_chunk(tail))
    yield sse(shape.final_chunk(cached["finish_reason"]))
    if shape.include_usage:
        yield sse(shape.usage_chunk(cached["usage"]))
    yield DONE
