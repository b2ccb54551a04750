"""Every client mistake gets its status and an OpenAI error body, never a 500 or a traceback; every
refusal is counted. Statuses follow OpenAI: 400 for malformed JSON and for invalid values alike."""

import json
import logging

import pytest
from api_doubles import MODEL, ScriptedEngine, TestServer, async_test, chat_body, completion_body, reply_script

from tandem.speculation.depth import Fixed

CONTEXT = 512  # ScriptedEngine's default context length


def assert_error(response, status: int, type_: str = "invalid_request_error", param=None, code=None,
                 says: str = "") -> dict:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    error = body["error"]
    assert error["type"] == type_ and error["message"]
    assert "Traceback" not in error["message"]
    if param is not None:
        assert error["param"] == param, error
    if code is not None:
        assert error["code"] == code, error
    assert says in error["message"], error["message"]
    return error


BAD_COMPLETIONS = [
    # (body, param, code, words in the message)
    ({"prompt": "hi"}, "model", "missing_required_parameter", "model"),
    ({"model": MODEL}, "prompt", "missing_required_parameter", "prompt"),
    (completion_body(prompt=["a", "b"]), "prompt", "unsupported_value", "one prompt per request"),
    (completion_body(prompt=[[1, 2], [3]]), "prompt", "unsupported_value", "one prompt per request"),
    (completion_body(prompt=[1, "a"]), "prompt", "invalid_value", "token ids"),
    (completion_body(prompt=[1, -2]), "prompt", "invalid_value", "non-negative"),
    (completion_body(prompt=[1, True]), "prompt", "invalid_value", "token ids"),
    (completion_body(prompt=[]), "prompt", "invalid_value", "empty"),
    (completion_body(prompt=[[]]), "prompt", "invalid_value", ""),
    (completion_body(prompt=[300]), "prompt", "invalid_value", "outside the model's vocabulary"),
    (completion_body(max_tokens="5"), "max_tokens", "invalid_type", "integer"),
    (completion_body(max_tokens=5.5), "max_tokens", "invalid_type", ""),
    (completion_body(max_tokens=0), "max_tokens", "invalid_value", ""),
    (completion_body(max_tokens=-3), "max_tokens", "invalid_value", ""),
    (completion_body(temperature=-0.1), "temperature", "invalid_value", ""),
    (completion_body(temperature=2.5), "temperature", "invalid_value", ""),
    (completion_body(temperature="hot"), "temperature", "invalid_type", ""),
    (completion_body(top_p=-0.1), "top_p", "invalid_value", ""),
    (completion_body(top_p=1.5), "top_p", "invalid_value", ""),
    (completion_body(seed=-2), "seed", "invalid_value", "-1"),
    (completion_body(seed=2**63), "seed", "invalid_value", ""),
    (completion_body(seed="7"), "seed", "invalid_value", ""),
    (completion_body(stop=5), "stop", "invalid_type", ""),
    (completion_body(stop=[f"s{i}" for i in range(17)]), "stop", "invalid_value", "16"),
    (completion_body(stream="yes"), "stream", "invalid_type", ""),
    (completion_body(stream_options={"include_usage": "yes"}), "stream_options.include_usage", "invalid_type", ""),
    (completion_body(stream=True, stream_options={"continuous_usage_stats": True}),
     "stream_options.continuous_usage_stats", "unsupported_value", ""),
    (completion_body(n=2), "n", "unsupported_value", "n=1"),
    (completion_body(tandem={"drafter": "magic"}), "tandem.drafter", "invalid_value", ""),
    (completion_body(tandem={"k": 65}), "tandem.k", "invalid_value", "auto"),
    (completion_body(tandem={"k": "fast"}), "tandem.k", "invalid_value", "auto"),
    (completion_body(tandem={"drafter": "none", "k": 3}), "tandem.k", "invalid_value", "drafts nothing"),  # ignored
    (completion_body(tandem={"drafer": "ngram"}), "tandem.drafer", "unknown_parameter", ""),
    (completion_body(tandem="ngram"), "tandem", "invalid_type", ""),
    (completion_body(prompt=""), "prompt", "invalid_value", "empty"),
    (completion_body(cache_salt=""), "cache_salt", None, ""),
    (completion_body(cache_salt=5), "cache_salt", "invalid_type", ""),
]

BAD_CHATS = [
    ({"model": MODEL}, "messages", "missing_required_parameter", ""),
    (chat_body(messages=[]), "messages", "invalid_value", ""),
    (chat_body(messages="hi"), "messages", "invalid_type", ""),
    (chat_body(messages=[{"role": "user"}]), "messages[0].content", "missing_required_parameter", ""),
    (chat_body(messages=[{"role": "wizard", "content": "x"}]), "messages[0].role", "invalid_value", ""),
    (chat_body(messages=[{"role": "user", "content": 5}]), "messages[0].content", "invalid_type", ""),
    (chat_body(messages=[{"role": "user", "content": None}]), "messages[0].content", "invalid_type", ""),
    (chat_body(messages=[{"role": "user", "content": ""}]), "messages", "invalid_value", "empty"),
    (chat_body(max_completion_tokens=0), "max_completion_tokens", "invalid_value", ""),
]


@pytest.mark.parametrize("body,param,code,says", BAD_COMPLETIONS)
@async_test
async def test_bad_completion_bodies_are_400(body, param, code, says):
    with TestServer() as server:
        async with server.client() as client:
            response = await client.post("/v1/completions", json=body)
        assert_error(response, 400, param=param, code=code, says=says)
        assert server.metrics.rejected == [400] and not server.engine.added


@pytest.mark.parametrize("body,param,code,says", BAD_CHATS)
@async_test
async def test_bad_chat_bodies_are_400(body, param, code, says):
    with TestServer() as server:
        async with server.client() as client:
            response = await client.post("/v1/chat/completions", json=body)
        assert_error(response, 400, param=param, code=code, says=says)
        assert not server.engine.added


def nested(depth: int) -> bytes:
    return b'{"model": "M", "prompt": "hi", "a": ' + b"[" * (depth - 1) + b"]" * (depth - 1) + b"}"


@pytest.mark.parametrize("raw", [b"{not json", b"", b"[1, 2]", b'"text"', b"\xff\xfe", b'{"model": NaN}',
                                 b"[" * 100_000, nested(33), nested(500)])
@async_test
async def test_malformed_json_is_400(raw):
    with TestServer() as server:
        async with server.client() as client:
            response = await client.post("/v1/completions", content=raw, headers={"content-type": "application/json"})
        assert_error(response, 400, code="invalid_json", says="JSON")


@async_test
async def test_json_nested_near_the_parsers_limit_is_400_not_500():
    """Around the depth where json.loads just succeeds (~959 here) the body parsed, then a
    recursive walk over it raised RecursionError: a 500. Every depth in the band is a 400."""
    with TestServer() as server:
        async with server.client() as client:
            for depth in range(900, 1001):
                response = await client.post("/v1/completions", content=nested(depth),
                                             headers={"content-type": "application/json"})
                assert_error(response, 400, code="invalid_json", says="JSON")


@async_test
async def test_a_client_gone_before_its_body_arrived_is_a_counted_400_not_a_500():
    """An upload cut short (Content-Length larger than what came, then the socket closed) raised
    starlette's ClientDisconnect through the app: a 500 and two tracebacks in the log per request."""
    from starlette.requests import Request

    from tandem.serve.api.body import read_limited
    from tandem.serve.api.errors import APIError

    messages = iter([{"type": "http.request", "body": b'{"mod', "more_body": True}, {"type": "http.disconnect"}])

    async def receive():
        return next(messages)

    request = Request({"type": "http", "method": "POST", "headers": [(b"content-length", b"1000")]}, receive)
    with pytest.raises(APIError) as error:
        await read_limited(request, 65536)
    assert error.value.status == 400 and error.value.code == "client_disconnected"


def half_sent_request():
    """A request whose client sent part of its body, and the rest never comes."""
    import asyncio

    from starlette.requests import Request

    sent = iter([{"type": "http.request", "body": b'{"mod', "more_body": True}])

    async def receive():
        message = next(sent, None)
        if message is None:
            await asyncio.Event().wait()
        return message

    return Request({"type": "http", "method": "POST", "headers": [(b"content-length", b"200")]}, receive)


@async_test
async def test_a_body_that_stops_arriving_is_a_408_at_the_request_time_limit():
    """A client that sends half a body and waits held its connection for ever: the request's time
    limit started after the body arrived."""
    import asyncio

    from tandem.serve.api.body import read_limited
    from tandem.serve.api.errors import APIError

    request = half_sent_request()
    with pytest.raises(APIError) as error:
        await asyncio.wait_for(read_limited(request, 65536, timeout_s=0.2), timeout=5)
    assert error.value.status == 408 and error.value.code == "request_timeout"
    assert "--request-timeout" in str(error.value)


@async_test
async def test_a_compressed_body_is_a_415_not_invalid_json():
    import gzip
    import json

    with TestServer() as server:
        async with server.client() as client:
            response = await client.post("/v1/completions", content=gzip.compress(json.dumps(completion_body()).encode()),
                                         headers={"Content-Type": "application/json", "Content-Encoding": "gzip"})
            assert_error(response, 415, code="unsupported_content_encoding", says="send the body uncompressed")


@async_test
async def test_a_body_still_arriving_when_the_server_drains_is_a_503_at_once():
    """SIGTERM while a client was mid-body: nothing cut the read, uvicorn cancelled it at its close
    timeout (after the grace), and the client got a plain-text 500, the log a traceback."""
    import asyncio

    from tandem.serve.api.body import read_limited
    from tandem.serve.api.errors import APIError

    request = half_sent_request()
    drain = asyncio.Event()
    asyncio.get_running_loop().call_later(0.1, drain.set)
    with pytest.raises(APIError) as error:
        await asyncio.wait_for(read_limited(request, 65536, timeout_s=30, stop=drain), timeout=5)
    assert error.value.status == 503 and error.value.code == "shutting_down"
    assert [t for t in asyncio.all_tasks() if t is not asyncio.current_task()] == []  # no read left behind


def test_the_first_signal_sets_the_drain_event_in_the_serving_loop():
    import asyncio
    from types import SimpleNamespace

    import uvicorn

    from tandem.serve.server import DrainingServer

    worker = SimpleNamespace(in_flight=0, shutdown=lambda grace: None)
    state = SimpleNamespace(draining=False, drain_started=None, worker=worker,
                            settings=SimpleNamespace(grace_seconds=1.0))
    server = DrainingServer(state, uvicorn.Config(lambda scope, receive, send: None))

    async def serving():
        server.loop = asyncio.get_running_loop()
        state.drain_started = asyncio.Event()
        server.handle_exit(15, None)  # as the signal handler runs it: in the loop's thread, outside the loop
        await asyncio.wait_for(state.drain_started.wait(), timeout=5)

    asyncio.run(serving())
    assert state.draining


def test_the_drain_ends_the_server_whatever_fails_on_the_way(monkeypatch):
    """A closed log pipe (BrokenPipeError on the drain's first line) or a failing shutdown left the
    server draining, answering 503, for good (a grace of 1e20 s overflowed the worker's join: now
    refused, test_api_settings.py)."""
    import sys
    from types import SimpleNamespace

    import uvicorn

    from tandem.serve.server import DrainingServer

    class ClosedPipe:
        def write(self, text):
            raise BrokenPipeError(32, "Broken pipe")

        def flush(self):
            raise BrokenPipeError(32, "Broken pipe")

    def failing_shutdown(grace):
        raise OverflowError("timestamp out of range for platform time_t")

    monkeypatch.setattr(sys, "stderr", ClosedPipe())
    for shutdown in (lambda grace: None, failing_shutdown):
        state = SimpleNamespace(draining=True, worker=SimpleNamespace(in_flight=2, shutdown=shutdown),
                                settings=SimpleNamespace(grace_seconds=1.0))
        server = DrainingServer(state, uvicorn.Config(lambda scope, receive, send: None))
        try:
            server._drain()
        except OverflowError:
            pass
        assert server.should_exit


def test_a_hangup_drains_as_sigterm_does_unless_nohup_ignores_it():
    """SIGHUP ended the server at once: in-flight answers cut, the prompt cache unsaved."""
    import os
    import signal
    from types import SimpleNamespace

    import uvicorn

    from tandem.serve.server import DrainingServer

    drains = []
    state = SimpleNamespace(draining=False, drain_started=None, worker=SimpleNamespace(in_flight=0),
                            settings=SimpleNamespace(grace_seconds=1.0))
    server = DrainingServer(state, uvicorn.Config(lambda scope, receive, send: None))
    server._drain = lambda: drains.append("drained")
    before = signal.getsignal(signal.SIGHUP)
    try:
        with server.capture_signals():
            os.kill(os.getpid(), signal.SIGHUP)  # its handler runs on this thread before the next line
            assert state.draining
        assert signal.getsignal(signal.SIGHUP) == before  # put back after serving
        signal.signal(signal.SIGHUP, signal.SIG_IGN)  # under nohup
        with server.capture_signals():
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, before)


@pytest.mark.parametrize("path,raw", [
    ("/v1/chat/completions", b'{"model": "M", "messages": [{"role": "user", "content": "\\ud83d"}]}'),
    ("/v1/chat/completions", b'{"model": "M", "messages": [{"role": "user", "content": "hi"}], "stop": ["\\udc00x"]}'),
    ("/v1/completions", b'{"model": "M", "prompt": "a \\ud83d b"}'),
    ("/v1/completions", b'{"model": "M", "prompt": "hi", "\\ud800": 1}'),
])
@async_test
async def test_a_lone_surrogate_escape_is_400_not_a_crash(path, raw):
    with TestServer() as server:
        async with server.client() as client:
            response = await client.post(path, content=raw.replace(b'"M"', f'"{MODEL}"'.encode()),
                                         headers={"content-type": "application/json"})
        assert_error(response, 400, code="invalid_value", says="surrogate")
        assert not server.engine.added
        async with server.client() as client:  # an escaped pair is one character: served
            pair = f'{{"model": "{MODEL}", "prompt": "\\ud83d\\ude00 smile", "max_tokens": 2}}'.encode()
            response = await client.post("/v1/completions", content=pair, headers={"content-type": "application/json"})
            assert response.status_code == 200, response.text


@async_test
async def test_fields_that_change_nothing_pass():
    """Fields that do not change the tokens (user, metadata, a vendor's extra) pass, as do the
    no-op values clients send by default for the ones this server does not implement."""
    with TestServer() as server:
        async with server.client() as client:
            response = await client.post("/v1/completions", json=completion_body(
                user="u1", metadata={"a": "b"}, presence_penalty=0, echo=False, best_of=1.0,
                response_format={"type": "text"}))
            assert response.status_code == 200
            response = await client.post("/v1/chat/completions", json=chat_body(
                logprobs=False, top_logprobs=0, tools=[], tool_choice="none", response_format={"type": "text"},
                frequency_penalty=0.0, echo=False, best_of=1))
            assert response.status_code == 200, response.text
            response = await client.post("/v1/chat/completions", json=chat_body(  # vLLM's and llama.cpp's defaults
                min_tokens=0, min_p=0.0, repetition_penalty=1.0, repeat_penalty=1, stop_token_ids=[], ignore_eos=False,
                modalities=["text"], messages=[{"role": "assistant", "content": "hi", "tool_calls": []},
                                               {"role": "user", "content": "hi", "name": "ann"}]))
            assert response.status_code == 200, response.text
            response = await client.post("/v1/chat/completions", json=chat_body(  # no-op values of other servers'
                logit_bias={"50": 0, "7": 0.0}, seed=-1, add_generation_prompt=True, continue_final_message=False,
                chat_template_kwargs={}, messages=[{"role": "user", "content": "  "}]))  # whitespace is a message
            assert response.status_code == 200, response.text
            response = await client.post("/v1/chat/completions", json=chat_body(messages=[  # null: OpenAI's empty turn
                {"role": "user", "content": "hi"}, {"role": "assistant", "content": None},
                {"role": "user", "content": "again"}]))
            assert response.status_code == 200, response.text


@async_test
async def test_features_not_implemented_are_refused_not_ignored():
    """JSON mode, function calling, logprobs, penalties, echo: a request asking for them gets a
    400 naming the field, not an answer that quietly lacks them."""
    refused = [("/v1/chat/completions", chat_body(response_format={"type": "json_object"}), "response_format"),
               ("/v1/completions", completion_body(response_format={"type": "json_schema", "json_schema": {}}),
                "response_format"),  # was ignored here: a 200 of unconstrained text
               ("/v1/completions", completion_body(structured_outputs={"json": {}}), "structured_outputs"),
               ("/v1/chat/completions", chat_body(tools=[{"type": "function", "function": {"name": "f"}}]), "tools"),
               ("/v1/chat/completions", chat_body(tool_choice="auto"), "tool_choice"),
               ("/v1/chat/completions", chat_body(functions=[{"name": "f"}]), "functions"),
               ("/v1/chat/completions", chat_body(function_call="auto"), "function_call"),
               ("/v1/chat/completions", chat_body(logprobs=True), "logprobs"),
               ("/v1/chat/completions", chat_body(top_logprobs=3), "top_logprobs"),
               ("/v1/completions", completion_body(presence_penalty=0.1), "presence_penalty"),
               ("/v1/completions", completion_body(frequency_penalty=-1.0), "frequency_penalty"),
               ("/v1/completions", completion_body(logprobs=2), "logprobs"),
               ("/v1/completions", completion_body(echo=True), "echo"),
               ("/v1/completions", completion_body(best_of=3), "best_of"),
               ("/v1/completions", completion_body(suffix="}"), "suffix"),
               ("/v1/chat/completions", chat_body(echo=True), "echo"),  # vLLM's chat echoes; this one did not, a 200
               ("/v1/chat/completions", chat_body(best_of=2), "best_of"),
               ("/v1/chat/completions", chat_body(messages=[{"role": "user", "content": [  # was a type error
                   {"type": "text", "text": "what is this?"},
                   {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]), "messages[0].content"),
               # other servers' fields their users send here too (a 200 that ignored them, before)
               ("/v1/chat/completions", chat_body(min_tokens=50), "min_tokens"),
               ("/v1/completions", completion_body(stop_token_ids=[2]), "stop_token_ids"),
               ("/v1/completions", completion_body(ignore_eos=True), "ignore_eos"),
               ("/v1/completions", completion_body(min_p=0.1), "min_p"),
               ("/v1/completions", completion_body(typical_p=0.9), "typical_p"),
               ("/v1/chat/completions", chat_body(repetition_penalty=1.2), "repetition_penalty"),
               ("/v1/chat/completions", chat_body(repeat_penalty=1.1), "repeat_penalty"),
               ("/v1/chat/completions", chat_body(include_stop_str_in_output=True), "include_stop_str_in_output"),
               ("/v1/chat/completions", chat_body(guided_json={"type": "object"}), "guided_json"),
               ("/v1/chat/completions", chat_body(guided_choice=["a", "b"]), "guided_choice"),
               ("/v1/completions", completion_body(grammar="root ::= \"a\""), "grammar"),
               ("/v1/completions", completion_body(json_schema={}), "json_schema"),
               ("/v1/chat/completions", chat_body(modalities=["text", "audio"]), "modalities"),
               ("/v1/chat/completions", chat_body(audio={"voice": "alloy"}), "audio"),
               ("/v1/chat/completions", chat_body(web_search_options={}), "web_search_options"),
               ("/v1/completions", completion_body(max_completion_tokens=5), "max_completion_tokens"),
               ("/v1/completions", completion_body(logit_bias={"50": 0, "7": -0.5}), "logit_bias"),
               ("/v1/chat/completions", chat_body(reasoning_effort="low"), "reasoning_effort"),
               ("/v1/chat/completions", chat_body(verbosity="low"), "verbosity"),
               # vLLM's template controls, ignored before: an assistant prefill got a new turn without a word
               ("/v1/chat/completions", chat_body(continue_final_message=True, add_generation_prompt=False),
                "add_generation_prompt"),
               ("/v1/chat/completions", chat_body(continue_final_message=True), "continue_final_message"),
               ("/v1/chat/completions", chat_body(chat_template_kwargs={"enable_thinking": False}),
                "chat_template_kwargs"),
               ("/v1/chat/completions", chat_body(chat_template="{{ messages }}"), "chat_template"),
               ("/v1/chat/completions", chat_body(messages=[{"role": "assistant", "content": "", "tool_calls": [
                   {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}]),
                "messages[0].tool_calls"),
               ("/v1/chat/completions", chat_body(messages=[  # what agent frameworks send: content null
                   {"role": "user", "content": "hi"}, {"role": "assistant", "content": None, "tool_calls": [
                       {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}]),
                "messages[1].tool_calls")]
    with TestServer() as server:
        async with server.client() as client:
            for path, body, field in refused:
                error = assert_error(await client.post(path, json=body), 400, param=field, code="unsupported_value")
                assert "not supported" in error["message"], (field, error)
                if field == "max_completion_tokens":  # it read "max_completion_tokens (chat's: here it is max_tokens)"
                    assert "on /v1/completions send max_tokens" in error["message"], error


@async_test
async def test_a_refused_value_is_quoted_as_json_not_python():
    """A JSON client wrote true, null and "5": the message said True, None and '5'."""
    with TestServer() as server:
        async with server.client() as client:
            for body, shown in ((chat_body(logprobs=True), "(true)"), (completion_body(max_tokens="5"), '("5")'),
                                (completion_body(stop={"a": None}), '({"a": null})')):
                error = (await client.post("/v1/completions" if "prompt" in body else "/v1/chat/completions",
                                           json=body)).json()["error"]
                assert shown in error["message"], error["message"]


@async_test
async def test_stream_options_without_a_stream_is_refused():
    """OpenAI answers 400 there; it was accepted and its include_usage silently did nothing."""
    with TestServer() as server:
        async with server.client() as client:
            body = chat_body(stream_options={"include_usage": True})
            assert_error(await client.post("/v1/chat/completions", json=body), 400, param="stream_options",
                         code="invalid_value", says="stream: true")


@async_test
async def test_unknown_model_is_404():
    with TestServer() as server:
        async with server.client() as client:
            for path, body in (("/v1/completions", completion_body(model="gpt-4")),
                               ("/v1/chat/completions", chat_body(model="gpt-4"))):
                error = assert_error(await client.post(path, json=body), 404, param="model", code="model_not_found")
                assert "gpt-4" in error["message"] and MODEL in error["message"]
            assert_error(await client.get("/v1/models/gpt-4"), 404, code="model_not_found")
            for path in ("/favicon.ico", "/healthz", "/wp-login.php"):  # no route: no API request refused
                assert_error(await client.get(path), 404, code="not_found", says=f"no route GET {path}")
            assert_error(await client.get("/dashboard/static/nosuch.js"), 404, says="no dashboard asset")  # nor this
        assert server.metrics.rejected == [404, 404, 404]  # the probes counted as refused requests


@async_test
async def test_a_trailing_slash_reaches_the_route_not_an_empty_redirect():
    """POST /v1/chat/completions/ was starlette's 307 with no body."""
    with TestServer() as server:
        async with server.client() as client:
            response = await client.post("/v1/chat/completions/", json=chat_body())
            assert response.status_code == 200 and response.json()["object"] == "chat.completion", response.text
            assert (await client.get("/v1/models//")).json()["data"][0]["id"] == MODEL
            assert_error(await client.get("/v1/nothing/"), 404, code="not_found", says="no route GET /v1/nothing")


@async_test
async def test_the_dashboard_with_a_trailing_slash_is_redirected_to_its_page():
    """/dashboard/ served the page, whose relative URLs then resolved to /dashboard/dashboard/...
    (404s: a page stuck at "connecting..."). The Location is relative, so a proxy's prefix stays."""
    with TestServer() as server:
        async with server.client() as client:
            for path, location in (("/dashboard/", "../dashboard"), ("/dashboard//?x=1", "../../dashboard?x=1")):
                response = await client.get(path)
                assert response.status_code == 308 and response.headers["location"] == location, path
            followed = await client.get("/dashboard/", follow_redirects=True)
            assert followed.status_code == 200 and str(followed.url).endswith("/dashboard")
            assert (await client.get("/dashboard/data/")).status_code == 200  # not a page: stripped


def test_unknown_fields_are_ignored_and_logged_once_each(caplog):
    """A misspelt field (`max_token`) changes nothing: the server's log names it, once."""
    caplog.set_level(logging.WARNING, logger="tandem.serve.api.body")

    @async_test
    async def send_twice():
        with TestServer() as server:
            async with server.client() as client:
                for _ in range(2):
                    body = completion_body(max_token=3, max_new_tokens=3, user="u")
                    assert (await client.post("/v1/completions", json=body)).status_code == 200

    send_twice()
    said = [r.getMessage() for r in caplog.records if "unknown request field" in r.getMessage()]
    assert len([m for m in said if "'max_token'" in m]) == 1 and len([m for m in said if "'max_new_tokens'" in m]) == 1
    assert not any("'user'" in m for m in said)  # a known field


@async_test
async def test_unknown_route_and_wrong_method():
    with TestServer() as server:
        async with server.client() as client:
            assert_error(await client.get("/v1/nothing"), 404, code="not_found", says="no route GET /v1/nothing")
            assert_error(await client.get("/dashboard/static/x.js"), 404, says="no dashboard asset named 'x.js'")
            # a 405 said "Method Not Allowed" with code null, unlike the 404 beside it
            assert_error(await client.get("/v1/completions"), 405, code="method_not_allowed",
                         says="GET is not allowed on /v1/completions; use POST")
            # a GET and HEAD route said "use HEAD" and Allow: HEAD (its HEAD route's alone)
            for path in ("/health", "/metrics", "/v1/models"):
                wrong = await client.post(path)
                assert_error(wrong, 405, says=f"POST is not allowed on {path}; use GET, HEAD")
                assert wrong.headers["allow"] == "GET, HEAD"


@async_test
async def test_prompt_longer_than_the_context_is_400_naming_the_numbers():
    with TestServer() as server:
        async with server.client() as client:
            response = await client.post("/v1/completions", json=completion_body(prompt="x" * 600))
            error = assert_error(response, 400, param="prompt", code="context_length_exceeded")
            assert "600" in error["message"] and str(CONTEXT) in error["message"]
            response = await client.post("/v1/completions", json=completion_body(prompt="x" * CONTEXT))
            said = assert_error(response, 400, param="prompt", code="context_length_exceeded")["message"]
            assert f"at most {CONTEXT - 1} tokens" in said, said  # "has 512 tokens but ... is 512 tokens"
            response = await client.post("/v1/chat/completions", json=chat_body(
                messages=[{"role": "user", "content": "y" * CONTEXT}]))
            assert_error(response, 400, param="messages", code="context_length_exceeded")


@async_test
async def test_max_tokens_beyond_the_context_is_400_naming_the_numbers():
    with TestServer() as server:
        async with server.client() as client:
            response = await client.post("/v1/completions", json=completion_body(prompt="abcd", max_tokens=600))
            error = assert_error(response, 400, param="max_tokens", code="context_length_exceeded")
            for number in ("600", "4", str(CONTEXT), str(CONTEXT - 4)):
                assert number in error["message"]
            response = await client.post("/v1/chat/completions", json=chat_body(max_completion_tokens=10**12))
            assert_error(response, 400, param="max_completion_tokens", code="context_length_exceeded")
            ok = await client.post("/v1/completions", json=completion_body(prompt="abcd", max_tokens=CONTEXT - 4))
            assert ok.status_code == 200


@async_test
async def test_a_drafter_the_server_cannot_run_is_400():
    with TestServer(ScriptedEngine(reply_script(), draft_model=False)) as server:
        async with server.client() as client:
            response = await client.post("/v1/completions", json=completion_body(tandem={"drafter": "model"}))
            assert_error(response, 400, param="tandem.drafter", says="ngram")
            ok = await client.post("/v1/completions", json=completion_body(tandem={"drafter": "ngram", "k": 3}))
            assert ok.status_code == 200
        assert server.engine.added[0][2].drafter == "ngram" and server.engine.added[0][2].k == Fixed(3)


@async_test
async def test_the_engine_refuses_a_drafter_it_cannot_run_even_if_the_server_offers_it():
    engine = ScriptedEngine(reply_script(), draft_model=False)
    with TestServer(engine, drafters=("model", "ngram", "none")) as server:  # SequencePool.validate decides
        async with server.client() as client:
            response = await client.post("/v1/completions", json=completion_body(tandem={"drafter": "model"}))
        assert_error(response, 400, code="invalid_value", says="needs a draft model")
        assert not server.engine.added


@async_test
async def test_a_server_drafting_nothing_refuses_only_a_k_that_would_draft():
    """On a server started with `--drafter none`, a request's k above 0 would be ignored (the CLI
    refuses `--drafter none --k 3`): a 400; leaving k out, "auto", 0, or another drafter with it pass."""
    from tandem.engine.events import SpeculationOptions

    with TestServer() as server:
        server.state.speculation_defaults = SpeculationOptions("none", "auto")
        async with server.client() as client:
            for tandem in ({}, {"k": "auto"}, {"k": 0}, {"drafter": "ngram", "k": 3}):
                response = await client.post("/v1/completions", json=completion_body(tandem=tandem))
                assert response.status_code == 200, (tandem, response.text)
            refused = await client.post("/v1/completions", json=completion_body(tandem={"k": 3}))
        assert_error(refused, 400, param="tandem.k", code="invalid_value", says="drafts nothing")


@async_test
async def test_oversized_body_is_413_even_without_a_truthful_content_length():
    with TestServer(max_body_bytes=2048) as server:
        async with server.client() as client:
            big = completion_body(prompt="z" * 4000)
            assert_error(await client.post("/v1/completions", json=big), 413, code="request_too_large", says="2048")

            async def chunks():  # streamed upload: no Content-Length at all
                for _ in range(8):
                    yield b" " * 1000

            response = await client.post("/v1/completions", content=chunks(),
                                         headers={"content-type": "application/json"})
            assert_error(response, 413, code="request_too_large")
        assert server.metrics.rejected == [413, 413] and not server.engine.added


@async_test
async def test_api_key_is_required_on_v1_routes_only():
    with TestServer(api_key="sesame") as server:
        async with server.client() as client:
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic sesame"},
                            {"Authorization": "Bearer "}):
                for method, path in (("POST", "/v1/completions"), ("POST", "/v1/chat/completions"),
                                     ("GET", "/v1/models")):
                    response = await client.request(method, path, json=completion_body(), headers=headers)
                    assert_error(response, 401, type_="authentication_error")
                    assert response.headers["www-authenticate"] == "Bearer"
            assert (await client.get("/health")).status_code == 200
            assert (await client.get("/metrics")).status_code == 200
        async with server.client(Authorization="Bearer sesame") as client:
            assert (await client.post("/v1/completions", json=completion_body())).status_code == 200
            assert (await client.get("/v1/models")).status_code == 200
        assert set(server.metrics.rejected) == {401} and len(server.engine.added) == 1


@async_test
async def test_auth_is_checked_before_the_body_is_read():
    with TestServer(api_key="sesame", max_body_bytes=1024) as server:
        async with server.client() as client:
            response = await client.post("/v1/completions", content=b"{" * 5000)
        assert_error(response, 401, type_="authentication_error")


@async_test
async def test_engine_failure_is_a_server_error_without_a_traceback():
    with TestServer() as server:
        server.engine.fail_with = "CUDA error: device-side assert triggered"
        async with server.client() as client:
            response = await client.post("/v1/completions", json=completion_body())
        error = assert_error(response, 500, type_="server_error", code="error", says="the engine failed")
        assert server.metrics.rejected == [] and server.metrics.finished[0][0] == "error"
        assert "CUDA error" in error["message"]


@async_test
async def test_nothing_left_to_run_a_request_is_a_503_the_client_may_retry():
    """A cluster whose last verifier died finishes its queued requests "unavailable": a 503 (they
    got an engine failure's 500 before), whole or streamed."""
    with TestServer() as server:
        server.engine.unavailable = "no verifier is alive in the cluster"
        async with server.client() as client:
            response = await client.post("/v1/completions", json=completion_body())
            error = assert_error(response, 503, type_="service_unavailable", code="unavailable", says="no verifier")
            stream = await client.post("/v1/completions", json=completion_body(stream=True))
        events = [json.loads(line[6:]) for line in stream.text.splitlines() if line.startswith("data: {")]
        assert events[-1]["error"]["type"] == "service_unavailable" and events[-1]["error"]["code"] == "unavailable"
        assert [finished[0] for finished in server.metrics.finished] == ["unavailable", "unavailable"]
        assert "cannot run this request now" in error["message"]


@async_test
async def test_an_engine_failure_tells_the_client_its_first_and_last_lines_only():
    """A multi-line error (a traceback folded into its text, a kernel's log) reaches the client as
    where and what, as a cluster replica's does; the log keeps the whole of it."""
    with TestServer() as server:
        server.engine.fail_with = ("\x1b[31mkernel failed\x1b[0m\n  at layer 3\n  at op mul_mat\n"
                                   "RuntimeError: out of memory")
        async with server.client() as client:
            response = await client.post("/v1/completions", json=completion_body())
        error = assert_error(response, 500, type_="server_error", code="error", says="the engine failed")
        assert "kernel failed: RuntimeError: out of memory" in error["message"]
        assert "layer 3" not in error["message"] and "\x1b" not in error["message"]


@async_test
async def test_a_request_arriving_with_nothing_left_to_run_it_is_a_503_unavailable_and_health_says_so():
    """A cluster with no verifier left answered new requests 503 `shutting_down` (the error's base
    class), and /health 200 "ok", so a load balancer kept sending them here."""
    with TestServer() as server:
        server.engine.unavailable_reason = "no verifier is alive in the cluster"
        async with server.client() as client:
            health = await client.get("/health")
            assert health.status_code == 503 and health.json()["status"] == "unavailable"
            assert "no verifier" in health.json()["reason"] and "retry-after" in health.headers
            for stream in (False, True):
                response = await client.post("/v1/completions", json=completion_body(stream=stream))
                assert_error(response, 503, type_="service_unavailable", code="unavailable", says="no verifier")
            server.engine.unavailable_reason = None  # a verifier back
            assert (await client.get("/health")).json()["status"] == "ok"
        assert not server.engine.added


def worker_state(name: str, role: str, alive: bool, restarting: bool = False) -> dict:
    return {"name": name, "role": role, "alive": alive, "restarting": restarting, "pid": None,
            "sequences": 0, "restarts": 0, "rtt_ms": 0.0, "routed": {}}


@async_test
async def test_health_names_a_clusters_workers_that_are_not_up():
    """/health said "ok" while a verifier restarted or a drafter was down for good (nothing told a
    cluster was degraded), and 200 "ok" while every verifier was restarting and nothing served."""
    with TestServer() as server:
        workers = [worker_state("verify-0", "verify", alive=True), worker_state("verify-1", "verify", alive=False,
                                                                                restarting=True),
                   worker_state("draft-0", "draft", alive=False)]
        server.engine.worker_states = lambda: workers
        async with server.client() as client:
            health = await client.get("/health")
            assert health.status_code == 200 and health.json()["status"] == "degraded"
            assert health.json()["workers_not_up"] == [{"name": "verify-1", "role": "verify", "state": "restarting"},
                                                       {"name": "draft-0", "role": "draft", "state": "down"}]
            workers[0] = worker_state("verify-0", "verify", alive=False, restarting=True)
            health = await client.get("/health")
            assert health.status_code == 503 and health.json()["status"] == "unavailable"
            assert health.json()["reason"] == "no verifier is up; restarting: verify-0, verify-1"
            workers[1] = worker_state("verify-1", "verify", alive=False)  # out of restarts
            health = await client.get("/health")
            assert health.json()["reason"] == "no verifier is up; restarting: verify-0; down for good: verify-1"
            workers[:] = [worker_state("verify-0", "verify", alive=True)]
            health = await client.get("/health")
            assert health.status_code == 200 and health.json()["status"] == "ok"
            assert "workers_not_up" not in health.json()


@async_test
async def test_a_client_gone_before_its_body_is_counted_as_cancelled_not_rejected():
    """It was counted as a 400 rejection: a 4xx alert fired where clients had only left."""
    import httpx
    from fastapi import FastAPI

    from tandem.serve.api.errors import APIError, install_error_handlers

    class Counts:
        def __init__(self):
            self.abandoned, self.rejected = 0, []

        def request_abandoned(self):
            self.abandoned += 1

        def request_rejected(self, status):
            self.rejected.append(status)

    counts, app = Counts(), FastAPI()
    install_error_handlers(app, counts)

    @app.post("/v1/completions")
    async def gone():
        raise APIError(400, "the client closed the connection before its request body arrived",
                       code="client_disconnected")

    @app.post("/v1/chat/completions")
    async def refused():
        raise APIError(400, "a bad request", code="invalid_value")

    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as client:
        await client.post("/v1/completions")
        await client.post("/v1/chat/completions")
    assert counts.abandoned == 1 and counts.rejected == [400]
