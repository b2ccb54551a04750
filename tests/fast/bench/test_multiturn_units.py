"""bench-serve --prompts multiturn without a model: the packaged scenarios, the figures per turn,
and conversations against a tiny in-test streaming server that checks every turn resends the
history with the answers it gave."""

import asyncio
import json
import threading
import time

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.responses import StreamingResponse
from starlette.routing import Route

from tandem.bench.serve.client import RequestRecord, build_record
from tandem.bench.serve.launcher import free_port
from tandem.bench.serve.conversations import (Conversation, ScenarioRun, Turn, load_scenarios,
                                              run_scenario_async, summarize_scenario)


def test_the_packaged_scenarios():
    scenarios = load_scenarios()
    assert [len(scenarios[s]) for s in ("chat", "agent", "shared_system")] == [10, 4, 16]
    assert all(len(c.turns) == 3 for c in scenarios["chat"]) and all(len(c.turns) == 4 for c in scenarios["agent"])
    systems = {c.system for c in scenarios["shared_system"]}
    assert len(systems) == 1 and len(next(iter(systems))) > 5000  # one long system prompt for all


def test_usage_cached_tokens_and_text_are_kept():
    usage = {"prompt_tokens": 100, "completion_tokens": 3, "prompt_tokens_details": {"cached_tokens": 80}}
    record = build_record("c/1", "chat", 0.0, 1.0, [0.2, 0.3, 0.4], usage, "stop", "abc")
    assert (record.cached_tokens, record.prompt_tokens, record.text) == (80, 100, "abc")
    assert build_record("c/1", "chat", 0.0, 1.0, [0.2], {"completion_tokens": 1}, "stop").cached_tokens is None


def test_figures_by_turn():
    def turn(number, ttft, cached):
        return Turn("c", number, RequestRecord("c", "chat", True, ttft_s=ttft, e2e_s=ttft + 1, completion_tokens=4,
                                               cached_tokens=cached, prompt_tokens=100))
    run = ScenarioRun("chat", 2, (turn(1, 3.0, 0), turn(1, 5.0, 0), turn(2, 1.0, 90), turn(2, 2.0, 90)), 10.0)
    summary = summarize_scenario(run)
    assert summary["ttft_p50_ms_by_turn"] == {"1": 4000.0, "2": 1500.0}
    assert summary["cached_share"] == 0.45 and summary["requests"] == 4 and summary["errors"] == 0


async def _chat(request):
    body = await request.json()
    messages = body["messages"]
    users = [m for m in messages if m["role"] == "user"]
    answers = [m["content"] for m in messages if m["role"] == "assistant"]
    assert answers == [f"answer {i + 1}" for i in range(len(users) - 1)]  # the history, as answered

    def events():
        chunk = {"choices": [{"delta": {"content": f"answer {len(users)}"}, "finish_reason": None}]}
        yield f"data: {json.dumps(chunk)}\n\n"
        usage = {"prompt_tokens": 10 * len(users), "completion_tokens": 2,
                 "prompt_tokens_details": {"cached_tokens": 10 * (len(users) - 1)}}
        yield f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n"
        yield "data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream")


def test_conversations_resend_their_history():
    app = Starlette(routes=[Route("/v1/chat/completions", _chat, methods=["POST"])])
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    try:
        conversations = [Conversation(f"u{i}", "be brief", ("one", "two", "three")) for i in range(3)]
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        run = asyncio.run(run_scenario_async(url, "chat", conversations, "m", 8, {}, 2))
    finally:
        server.should_exit = True
        thread.join(timeout=10)
    assert len(run.turns) == 9 and all(t.record.ok for t in run.turns), [t.record.error for t in run.turns]
    assert summarize_scenario(run)["cached_share"] == round(30 / 60, 3)  # (0 + 10 + 20) x 3 of 60 x 3


def test_an_interrupted_multiturn_run_keeps_its_finished_scenarios(tmp_path, monkeypatch):
    """Ctrl-C during the second scenario after the first finished on every server: results.json
    and report.md hold the first, marked interrupted, and the interrupt goes on (exit 130)."""
    from tandem.bench.serve import multiturn
    from tandem.bench.serve.server_kinds import ServerLaunch
    from tandem.bench.serve.settings import ServeBenchSettings
    from tandem.bench.workload import DEFAULT_WORKLOAD

    record = RequestRecord("c/1", "chat", True, ttft_s=0.2, e2e_s=1.0, completion_tokens=4)
    finished = ScenarioRun("chat", 10, (Turn("c", 1, record),), 1.0)

    def run_scenario(url, scenario, conversations, model, max_tokens, extras, concurrency):
        if scenario != "chat":
            raise KeyboardInterrupt
        return finished

    monkeypatch.setattr(multiturn, "server_launch", lambda settings, kinds: ServerLaunch(
        "t", "d", "/nonexistent/t.gguf", threads=1, max_running=4, context_length=512))
    monkeypatch.setattr(multiturn, "start_servers", lambda servers, kinds, launch, max_tokens, log_dir: (
        {"tandem-spec": type("E", (), {"chat_url": "http://x", "model": "m"})()},
        {"tandem-spec": {"notes": "a stand-in"}}))
    monkeypatch.setattr(multiturn, "run_scenario", run_scenario)
    settings = ServeBenchSettings("t", "d", ("tandem-spec",), (1,), DEFAULT_WORKLOAD, tmp_path / "out")
    with pytest.raises(KeyboardInterrupt):
        multiturn.run_multiturn_bench(settings)
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert results["interrupted"] and [entry["scenario"] for entry in results["scenarios"]] == ["chat"]
    assert "**Interrupted**" in (tmp_path / "out" / "report.md").read_text()
