"""The serving benchmark without a model: SSE parsing, per-request timing, the figures and ratios,
request planning, option checks, the server launcher, and the closed-loop client pool and the
whole sweep against a tiny in-test streaming server with known delays."""

import asyncio
import json
import os
import sys
import threading
import time
from pathlib import Path
from types import MappingProxyType

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.responses import JSONResponse, PlainTextResponse, StreamingResponse
from starlette.routing import Route

from tandem.bench.serve import launcher as launcher_module
from tandem.bench.serve.client import RequestRecord, answer_tokens_only, build_record
from tandem.bench.serve.launcher import ServerProcess, free_port
from tandem.bench.serve.loadgen import LoadItem, LoadResult, run_load
from tandem.bench.serve.metrics import compare, summarize
from tandem.bench.serve.requests import (REPEAT_MARK, chat_payload, interleave_categories, level_requests, repeats,
                                         load_items)
from tandem.bench.serve.results import build_results
from tandem.bench.serve.server_kinds import SERVER_KINDS, ServerLaunch
from tandem.bench.serve.session import plan_levels, write_outputs
from tandem.bench.serve.settings import ServeBenchSettings, parse_concurrency, parse_configs
from tandem.bench.serve.sse import DONE, SseDecoder, parse_chunk
from tandem.bench.serve.sweep import LevelPlan, as_answers, config_order, run_sweep
from tandem.bench.workload import DEFAULT_WORKLOAD, BenchPrompt, load_prompts
from tandem.cli.main import main
from tandem.errors import TandemError

FIRST_DELAY_S = 0.20  # fake server: send -> first token
GAP_S = 0.05  # fake server: between tokens
SLACK_S = 0.08  # timing tolerance on a loaded machine
LAUNCH = ServerLaunch("tiny", "tiny", "/nonexistent/tiny.gguf", threads=1, max_running=4, context_length=512)


# --- a fake OpenAI-compatible streaming server ------------------------------------------------


class FakeServer:
    """Streams `max_tokens` one-word chunks: the first after FIRST_DELAY_S, then one per GAP_S;
    counts the requests open at once."""

    def __init__(self):
        self.active = 0
        self.peak = 0
        self.bodies: list[dict] = []
        self.app = Starlette(routes=[
            Route("/v1/chat/completions", self.chat, methods=["POST"]),
            Route("/v1/models", self.models),
            Route("/health", self.models),
            Route("/metrics", self.metrics),
        ])

    async def metrics(self, request):
        """Tandem's draft-source counters: every chat request so far drafted 4 `suffix9` tokens
        (3 accepted) in one round, and was offered one `ngram3` round it drafted nothing in (a
        request marked `"user": "nospec"` counts as another server's); and its engine steps: 5
        a request, one with prompt tokens, 0.5 s in all, 0.1 s drafting and 0.3 s verifying."""
        n = sum(body.get("user") != "nospec" for body in self.bodies)
        labels = 'model_name="fake-model",source='
        steps = [line for name, count, seconds in (("engine", 5 * n, 0.5 * n), ("prefill", n, 0.05 * n),
                                                   ("draft", 5 * n, 0.1 * n), ("verify", 5 * n, 0.3 * n))
                 for line in (f"# TYPE tandem:{name}_step_seconds histogram",
                              f'tandem:{name}_step_seconds_bucket{{model_name="fake-model",le="+Inf"}} {count}',
                              f'tandem:{name}_step_seconds_count{{model_name="fake-model"}} {count}',
                              f'tandem:{name}_step_seconds_sum{{model_name="fake-model"}} {seconds}')]
        return PlainTextResponse("\n".join(steps + [
            "# TYPE tandem:engine_prompt_steps counter",
            f'tandem:engine_prompt_steps_total{{model_name="fake-model"}} {n}',
            "# TYPE tandem:spec_decode_rounds counter",
            f'tandem:spec_decode_rounds_total{{{labels}"suffix9"}} {n}',
            f'tandem:spec_decode_rounds_total{{{labels}"ngram3"}} {n}',
            "# TYPE tandem:spec_decode_draft_tokens_by_source counter",
            f'tandem:spec_decode_draft_tokens_by_source_total{{{labels}"suffix9"}} {4 * n}',
            "# TYPE tandem:spec_decode_accepted_tokens_by_source counter",
            f'tandem:spec_decode_accepted_tokens_by_source_total{{{labels}"suffix9"}} {3 * n}']) + "\n")

    async def models(self, request):
        return JSONResponse({"object": "list", "data": [{"id": "fake-model", "object": "model"}]})

    async def chat(self, request):
        body = await request.json()
        self.bodies.append(body)
        if body.get("model") != "fake-model":
            return JSONResponse({"error": {"message": "unknown model"}}, status_code=404)
        return StreamingResponse(self.events(body), media_type="text/event-stream")

    async def events(self, body):
        self.active += 1
        self.peak = max(self.peak, self.active)
        try:
            yield _event({"choices": [{"index": 0, "delta": {"role": "assistant"}}]})
            yield ": ping\n\n"
            await asyncio.sleep(FIRST_DELAY_S)
            for i in range(body["max_tokens"]):
                if i:
                    await asyncio.sleep(GAP_S)
                yield _event({"choices": [{"index": 0, "delta": {"content": f" w{i}"}}]})
            yield _event({"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]})
            if body.get("stream_options", {}).get("include_usage"):
                usage = {"completion_tokens": body["max_tokens"], "prompt_tokens": 7,
                         "speculative": {"drafted_tokens": 4, "accepted_tokens": 3}}
                yield _event({"choices": [], "usage": usage})
            yield f"data: {DONE}\n\n"
        finally:
            self.active -= 1


def _event(data: dict) -> str:
    return f"data: {json.dumps(data)}\n\n"


@pytest.fixture()
def fake_server():
    server = FakeServer()
    port = free_port()
    uv = uvicorn.Server(uvicorn.Config(server.app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=uv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not uv.started and time.monotonic() < deadline:
        time.sleep(0.02)
    server.base_url = f"http://127.0.0.1:{port}/v1"
    yield server
    uv.should_exit = True
    thread.join(timeout=10)


def items(count: int, max_tokens: int = 5, model: str = "fake-model") -> list[LoadItem]:
    requests = level_requests([BenchPrompt("p", "c", prompt="hi")], count, 0)
    return load_items(requests, model, max_tokens, {})


# --- SSE parsing and one request's record -----------------------------------------------------


def test_sse_decoder_joins_data_lines_and_skips_comments():
    decoder = SseDecoder()
    lines = [": ping", "event: message", "data: {\"a\":", "data: 1}", "", "data: [DONE]\r"]
    payloads = [p for line in lines for p in decoder.feed(line)] + decoder.flush()
    assert payloads == ['{"a":\n1}', DONE]
    assert decoder.flush() == []


def test_parse_chunk_reads_content_finish_usage_and_errors():
    assert parse_chunk('{"choices": [{"delta": {"role": "assistant"}}]}').text == ""
    assert parse_chunk('{"choices": [{"delta": {"content": "hi"}}]}').text == "hi"
    assert parse_chunk('{"choices": [{"delta": {}, "finish_reason": "stop"}]}').finish_reason == "stop"
    usage = parse_chunk('{"choices": [], "usage": {"completion_tokens": 7}}').usage
    assert usage == {"completion_tokens": 7}
    assert parse_chunk('{"error": {"message": "boom"}}').error == "boom"
    assert "malformed" in parse_chunk("{not json").error


def test_record_counts_tokens_from_usage_else_chunks():
    times = [1.5, 1.6, 1.8]
    usage = {"completion_tokens": 6, "speculative": {"drafted_tokens": 8, "accepted_tokens": 5}}
    record = build_record("p", "c", 1.0, 2.0, times, usage, "length")
    assert record.ttft_s == pytest.approx(0.5) and record.e2e_s == pytest.approx(1.0)
    assert record.itl_s == pytest.approx((0.1, 0.2))
    assert (record.completion_tokens, record.tokens_from_usage, record.token_chunks) == (6, True, 3)
    assert (record.drafted, record.accepted) == (8, 5)
    assert record.tpot_s == pytest.approx(0.3 / 5)
    plain = build_record("p", "c", 1.0, 2.0, times, None, "stop")
    assert (plain.completion_tokens, plain.tokens_from_usage, plain.drafted) == (3, False, None)
    assert plain.tpot_s == pytest.approx(0.15)
    empty = build_record("p", "c", 1.0, 1.2, [], None, "stop")
    assert empty.ttft_s is None and empty.tpot_s is None and empty.completion_tokens == 0


def test_every_server_is_counted_by_the_answers_tokens_its_end_token_left_out():
    """llama-server's usage counts the end-of-sequence token it sampled ("Bonjour" + end: 2), Tandem's
    does not: an answer that ended by itself was one token longer on llama-server's side."""
    times = [1.5, 1.6, 1.8]
    ended = build_record("p", "c", 1.0, 2.0, times, {"completion_tokens": 4}, "stop")
    assert answer_tokens_only(ended).completion_tokens == 3
    cut = build_record("p", "c", 1.0, 2.0, times, {"completion_tokens": 3}, "length")
    chunks = build_record("p", "c", 1.0, 2.0, times, None, "stop")  # counted by chunks: no end token in them
    for record in (cut, chunks, RequestRecord("p", "c", ok=False, error="boom")):
        assert answer_tokens_only(record) == record
    result = LoadResult(1, (ended, cut), 1.0, 1)
    counted = {label: [r.completion_tokens for r in as_answers(result, SERVER_KINDS[label]).records]
               for label in ("llama-server", "llama-server-ngram", "tandem-spec", "llamacpp-server")}
    assert counted == {"llama-server": [3, 3], "llama-server-ngram": [3, 3], "tandem-spec": [4, 3],
                       "llamacpp-server": [4, 3]}


# --- figures and ratios -----------------------------------------------------------------------


def ok_record(ttft, gaps, tokens, e2e, drafted=None, accepted=None) -> RequestRecord:
    return RequestRecord("p", "c", True, ttft_s=ttft, e2e_s=e2e, itl_s=tuple(gaps), token_chunks=len(gaps) + 1,
                         completion_tokens=tokens, drafted=drafted, accepted=accepted)


def test_summary_figures_and_percentiles():
    records = (ok_record(0.1, [0.01, 0.03], 3, 1.0, 10, 6), ok_record(0.3, [0.02], 2, 2.0, 10, 2),
               RequestRecord("p", "c", False, error="HTTP 500: boom", e2e_s=0.5))
    s = summarize(LoadResult(2, records, wall_s=2.5, peak_in_flight=2))
    assert (s["requests"], s["errors"], s["error_samples"]) == (3, 1, ["HTTP 500: boom"])
    assert s["completion_tokens"] == 5 and s["throughput_tok_s"] == pytest.approx(2.0)
    assert s["requests_per_s"] == pytest.approx(0.8)
    assert s["ttft_ms_p50"] == pytest.approx(200) and s["ttft_ms_p99"] == pytest.approx(298)
    assert s["itl_ms_p50"] == pytest.approx(20) and s["e2e_s_p50"] == pytest.approx(1.5)
    assert s["acceptance_rate"] == pytest.approx(8 / 20)
    assert s["mean_in_flight"] == pytest.approx(3.5 / 2.5)


def test_summary_without_speculation_or_successes():
    s = summarize(LoadResult(1, (RequestRecord("p", "c", False, error="x"),), wall_s=1.0, peak_in_flight=1))
    assert s["acceptance_rate"] is None and s["ttft_ms_p50"] is None and s["throughput_tok_s"] == 0


def test_compare_orients_every_ratio_so_above_one_means_better():
    a = {"throughput_tok_s": 30.0, "ttft_ms_p50": 100.0, "itl_ms_p50": 20.0, "tpot_ms_p50": 10.0, "e2e_s_p50": 1.0}
    b = {"throughput_tok_s": 15.0, "ttft_ms_p50": 200.0, "itl_ms_p50": 20.0, "tpot_ms_p50": 30.0, "e2e_s_p50": None}
    assert compare(a, b) == {"throughput": 2.0, "ttft_p50": 2.0, "itl_p50": 1.0, "tpot_p50": 3.0, "e2e_p50": None}


def test_no_itl_ratio_between_servers_that_chunk_their_streams_differently():
    """A server sending a round's tokens in one chunk against one sending a token a chunk: their
    gaps between chunks are not the same thing (an edits run printed ITL p50 "0.00x")."""
    rounds = summarize(LoadResult(1, (ok_record(0.1, [0.5, 0.5], 12, 1.2),), wall_s=1.2, peak_in_flight=1))
    tokens = summarize(LoadResult(1, (ok_record(0.1, [0.0001] * 10 + [0.09], 12, 1.2),), wall_s=1.2, peak_in_flight=1))
    assert (rounds["tokens_per_chunk"], tokens["tokens_per_chunk"]) == (4.0, 1.0)
    assert compare(rounds, tokens)["itl_p50"] is None and compare(rounds, tokens)["throughput"] == 1.0
    assert compare(tokens, tokens)["itl_p50"] == 1.0


# --- request planning and options ------------------------------------------------------------


def test_levels_interleave_categories_and_mark_repeats(capsys):
    prompts = [BenchPrompt(f"{c}{i}", c, prompt=f"{c}{i}") for c in "ab" for i in range(2)]
    assert [p.id for p in interleave_categories(prompts)] == ["a0", "b0", "a1", "b1"]
    requests = level_requests(prompts, 3, 3)
    assert [r.prompt_id for r in requests] == ["b1", "a0~1", "b0~1"]
    assert requests[1].messages[-1]["content"] == REPEAT_MARK.format(1) + "a0"  # in front: no prompt cache
    settings = ServeBenchSettings("t", "d", ("llamacpp-server",), (1, 2), DEFAULT_WORKLOAD, "out", num_prompts=3)
    plans = plan_levels(settings, prompts)
    contents = [r.messages[-1]["content"] for plan in plans for r in plan.requests]
    assert len(set(contents)) == len(contents) == 6  # no request is ever sent twice
    assert [repeats(plan.requests) for plan in plans] == [0, 2]  # the second level wraps: said, and recorded
    assert "at C=2, 2 of 3 requests take a prompt again" in capsys.readouterr().err
    from tandem.bench.serve.session import header

    class Launch:
        def __getattr__(self, name):
            return None

    assert header(settings, Launch(), plans)["settings"]["repeats_per_level"] == {"1": 0, "2": 2}


def test_default_workload_window_has_every_category():
    requests = level_requests(load_prompts(DEFAULT_WORKLOAD), 20, 0)
    assert len({r.category for r in requests}) == 5 and len({r.prompt_id for r in requests}) == 20


def test_payload_is_greedy_streaming_with_usage_and_kind_extras():
    request = level_requests([BenchPrompt("p", "c", prompt="hi")], 1, 0)[0]
    payload = chat_payload(request, "m", 8, {"repeat_penalty": 1.0})
    assert payload["messages"] == [{"role": "user", "content": "hi"}]
    assert payload["temperature"] == 0.0 and payload["stream"] is True and payload["max_tokens"] == 8
    assert payload["stream_options"] == {"include_usage": True} and payload["repeat_penalty"] == 1.0


def test_a_spread_varies_each_requests_cap_the_same_way_for_every_server():
    prompts = [BenchPrompt(f"p{i}", "c", prompt=f"p{i}") for i in range(40)]
    requests = level_requests(prompts, 40, 0, spread=10)
    caps = [chat_payload(r, "m", 50, {})["max_tokens"] for r in requests]
    assert min(caps) == 40 and max(caps) == 60 and len(set(caps)) >= 18  # caps across 50 +- 10
    assert caps == [chat_payload(r, "m", 50, {})["max_tokens"] for r in level_requests(prompts, 40, 0, spread=10)]
    assert all(a != b for a, b in zip(caps, caps[1:]))  # neighbours never end together
    assert [chat_payload(r, "m", 50, {})["max_tokens"] for r in level_requests(prompts, 5, 0)] == [50] * 5
    settings = ServeBenchSettings("t", "d", ("tandem-spec",), (1,), DEFAULT_WORKLOAD, "out", num_prompts=4,
                                  max_tokens_spread=3)
    offsets = [r.max_tokens_offset for plan in plan_levels(settings, prompts) for r in plan.requests]
    assert offsets == [-3, 1, -2, 2]
    for bad in (-1, 50):
        with pytest.raises(TandemError, match="spread"):
            ServeBenchSettings("t", "d", ("tandem-spec",), (1,), DEFAULT_WORKLOAD, "out", max_tokens_spread=bad)


def test_option_parsing_and_defaults():
    assert parse_configs(" tandem-spec,llamacpp-server ") == ("tandem-spec", "llamacpp-server")
    assert parse_concurrency("4, 1,2") == (1, 2, 4)
    for bad in ("", "0", "1,x", "-1", "2000"):
        with pytest.raises(TandemError):
            parse_concurrency(bad)
    for bad in ("", "vllm", "tandem-spec,tandem-spec"):
        with pytest.raises(TandemError):
            parse_configs(bad)
    settings = ServeBenchSettings("t", "d", ("tandem-spec",), (1, 16), DEFAULT_WORKLOAD, "out")
    assert settings.requests_at(1) == 20 and settings.requests_at(16) == 32
    with pytest.raises(TandemError, match="never be reached"):
        ServeBenchSettings("t", "d", ("tandem-spec",), (1, 16), DEFAULT_WORKLOAD, "out", num_prompts=8)
    with pytest.raises(TandemError):
        ServeBenchSettings("t", "d", ("tandem-spec",), (1,), DEFAULT_WORKLOAD, "out", max_tokens=0)


def test_tandem_servers_get_a_dtype_only_for_models_torch_runs(monkeypatch):
    """`bench-serve --backend torch --dtype bf16 --draft-backend llamacpp` (torch-fused.md's sweep)
    gave every server `--draft-dtype bf16`, which serve refuses for a GGUF draft: each exited 2."""
    from tandem.cli.main import build_parser
    from tandem.cli.options import engine_config
    from tandem.models import backends, resolve

    monkeypatch.setattr(backends, "_gpu_device", lambda: None)
    monkeypatch.setattr(resolve, "check_model_name", lambda model: None)  # "tiny" stands for a model
    launch = ServerLaunch("tiny", "tiny", "/m.gguf", 1, 4, 512, backend="torch", dtype="bf16", draft_backend="llamacpp")
    for kind in ("tandem-spec", "tandem-nospec"):
        command = SERVER_KINDS[kind]().command(launch, 1234)
        assert "--draft-dtype" not in command and command[command.index("--dtype") + 1] == "bf16"
        engine_config(build_parser().parse_args(command[3:]))  # serve's own check passes
    command = SERVER_KINDS["tandem-spec"]().command(LAUNCH, 1234)  # llama.cpp for both: no dtype at all
    assert "--dtype" not in command and "--draft-dtype" not in command


def test_server_kind_command_lines(tmp_path, monkeypatch):
    peer = tmp_path / "llama-server"  # the command line only names the binary: no build needed (CI has none)
    peer.write_text("")
    peer.chmod(0o755)
    monkeypatch.setenv("TANDEM_LLAMA_SERVER", str(peer))
    spec, nospec, llama = (SERVER_KINDS[n]() for n in ("tandem-spec", "tandem-nospec", "llamacpp-server"))
    assert "--drafter" not in spec.command(LAUNCH, 1234) and "--port" in spec.command(LAUNCH, 1234)
    assert nospec.command(LAUNCH, 1234)[-2:] == ["--drafter", "none"]
    assert SERVER_KINDS["tandem-waves"]().command(LAUNCH, 1234)[-1] == "--prefill-waves"
    assert SERVER_KINDS["tandem-chunks256"]().command(LAUNCH, 1234)[-2:] == ["--prefill-floor", "256"]
    assert SERVER_KINDS["tandem-shortgaps"]().command(LAUNCH, 1234)[-2:] == ["--prefill-floor", "auto"]
    line = llama.command(LAUNCH, 1234)
    assert line[line.index("--interrupt_requests") + 1] == "False" and "1234" in line
    server = SERVER_KINDS["llama-server"]().command(LAUNCH, 1234)
    wide = SERVER_KINDS["llama-server"]().command(ServerLaunch("t", "d", "/m.gguf", 1, 16, 4096), 1234)
    assert server[server.index("-c") + 1] == "1024" and server[server.index("-np") + 1] == "4"  # 4 slots x 512 / 2
    assert wide[wide.index("-c") + 1] == "32768"  # the pool Tandem's runner holds for 16 slots, not one context
    assert spec.base_url(0, "loading\nserving on http://127.0.0.1:4321/v1 (ctrl-c)\n") == "http://127.0.0.1:4321/v1"
    assert spec.base_url(0, "loading...") is None
    assert llama.base_url(1234, "") == "http://127.0.0.1:1234/v1"


def test_cli_rejects_bad_input_with_one_line(capsys):
    for args in (["--configs", "bogus"], ["--concurrency", "1,zero"], ["--target", "/nonexistent/model.gguf"],
                 ["--prompts", "/nonexistent/prompts.jsonl"]):
        assert main(["bench-serve", "--configs", "llamacpp-server", *args]) == 2
        error = capsys.readouterr().err
        assert error.startswith("error: ") and error.count("\n") == 1


def test_the_draft_left_out_is_the_one_tandem_serve_would_pick_for_the_draft_backend(monkeypatch, tmp_path, capsys):
    """bench-serve hands the servers one draft file; left out, it is the one `tandem serve` picks for
    Tandem's draft backend (the re-quantized file on llama.cpp, the shipped one on torch)."""
    from tandem.bench.serve import session
    from tandem.models.catalog import DEFAULT_DRAFT, SHIPPED_DRAFT

    seen = []
    machine = {"cpu_model": "AMD EPYC", "cpu_count": 2, "llama_cpp_cpu": "SSE3 AVX2 FMA AVX512 AVX512_VNNI OPENMP"}
    monkeypatch.setattr(session, "run_serve_bench", lambda settings: seen.append(settings.draft) or {"machine": machine, "levels": []})
    monkeypatch.setattr("tandem.cli.bench_serve_cmd.throughput_table", lambda results: [])
    base = ["bench-serve", "--configs", "tandem-spec", "--concurrency", "1", "--out", str(tmp_path / "out")]
    for extra in ([], ["--backend", "torch"], ["--backend", "torch", "--draft-backend", "llamacpp"],
                  ["--backend", "torch", "--draft", DEFAULT_DRAFT]):
        assert main(base + extra) == 0
    assert seen == [DEFAULT_DRAFT, SHIPPED_DRAFT, DEFAULT_DRAFT, DEFAULT_DRAFT]
    # the table at the terminal names its machine (only the report did)
    assert capsys.readouterr().out.splitlines()[0] == "machine: AMD EPYC, 2 CPUs; llama.cpp built for AVX2 AVX512 AVX512_VNNI"


def test_a_soaked_server_gets_the_draft_named_and_else_picks_its_own():
    from tandem.bench.soak.server import SoakedServer

    assert SoakedServer("t", None, 8, ["--backend", "torch"]).arguments == [
        "--target", "t", "--max-running", "8", "--backend", "torch"]
    assert SoakedServer("t", "d", 8, []).arguments[:4] == ["--target", "t", "--draft", "d"]


# --- the client pool against the fake server --------------------------------------------------


def test_pool_measures_ttft_and_itl(fake_server):
    load = run_load(fake_server.base_url + "/chat/completions", items(3, max_tokens=6), 1)
    s = summarize(load)
    assert s["errors"] == 0 and s["completion_tokens"] == 18 and s["tokens_from_usage"]
    assert 1000 * FIRST_DELAY_S * 0.95 <= s["ttft_ms_p50"] <= 1000 * (FIRST_DELAY_S + SLACK_S)
    assert 1000 * GAP_S * 0.9 <= s["itl_ms_p50"] <= 1000 * (GAP_S + SLACK_S / 2)
    assert s["acceptance_rate"] == pytest.approx(0.75)
    assert all(r.token_chunks == 6 and r.finish_reason == "length" for r in load.records)
    sent = [r.sent_s for r in load.records]  # one client: each sent as the last one ended
    assert sent[0] < 1.0 and all(later >= earlier + r.e2e_s for earlier, later, r in zip(sent, sent[1:], load.records))
    last_end = max(sent_s + r.e2e_s for sent_s, r in zip(sent, load.records))
    assert load.wall_s - 1.0 < last_end <= load.wall_s  # the run ends with its last request (slack for a busy CI)


def test_pool_reaches_its_concurrency(fake_server):
    concurrency, count, tokens = 4, 8, 4
    one_request = FIRST_DELAY_S + (tokens - 1) * GAP_S
    load = run_load(fake_server.base_url + "/chat/completions", items(count, tokens), concurrency)
    assert load.peak_in_flight == concurrency == fake_server.peak
    assert all(r.ok for r in load.records) and [r.prompt_id for r in load.records][:2] == ["p", "p~1"]
    assert load.wall_s < 0.5 * count * one_request  # serial would take count * one_request
    assert load.mean_in_flight > 0.6 * concurrency


def test_pool_records_http_and_connection_errors(fake_server):
    load = run_load(fake_server.base_url + "/chat/completions", items(2, model="other"), 2)
    assert [r.ok for r in load.records] == [False, False] and "HTTP 404" in load.records[0].error
    closed = run_load(f"http://127.0.0.1:{free_port()}/v1/chat/completions", items(1), 1)
    assert not closed.records[0].ok and "Connect" in closed.records[0].error


# --- the launcher ------------------------------------------------------------------------------


class ScriptKind:
    """A 'server' that runs a Python snippet; ready once its log holds `ready_mark` and the fake
    server's /health answers."""

    label = "script"
    needs_draft = False
    health_path = "/health"
    metrics_path = None
    usage_counts_end_token = False
    request_extras = MappingProxyType({})
    notes = "test double"

    def __init__(self, code: str, base_url: str | None = None, ready_mark: str = ""):
        self.code = code
        self.url = base_url
        self.ready_mark = ready_mark

    def command(self, launch, port):
        return [sys.executable, "-c", self.code]

    def base_url(self, port, log_text):
        return self.url if self.ready_mark in log_text else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_launcher_reports_early_exit_with_the_log(tmp_path):
    kind = ScriptKind("print('cannot load the model'); raise SystemExit(3)", "http://127.0.0.1:1/v1")
    with pytest.raises(TandemError, match="exited with code 3(.|\n)*cannot load the model"):
        with ServerProcess(kind, LAUNCH, tmp_path / "script.log"):
            pass


def test_launcher_times_out_and_leaves_no_process(tmp_path):
    server = ServerProcess(ScriptKind("import time; time.sleep(60)"), LAUNCH, tmp_path / "s.log", ready_timeout_s=0.5)
    with pytest.raises(TandemError, match="not ready"):
        with server:
            pass
    assert not _alive(server.pid)


def test_launcher_stops_the_server_and_kills_one_that_ignores_sigterm(fake_server, tmp_path, monkeypatch):
    monkeypatch.setattr(launcher_module, "STOP_GRACE_S", 0.5)
    code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(60)"
    with ServerProcess(ScriptKind(code, fake_server.base_url, "up"), LAUNCH, tmp_path / "s.log") as server:
        assert server.base_url == fake_server.base_url and _alive(server.pid)
    assert not _alive(server.pid)  # the SIGKILL fallback ran: the child ignores SIGTERM


# --- the sweep, end to end ---------------------------------------------------------------------


def test_sweep_alternates_order_and_writes_every_output(fake_server, tmp_path):
    kinds = [ScriptKind("import time; time.sleep(60)", fake_server.base_url) for _ in range(2)]
    kinds[0].label, kinds[1].label = "tandem-spec", "tandem-nospec"
    kinds[0].metrics_path = "/metrics"  # only tandem-spec's draft sources are read
    kinds[1].request_extras = MappingProxyType({"user": "nospec"})  # tells its requests apart
    assert [k.label for k in config_order(kinds, 1)] == ["tandem-nospec", "tandem-spec"]
    prompts = [BenchPrompt(f"p{i}", "c", prompt=f"hi {i}") for i in range(3)]
    plans = [LevelPlan(1, tuple(level_requests(prompts, 2, 0))), LevelPlan(2, tuple(level_requests(prompts, 3, 2)))]
    outcome = run_sweep(kinds, LAUNCH, plans, max_tokens=3, log_dir=tmp_path / "logs", progress=False)
    assert outcome.orders == {1: ["tandem-spec", "tandem-nospec"], 2: ["tandem-nospec", "tandem-spec"]}
    assert outcome.servers["tandem-spec"]["model"] == "fake-model"
    assert fake_server.bodies[0]["messages"][0]["content"].startswith("Say hello")  # the warm-up
    # C=1: the servers take turns request by request, the order rotating (warm-ups first)
    assert [b.get("user", "spec") for b in fake_server.bodies[2:6]] == ["spec", "nospec", "nospec", "spec"]
    assert [b["messages"][0]["content"] for b in fake_server.bodies[2:6]] == ["hi 0", "hi 0", "hi 1", "hi 1"]
    header = {"command": "test", "machine": {"cpu_count": 1},
              "settings": {"target": "t", "draft": "d", "threads": 1, "max_tokens": 3, "prompts_file": "x",
                           "requests_per_level": {"1": 2, "2": 3}}}
    results = build_results(outcome, header)
    write_outputs(results, tmp_path)
    level = results["levels"][1]
    assert level["concurrency"] == 2 and level["configs"]["tandem-spec"]["peak_in_flight"] == 2
    assert level["configs"]["tandem-spec"]["request_records"][0]["prompt_tokens"] == 7  # each request's, as sent
    assert level["ratios"][0]["a"] == "tandem-spec" and level["ratios"][0]["throughput"] > 0
    assert json.loads((tmp_path / "results.json").read_text())["configs"] == ["tandem-spec", "tandem-nospec"]
    report = (tmp_path / "report.md").read_text()
    assert "## Concurrency 2" in report and "tandem-spec vs tandem-nospec" in report
    assert "Target `t`, draft `d`," in report  # tandem-spec drafts with it
    from tandem.bench.serve.report import render_report
    assert "Target `t` (no config drafts with a model)," in render_report(results | {"configs": ["tandem-nospec"]})
    # the level's 3 requests, read off /metrics before and after tandem-spec's run
    assert level["configs"]["tandem-spec"]["draft_sources"] == {
        "suffix9": {"rounds": 3, "drafted": 12, "accepted": 9}, "ngram3": {"rounds": 3, "drafted": 0, "accepted": 0}}
    assert level["configs"]["tandem-nospec"]["draft_sources"] is None
    assert "| tandem-spec | suffix9 | 3 | 12 | 9 | 75" in report
    assert level["configs"]["tandem-spec"]["engine_steps"] == {
        "steps": 15, "prompt_steps": 3, "step_s": 1.5, "draft_s": 0.3, "verify_s": 0.9}
    assert level["configs"]["tandem-nospec"]["engine_steps"] is None
    assert "| tandem-spec | 15 | 3 | 1.5 | 0.3 | 0.9 |" in report
    for name in ("throughput.png", "ttft.png", "itl.png"):
        assert (tmp_path / name).stat().st_size > 1000
    assert (tmp_path / "logs" / "tandem-spec.log").exists()


def test_engine_steps_are_read_off_the_servers_own_metrics():
    """The names bench-serve parses are the ones `tandem serve` exposes: two steps observed by the
    real ServingMetrics, one with a prompt (scored in the verify call, as on llama.cpp), read back
    (a renamed histogram would read zero)."""
    from tandem.bench.serve.engine_steps import parse_steps, step_delta
    from tandem.engine.events import RoundReport, StepReport
    from tandem.serve.observability.metrics import ServingMetrics

    metrics = ServingMetrics("m")
    before = parse_steps(metrics.render()[0].decode())
    for prefilled in (("seq-0",), ()):
        metrics.observe_step(StepReport(started_at=1.0, step_seconds=0.25, prefill_seconds=0.0, draft_seconds=0.05,
                                        verify_seconds=0.125, running=1, waiting=0, batch_tokens=3,
                                        rounds=(RoundReport("seq-0", "ngram3", 2, 1),), prefilled=prefilled))
    after = parse_steps(metrics.render()[0].decode())
    assert step_delta(before, after) == {"steps": 2, "prompt_steps": 1, "step_s": 0.5, "draft_s": 0.1,
                                         "verify_s": 0.25}


def test_a_starting_servers_word_is_its_logs_latest_line():
    """While a server starts, bench-serve and soak repeat its log's latest line: a progress bar's
    current state (tqdm rewrites its line with \r), never an empty one."""
    from tandem.bench.serve.launcher import last_line

    assert last_line("loading\nprofiling x:  10%|#\rprofiling x:  60%|######\r") == "profiling x:  60%|######"
    assert last_line("\n \n") == "(nothing logged yet)" and len(last_line("y" * 500)) == 160


def test_an_interrupted_sweep_keeps_its_finished_levels(tmp_path, monkeypatch):
    """Ctrl-C during C=4 after C=1 finished: results.json and report.md hold C=1, marked
    interrupted, and the interrupt goes on (exit 130). The out folder held only logs/ before."""
    from tandem.bench.serve import session

    def sweep(kinds, launch, plans, max_tokens, log_dir, progress, outcome):
        record = RequestRecord("p0", "chat", True, ttft_s=0.1, e2e_s=0.5, completion_tokens=5, token_chunks=5,
                               itl_s=(0.1,) * 4)
        outcome.orders[1] = ["tandem-spec"]
        outcome.results[1] = {"tandem-spec": LoadResult(1, (record,), wall_s=0.5, peak_in_flight=1)}
        outcome.servers["tandem-spec"] = {"model": "fake-model", "notes": "a stand-in", "command": ["serve"]}
        outcome.orders[4] = ["tandem-spec"]
        raise KeyboardInterrupt

    monkeypatch.setattr(session, "server_launch", lambda settings, kinds: LAUNCH)
    monkeypatch.setattr(session, "run_sweep", sweep)
    settings = ServeBenchSettings("t", "d", ("tandem-spec",), (1, 4), DEFAULT_WORKLOAD, tmp_path / "out", num_prompts=4)
    with pytest.raises(KeyboardInterrupt):
        session.run_serve_bench(settings, progress=False)
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert results["interrupted"] and [level["concurrency"] for level in results["levels"]] == [1]
    report = (tmp_path / "out" / "report.md").read_text()
    assert "## Concurrency 1" in report and "**Interrupted**" in report


def test_an_interrupt_before_any_level_finished_says_nothing_was_written(tmp_path, monkeypatch, capsys):
    from tandem.bench.serve import session

    def sweep(kinds, launch, plans, max_tokens, log_dir, progress, outcome):
        raise KeyboardInterrupt

    monkeypatch.setattr(session, "server_launch", lambda settings, kinds: LAUNCH)
    monkeypatch.setattr(session, "run_sweep", sweep)
    settings = ServeBenchSettings("t", "d", ("tandem-spec",), (1,), DEFAULT_WORKLOAD, tmp_path / "out", num_prompts=4)
    with pytest.raises(KeyboardInterrupt):
        session.run_serve_bench(settings, progress=False)
    assert "interrupted before any level finished: no results written" in capsys.readouterr().err
    assert not (tmp_path / "out" / "results.json").exists()


def test_a_peer_never_built_is_an_error_before_any_server_starts(tmp_path, monkeypatch):
    from tandem.bench.serve import session

    monkeypatch.setenv("TANDEM_LLAMA_SERVER", str(tmp_path / "missing"))
    monkeypatch.setattr(session, "server_launch", lambda settings, kinds: LAUNCH)
    monkeypatch.setattr(session, "run_sweep", lambda *args, **kwargs: pytest.fail("started the servers first"))
    settings = ServeBenchSettings("t", "d", ("tandem-nospec", "llama-server"), (1,), DEFAULT_WORKLOAD, tmp_path / "out")
    with pytest.raises(TandemError, match="no llama-server"):
        session.run_serve_bench(settings, progress=False)
    assert not (tmp_path / "out").exists()


def test_a_soak_url_without_its_v1_says_to_add_it(monkeypatch):
    """`soak --url http://host:port` (no /v1) said httpx's two-line 404 and nothing to do."""
    import httpx

    from tandem.bench.soak import server

    monkeypatch.setattr(httpx, "get", lambda url, **kwargs: httpx.Response(404, request=httpx.Request("GET", url)))
    with pytest.raises(TandemError) as error:
        server._served_model("http://127.0.0.1:9", None)
    assert str(error.value) == ("http://127.0.0.1:9/models is not found: give the API's URL, with its /v1 "
                                "(http://127.0.0.1:9/v1)")
    with pytest.raises(TandemError, match=r"models: HTTP 404$"):
        server._served_model("http://127.0.0.1:9/v1", None)


def test_a_draft_file_with_another_tokenizer_is_refused_before_any_server_starts(tmp_path, monkeypatch):
    """A draft given as a .gguf path was not checked: tandem-spec failed to start on it, after the
    out folder was made, and llama-server-draft ran with it."""
    sys.path.insert(0, str(Path(__file__).parents[1]))
    from test_chat_prompt import chatml_tokenizer

    from tandem.bench.serve import session
    from tandem.errors import VocabularyMismatchError

    target, draft = tmp_path / "target", tmp_path / "draft"
    chatml_tokenizer(target)
    chatml_tokenizer(draft, corpus="another vocabulary for another model")
    monkeypatch.setattr(session, "gguf_path", Path)  # the folders stand for the GGUF files
    for config in ("tandem-spec", "llama-server-draft"):
        settings = ServeBenchSettings(str(target), str(draft), (config,), (1,), DEFAULT_WORKLOAD, tmp_path / "out")
        with pytest.raises(VocabularyMismatchError, match=f"tokenizers differ.*leave {config} out of --configs"):
            session.run_serve_bench(settings, progress=False)
        assert not (tmp_path / "out").exists()


def test_a_peer_binary_that_cannot_run_is_a_clear_error_not_a_traceback(tmp_path, monkeypatch):
    from tandem.bench.serve.server_kinds import llama_server_binary

    data = tmp_path / "model.gguf"
    data.write_bytes(b"GGUF")
    monkeypatch.setenv("TANDEM_LLAMA_SERVER", str(data))
    with pytest.raises(TandemError, match="is not executable"):
        llama_server_binary()
    data.chmod(0o755)  # executable, but not a program: the launcher says so (a PermissionError went up)
    kind = ScriptKind("")
    kind.command = lambda launch, port: [str(data)]
    with pytest.raises(TandemError, match="script cannot start .*model.gguf: .*Exec format error"):
        with ServerProcess(kind, LAUNCH, tmp_path / "s.log"):
            pass


def test_a_config_whose_every_request_failed_is_named():
    """Every request refused (a 400 on each) gave a table of zeros and exit status 0."""
    from tandem.bench.serve.results import failed_runs

    ok, bad = {"ok": True}, {"ok": False}
    results = {"levels": [{"concurrency": 1, "configs": {"tandem-spec": {"request_records": [ok, bad]},
                                                         "llama-server": {"request_records": [bad, bad]}}},
                          {"concurrency": 4, "configs": {"tandem-spec": {"request_records": [bad]},
                                                         "llama-server": {"request_records": [ok]}}}]}
    assert failed_runs(results) == ["llama-server at C=1", "tandem-spec at C=4"]
