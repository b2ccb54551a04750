"""Server-sent events from an OpenAI-compatible streaming endpoint, parsed into chunks.

An event is one or more `data:` lines ended by a blank line; lines starting with `:` are comments
(keep-alive pings) and other fields (`event:`, `id:`, `retry:`) are ignored. The payload
`[DONE]` ends the stream. Every other payload is a `chat.completion.chunk` JSON object: its
`choices[0].delta.content` is the streamed text, a chunk with `usage` carries the token counts
(`usage.speculative.{drafted_tokens, accepted_tokens}` where the server speculates), and a chunk
with `error` reports a failure mid-stream.
"""

import json
from dataclasses import dataclass
from typing import AsyncIterable, AsyncIterator

DONE = "[DONE]"


@dataclass(frozen=True, slots=True)
class StreamChunk:
    text: str = ""  # streamed content; "" for role-only, finish and usage chunks
    finish_reason: str | None = None
    usage: dict | None = None
    error: str | None = None


class SseDecoder:
    """Feed lines one at a time; `feed` returns the payloads of the events they complete."""

    def __init__(self):
        self._data: list[str] = []

    def feed(self, line: str) -> list[str]:
        line = line.rstrip("\r")
        if not line:
            return self.flush()
        if line.startswith(":"):
            return []
        field, _, value = line.partition(":")
        if field == "data":
            self._data.append(value[1:] if value.startswith(" ") else value)
        return []

    def flush(self) -> list[str]:
        """The pending event's payload, if any (also called at the end of the stream)."""
        if not self._data:
            return []
        payload, self._data = "\n".join(self._data), []
        return [payload]


async def sse_payloads(lines: AsyncIterable[str]) -> AsyncIterator[str]:
    """Event payloads from an async stream of lines, the last one flushed at the end."""
    decoder = SseDecoder()
    async for line in lines:
        for payload in decoder.feed(line):
            yield payload
    for payload in decoder.flush():
        yield payload


def parse_chunk(payload: str) -> StreamChunk:
    """One event payload (not `[DONE]`) as a chunk; malformed JSON becomes an error chunk."""
    try:
        data = json.loads(payload)
    except json.JSONDecodeError:
        return StreamChunk(error=f"malformed stream chunk: {payload[:200]!r}")
    if not isinstance(data, dict):
        return StreamChunk(error=f"unexpected stream chunk: {payload[:200]!r}")
    if "error" in data:
        error = data["error"]
        return StreamChunk(error=str(error.get("message", error) if isinstance(error, dict) else error))
    choices = data.get("choices") or [{}]
    choice = choices[0] if isinstance(choices[0], dict) else {}
    delta = choice.get("delta") or {}
    usage = data.get("usage") if isinstance(data.get("usage"), dict) else None
    return StreamChunk(str(delta.get("content") or ""), choice.get("finish_reason"), usage)
