"""`tandem bench-serve` end to end on smollm2-135m-instruct: a tiny sweep (concurrency 1 and 2,
3 prompts, 8 tokens) against real servers, checking the files it writes and that no server
outlives it. The Tandem configs join once `tandem serve` exists in this tree."""

import importlib.util
import json
import subprocess
import sys

import httpx
import pytest

from tandem.bench.workload import DEFAULT_WORKLOAD

pytestmark = pytest.mark.real

SMALL = "smollm2-135m-instruct"
PROMPTS = 3
MAX_TOKENS = 8
TANDEM_CONFIGS = ["tandem-spec", "tandem-nospec"] if importlib.util.find_spec("tandem.cli.serve_cmd") else []
CONFIGS = TANDEM_CONFIGS + ["llamacpp-server"]
SUMMARY_FIELDS = ("requests", "errors", "completion_tokens", "wall_s", "throughput_tok_s", "requests_per_s",
                  "ttft_ms_p50", "ttft_ms_p99", "itl_ms_p50", "itl_ms_p99", "e2e_s_p50", "e2e_s_p99",
                  "peak_in_flight", "acceptance_rate")


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    folder = tmp_path_factory.mktemp("bench-serve")
    prompts = folder / "prompts.jsonl"
    prompts.write_text("\n".join(DEFAULT_WORKLOAD.read_text().splitlines()[:PROMPTS]) + "\n")
    out = folder / "out"
    command = [sys.executable, "-m", "tandem.cli.main", "bench-serve", "--target", SMALL, "--draft", SMALL,
               "--configs", ",".join(CONFIGS), "--concurrency", "1,2", "--num-prompts", str(PROMPTS),
               "--max-tokens", str(MAX_TOKENS), "--threads", "1", "--prompts", str(prompts), "--out", str(out)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return out, result


def test_results_hold_every_level_and_config(sweep):
    out, _ = sweep
    results = json.loads((out / "results.json").read_text())
    assert results["configs"] == CONFIGS
    assert [level["concurrency"] for level in results["levels"]] == [1, 2]
    for level in results["levels"]:
        for label in CONFIGS:
            summary = level["configs"][label]
            assert all(field in summary for field in SUMMARY_FIELDS)
            assert summary["requests"] == PROMPTS and summary["errors"] == 0, summary["error_samples"]
            assert 0 < summary["completion_tokens"] <= PROMPTS * MAX_TOKENS
            assert summary["peak_in_flight"] == level["concurrency"]
            assert summary["throughput_tok_s"] > 0 and summary["ttft_ms_p50"] > 0
    if "tandem-spec" in CONFIGS:
        spec = results["levels"][0]["configs"]["tandem-spec"]
        assert spec["tokens_from_usage"] and spec["drafted"] is not None
        assert {r["a"] for r in results["levels"][0]["ratios"]} == {"tandem-spec", "tandem-nospec"}


def test_report_plots_and_logs_exist(sweep):
    out, result = sweep
    report = (out / "report.md").read_text()
    assert "## Concurrency 1" in report and "## Concurrency 2" in report and "llamacpp-server" in report
    for name in ("throughput.png", "ttft.png", "itl.png"):
        assert (out / name).stat().st_size > 1000
    assert all((out / "logs" / f"{label}.log").exists() for label in CONFIGS)
    assert "llamacpp-server" in result.stdout  # the throughput table


def test_no_server_outlives_the_benchmark(sweep):
    out, _ = sweep
    servers = json.loads((out / "results.json").read_text())["servers"]
    for label, info in servers.items():
        with pytest.raises(httpx.ConnectError):
            httpx.get(info["base_url"] + "/models", timeout=2)
