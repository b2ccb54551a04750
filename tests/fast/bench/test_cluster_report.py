"""bench-cluster's report over repeated passes: each pass's figures are kept under its own name,
and the summary folds the passes of a configuration together."""

import pytest

from tandem.bench.cluster.run import markdown, measured_figures, measured_file, prompt_prefixes, summarize
from tandem.cli.main import main


def run(tok_s):
    return {"throughput_tok_s": tok_s, "latency_ms_p50": 1.0, "latency_ms_p99": 2.0, "ttft_ms_p50": 0.5,
            "ms_per_token_p50": 3.0, "acceptance": None}


def results_of_two_passes():
    return {
        "solo fast": run(30.0), "solo slow": run(10.0), "solo sum": {"throughput_tok_s": 40.0},
        "cluster": run(36.0),
        "solo fast #2": run(26.0), "solo slow #2": run(9.0), "solo sum #2": {"throughput_tok_s": 35.0},
        "cluster #2": run(33.0),
    }


def test_summary_folds_each_configurations_passes_and_divides_by_the_mean_solo_sum():
    summary = summarize(results_of_two_passes())
    assert summary["cluster"]["throughput_tok_s"] == [36.0, 33.0]
    assert summary["cluster"]["mean"] == pytest.approx(34.5)
    assert summary["solo sum"]["mean"] == pytest.approx(37.5)
    assert summary["cluster"]["x_solo_sum"] == pytest.approx(34.5 / 37.5)
    assert "x_solo_sum" not in summary["solo fast"]


def test_without_solo_runs_there_is_no_ratio():
    summary = summarize({"cluster": run(36.0), "cluster-verify-only": run(30.0)})
    assert all("x_solo_sum" not in entry for entry in summary.values())


def test_the_report_shows_every_pass_and_the_summary_only_when_repeated():
    results = results_of_two_passes()
    report = {"cluster_file": "c.yaml", "drafter": "none", "k": "0", "concurrency": 8, "requests": 32,
              "max_tokens": 50, "repeats": 2, "results": results, "summary": summarize(results)}
    text = markdown(report)
    assert "| cluster #2 | 33.0 |" in text
    assert "| cluster | 36.0, 33.0 | 34.5 | 0.92 |" in text
    assert "run 2 times in turn" in text
    once = {**report, "repeats": 1}
    assert "Over the passes" not in markdown(once)


def test_cli_rejects_bad_counts_with_one_line(capsys):
    """Checked before the cluster file is read or Ray starts."""
    for args in (["--repeat", "0"], ["--concurrency", "0"], ["--configs", "bogus"]):
        assert main(["bench-cluster", "--cluster", "examples/clusters/mixed-replicas.yaml", *args]) == 2
        error = capsys.readouterr().err
        assert error.startswith("error: ") and error.count("\n") == 1


def test_each_cluster_configuration_has_its_measured_file():
    assert [measured_file(c) for c in ("cluster", "cluster-verify-only")] == ["measured.json", "measured-verify-only.json"]


def test_the_measured_figures_a_simulation_is_held_to_are_the_means_of_the_passes():
    results = results_of_two_passes()
    results["cluster #2"]["latency_ms_p50"] = 3.0
    measured = measured_figures(results, "cluster")
    assert measured["throughput_tok_s"] == pytest.approx(34.5)
    assert measured["latency_ms_p50"] == pytest.approx(2.0)
    assert measured["ttft_ms_p50"] == 0.5 and measured["acceptance"] is None
    assert measured["passes"] == 2
    assert measured_figures({"cluster": run(36.0)}, "cluster")["throughput_tok_s"] == 36.0


def test_ctrl_c_writes_the_runs_finished_and_closes_the_cluster(tmp_path, monkeypatch):
    """An hour-long bench-cluster interrupted after its first configuration kept nothing, and left
    the cluster's router running; now the finished runs are written, marked, and the cluster closed."""
    import json
    from types import SimpleNamespace

    from tandem.bench.cluster import run as bench_run

    closed = []
    engine = SimpleNamespace(clear_caches=lambda: None, close=lambda: closed.append(True))
    calls = iter([run(36.0), KeyboardInterrupt()])

    def cluster_run(*args):
        figures = next(calls)
        if isinstance(figures, BaseException):
            raise figures
        return figures

    monkeypatch.setattr(bench_run, "launch_cluster", lambda *args: engine)
    monkeypatch.setattr(bench_run, "requests_for", lambda *args: [])
    monkeypatch.setattr(bench_run, "_cluster_run", cluster_run)
    cluster = SimpleNamespace(target=SimpleNamespace(model="m"), spec=SimpleNamespace(source="c.yaml"), ray_address=None)
    with pytest.raises(KeyboardInterrupt):
        bench_run.run_cluster_bench(cluster, "none", 0, 8, 32, 50, ("cluster", "cluster-verify-only"), tmp_path,
                                    progress=lambda message: None)
    report = json.loads((tmp_path / "results.json").read_text())
    assert report["interrupted"] and list(report["results"]) == ["cluster"] and closed
    assert (tmp_path / "measured.json").exists() and "Interrupted" in (tmp_path / "report.md").read_text()


def test_each_prompt_records_the_opening_it_shares_grouped_by_its_first_tokens():
    system = list(range(100, 124))  # a 24-token system turn
    other = list(range(500, 540))
    prompts = [system + [1, 2, 3], system + [1, 2, 9], other, system + [7], other[:20] + [0], other[:10] + [5]]
    assert prompt_prefixes(prompts) == [[0, 26], [0, 26], [2, 20], [0, 24], [2, 20], None]  # 10 shared: too few
    assert prompt_prefixes([system]) == [None]  # alone, it shares nothing
    assert prompt_prefixes([]) == []
