"""The simulator fed from cluster files: profiles to devices, roles and plans to replicas, the
scaling sweep and `tandem simulate` itself, on public-spec device classes (no hardware needed)."""

import json

import pytest

from tandem.cli.main import main
from tandem.cluster.config.cluster_spec import ClusterSpec, NetworkSpec, WorkerSpec
from tandem.cluster.runtime.launch import DEFAULT_SLOTS
from tandem.cluster.planning.planner import plan_cluster
from tandem.cluster.profiles.profile_store import cluster_profiles
from tandem.cluster.profiles.public_profiles import public_profile
from tandem.cluster.sim import FixedLength, Workload, simulate
from tandem.cluster.sim.adapter import SimOptions, simulation_from_cluster
from tandem.cluster.sim.from_profile import device_from_profile
from tandem.cluster.sim.scaling import SweepOptions, apportion, scaled_spec, sweep
from tandem.cluster.sim.scaling_report import write_scaling
from tandem.errors import TandemError

TARGET, DRAFT = "qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct"
WORKLOAD = Workload(24, FixedLength(32), FixedLength(32), concurrency=8)


def mixed_cluster(**top) -> ClusterSpec:
    return ClusterSpec(workers=(
        WorkerSpec("gpu", "verify", TARGET, backend="torch", device="cuda", dtype="bf16", hardware="l4", replicas=2),
        WorkerSpec("npu", "both", TARGET, draft_model=DRAFT, backend="torch", device="npu", dtype="fp16",
                   hardware="ascend-910b", utilization=0.5),
        WorkerSpec("cpu", "draft", DRAFT, hardware="epyc-9654", replicas=3, group="edge"),
    ), network=NetworkSpec({("edge", "local"): 8.0}), **top)


def test_a_device_prices_batches_as_its_profile_does():
    profile = public_profile("l4", TARGET, "torch", "bf16")
    device = device_from_profile("l4/0", profile, context=512)
    for batch, n in [(1, 1), (1, 8), (8, 4), (32, 2), (64, 1)]:
        assert device.forward_ms([n] * batch) == pytest.approx(profile.step_ms(batch, n, 512), rel=0.02)
    assert device.forward_ms([1500]) > 3 * device.forward_ms([1])  # a long prefill is not free
    slower = device_from_profile("l4/0", profile, context=512, slowdown=2.0)
    assert slower.forward_ms([4] * 8) == pytest.approx(2 * device.forward_ms([4] * 8))


def test_a_device_prices_a_call_on_the_context_it_holds():
    """Read at more cached tokens than the file's context, a call costs what the profile says
    there (between the file's context and the deepest profiled); at fewer, the file's price.
    One sequence's calls and a batch's alike (its per-sequence term is read at depth too: read at
    the file's context alone, 8 x 4 tokens at 2,048 came 8% under the curve)."""
    profile = public_profile("l4", TARGET, "torch", "bf16")  # curves at 64, 512 and 2048 cached tokens
    device = device_from_profile("l4/0", profile, context=512)
    for batch, n, tolerance in [(1, 1, 0.02), (1, 16, 0.02), (8, 4, 0.02), (32, 2, 0.02)]:
        at_512 = device.forward_ms([n] * batch)
        assert device.forward_ms([n] * batch, context=100) == at_512
        deep = device.forward_ms([n] * batch, context=2048)
        assert deep == pytest.approx(profile.step_ms(batch, n, 2048), rel=tolerance)
        assert at_512 < device.forward_ms([n] * batch, context=1024) < device.forward_ms([n] * batch, context=2048)
        assert device.forward_ms([n] * batch, context=2048) > profile.step_ms(batch, n, 512) * 1.01


def test_roles_as_written_give_every_replica_its_device_and_drafter():
    sim = simulation_from_cluster(mixed_cluster(drafter="model"), WORKLOAD, SimOptions(fused=True))
    assert [v.device.name for v in sim.verifiers] == ["gpu/0", "gpu/1", "npu/0"]
    by_name = {d.name: d for d in sim.drafters}
    assert [v.drafter for v in sim.verifiers] == ["cpu/0", "cpu/1", "npu/0:draft"]
    assert by_name["npu/0:draft"].device.name == "npu/0"  # beside its verifier, on one device
    assert "cpu/2" in by_name  # idle draft workers are still there, to show they idle
    assert sim.router_group == "local" and {v.max_batch for v in sim.verifiers} == {DEFAULT_SLOTS}  # as launched
    edge_first = ClusterSpec(workers=(mixed_cluster().workers[2], mixed_cluster().workers[0]),
                             network=NetworkSpec({("edge", "local"): 8.0}), drafter="model")
    assert simulation_from_cluster(edge_first, WORKLOAD).router_group == "edge"
    npu = sim.verifiers[2].device
    plain = device_from_profile("x", public_profile("ascend-910b", TARGET, "torch", "fp16"), context=512)
    assert npu.forward_ms([1]) == pytest.approx(2 * plain.forward_ms([1]))  # utilization 0.5
    result = simulate(sim)
    assert result.requests == 24 and set(result.utilisation) == {"gpu/0", "gpu/1", "npu/0", "cpu/0", "cpu/1", "cpu/2"}


@pytest.mark.parametrize("drafter", ["model", "hybrid"])
def test_a_model_drafter_without_a_draft_model_is_an_error_and_auto_copies(drafter):
    verifiers_only = ClusterSpec(workers=(mixed_cluster().workers[0],), drafter=drafter)
    with pytest.raises(TandemError, match=f"drafter '{drafter}' needs a draft or both worker"):
        simulation_from_cluster(verifiers_only, WORKLOAD)
    auto = simulation_from_cluster(ClusterSpec(workers=verifiers_only.workers, drafter="auto"), WORKLOAD)
    assert {v.drafter for v in auto.verifiers} == {"ngram"}


def test_the_plans_placement_is_simulated():
    spec = mixed_cluster()
    plan = plan_cluster(spec, cluster_profiles(spec))
    sim = simulation_from_cluster(spec, WORKLOAD, SimOptions(fused=True, use_plan_k=True), plan)
    assert len(sim.verifiers) == sum(plan.chosen.verifying.values())
    assert sim.depth.fixed_k == plan.chosen.k
    assert {v.max_batch for v in sim.verifiers} <= {a.step.batch for a in plan.chosen.assignments}
    assert simulate(sim).output_tokens == 24 * 32


def test_scaling_keeps_the_mix_and_a_verifier():
    assert apportion([16, 16, 16, 16], 2) == [1, 1, 0, 0]
    assert apportion([1, 3], 8) == [2, 6]
    spec = mixed_cluster()
    only_cpu_first = scaled_spec(ClusterSpec(workers=tuple(reversed(spec.workers)), network=spec.network), 1)
    assert [(w.name, w.replicas) for w in only_cpu_first.workers] == [("gpu", 1)]
    half = scaled_spec(spec, 3)
    assert sum(w.replicas for w in half.workers) == 3 and any(w.can_verify for w in half.workers)
    assert scaled_spec(spec, 1).network.latency_ms == {}  # the edge group is gone, and its link


def test_a_small_sweep_writes_its_files(tmp_path):
    options = SweepOptions(sizes=(1, 2), waves=1, output_tokens=16, prompt_tokens=FixedLength(16))
    said, rows = [], []
    result = sweep(mixed_cluster(), options, said=said.append, on_row=rows.append)
    assert [(r["devices"], r["mode"]) for r in result["rows"]] == [(1, "independent"), (2, "independent")]
    assert rows == result["rows"]  # each told as its size was done (a large size ran for minutes in silence)
    assert [line.split(":")[0] for line in said] == ["1 device", "2 devices"]
    assert all(r["throughput_tok_s"] > 0 for r in result["rows"])
    assert all(p["source"] == "public-spec" for p in result["profiles"].values())
    paths = write_scaling(result, tmp_path)
    assert [p.name for p in paths] == ["scaling.json", "scaling.md", "scaling.png"]
    assert "public-spec" in paths[1].read_text() and paths[2].stat().st_size > 1000


def test_tandem_simulate_prints_json_and_compares_with_a_measurement(tmp_path, capsys):
    cluster = tmp_path / "c.yaml"
    cluster.write_text(f"workers:\n  - {{name: g, role: verify, model: {TARGET}, backend: torch, device: cuda,"
                       " dtype: bf16, hardware: l4}\ndrafter: ngram\n")
    measured = tmp_path / "measured.json"
    measured.write_text(json.dumps({"throughput_tok_s": 1000.0, "latency_ms_p50": 100.0}))
    code = main(["simulate", "--cluster", str(cluster), "--concurrency", "2", "--requests", "4", "--max-tokens", "16",
                 "--prompt-tokens", "8", "--measured", str(measured), "--json", "--out", str(tmp_path / "out")])
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    assert report["result"]["requests"] == 4
    assert set(report["comparison"]["figures"]) == {"throughput_tok_s", "latency_ms_p50"}
    assert (tmp_path / "out" / "simulation.json").exists()
    # what the options left to defaults and the plan resolved to (they recorded nulls and "func")
    simulated = report["simulated"]
    assert (simulated["prompt_tokens"], simulated["concurrency"], simulated["step_overhead_ms"]) == (8, 2, 1.0)
    assert simulated["verifiers"][0]["max_batch"] >= 1 and "func" not in report["options"]
    for rate in ("-1", "nan"):  # argparse refuses it: exit 2
        with pytest.raises(SystemExit) as stop:
            main(["simulate", "--cluster", str(cluster), "--rate", rate])
        assert stop.value.code == 2


def test_tandem_simulate_replays_a_measured_runs_prompts_with_a_fixed_k(tmp_path, capsys):
    cluster = tmp_path / "c.yaml"
    cluster.write_text(f"workers:\n  - {{name: g, role: verify, model: {TARGET}, backend: torch, device: cuda,"
                       " dtype: bf16, hardware: l4}\ndrafter: ngram\n")
    measured = tmp_path / "measured.json"

    def run(prompts: list[int]) -> dict:
        measured.write_text(json.dumps({"throughput_tok_s": 1000.0, "latency_ms_p50": 100.0, "prompt_tokens": prompts}))
        assert main(["simulate", "--cluster", str(cluster), "--concurrency", "1", "--requests", "2", "--max-tokens", "16",
                     "--k", "2", "--measured", str(measured), "--json"]) == 0
        return json.loads(capsys.readouterr().out)["result"]

    short, long = run([8, 8]), run([2000, 2000])
    assert short["mean_k"] == pytest.approx(2.0, abs=0.2)  # every round but a request's last drafts 2
    assert long["ttft_ms"]["p50"] > 2 * short["ttft_ms"]["p50"]  # the recorded prompts were prefilled
    measured.write_text(json.dumps({"throughput_tok_s": 1.0, "latency_ms_p50": 1.0, "prompt_tokens": ["x"]}))
    assert main(["simulate", "--cluster", str(cluster), "--measured", str(measured)]) == 2


def test_tandem_simulate_runs_a_measured_runs_requests_concurrency_and_answer_length(tmp_path, capsys):
    cluster = tmp_path / "c.yaml"
    cluster.write_text(f"workers:\n  - {{name: g, role: verify, model: {TARGET}, backend: torch, device: cuda,"
                       " dtype: bf16, hardware: l4}\ndrafter: none\n")
    measured = tmp_path / "measured.json"
    figures = {"throughput_tok_s": 30.0, "latency_ms_p50": 900.0, "prompt_tokens": [40, 60, 80],
               "requests": 3, "concurrency": 2, "max_tokens": 16, "completion_tokens": 36}

    def simulated(*options, **more) -> tuple[dict, str]:
        measured.write_text(json.dumps(figures | more))
        assert main(["simulate", "--cluster", str(cluster), "--measured", str(measured), "--json", *options]) == 0
        out = capsys.readouterr()
        return json.loads(out.out)["result"], out.err

    result, said = simulated()
    assert result["requests"] == 3 and result["output_tokens"] == 36  # 3 answers of 12 tokens (36 / 3), not 64 x 128
    assert "from the measured run: --requests 3, --concurrency 2, --max-tokens 12" in said
    result, said = simulated("--requests", "5")
    assert result["requests"] == 5 and "note: simulating --requests 5 (the run: 3)" in said
    result, said = simulated(completion_tokens=None)
    assert result["output_tokens"] == 3 * 16  # no answers recorded: the run's max_tokens
    result, said = simulated(requests=None, concurrency=None, max_tokens=None, completion_tokens=None)
    assert "does not say its requests, concurrency, max-tokens" in said
    measured.write_text(json.dumps(figures | {"concurrency": 0}))
    assert main(["simulate", "--cluster", str(cluster), "--measured", str(measured)]) == 2
    assert "concurrency must be at least 1" in capsys.readouterr().err


def test_device_speed_slows_every_device_and_run_speed_finds_it():
    from tandem.cluster.sim.validation import run_speed

    spec = mixed_cluster(drafter="model")
    as_profiled = simulation_from_cluster(spec, WORKLOAD, SimOptions(fused=True))
    slower = simulation_from_cluster(spec, WORKLOAD, SimOptions(fused=True, device_speed=1.5))
    for sim in (as_profiled, slower):
        assert [v.device.name for v in sim.verifiers] == ["gpu/0", "gpu/1", "npu/0"]
    for fast, slow in zip(as_profiled.verifiers, slower.verifiers):
        assert slow.device.forward_ms([4] * 8) == pytest.approx(1.5 * fast.device.forward_ms([4] * 8))
        assert slow.device.prompt_ms([300]) == pytest.approx(1.5 * fast.device.prompt_ms([300]))
    drafters = {d.name: d for d in slower.drafters}
    for d in as_profiled.drafters:  # the drafters' devices too
        assert drafters[d.name].device.forward_ms([1]) == pytest.approx(1.5 * d.device.forward_ms([1]))
    result = simulate(as_profiled)
    computing_s = sum(u * result.duration_s for u in result.utilisation.values())
    assert run_speed(result, 1.2 * computing_s) == pytest.approx(1.2)
    with pytest.raises(ValueError, match="device_speed must be > 0"):
        SimOptions(device_speed=0.0)


def test_tandem_simulate_compares_again_at_the_runs_device_speed(tmp_path, capsys):
    cluster = tmp_path / "c.yaml"
    cluster.write_text(f"workers:\n  - {{name: g, role: verify, model: {TARGET}, backend: torch, device: cuda,"
                       " dtype: bf16, hardware: l4}\ndrafter: none\n")
    measured = tmp_path / "measured.json"
    args = ["simulate", "--cluster", str(cluster), "--concurrency", "2", "--requests", "4", "--max-tokens", "16",
            "--prompt-tokens", "8", "--measured", str(measured)]
    measured.write_text(json.dumps({"throughput_tok_s": 1000.0, "latency_ms_p50": 100.0}))
    assert main(args + ["--json"]) == 0
    first = json.loads(capsys.readouterr().out)
    assert "at_run_speed" not in first["comparison"]  # no call_seconds: nothing to rescale by
    result = first["result"]
    computing_s = sum(u * result["duration_s"] for u in result["utilisation"].values())
    measured.write_text(json.dumps({"throughput_tok_s": result["throughput_tok_s"] / 2,
                                    "latency_ms_p50": result["latency_ms"]["p50"] * 2,
                                    "call_seconds": 2 * computing_s}))  # a run on a device half as fast
    assert main(args + ["--json"]) == 0
    comparison = json.loads(capsys.readouterr().out)["comparison"]
    assert comparison["figures"]["throughput_tok_s"]["relative_error"] == pytest.approx(1.0, abs=0.01)
    again = comparison["at_run_speed"]
    assert again["device_speed"] == pytest.approx(2.0, rel=0.01)
    assert abs(again["figures"]["throughput_tok_s"]["relative_error"]) < 0.05  # the steps' 1 ms bookkeeping stays
    assert again["within_tolerance"]
    assert main(args) == 0
    assert "at the run's device speed (its calls took 2.00x" in capsys.readouterr().out
    measured.write_text(json.dumps({"throughput_tok_s": 1.0, "latency_ms_p50": 1.0, "call_seconds": -3}))
    assert main(args) == 2
    assert "call_seconds must be positive" in capsys.readouterr().err


def test_the_engines_floor_chunk_is_read_at_the_profiles_shortest_context():
    from tandem.cluster.profiles.profile import Curve, DeviceProfile
    from tandem.engine.step_budget import floor_chunk
    from tandem.models.cost import CostModel

    short = {1: 10.0, 2: 12.0, 4: 16.0, 8: 24.0, 16: 40.0, 32: 72.0, 64: 136.0}  # a fixed cost per call
    deep = {n: 10.0 * n for n in short}  # proportional: any chunk runs at full speed
    profile = DeviceProfile("m", "llamacpp", "cpu", "gguf", 1, "measured", (
        Curve(1, 64, tuple(short.items())), Curve(1, 512, tuple(deep.items()))))
    device = device_from_profile("v", profile, context=512)  # calls priced at 512 cached tokens
    assert device.prefill_floor == floor_chunk(CostModel(short).cost_ms) == 18
    assert floor_chunk(CostModel(deep).cost_ms) == 1


def test_tandem_simulate_reuses_the_openings_a_measured_run_shares(tmp_path, capsys):
    cluster = tmp_path / "c.yaml"
    cluster.write_text(f"workers:\n  - {{name: g, role: verify, model: {TARGET}, backend: torch, device: cuda,"
                       " dtype: bf16, hardware: l4}\ndrafter: none\n")
    measured = tmp_path / "measured.json"
    figures = {"throughput_tok_s": 1000.0, "latency_ms_p50": 100.0, "prompt_tokens": [300, 300, 300]}
    args = ["simulate", "--cluster", str(cluster), "--concurrency", "1", "--requests", "3", "--max-tokens", "8",
            "--measured", str(measured), "--json"]

    def result(extra=(), **more) -> dict:
        measured.write_text(json.dumps(figures | more))
        assert main(args + list(extra)) == 0
        return json.loads(capsys.readouterr().out)

    assert result()["result"]["reused_tokens"] == 0
    shared = result(prompt_prefixes=[[0, 200], [0, 200], None], scored_tokens=500)
    assert shared["result"]["reused_tokens"] == 200  # the second found the first's opening; the third has none
    assert shared["comparison"]["figures"]["scored_tokens"]["measured"] == 500
    assert result(["--shared-prefix-tokens", "100"])["result"]["reused_tokens"] == 200
    measured.write_text(json.dumps(figures | {"prompt_prefixes": [[0, 200]]}))  # one entry for three prompts
    assert main(args) == 2
    assert "one entry per prompt_tokens entry" in capsys.readouterr().err
    measured.write_text(json.dumps(figures | {"prompt_prefixes": [[0], None, None]}))
    assert main(args) == 2
    assert "[group, tokens]" in capsys.readouterr().err
    assert main(["simulate", "--scaling", str(cluster), "--out", str(tmp_path / "o"), "--shared-prefix-tokens", "5"]) == 2


def multiturn_run(**changes) -> dict:
    """What scripts/measure_cluster_multiturn.py --out writes for one scenario: 2 conversations."""
    turn = lambda n, prompt, ok=True: {"turn": n, "ok": ok, "prompt_tokens": prompt, "completion_tokens": 16,
                                       "cached_tokens": 0, "ttft_ms": 500.0}
    return {"scenario": "chat", "concurrency": 2, "ttft_p50_ms_by_turn": {"1": 900.0, "2": 150.0, "3": 140.0},
            "placements": {"verify-verify-0 cost": 1, "verify-verify-1 cost": 1, "verify-verify-0 prefix": 3},
            "conversations": [[turn(1, 300), turn(2, 330), turn(3, 360)], [turn(1, 200), turn(2, 230, ok=False)]],
            **changes}


def test_a_multi_turn_run_becomes_its_conversations_up_to_a_failed_turn():
    from tandem.cluster.sim.multiturn import MultiTurnRun

    run = MultiTurnRun.from_json(multiturn_run())
    assert run.new_tokens == ((300, 14, 14), (200,))  # each turn's prompt less the turn before's and its answer
    assert run.completion_tokens == (16, 16, 16, 16)
    assert run.placements == {"cost": 2, "prefix": 3}
    workload = run.workload()
    assert (workload.num_requests, workload.concurrency) == (4, 2)
    assert run.workload(concurrency=1).concurrency == 1
    assert workload.requested_tokens is None  # no cap recorded: every answer ran to its cap
    assert MultiTurnRun.from_json(multiturn_run(max_tokens=48)).workload().requested_tokens == 48
    with pytest.raises(ValueError, match="max_tokens 8 is below an answer of 16"):
        MultiTurnRun.from_json(multiturn_run(max_tokens=8))


def test_tandem_simulate_replays_a_multi_turn_run(tmp_path, capsys):
    cluster = tmp_path / "c.yaml"
    cluster.write_text(f"workers:\n  - {{name: g, role: verify, model: {TARGET}, backend: torch, device: cuda,"
                       " dtype: bf16, hardware: l4, replicas: 2}\n")
    run = tmp_path / "chat.json"
    run.write_text(json.dumps(multiturn_run()))
    assert main(["simulate", "--cluster", str(cluster), "--roles", "as-written", "--conversations", str(run),
                 "--k", "0", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["result"]["requests"] == 4
    assert set(report["turns"]["ttft_ms_p50_by_turn"]) == {"1", "2", "3"}
    assert report["turns"]["placements"]["measured"] == {"cost": 2, "prefix": 3}
    assert report["result"]["reused_tokens"] >= 300 + 16 - 1  # the second turn found the first
    assert "at_run_speed" not in report["turns"]
    run.write_text(json.dumps(multiturn_run(call_seconds=1000.0)))  # the replicas computed far slower
    assert main(["simulate", "--cluster", str(cluster), "--roles", "as-written", "--conversations", str(run),
                 "--k", "0", "--json"]) == 0
    again = json.loads(capsys.readouterr().out)["turns"]["at_run_speed"]
    assert again["device_speed"] > 10
    assert again["ttft_ms_p50_by_turn"]["1"]["predicted"] > report["turns"]["ttft_ms_p50_by_turn"]["1"]["predicted"]
    assert main(["simulate", "--cluster", str(cluster), "--conversations", str(run), "--k", "0"]) == 0
    assert "TTFT p50 turn 2" in capsys.readouterr().out
    for extra in (["--requests", "4"], ["--max-tokens", "8"], ["--rate", "1"]):
        assert main(["simulate", "--cluster", str(cluster), "--conversations", str(run), *extra]) == 2
        assert "--conversations replays a run's own requests" in capsys.readouterr().err
    run.write_text(json.dumps(multiturn_run(conversations=[])))
    assert main(["simulate", "--cluster", str(cluster), "--conversations", str(run)]) == 2
    assert "not a multi-turn run" in capsys.readouterr().err
    assert main(["simulate", "--cluster", str(cluster), "--conversations", str(tmp_path / "missing.json")]) == 2
    assert "cannot read the multi-turn run" in capsys.readouterr().err


def test_the_header_says_the_depth_that_ran_not_the_plans_estimate(capsys):
    """`simulate` on a plan said "(plan: ngram k=3)" while every round's k was the engine
    planner's (mean k 12.4); the plan's k runs only where --k (or the file) fixes it."""
    from pathlib import Path

    hetero = str(Path(__file__).parents[3] / "examples" / "clusters" / "hetero-64.yaml")
    assert main(["simulate", "--cluster", hetero, "--requests", "4", "--max-tokens", "16"]) == 0
    header = capsys.readouterr().out.splitlines()[0]
    assert "k auto per round; the plan estimated k=" in header
    assert main(["simulate", "--cluster", hetero, "--requests", "4", "--max-tokens", "16", "--k", "3"]) == 0
    assert capsys.readouterr().out.splitlines()[0].endswith("(plan: ngram, k=3)")


def test_drawn_prompt_lengths_are_recorded_as_figures(tmp_path, capsys):
    """simulation.json said "drawn (EmpiricalLengths)", a class name, where the default workload's
    lengths were drawn."""
    cluster = tmp_path / "c.yaml"
    cluster.write_text(f"workers:\n  - {{name: g, role: verify, model: {TARGET}, backend: torch, device: cuda,"
                       " dtype: bf16, hardware: l4}\ndrafter: ngram\n")
    assert main(["simulate", "--cluster", str(cluster), "--requests", "4", "--max-tokens", "8", "--json"]) == 0
    drawn = json.loads(capsys.readouterr().out)["simulated"]["prompt_tokens"]
    assert drawn["drawn"] == "at random" and 1 <= drawn["min"] <= drawn["mean"] <= drawn["max"] and drawn["from"] > 1
