"""Device profiles: interpolation, JSON round trips, public-spec rooflines, where profiles come from."""

import dataclasses
import json
from pathlib import Path

import pytest
from profile_doubles import cluster, fused_profile, verifier

from tandem.cluster.profiles.profile import Curve, DeviceProfile, load_profile, profile_from_json, profile_to_json, save_profile
from tandem.cluster.profiles.profile_store import cluster_profiles, default_profile_path, worker_profile
from tandem.cluster.profiles.public_profiles import DEVICE_CLASSES, public_profile, roofline_ms
from tandem.cluster.config.cluster_spec import WorkerSpec
from tandem.cluster.config.load import load_cluster
from tandem.errors import TandemError

QWEN = "qwen2.5-coder-1.5b-instruct"
EXAMPLES = Path(__file__).parents[3] / "examples" / "clusters"


def two_context_profile() -> DeviceProfile:
    curves = (
        Curve(1, 64, ((1, 10.0), (4, 20.0))), Curve(4, 64, ((1, 30.0), (4, 60.0))),
        Curve(1, 512, ((1, 20.0), (4, 40.0))), Curve(4, 512, ((1, 50.0), (4, 100.0))),
    )
    return DeviceProfile("m", "llamacpp", "cpu", "gguf", 2, "measured", curves, measured_at="2026-01-01T00:00:00+00:00")


def test_step_ms_interpolates_batches_and_contexts():
    p = two_context_profile()
    assert p.step_ms(1, 4, 64) == 20.0
    assert p.step_ms(2, 1, 64) == pytest.approx(10 + (30 - 10) / 3)  # a third of the way from 1 to 4
    assert p.step_ms(1, 1, 288) == pytest.approx(15.0)  # halfway between contexts
    assert p.step_ms(1, 1, 10) == 10.0 and p.step_ms(1, 1, 9999) == 20.0  # clamped
    assert p.step_ms(8, 2, 64) == pytest.approx(60.0)  # 8 x 2 tokens priced as 4 x 4
    assert p.step_ms(1, 2, 64) == pytest.approx(10 + 10 / 3)  # the CostModel's interpolation


def test_json_round_trip(tmp_path):
    p = two_context_profile()
    path = save_profile(p, tmp_path / "sub" / "p.json")
    assert load_profile(path) == p
    assert profile_from_json(json.loads(json.dumps(profile_to_json(p)))) == p


def test_the_prompt_curve_round_trips_and_older_files_load_without_one(tmp_path):
    p = dataclasses.replace(two_context_profile(), prompt_ms=((1, 10.0), (64, 200.0), (256, 700.0)))
    assert load_profile(save_profile(p, tmp_path / "p.json")) == p
    assert p.prompt_cost().cost_ms(64) == 200.0
    older = profile_to_json(two_context_profile())
    assert "prompt_ms" not in older
    assert profile_from_json(older).prompt_cost() is None


def test_a_logits_row_is_read_off_the_prompt_curve_against_the_shortest_contexts_curve():
    from tandem.cluster.sim.from_profile import device_from_profile, logits_row_ms

    p = dataclasses.replace(two_context_profile(), prompt_ms=((1, 10.0), (4, 17.0), (256, 700.0)))
    assert logits_row_ms(p) == pytest.approx((20.0 - 17.0) / 3)  # n = 4: the largest both hold, at 64 cached
    assert device_from_profile("v", p, slowdown=2.0, typical=False).logits_row_ms == pytest.approx(2.0)
    assert logits_row_ms(two_context_profile()) == 0.0  # no prompt curve: nothing to tell the rows by
    cheaper_rows = dataclasses.replace(p, prompt_ms=((1, 10.0), (4, 25.0)))  # a noisy prompt curve above the rows'
    assert logits_row_ms(cheaper_rows) == 0.0


def test_the_typical_speed_round_trips_prices_the_simulators_device_and_older_files_read_as_fastest(tmp_path):
    from tandem.cluster.profiles.measure import typical_over_fastest
    from tandem.cluster.sim.from_profile import device_from_profile

    assert typical_over_fastest([[10.0, 30.0, 20.0], [5.0, 5.0, 5.0], [4.0, 8.0, 6.0]]) == 1.5  # 2.0, 1.0, 1.5
    assert typical_over_fastest([[7.0], [9.0]]) == 1.0  # one sample a point: nothing to tell
    p = dataclasses.replace(two_context_profile(), typical_over_fastest=1.25)
    assert load_profile(save_profile(p, tmp_path / "p.json")) == p
    older = profile_to_json(two_context_profile())
    assert older["typical_over_fastest"] is None and profile_from_json(older).typical_over_fastest is None
    del older["typical_over_fastest"]
    assert profile_from_json(older) == two_context_profile()
    fastest = device_from_profile("d", two_context_profile(), context=64)
    typical = device_from_profile("d", p, context=64)
    assert typical.forward_ms([4] * 4) == pytest.approx(1.25 * fastest.forward_ms([4] * 4))
    assert device_from_profile("d", p, context=64, typical=False).forward_ms([4] * 4) == fastest.forward_ms([4] * 4)
    with pytest.raises(TandemError, match="typical_over_fastest must be >= 1"):
        dataclasses.replace(p, typical_over_fastest=0.9)


def test_invalid_profiles_are_refused(tmp_path):
    curves = (Curve(1, 64, ((1, 1.0),)),)
    with pytest.raises(TandemError, match="must cite"):
        DeviceProfile("m", "torch", "npu", "fp16", None, "public-spec", curves)
    with pytest.raises(TandemError, match="lacks a batch-1 curve"):
        DeviceProfile("m", "torch", "npu", "fp16", None, "measured", (Curve(2, 64, ((1, 1.0),)),))
    with pytest.raises(TandemError, match="ascending"):
        Curve(1, 64, ((4, 1.0), (1, 2.0)))
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(TandemError, match="unsupported profile format"):
        load_profile(tmp_path / "bad.json")
    (tmp_path / "broken.json").write_text("{")
    with pytest.raises(TandemError, match="not valid JSON"):
        load_profile(tmp_path / "broken.json")


def test_public_profiles_are_derived_and_shaped_like_their_devices():
    gpu = public_profile("h100-sxm", QWEN)
    cpu = public_profile("epyc-9654", QWEN, backend="llamacpp", dtype="gguf")
    assert gpu.source == "public-spec" and "DERIVED" in gpu.citation and "datasheet" in gpu.citation
    assert gpu.peak_tflops == 989.0 and gpu.bandwidth_gbs == 3350.0
    # memory-bound at small n on the GPU: 16 tokens cost about what 1 does
    assert gpu.step_ms(1, 16, 64) < 1.05 * gpu.step_ms(1, 1, 64)
    # compute-bound sooner on the CPU
    assert cpu.step_ms(1, 64, 64) > 3 * cpu.step_ms(1, 1, 64)
    h100 = DEVICE_CLASSES["h100-sxm"]
    assert roofline_ms(h100, 1e9, 2e9, 0, 1, 1, 0) == pytest.approx(2e9 / 3.35e12 * 1000 + h100.fixed_ms)
    with pytest.raises(TandemError, match="no model shape"):
        public_profile("h100-sxm", "some/local/model.gguf")


def test_worker_profile_sources(tmp_path, monkeypatch):
    monkeypatch.setenv("TANDEM_HOME", str(tmp_path))
    mine = fused_profile({1: 5.0, 64: 50.0}, "target")
    other = fused_profile({1: 5.0, 64: 50.0}, "draft")
    listed = [str(save_profile(other, tmp_path / "o.json")), str(save_profile(mine, tmp_path / "m.json"))]
    spec = cluster(verifier(), profiles={"v": listed})
    assert worker_profile(spec, spec.workers[0], "target") == load_profile(listed[1])
    bare = cluster(verifier(threads=1))
    with pytest.raises(TandemError, match="neither a catalog model nor a file"):
        cluster_profiles(bare)  # "target" is no model at all
    monkeypatch.chdir(tmp_path)
    (tmp_path / "target").write_bytes(b"")
    with pytest.raises(TandemError, match="run `tandem profile"):
        cluster_profiles(bare)
    save_profile(mine, default_profile_path("target", "llamacpp", "cpu", "fp32", 1))
    assert cluster_profiles(bare)[("v", "target")] == load_profile(default_profile_path(
        "target", "llamacpp", "cpu", "fp32", 1))


def test_a_model_name_typo_is_named_with_the_nearest_catalog_model(tmp_path, monkeypatch):
    monkeypatch.setenv("TANDEM_HOME", str(tmp_path))
    spec = cluster(WorkerSpec("v", "verify", "qwen2.5-coder-1.5b-instrct", threads=1))
    with pytest.raises(TandemError, match=f"did you mean '{QWEN}'"):
        cluster_profiles(spec)


def test_two_model_files_of_one_name_never_share_a_profile(tmp_path, monkeypatch):
    monkeypatch.setenv("TANDEM_HOME", str(tmp_path))
    first, second = str(tmp_path / "a" / "m.gguf"), str(tmp_path / "b" / "m.gguf")
    paths = [default_profile_path(model, "llamacpp", "cpu", "fp32", 1) for model in (first, second)]
    assert paths[0] != paths[1] and all(path.name.startswith("m.gguf-") for path in paths)
    assert default_profile_path(first, "llamacpp", "cpu", "fp32", 1) == paths[0]  # stable
    catalog = default_profile_path("qwen2.5-coder-1.5b-instruct", "llamacpp", "cpu", "fp32", 2)
    assert catalog.name == "qwen2.5-coder-1.5b-instruct__llamacpp__cpu__gguf__2t.json"


def test_public_hardware_gives_profiles_without_measuring(tmp_path, monkeypatch):
    monkeypatch.setenv("TANDEM_HOME", str(tmp_path))
    spec = load_cluster(EXAMPLES / "hetero-64.yaml")
    profiles = cluster_profiles(spec)
    assert {p.source for p in profiles.values()} == {"public-spec"}
    assert profiles[("ascend", "qwen2.5-coder-0.5b-instruct")].hardware == "ascend-910b"


class SleepyRunner:
    """A batch runner whose calls take 0.1 ms per token; both samples of (context 0, batch 1, n 1)
    (calls 2 and 8, after the warm-up) are hit by 50 ms of interference."""

    fused = True
    can_copy_prefix = True
    max_slots = 4
    context_length = 4096  # what a batch runner holds per sequence (the profile checks its grid fits)

    def __init__(self):
        self.lengths = [0] * self.max_slots
        self.calls = 0

    def forward_batch(self, items, views: bool = False):
        import time

        self.calls += 1
        tokens = sum(len(item.token_ids) for item in items)
        time.sleep(0.0001 * tokens + (0.05 if self.calls in (2, 8) else 0.0))
        for item in items:
            self.lengths[item.slot] += len(item.token_ids)
        return [None for _ in items]

    def rollback(self, slot, length):
        self.lengths[slot] = min(self.lengths[slot], length)

    def copy_prefix(self, source, destination, length):
        self.lengths[destination] = length


def test_measure_sweeps_the_grid_and_caps_noise(monkeypatch):
    from tandem.cluster.profiles import measure
    from tandem.models.backends import RunnerSpec

    runner = SleepyRunner()
    monkeypatch.setattr(measure, "load_batch_runner", lambda spec, slots: runner)
    grid = measure.ProfileGrid(sizes=(1, 4, 16), contexts=(0, 32), batches=(1, 4), repeats=2)
    profile = measure.measure_profile(RunnerSpec("smollm2-135m-instruct", "llamacpp", "cpu", threads=1), grid,
                                      progress=False)
    assert (profile.source, profile.threads, profile.dtype) == ("measured", 1, "gguf")
    assert profile.batches == (1, 4) and profile.contexts == (0, 32)
    assert profile.memory is not None
    for curve in profile.curves:  # capping by more work makes every curve monotone in n
        costs = [ms for _, ms in curve.latency_ms]
        assert costs == sorted(costs)
    assert profile.step_ms(1, 1, 0) < 10  # capped by the faster samples that did more work
    assert profile.typical_over_fastest >= 1.0  # recorded: each point's median sample over its fastest
    assert [n for n, _ in profile.prompt_ms] == [1, 4, 16, 128, 256]  # the grid's sizes and PROMPT_SIZES
    costs = [ms for _, ms in profile.prompt_ms]
    assert costs == sorted(costs)


def test_cap_by_more_work():
    from tandem.cluster.profiles.measure import _cap_by_more_work

    samples = {(0, 1, 1): 9.0, (0, 1, 2): 2.0, (0, 2, 1): 3.0, (64, 1, 1): 1.5}
    assert _cap_by_more_work(samples) == {(0, 1, 1): 1.5, (0, 1, 2): 2.0, (0, 2, 1): 3.0, (64, 1, 1): 1.5}


def test_a_grid_beyond_the_models_context_is_refused_before_measuring(monkeypatch):
    """--contexts 9000 on a model trained for 8,192 ran three minutes past what it holds."""
    import pytest

    from tandem.cluster.profiles import measure
    from tandem.errors import TandemError
    from tandem.models.backends import RunnerSpec

    runner = SleepyRunner()
    runner.context_length = 8192
    monkeypatch.setattr(measure, "load_batch_runner", lambda spec, slots: runner)
    grid = measure.ProfileGrid(sizes=(1, 64), contexts=(0, 9000), batches=(1,), repeats=1)
    with pytest.raises(TandemError, match="needs 9064 tokens of context"):
        measure.measure_profile(RunnerSpec("smollm2-135m-instruct", "llamacpp", "cpu", threads=1), grid, progress=False)
    assert runner.calls == 0


def test_the_measured_gpu_example_prices_its_replica_on_the_h200_profile():
    """examples/clusters/h200-measured.yaml names the profile measured on an H200 (scripts/
    gpu_check.py --only device_profile) under `profiles:`, relative to the file: the planner and
    the simulator price that replica on it, not on the public figures of its device class."""
    spec = load_cluster(EXAMPLES / "h200-measured.yaml")
    profile = cluster_profiles(spec)[("h200", "qwen2.5-coder-1.5b-instruct")]
    assert (profile.source, profile.device, profile.dtype) == ("measured", "cuda", "bf16")
    assert profile.batches == (1, 2, 4, 8, 16, 32, 64)
    # the runner launches its kernels from Python: 64 sequences' decode step costs under twice one's
    assert profile.step_ms(64, 1, 512) < 2 * profile.step_ms(1, 1, 512)
