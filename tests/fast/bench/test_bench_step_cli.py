"""tandem bench-step's command: what an interrupted run keeps, and the machine it names."""


def test_bench_step_interrupted_keeps_the_points_timed(tmp_path, monkeypatch, capsys):
    """Ctrl-C partway through bench-step threw every timing away; now the table and --out hold the
    points timed so far, marked, and the exit is 130."""
    import json
    from types import SimpleNamespace

    from tandem.bench import step
    from tandem.bench.step import StepTiming
    from tandem.cli.main import main

    timed = iter([StepTiming("layout", 1, 1, 30.0, 29.0), KeyboardInterrupt()])

    def time_step(runner, label, batch, count, repeats):
        timing = next(timed)
        if isinstance(timing, BaseException):
            raise timing
        return timing

    runner = SimpleNamespace(context_length=4096)
    monkeypatch.setattr(step, "load_llamacpp_runners", lambda *args: {"layout": runner})
    monkeypatch.setattr(step, "fill_slots", lambda *args: None)
    monkeypatch.setattr(step, "time_step", time_step)
    out = tmp_path / "steps.json"
    code = main(["bench-step", "--backend", "llamacpp", "--batches", "1", "--tokens", "1,4", "--out", str(out)])
    assert code == 130
    figures = json.loads(out.read_text())
    assert figures["interrupted"] and [t["tokens_per_slot"] for t in figures["timings"]] == [1]
    printed = capsys.readouterr().out
    assert "layout" in printed
    # the figures name the CPU they came from, printed and kept (they named nothing)
    assert figures["machine"]["cpu_count"] and printed.startswith("machine: ")
