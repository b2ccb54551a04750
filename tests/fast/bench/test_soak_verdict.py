"""The soak's verdict: memory growth is judged beside the prompt cache's host tier, which fills up
to its --cache-ram budget by design, and the drafters' memory of earlier answers, which fills up to
its bounds, so a full cache is not a leak and a leak is still one."""

from tandem.bench.soak.samples import ServerSample
from tandem.bench.soak.verdict import judge

MIB = 2**20


def samples(rss_mib: list[float], cache_mib: list[float], drafting_mib: list[float] | None = None) -> list[ServerSample]:
    phases = ["load"] * (len(rss_mib) - 1) + ["idle"]
    drafting_mib = drafting_mib or [0.0] * len(rss_mib)
    return [ServerSample(10.0 * i, phase, 10 * i, 0, rss_bytes=rss * MIB, prompt_cache_bytes=cache * MIB,
                         drafting_memory_bytes=drafting * MIB, kv_slots_in_use=0.0 if phase == "idle" else 4.0)
            for i, (phase, rss, cache, drafting) in enumerate(zip(phases, rss_mib, cache_mib, drafting_mib))]


def rss_check(checks):
    return next(check for check in checks if check.name == "rss growth after warm-up")


def test_a_filling_prompt_cache_is_not_a_leak():
    check = rss_check(judge(samples([1800, 2000, 2400, 2600], [0, 200, 600, 800]), warmup_s=0))
    assert check.passed, check.figure


def test_growth_beside_the_cache_is_still_caught():
    check = rss_check(judge(samples([1800, 2000, 2400, 2600], [0, 100, 100, 100]), warmup_s=0))
    assert not check.passed and "host tier" in check.figure


def test_filling_drafting_memory_is_not_a_leak():
    """The n-gram store and suffix index fill towards their bounds over a soak (+4.7% of resident
    memory in CI's three minutes, AMD EPYC): their charged bytes are set beside it."""
    check = rss_check(judge(samples([1500, 1540, 1580, 1600], [256] * 4, [10, 50, 90, 110]), warmup_s=0))
    assert check.passed and "drafting memory, peak 110 MiB" in check.figure, check.figure


def test_growth_beside_drafting_memory_is_still_caught():
    check = rss_check(judge(samples([1500, 1540, 1580, 1600], [256] * 4, [10, 20, 20, 20]), warmup_s=0))
    assert not check.passed, check.figure


def test_an_interrupted_soak_writes_its_samples_so_far(tmp_path, monkeypatch, capsys):
    """Ctrl-C an hour into a soak: the samples and counts so far are written, judged as what they
    are (no idle phase: not passed), and the interrupt goes on. Before, only server.log was left."""
    import contextlib
    import json

    from tandem.bench.soak import run as soak_run, server as soak_server
    from tandem.cli.main import main

    @contextlib.contextmanager
    def no_server(args, out):
        yield "http://127.0.0.1:9/v1", "m", lambda: ""

    async def interrupted_soak(settings, on_sample, tally):
        tally.done, tally.completion_tokens = 40, 400
        for sample in (ServerSample(60.0, "load", 20, 0), ServerSample(120.0, "load", 40, 0)):
            on_sample(sample)
        raise KeyboardInterrupt

    monkeypatch.setattr(soak_server, "started_server", no_server)
    monkeypatch.setattr(soak_run, "soak", interrupted_soak)
    out = tmp_path / "soak"
    assert main(["soak", "--duration", "1h", "--sample-every", "1m", "--out", str(out)]) == 130
    results = json.loads((out / "results.json").read_text())
    assert results["interrupted"] and not results["passed"] and len(results["samples"]) == 2
    assert results["tally"]["done"] == 40 and "interrupted: wrote the 2 samples" in capsys.readouterr().err
    assert "**Interrupted** after 2.0 min" in (out / "report.md").read_text()  # its title names the hour asked


def test_a_server_that_dies_mid_soak_ends_it_with_the_samples_so_far_and_fails_it(monkeypatch):
    """The server killed during a soak: the clients counted every refused connection as a finished
    request (thousands a second), the next sample raised and nothing was written. Now the first
    failure that /health does not answer ends the soak, with what was seen, and the verdict fails."""
    import asyncio
    import functools
    import json as jsonlib

    import httpx

    from tandem.bench.soak import run as soak_run
    from tandem.bench.workload import BenchPrompt

    served = {"requests": 0}
    dies_after = 6

    def handler(request: httpx.Request) -> httpx.Response:
        if served["requests"] >= dies_after:
            raise httpx.ConnectError("Connection refused", request=request)
        if request.url.path == "/metrics":
            return httpx.Response(200, text="process_resident_memory_bytes 1e8\n")
        if request.url.path == "/health":
            return httpx.Response(200, json={"status": "ok"})
        served["requests"] += 1
        chunk = {"choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": "stop"}]}
        return httpx.Response(200, text=f"data: {jsonlib.dumps(chunk)}\n\ndata: [DONE]\n\n",
                              headers={"content-type": "text/event-stream"})

    monkeypatch.setattr(soak_run.httpx, "AsyncClient",
                        functools.partial(httpx.AsyncClient, transport=httpx.MockTransport(handler)))
    prompts = (BenchPrompt("p0", "chat", ({"role": "user", "content": "hello"},)),)
    settings = soak_run.SoakSettings("http://soaked/v1", "m", prompts, concurrency=2, duration_s=30,
                                     sample_every_s=10, abandon_every=0)
    result = asyncio.run(asyncio.wait_for(soak_run.soak(settings), timeout=10))  # not the whole 30 s
    tally = result.tally
    assert tally.server_lost is not None and "nothing answers http://soaked/health" in tally.server_lost
    assert tally.done <= dies_after + settings.concurrency and tally.errors <= settings.concurrency
    assert result.samples and all(sample.phase == "load" for sample in result.samples)
    checks = judge(list(result.samples), warmup_s=0, server_lost=tally.server_lost)
    assert [check.name for check in checks] == ["server up"] and not checks[0].passed


def test_a_lost_server_is_a_written_failed_soak_that_says_how_it_ended(tmp_path, monkeypatch, capsys):
    import contextlib
    import json

    from tandem.bench.soak import run as soak_run, server as soak_server
    from tandem.cli.main import main

    @contextlib.contextmanager
    def killed_server(args, out):
        yield "http://127.0.0.1:9/v1", "m", lambda: "tandem serve exited with code -9 (see server.log)"

    async def lost_soak(settings, on_sample, tally):
        tally.done, tally.errors, tally.completion_tokens = 12, 1, 100
        sample = ServerSample(60.0, "load", 10, 0)
        on_sample(sample)
        tally.server_lost = "nothing answers http://127.0.0.1:9/health after 12 requests; the last: ConnectError"
        return soak_run.SoakResult(settings, (sample,), tally, 61.0)

    monkeypatch.setattr(soak_server, "started_server", killed_server)
    monkeypatch.setattr(soak_run, "soak", lost_soak)
    out = tmp_path / "soak"
    assert main(["soak", "--duration", "1h", "--sample-every", "1m", "--out", str(out)]) == 1
    results = json.loads((out / "results.json").read_text())
    assert not results["passed"] and results["checks"][0]["name"] == "server up"
    assert results["tally"]["server_lost"].startswith("tandem serve exited with code -9 (see server.log); nothing answers")
    assert "**The server stopped answering**: tandem serve exited with code -9" in (out / "report.md").read_text()
    assert "FAIL server up: tandem serve exited with code -9" in capsys.readouterr().out
