"""Streaming over SSE: framing, complete UTF-8 in every chunk, no stop string ever sent, usage
chunk, cached replays, engine errors as events, and a client that disconnects mid-stream having
its sequence cancelled at once."""

import asyncio
import json

import pytest
from api_doubles import (
    EOS,
    MODEL,
    REPLY,
    ScriptedEngine,
    TestServer,
    async_test,
    chat_body,
    completion_body,
    reply_script,
    sse_events,
)

from tandem.serve.api.streaming import ClosingStreamingResponse


def chunk_texts(events: list, kind: str) -> list[str]:
    key = (lambda c: c["delta"].get("content")) if kind == "chat" else (lambda c: c["text"])
    return [key(e["choices"][0]) or "" for e in events if isinstance(e, dict) and e.get("choices")]


@async_test
async def test_chat_stream_framing():
    with TestServer() as server:
        async with server.client() as client:
            response = await client.post("/v1/chat/completions", json=chat_body(stream=True))
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        events = sse_events(response.text)
        assert events[-1] == "[DONE]"
        chunks = events[:-1]
        assert all(c["object"] == "chat.completion.chunk" and c["model"] == MODEL for c in chunks)
        assert len({c["id"] for c in chunks}) == 1 and chunks[0]["id"].startswith("chatcmpl-")
        assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
        assert chunks[-1]["choices"][0] == {"index": 0, "delta": {}, "finish_reason": "stop", "logprobs": None}
        assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])
        assert "".join(chunk_texts(chunks, "chat")) == REPLY
        assert all("usage" not in c for c in chunks)


@async_test
async def test_completion_stream_with_usage_chunk():
    with TestServer() as server:
        async with server.client() as client:
            response = await client.post("/v1/completions", json=completion_body(
                stream=True, stream_options={"include_usage": True}))
        events = sse_events(response.text)
        *chunks, usage_chunk, done = events
        assert done == "[DONE]"
        assert all(c["object"] == "text_completion" and c["usage"] is None for c in chunks)
        assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
        assert "".join(chunk_texts(chunks, "text")) == REPLY
        assert usage_chunk["choices"] == [] and usage_chunk["usage"]["completion_tokens"] == len(REPLY.encode())
        assert usage_chunk["usage"]["speculative"]["drafted_tokens"] > 0


@pytest.mark.parametrize("tokens_per_step", [1, 2, 3, 5])
@async_test
async def test_every_chunk_is_complete_utf8(tokens_per_step):
    with TestServer(ScriptedEngine(reply_script(), tokens_per_step=tokens_per_step)) as server:
        async with server.client() as client:
            response = await client.post("/v1/chat/completions", json=chat_body(stream=True))
        texts = [t for t in chunk_texts(sse_events(response.text)[:-1], "chat") if t]
        assert "".join(texts) == REPLY
        assert all("\ufffd" not in t for t in texts)


@pytest.mark.parametrize("tokens_per_step", [1, 4])
@async_test
async def test_stop_strings_never_reach_the_stream(tokens_per_step):
    with TestServer(ScriptedEngine(reply_script(), tokens_per_step=tokens_per_step)) as server:
        async with server.client() as client:
            response = await client.post("/v1/completions", json=completion_body(stream=True, stop=["ld! 🙂"]))
        chunks = sse_events(response.text)[:-1]
        texts = chunk_texts(chunks, "text")
        assert "".join(texts) == "Héllo, wör"
        assert not any("ld" in t for t in texts)
        assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


@async_test
async def test_cached_answer_is_replayed_as_a_marked_stream():
    with TestServer() as server:
        async with server.client() as client:
            live = (await client.post("/v1/completions", json=completion_body())).json()
            response = await client.post("/v1/completions", json=completion_body(
                stream=True, stream_options={"include_usage": True}))
            chat = await client.post("/v1/chat/completions", json=chat_body(stream=True))
            chat_again = await client.post("/v1/chat/completions", json=chat_body(stream=True))
        *chunks, usage_chunk, done = sse_events(response.text)
        assert done == "[DONE]"
        assert "".join(chunk_texts(chunks, "text")) == live["choices"][0]["text"]
        assert len(chunks) > 2 and all(c["tandem"] == {"cached": True} for c in chunks)
        prompt = live["usage"]["prompt_tokens"]  # the replay spent no prompt computation and no drafts
        assert usage_chunk["usage"] == live["usage"] | {"prompt_tokens_details": {"cached_tokens": prompt},
                                                        "speculative": {"drafted_tokens": 0, "accepted_tokens": 0}}
        replayed = sse_events(chat_again.text)
        assert "".join(chunk_texts(replayed, "chat")) == "".join(chunk_texts(sse_events(chat.text), "chat"))
        assert replayed[0]["choices"][0]["delta"]["role"] == "assistant"
        assert len(server.engine.added) == 2  # one live completion and one live chat


@async_test
async def test_engine_failure_mid_stream_is_an_error_event():
    engine = ScriptedEngine(reply_script(eos=False), tokens_per_step=1, step_seconds=0.002)
    with TestServer(engine) as server:
        async with server.client() as client:
            async def fail_soon():
                await server.wait_until(lambda: server.engine.running)
                server.engine.fail_with = "device lost"

            failing = asyncio.create_task(fail_soon())
            response = await client.post("/v1/completions", json=completion_body(stream=True, max_tokens=400))
            await failing
        events = sse_events(response.text)
        assert events[-1] == "[DONE]"
        error = events[-2]["error"]
        assert error["type"] == "server_error" and "device lost" in error["message"]


@async_test
async def test_a_stream_that_ends_in_an_error_counts_its_tokens_first_where_usage_was_asked():
    """A stream cancelled at shutdown (or failed) with include_usage got the error and no usage:
    the client billed nothing for tokens /metrics counted. The usage comes before the error,
    where the openai client still reads it."""
    engine = ScriptedEngine(reply_script(eos=False), tokens_per_step=1, step_seconds=0.002)
    with TestServer(engine) as server:
        async with server.client() as client:
            async def fail_soon():
                await server.wait_until(lambda: server.engine.running and len(server.engine.running) > 0)
                await asyncio.sleep(0.02)
                server.engine.fail_with = "device lost"

            failing = asyncio.create_task(fail_soon())
            body = completion_body(stream=True, max_tokens=400, stream_options={"include_usage": True})
            response = await client.post("/v1/completions", json=body)
            await failing
        events = sse_events(response.text)
        assert events[-1] == "[DONE]" and "error" in events[-2]
        usage = events[-3]["usage"]
        streamed = "".join(chunk_texts(events[:-3], "text"))
        generated = usage["completion_tokens"]  # byte tokens: the text is their bytes, a cut character replaced
        script = reply_script(eos=False)  # the engine cycles through it
        assert generated > 0 and streamed == bytes(script[i % len(script)] for i in range(generated)).decode(
            errors="replace")


async def call_then_disconnect(app, path: str, body: dict, leave: asyncio.Event,
                               chunks_before_leaving: int | None = None) -> list[bytes]:
    """Drive the ASGI app like a client that hangs up once `leave` is set (or after some chunks)."""
    received, sent_request = [], False

    async def receive():
        nonlocal sent_request
        if not sent_request:
            sent_request = True
            return {"type": "http.request", "body": json.dumps(body).encode(), "more_body": False}
        await leave.wait()
        return {"type": "http.disconnect"}

    async def send(message):
        if message["type"] == "http.response.body" and message.get("body"):
            received.append(message["body"])
            if chunks_before_leaving is not None and len(received) >= chunks_before_leaving:
                leave.set()

    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
             "method": "POST", "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
             "root_path": "", "headers": [(b"content-type", b"application/json"), (b"host", b"localhost")],
             "client": ("127.0.0.1", 5000), "server": ("localhost", 80)}
    await asyncio.wait_for(app(scope, receive, send), 5)
    return received


@pytest.mark.parametrize("path,body", [("/v1/chat/completions", chat_body(stream=True, max_tokens=400)),
                                       ("/v1/completions", completion_body(stream=True, max_tokens=400))])
@async_test
async def test_client_disconnect_mid_stream_cancels_the_sequence(path, body):
    engine = ScriptedEngine(reply_script(eos=False), tokens_per_step=1, step_seconds=0.005)
    with TestServer(engine) as server:
        received = await call_then_disconnect(server.app, path, body, asyncio.Event(), chunks_before_leaving=3)
        assert received and received[0].startswith(b"data: ")
        await server.wait_until(lambda: server.worker.in_flight == 0, timeout=1.0)
        [(seq_id, _, _)] = server.engine.added
        assert server.engine.cancelled == [seq_id] and server.engine.num_running == 0
        assert server.metrics.finished[0][0] == "cancelled"
        assert server.tracer.ended[seq_id]["gen_ai.response.finish_reason"] == "cancelled"


@async_test
async def test_a_streams_tokens_are_counted_while_it_runs():
    """generation_tokens counted a request's tokens only when it ended: a long or stuck stream's
    were invisible to a Prometheus rate until then (a trial's 60 s stream read flat, then jumped
    by 2,260). The prompt counts once its first token came."""
    engine = ScriptedEngine(reply_script(eos=False), tokens_per_step=1, step_seconds=0.005)
    with TestServer(engine) as server:
        received = await call_then_disconnect(server.app, "/v1/completions",
                                              completion_body(prompt="abc", stream=True, max_tokens=400),
                                              asyncio.Event(), chunks_before_leaving=5)
        assert len(received) >= 5
        await server.wait_until(lambda: server.worker.in_flight == 0, timeout=1.0)
        assert len(server.metrics.generated) >= 4  # told update by update, one token each
        assert server.metrics.finished[0][:3] == ("cancelled", 3, sum(server.metrics.generated))


@async_test
async def test_an_answer_that_ends_at_once_still_counts_its_prompt():
    """An EOS as the first token gives no token, yet the prompt was processed: counted."""
    with TestServer(ScriptedEngine([EOS])) as server:
        async with server.client() as client:
            answer = (await client.post("/v1/completions", json=completion_body(prompt="abcd"))).json()
        assert answer["choices"][0]["finish_reason"] == "stop" and answer["choices"][0]["text"] == ""
        assert server.metrics.finished[0][:3] == ("stop", 4, 0)


@async_test
async def test_client_disconnect_cancels_a_queued_non_streaming_request():
    engine = ScriptedEngine(reply_script(eos=False))
    engine.gate.clear()  # the request waits; nothing is generated before the client leaves
    with TestServer(engine) as server:
        leave = asyncio.Event()
        calling = asyncio.create_task(call_then_disconnect(server.app, "/v1/completions",
                                                           completion_body(max_tokens=500), leave))
        await server.wait_until(lambda: server.engine.added)
        leave.set()
        await calling
        await server.wait_until(lambda: server.worker.in_flight == 0, timeout=1.0)
        [(seq_id, _, _)] = server.engine.added
        assert server.engine.cancelled == [seq_id] and server.engine.num_waiting == 0


@async_test
async def test_client_gone_before_the_first_event_cancels_the_stream():
    engine = ScriptedEngine(reply_script(eos=False))
    engine.gate.clear()
    with TestServer(engine) as server:
        gone = asyncio.Event()
        gone.set()
        await call_then_disconnect(server.app, "/v1/completions", completion_body(stream=True, max_tokens=400), gone)
        await server.wait_until(lambda: server.worker.in_flight == 0, timeout=1.0)
        [(seq_id, _, _)] = server.engine.added
        assert server.engine.cancelled == [seq_id]
        assert [f[0] for f in server.metrics.finished] == ["cancelled"]


@async_test
async def test_closing_response_runs_on_close_even_if_the_events_never_started():
    started, closed = [], []

    async def events():
        started.append(True)
        yield b"data: {}\n\n"

    async def receive():
        await asyncio.sleep(10)

    async def send(message):
        raise OSError("connection reset")  # the client is gone before the response starts

    response = ClosingStreamingResponse(events(), on_close=(lambda: closed.append(True),))
    with pytest.raises(OSError):
        await response({"type": "http", "asgi": {"spec_version": "2.3"}}, receive, send)
    assert closed == [True] and started == []


@async_test
async def test_a_response_blocked_on_a_silent_reader_is_dropped_after_its_deadline():
    """A client that stops reading blocks `send` (flow control): past the deadline the response
    gives up, closes its events and runs on_close, so nothing waits on that client for ever."""
    import time

    from tandem.serve.api.streaming import STUCK_WRITER_GRACE_S

    closed, sent = [], []

    async def events():
        while True:
            yield b"data: {}\n\n"

    async def receive():
        await asyncio.sleep(60)

    async def send(message):
        sent.append(message)
        if len(sent) > 2:
            await asyncio.sleep(60)  # the reader's window is full

    response = ClosingStreamingResponse(events(), on_close=(lambda: closed.append(True),),
                                        deadline=time.perf_counter() + 0.2)
    started = time.perf_counter()
    await asyncio.wait_for(response({"type": "http", "asgi": {"spec_version": "2.4"}}, receive, send), 10)
    assert closed == [True]
    assert 0.2 + STUCK_WRITER_GRACE_S - 0.1 < time.perf_counter() - started < 0.2 + STUCK_WRITER_GRACE_S + 1
