"""The operator's limits: max_tokens and prompt caps (400 naming the limit), logit_bias refused
(not silently ignored), long stop strings refused, a whole-request timeout (504, or an error event
on a stream, and the sequence freed), and open streams per client (429 past the limit, the count
released when a stream ends)."""

import asyncio

from api_doubles import ScriptedEngine, TestServer, async_test, chat_body, completion_body, reply_script, sse_events

from tandem.serve.api.protocol import MAX_STOP_CHARS, MAX_STOP_STRINGS


@async_test
async def test_max_tokens_over_the_servers_limit_is_400_and_the_default_is_capped():
    with TestServer(ScriptedEngine(reply_script(eos=False)), max_tokens_limit=4) as server:
        async with server.client() as client:
            refused = await client.post("/v1/chat/completions", json=chat_body(max_tokens=5))
            assert refused.status_code == 400
            error = refused.json()["error"]
            assert error["code"] == "max_tokens_exceeded" and error["param"] == "max_tokens" and "4" in error["message"]
            capped = await client.post("/v1/completions", json=completion_body())  # no max_tokens: the cap
            assert capped.status_code == 200 and capped.json()["usage"]["completion_tokens"] == 4


@async_test
async def test_prompt_over_the_servers_limit_is_400():
    with TestServer(max_prompt_tokens=10) as server:
        async with server.client() as client:
            refused = await client.post("/v1/completions", json=completion_body(prompt="x" * 11))
            assert refused.status_code == 400 and refused.json()["error"]["code"] == "prompt_too_long"
            assert (await client.post("/v1/completions", json=completion_body(prompt="x" * 10))).status_code == 200


@async_test
async def test_logit_bias_is_refused_not_ignored_and_long_stop_strings_are_refused():
    with TestServer() as server:
        async with server.client() as client:
            biased = await client.post("/v1/completions", json=completion_body(logit_bias={"50": 100}))
            assert biased.status_code == 400 and biased.json()["error"]["param"] == "logit_bias"
            assert (await client.post("/v1/completions", json=completion_body(logit_bias={}))).status_code == 200
            assert (await client.post("/v1/completions", json=completion_body(logit_bias={"50": 0}))).status_code == 200
            for key in ("abc", "-1", "1.5", "", "9" * 5000):  # no token ids: refused as OpenAI refuses them (they
                # passed at bias 0; 5,000 digits said Python's own int() limit)
                odd = await client.post("/v1/completions", json=completion_body(logit_bias={key: 0}))
                assert odd.status_code == 400 and odd.json()["error"]["param"] == "logit_bias", key
                assert "token ids" in odd.json()["error"]["message"]
            beyond = await client.post("/v1/completions", json=completion_body(logit_bias={"99999999": 0}))
            assert beyond.status_code == 400 and beyond.json()["error"]["code"] == "invalid_value"  # it passed
            assert "not a token id of this model" in beyond.json()["error"]["message"]
            typed = await client.post("/v1/completions", json=completion_body(logit_bias={"50": "5"}))
            assert typed.status_code == 400 and typed.json()["error"]["code"] == "invalid_type"  # "not supported"
            long_stop = await client.post("/v1/completions", json=completion_body(stop=["x" * (MAX_STOP_CHARS + 1)]))
            assert long_stop.status_code == 400 and long_stop.json()["error"]["param"] == "stop"
            many = ["s%d" % i for i in range(MAX_STOP_STRINGS + 1)]
            too_many = await client.post("/v1/completions", json=completion_body(stop=many))
            assert too_many.status_code == 400 and too_many.json()["error"]["param"] == "stop"
            # empty strings are dropped and a repeat is one stop, before they are counted
            for stop in (many[:MAX_STOP_STRINGS] + [""] * 4, ["end"] * (MAX_STOP_STRINGS + 4)):
                response = await client.post("/v1/completions", json=completion_body(stop=stop))
                assert response.status_code == 200, response.text


@async_test
async def test_a_request_past_the_timeout_is_504_and_its_sequence_is_freed():
    engine = ScriptedEngine(reply_script())
    engine.gate.clear()  # the engine never steps: the request waits until its deadline
    with TestServer(engine, request_timeout_seconds=0.3) as server:
        async with server.client() as client:
            response = await client.post("/v1/chat/completions", json=chat_body())
            assert response.status_code == 504
            assert response.json()["error"]["code"] == "request_timeout"
            await server.wait_until(lambda: server.worker.in_flight == 0 and not server.engine.has_work)
        assert server.metrics.finished[-1][0] == "timeout"  # not "cancelled", a client's leaving


@async_test
async def test_a_stream_past_the_timeout_ends_with_an_error_event_and_done():
    engine = ScriptedEngine(reply_script())
    engine.gate.clear()
    with TestServer(engine, request_timeout_seconds=0.3) as server:
        async with server.client() as client:
            response = await client.post("/v1/chat/completions", json=chat_body(stream=True))
            assert response.status_code == 200
            events = sse_events(response.text)
            assert events[-1] == "[DONE]" and events[-2]["error"]["code"] == "request_timeout"
            await server.wait_until(lambda: server.worker.in_flight == 0 and not server.engine.has_work)
        assert server.metrics.finished[-1][0] == "timeout"


@async_test
async def test_open_streams_per_client_are_capped_and_released():
    engine = ScriptedEngine(reply_script(), max_running=4)
    engine.gate.clear()
    with TestServer(engine, max_streams_per_client=2) as server:
        async with server.client() as client:

            async def stream(prompt):
                async with client.stream("POST", "/v1/completions", json=completion_body(stream=True, prompt=prompt)) as r:
                    return r.status_code, (await r.aread()).decode()

            held = [asyncio.create_task(stream(f"p{i}")) for i in range(2)]
            await server.wait_until(lambda: server.worker.in_flight == 2)
            third = await client.post("/v1/completions", json=completion_body(stream=True, prompt="p3"))
            assert third.status_code == 429 and third.json()["error"]["code"] == "too_many_streams"
            assert "retry-after" in third.headers
            plain = await asyncio.wait_for(_released(client, server), 5)  # a non-streaming request is not capped
            assert plain == 200
            server.engine.gate.set()
            assert [status for status, _ in await asyncio.gather(*held)] == [200, 200]
            assert server.state.streams.open_streams == {}
            again = await client.post("/v1/completions", json=completion_body(stream=True, prompt="p4"))
            assert again.status_code == 200


async def _released(client, server):
    task = asyncio.create_task(client.post("/v1/completions", json=completion_body(prompt="plain")))
    await server.wait_until(lambda: server.worker.in_flight == 3)
    server.engine.gate.set()
    status = (await task).status_code
    server.engine.gate.clear()
    return status
