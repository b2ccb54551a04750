"""Bounded capacity and shutdown: 429 with Retry-After when the queue is full, 503 while draining,
/health from the engine's counts, /metrics from ServingMetrics.render(), the dashboard at /."""

import asyncio

from api_doubles import ScriptedEngine, TestServer, async_test, chat_body, completion_body, reply_script


@async_test
async def test_queue_full_is_429_with_retry_after():
    engine = ScriptedEngine(reply_script(), max_running=1)
    engine.gate.clear()
    with TestServer(engine, max_running=1, max_waiting=1) as server:
        async with server.client() as client:
            held = [asyncio.create_task(client.post("/v1/completions", json=completion_body(prompt=f"p{i}")))
                    for i in range(2)]
            await server.wait_until(lambda: server.worker.in_flight == 2)
            response = await client.post("/v1/chat/completions", json=chat_body())
            assert response.status_code == 429
            assert int(response.headers["retry-after"]) >= 1
            error = response.json()["error"]
            assert error["type"] == "rate_limit_error" and error["code"] == "queue_full"
            assert "(2 requests in flight)" in error["message"]
            health = (await client.get("/health")).json()
            assert health["in_flight"] == 2 and health["status"] == "ok"
            server.engine.gate.set()
            assert [(await r).status_code for r in held] == [200, 200]
        assert server.metrics.rejected == [429]


@async_test
async def test_streaming_request_is_refused_before_the_stream_starts():
    engine = ScriptedEngine(reply_script(), max_running=1)
    engine.gate.clear()
    with TestServer(engine, max_running=1, max_waiting=0) as server:
        async with server.client() as client:
            held = asyncio.create_task(client.post("/v1/completions", json=completion_body()))
            await server.wait_until(lambda: server.worker.in_flight == 1)
            response = await client.post("/v1/completions", json=completion_body(stream=True, prompt="other"))
            assert response.status_code == 429 and response.headers["content-type"] == "application/json"
            assert "(1 request in flight)" in response.json()["error"]["message"]  # it said "1 requests"
            server.engine.gate.set()
            await held


async def one_request_in_flight(server, client) -> asyncio.Task:
    """A completion the engine has taken and holds (its gate closed): the task awaiting it."""
    in_flight = asyncio.create_task(client.post("/v1/completions", json=completion_body()))
    await server.wait_until(lambda: server.worker.in_flight == 1)
    return in_flight


@async_test
async def test_draining_server_refuses_with_503_and_finishes_in_flight_requests():
    engine = ScriptedEngine(reply_script(), max_running=1)
    engine.gate.clear()
    with TestServer(engine) as server:
        async with server.client() as client:
            in_flight = await one_request_in_flight(server, client)
            server.state.draining = True
            refused = await client.post("/v1/completions", json=completion_body(prompt="late"))
            assert refused.status_code == 503 and int(refused.headers["retry-after"]) >= 1
            assert refused.json()["error"]["type"] == "service_unavailable"
            health = await client.get("/health")
            assert health.status_code == 503 and health.json()["status"] == "draining"
            assert int(health.headers["retry-after"]) >= 1  # a load balancer's probe learns when to look again
            assert (await client.head("/health")).status_code == 503
            server.engine.gate.set()
            draining = asyncio.create_task(asyncio.to_thread(server.worker.shutdown, 5))
            assert (await in_flight).status_code == 200
            await draining
        assert server.metrics.rejected == [503]


@async_test
async def test_engine_stopped_is_503():
    with TestServer() as server:
        server.worker.shutdown(0)
        async with server.client() as client:
            response = await client.post("/v1/completions", json=completion_body())
        assert response.status_code == 503 and "retry-after" in response.headers


@async_test
async def test_a_whole_request_cancelled_by_shutdown_is_a_503_with_retry_after():
    """Every other 503 says when to retry; the one for a request the shutdown cancelled did not."""
    engine = ScriptedEngine(reply_script(), max_running=1)
    engine.gate.clear()
    with TestServer(engine) as server:
        async with server.client() as client:
            in_flight = await one_request_in_flight(server, client)
            await asyncio.to_thread(server.worker.shutdown, 0)  # no grace: in-flight requests are cancelled
            response = await in_flight
        assert response.status_code == 503 and int(response.headers["retry-after"]) >= 1, response.text
        assert response.json()["error"]["type"] == "service_unavailable"


@async_test
async def test_health_reports_engine_counts():
    engine = ScriptedEngine(reply_script(eos=False), max_running=1)
    with TestServer(engine) as server:
        async with server.client() as client:
            assert (await client.get("/health")).json() == {"status": "ok", "model": server.state.model_name,
                                                            "running": 0, "waiting": 0, "in_flight": 0}
            engine.step_seconds = 0.01
            tasks = [asyncio.create_task(client.post("/v1/completions", json=completion_body(
                prompt=f"p{i}", max_tokens=30))) for i in range(2)]
            # paused as soon as one runs and one waits, so /health is read before the first finishes
            await server.wait_until(lambda: engine.num_running == 1 and engine.num_waiting == 1
                                    and (engine.gate.clear() or True))
            health = (await client.get("/health")).json()
            engine.gate.set()
            assert (health["running"], health["waiting"], health["in_flight"]) == (1, 1, 2)
            await asyncio.gather(*tasks)


@async_test
async def test_metrics_endpoint_serves_the_prometheus_text():
    with TestServer() as server:
        async with server.client() as client:
            response = await client.get("/metrics")
        assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
        assert b"tandem_test_total 1" in response.content


@async_test
async def test_dashboard_is_served_at_the_root():
    with TestServer() as server:
        async with server.client() as client:
            page = await client.get("/")
            data = await client.get("/dashboard/data")
        assert page.status_code == 200 and "text/html" in page.headers["content-type"]
        assert data.json() == {"series": []}
