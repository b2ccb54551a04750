"""Server-sent events for streaming responses: `data: {json}\\n\\n` chunks, then `data: [DONE]`.

A stream is: (chat only) an opening chunk with the assistant role, one chunk per text delta, a
chunk with the finish_reason, a usage chunk when `stream_options.include_usage`, then [DONE]. An
engine failure mid-stream becomes one `data: {"error": {...}}` event before [DONE].

`ClosingStreamingResponse` closes its event generator however the response ends, so a client that
disconnects mid-stream has its sequence cancelled at once, not whenever the generator is collected
(and `on_close` covers a client that left before the generator ever started).
"""

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import aclosing

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from tandem.serve.errors import error_body
from tandem.serve.generation import EngineFailure, GenerationRun
from tandem.serve.responses import ResponseShape
from tandem.text.stream import TextStream

DONE = b"data: [DONE]\n\n"
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def sse(data: dict) -> bytes:
    return f"data: {json.dumps(data, ensure_ascii=False, separators=(',', ':'))}\n\n".encode()


class ClosingStreamingResponse(StreamingResponse):
    def __init__(self, events: AsyncIterator[bytes], on_close: Callable[[], None] | None = None):
        super().__init__(events, media_type="text/event-stream", headers=SSE_HEADERS)
        self.on_close = on_close  # runs last, also when the client left before the first event

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.body_iterator.aclose()
            if self.on_close is not None:
                self.on_close()


async def generation_events(run: GenerationRun, shape: ResponseShape,
                            on_complete: Callable[[GenerationRun], Awaitable[None]]) -> AsyncIterator[bytes]:
    """The events of a live generation; `on_complete` runs after [DONE] when it finished cleanly."""
    opening = shape.opening_chunk()
    if opening is not None:
        yield sse(opening)
    try:
        async with aclosing(run.deltas()) as deltas:
            async for delta in deltas:
                yield sse(shape.text_chunk(delta))
    except EngineFailure as failure:
        kind = "server_error" if failure.finish_reason == "error" else "service_unavailable"
        yield sse(error_body(str(failure), kind, code=failure.finish_reason))
        yield DONE
        return
    yield sse(shape.final_chunk(run.finish_reason))
    if shape.include_usage:
        yield sse(shape.usage_chunk(run.usage()))
    yield DONE
    await on_complete(run)


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
