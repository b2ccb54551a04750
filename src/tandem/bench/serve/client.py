"""One streamed chat completion, timed: a `RequestRecord` per request, never an exception.

Times are `time.perf_counter` seconds from just before the request is sent. A token chunk is a
stream chunk with non-empty content. TTFT = first token chunk - send; inter-token latencies
(ITL) = gaps between consecutive token chunks (a server that streams several tokens in one chunk
shows fewer, longer gaps); e2e = end of stream - send. Completion tokens come from the usage
chunk when the server sends one, else they are the count of token chunks; they are the answer's
tokens, so where a server's usage also counts the end-of-sequence token it sampled (llama-server's
does, Tandem's does not) `answer_tokens_only` takes it off an answer that ended by itself. TPOT (time per output
token after the first) = (last token chunk - first token chunk) / (completion tokens - 1).
Cached prompt tokens come from the usage chunk's `prompt_tokens_details.cached_tokens` (OpenAI's
field; None where a server does not send it). The answer's text is kept for multi-turn
workloads, which send it back as the next turn's history.
"""

import time
from dataclasses import dataclass, replace

import httpx

from tandem.bench.serve.sse import DONE, parse_chunk, sse_payloads

MAX_ERROR_CHARS = 300


@dataclass(frozen=True, slots=True)
class RequestRecord:
    prompt_id: str
    category: str
    ok: bool
    error: str | None = None
    ttft_s: float | None = None  # None when no token chunk arrived
    e2e_s: float | None = None
    itl_s: tuple[float, ...] = ()
    token_chunks: int = 0
    completion_tokens: int = 0
    tokens_from_usage: bool = False
    drafted: int | None = None  # usage.speculative, where the server reports it
    accepted: int | None = None
    finish_reason: str | None = None
    cached_tokens: int | None = None  # usage.prompt_tokens_details.cached_tokens, where sent
    prompt_tokens: int | None = None
    text: str = ""  # the streamed answer
    sent_s: float | None = None  # when it was sent, seconds from the run's start (set by the load generator)

    @property
    def tpot_s(self) -> float | None:
        if self.completion_tokens < 2 or not self.itl_s:
            return None
        return sum(self.itl_s) / (self.completion_tokens - 1)


def build_record(prompt_id: str, category: str, start: float, end: float, token_times: list[float],
                 usage: dict | None, finish_reason: str | None, text: str = "") -> RequestRecord:
    """A successful request's record from its send time, end time and token-chunk arrival times."""
    speculative = (usage or {}).get("speculative") or {}
    usage_tokens = (usage or {}).get("completion_tokens")
    cached = ((usage or {}).get("prompt_tokens_details") or {}).get("cached_tokens")
    prompt_tokens = (usage or {}).get("prompt_tokens")
    return RequestRecord(
        prompt_id, category, ok=True,
        ttft_s=token_times[0] - start if token_times else None,
        e2e_s=end - start,
        itl_s=tuple(b - a for a, b in zip(token_times, token_times[1:])),
        token_chunks=len(token_times),
        completion_tokens=int(usage_tokens) if usage_tokens is not None else len(token_times),
        tokens_from_usage=usage_tokens is not None,
        drafted=speculative.get("drafted_tokens"),
        accepted=speculative.get("accepted_tokens"),
        finish_reason=finish_reason,
        cached_tokens=int(cached) if isinstance(cached, (int, float)) else None,
        prompt_tokens=int(prompt_tokens) if isinstance(prompt_tokens, (int, float)) else None,
        text=text,
    )


def answer_tokens_only(record: RequestRecord) -> RequestRecord:
    """The record of a server whose usage counts the end-of-sequence token, counted as the answer's
    tokens: one fewer where the answer ended by itself (finish_reason "stop"; the benchmarks send
    no stop strings), else as it was."""
    if not (record.ok and record.tokens_from_usage and record.finish_reason == "stop" and record.completion_tokens):
        return record
    return replace(record, completion_tokens=record.completion_tokens - 1)


def failed(prompt_id: str, category: str, error: str, start: float) -> RequestRecord:
    return RequestRecord(prompt_id, category, ok=False, error=error[:MAX_ERROR_CHARS],
                         e2e_s=time.perf_counter() - start)


async def stream_chat(client: httpx.AsyncClient, url: str, payload: dict, prompt_id: str = "",
                      category: str = "") -> RequestRecord:
    """POST `payload` (with `stream: true`) to `url` and time the streamed answer."""
    start = time.perf_counter()
    token_times: list[float] = []
    texts: list[str] = []
    usage = finish_reason = None
    try:
        async with client.stream("POST", url, json=payload) as response:
            if response.status_code != 200:
                body = (await response.aread()).decode("utf-8", errors="replace")
                return failed(prompt_id, category, f"HTTP {response.status_code}: {body}", start)
            async for data in sse_payloads(response.aiter_lines()):
                now = time.perf_counter()
                if data == DONE:
                    break
                chunk = parse_chunk(data)
                if chunk.error:
                    return failed(prompt_id, category, chunk.error, start)
                if chunk.text:
                    token_times.append(now)
                    texts.append(chunk.text)
                usage = chunk.usage or usage
                finish_reason = chunk.finish_reason or finish_reason
    except httpx.HTTPError as error:
        return failed(prompt_id, category, f"{type(error).__name__}: {error}", start)
    return build_record(prompt_id, category, start, time.perf_counter(), token_times, usage, finish_reason,
                        "".join(texts))
