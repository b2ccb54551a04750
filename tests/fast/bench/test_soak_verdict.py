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
        yield "http://127.0.0.1:9/v1", "m"

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
