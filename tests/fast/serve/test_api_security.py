"""Security defaults: no CORS headers unless origins are configured; /metrics, the dashboard's data
and /openapi.json open unless --protect-metrics (then the key is needed, the page itself stays
open); a warning when binding beyond loopback without a key; no prompt, completion or key text in
the log unless --log-requests (and the key never)."""

import json
import logging
import re

import pytest
from api_doubles import TestServer, async_test, chat_body

from tandem.errors import TandemError
from tandem.serve.api.host_guard import is_loopback_name
from tandem.serve.server import warn_if_exposed
from tandem.serve.settings import ServeSettings

KEY = "sk-very-secret-key-123"
SECRET_PROMPT = "my bank PIN is 9371"
ORIGIN = "https://app.example.com"


def preflight(origin: str) -> dict:
    return {"Origin": origin, "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization,content-type"}


@async_test
async def test_other_web_origins_are_refused_by_default():
    """A page on another origin can POST without a preflight (text/plain): it was served (the
    model generated for it) though it could not read the answer. Now it is refused before any
    work; clients that send no Origin, and the server's own pages, are served."""
    with TestServer() as server:
        async with server.client() as client:
            for content_type in ("application/json", "text/plain"):
                answer = await client.post("/v1/chat/completions", content=json.dumps(chat_body()),
                                           headers={"Origin": ORIGIN, "Content-Type": content_type})
                assert answer.status_code == 403 and answer.json()["error"]["code"] == "origin_not_allowed"
                assert "--allowed-origins" in answer.json()["error"]["message"]
                assert "access-control-allow-origin" not in answer.headers
            assert not server.engine.added
            options = await client.options("/v1/chat/completions", headers=preflight(ORIGIN))
            assert "access-control-allow-origin" not in options.headers
            assert (await client.post("/v1/chat/completions", json=chat_body())).status_code == 200
            own = await client.post("/v1/chat/completions", json=chat_body(), headers={"Origin": "http://localhost"})
            assert own.status_code == 200
            # the same origin, spelt with the scheme's default port or in capitals (it was a 403)
            for host, origin in (("localhost:80", "http://localhost"), ("localhost", "http://localhost:80"),
                                 ("LocalHost", "HTTP://localhost")):
                same = await client.post("/v1/chat/completions", json=chat_body(),
                                         headers={"Origin": origin, "Host": host})
                assert same.status_code == 200, (host, origin)
            other_port = await client.post("/v1/chat/completions", json=chat_body(),
                                           headers={"Origin": "http://localhost:8080", "Host": "localhost"})
            assert other_port.status_code == 403
            # no advice the command line refuses (it said "serve with --allowed-origins null")
            for unnamable in ("null", "chrome-extension://abc", "https://a.example/path"):
                refused = await client.post("/v1/chat/completions", json=chat_body(), headers={"Origin": unnamable})
                assert refused.status_code == 403 and "--allowed-origins" in refused.json()["error"]["message"]
                assert f"--allowed-origins {unnamable}" not in refused.json()["error"]["message"]
        assert server.state.metrics.rejected == [403] * 7  # the posts and the preflight, counted


@async_test
async def test_cors_only_for_the_configured_origins():
    with TestServer(allowed_origins=(ORIGIN,)) as server:
        async with server.client() as client:
            allowed = await client.options("/v1/chat/completions", headers=preflight(ORIGIN))
            assert allowed.status_code == 200 and allowed.headers["access-control-allow-origin"] == ORIGIN
            other = await client.options("/v1/chat/completions", headers=preflight("https://evil.example"))
            assert other.headers.get("access-control-allow-origin") != "https://evil.example"
            answer = await client.post("/v1/chat/completions", json=chat_body(), headers={"Origin": ORIGIN})
            assert answer.headers["access-control-allow-origin"] == ORIGIN
            # the allowed origin in capitals or with its default port is the same origin (it was a 403)
            for spelt in (ORIGIN.upper(), ORIGIN + ":443"):
                same = await client.post("/v1/chat/completions", json=chat_body(), headers={"Origin": spelt})
                assert same.status_code == 200, spelt
                asked = await client.options("/v1/chat/completions", headers=preflight(spelt))  # CORS said 400
                assert asked.status_code == 200 and asked.headers["access-control-allow-origin"] == spelt, spelt
            # the official JS client's headers pass the preflight (it was a 400 "Disallowed CORS headers"),
            # and a page may read Retry-After (of a 429)
            sdk = await client.options("/v1/chat/completions", headers={
                **preflight(ORIGIN), "Access-Control-Request-Headers": "authorization,content-type,x-stainless-arch,"
                "x-stainless-lang,x-stainless-os,x-stainless-package-version,x-stainless-retry-count"})
            assert sdk.status_code == 200, sdk.text
            assert "retry-after" in answer.headers["access-control-expose-headers"].lower()
            # a refused preflight is an error body like every other (it was plain text)
            put = await client.options("/v1/chat/completions", headers={**preflight(ORIGIN),
                                                                         "Access-Control-Request-Method": "PUT"})
            assert put.status_code == 400 and put.json()["error"]["code"] == "cors_preflight_refused"
            assert "Disallowed CORS method" in put.json()["error"]["message"]
            assert put.headers["access-control-allow-origin"] == ORIGIN
    for configured in ("https://App.Example.com", ORIGIN + ":443"):
        # an operator's spelling: the guard passed the browser's origin but CORS gave it no header
        with TestServer(allowed_origins=(configured,)) as server:
            async with server.client() as client:
                allowed = await client.options("/v1/chat/completions", headers=preflight(ORIGIN))
                assert allowed.status_code == 200 and allowed.headers["access-control-allow-origin"] == ORIGIN
                answer = await client.post("/v1/chat/completions", json=chat_body(), headers={"Origin": ORIGIN})
                assert answer.status_code == 200 and answer.headers["access-control-allow-origin"] == ORIGIN


@async_test
async def test_no_body_is_sniffed_and_no_site_frames_the_dashboard():
    """None of them said nosniff, and the dashboard could be framed by any site."""
    with TestServer(api_key=KEY) as server:
        async with server.client() as client:
            answers = [await client.get(path) for path in ("/", "/dashboard/static/dashboard.js", "/health", "/v1/models")]
            answers.append(await client.post("/v1/completions", json={}, headers={"Host": "evil.example"}))
            assert [a.status_code for a in answers] == [200, 200, 200, 401, 403]
            assert all(a.headers["x-content-type-options"] == "nosniff" for a in answers)
            page = answers[0]
            assert page.headers["x-frame-options"] == "DENY"
            assert "frame-ancestors 'none'" in page.headers["content-security-policy"]


@async_test
async def test_metrics_and_dashboard_data_are_open_by_default():
    with TestServer(api_key=KEY) as server:
        async with server.client() as client:
            for path in ("/metrics", "/dashboard/data", "/openapi.json", "/health"):
                assert (await client.get(path)).status_code == 200, path
            assert (await client.get("/v1/models")).status_code == 401


@async_test
async def test_protect_metrics_puts_them_behind_the_key():
    with TestServer(api_key=KEY, protect_metrics=True) as server:
        async with server.client() as client:
            for path in ("/metrics", "/dashboard/data", "/openapi.json"):
                refused = await client.get(path)
                assert refused.status_code == 401 and refused.json()["error"]["type"] == "authentication_error"
                assert (await client.get(path, headers={"Authorization": f"Bearer {KEY}"})).status_code == 200
            assert (await client.get("/")).status_code == 200  # the page holds no data
            health = await client.get("/health")  # load balancers probe it: its status alone (it told the
            assert health.status_code == 200 and health.json() == {"status": "ok"}  # model and its load to anyone)
        assert server.state.metrics.rejected == []  # a dashboard polling without the key is no rejected request


def test_protect_metrics_needs_a_key():
    with pytest.raises(TandemError, match="--api-key"):
        ServeSettings(protect_metrics=True)


@pytest.mark.parametrize("host, key, warned", [("0.0.0.0", None, True), ("::", None, True), ("10.1.2.3", None, True),
                                               ("0.0.0.0", KEY, False), ("127.0.0.1", None, False),
                                               ("::1", None, False), ("localhost", None, False)])
def test_binding_beyond_loopback_without_a_key_warns(capsys, host, key, warned):
    warn_if_exposed(ServeSettings(host=host, api_key=key))
    assert ("without --api-key" in capsys.readouterr().err) == warned
    assert is_loopback_name(host) == (host in ("127.0.0.1", "::1", "localhost"))


@async_test
async def _exchange(server):
    async with server.client(Authorization=f"Bearer {KEY}") as client:
        body = chat_body(messages=[{"role": "user", "content": SECRET_PROMPT}])
        assert (await client.post("/v1/chat/completions", json=body)).status_code == 200
        bad = await client.post("/v1/chat/completions", json={**body, "temperature": "hot"})
        assert bad.status_code == 400
        await client.get("/v1/models", headers={"Authorization": "Bearer wrong-" + KEY})


def test_logs_hold_no_prompt_completion_or_key_by_default(caplog):
    caplog.set_level(logging.DEBUG)
    with TestServer(api_key=KEY) as server:
        _exchange(server)
        assert server.metrics.finished  # the request ran to its end
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert SECRET_PROMPT not in logged and KEY not in logged and "Héllo" not in logged


def test_log_requests_logs_the_texts_but_never_the_key(caplog):
    caplog.set_level(logging.INFO, logger="tandem.requests")
    with TestServer(api_key=KEY, log_requests=True) as server:
        _exchange(server)
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert SECRET_PROMPT in logged and "Héllo" in logged
    assert re.search(r"chatcmpl-[0-9a-f]{32} seq-\d+ \(stop\)", logged)  # the answer's id: the line is found
    assert KEY not in logged


@pytest.mark.parametrize("level, root, texts", [("warning", logging.WARNING, False), ("info", logging.INFO, False),
                                                 ("debug", logging.DEBUG, False), ("debug", logging.DEBUG, True)])
def test_the_log_level_sets_what_is_logged_but_request_texts_need_log_requests(level, root, texts):
    from tandem.serve.server import configure_logging
    from tandem.serve.settings import ServeSettings

    before = logging.getLogger().level, logging.getLogger("tandem.requests").level
    try:
        configure_logging(ServeSettings(log_level=level, log_requests=texts))
        assert logging.getLogger().level == root
        assert logging.getLogger("tandem.requests").isEnabledFor(logging.INFO) == texts  # never by level alone
    finally:
        logging.getLogger().setLevel(before[0])
        logging.getLogger("tandem.requests").setLevel(before[1])


def test_a_taken_port_is_refused_before_the_models_load(monkeypatch):
    """The port was bound after loading: a first start pulled and profiled for minutes, then said
    the port was taken."""
    import socket

    from tandem.engine.build import EngineConfig
    from tandem.models.backends import RunnerSpec
    from tandem.serve import server as server_module

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    monkeypatch.setattr(server_module, "build_state", lambda *args, **kwargs: pytest.fail("loaded the models first"))
    config = EngineConfig(RunnerSpec("smollm2-135m-instruct", backend="llamacpp"), drafter="ngram")
    try:
        with pytest.raises(TandemError, match="cannot listen on"):
            server_module.serve(config, ServeSettings(port=listener.getsockname()[1]))
    finally:
        listener.close()


@async_test
async def test_a_loopback_server_answers_only_requests_addressed_to_loopback():
    """DNS rebinding: a page re-points its own name at 127.0.0.1 and reads a keyless local server
    as its own origin; the request still names that page's host, which is refused."""
    from tandem.serve.api.host_guard import host_name

    assert [host_name(h) for h in ("[::1]:8000", "a.b:80", "localhost", "::1")] == ["[::1]", "a.b", "localhost", "::1"]
    assert [host_name(h) for h in ("a:b", "[::1", "[::1]:x", "[[::1]]", "a:1x")] == [None] * 5
    with TestServer() as server:  # bound to 127.0.0.1, the default
        async with server.client() as client:
            for host in ("localhost:8000", "127.0.0.1", "[::1]:8000", "app.localhost"):
                assert (await client.post("/v1/chat/completions", json=chat_body(), headers={"Host": host})).status_code == 200
            refused = await client.post("/v1/chat/completions", json=chat_body(), headers={"Host": "attacker.example:8000"})
            assert refused.status_code == 403 and refused.json()["error"]["code"] == "host_not_allowed"
            assert "--allowed-hosts attacker.example" in refused.json()["error"]["message"]
            for malformed in ("localhost:evil.example", "[::1", "[::1]evil", "localhost:8000x"):  # they passed
                refused = await client.post("/v1/chat/completions", json=chat_body(), headers={"Host": malformed})
                assert refused.status_code == 403 and "no host name" in refused.json()["error"]["message"], malformed
        assert server.state.metrics.rejected == [403] * 5  # only those addressed elsewhere
    with TestServer(allowed_hosts=("proxy.example",)) as server:
        async with server.client() as client:
            answer = await client.post("/v1/chat/completions", json=chat_body(), headers={"Host": "proxy.example"})
            assert answer.status_code == 200
    with TestServer(host="0.0.0.0", api_key=KEY) as server:  # exposed on purpose: names are not guarded
        async with server.client(authorization=f"Bearer {KEY}") as client:
            answer = await client.post("/v1/chat/completions", json=chat_body(), headers={"Host": "tandem.example"})
            assert answer.status_code == 200


def test_uvicorns_records_reach_the_one_stderr_handler_not_stdout(caplog, capsys):
    """--log-level info wrote the access log to stdout in uvicorn's format (no time), while the
    rest went to stderr as 'time LEVEL name: message'."""
    import uvicorn

    from tandem.serve.server import UVICORN_LOG_CONFIG

    caplog.set_level(logging.INFO)
    uvicorn.Config(lambda scope, receive, send: None, log_config=UVICORN_LOG_CONFIG, log_level="info",
                   access_log=True)  # configures uvicorn's loggers, as the server's Config does
    access = logging.getLogger("uvicorn.access")
    access.info('%s - "%s %s HTTP/%s" %d', "127.0.0.1:5", "POST", "/v1/completions", "1.1", 200)
    assert not access.handlers and access.propagate
    assert capsys.readouterr().out == ""
    assert any(r.name == "uvicorn.access" and "POST /v1/completions" in r.getMessage() for r in caplog.records)


def test_the_start_line_says_how_a_protected_dashboard_takes_its_key():
    """Under --protect-metrics the dashboard showed nothing until its address carried the key,
    and the line pointing at it said nothing of that."""
    from tandem.serve.server import _banner

    assert _banner("m", "127.0.0.1", 8000).endswith("dashboard: http://127.0.0.1:8000/")
    assert _banner("m", "::1", 8000, protected=True).endswith(
        "dashboard: http://[::1]:8000/ (add #key=YOUR_API_KEY to its address: --protect-metrics)")
