"""`tandem profile` on a real model: smollm2 on llama.cpp over a few sizes, saved, loaded back,
and usable by `tandem plan` (kept small: a few seconds on two cores)."""

import pytest

from tandem.cli.main import main
from tandem.cluster.profiles.profile import load_profile

pytestmark = pytest.mark.real

SMALL = "smollm2-135m-instruct"


@pytest.fixture(scope="module")
def profile_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("profiles") / "smollm2.json"
    code = main(["profile", "--model", SMALL, "--backend", "llamacpp", "--device", "cpu", "--threads", "2",
                 "--sizes", "1,8,32", "--contexts", "16,128", "--batches", "1,2", "--repeats", "2",
                 "--out", str(path)])
    assert code == 0
    return path


def test_profile_is_saved_and_loads_back(profile_path):
    profile = load_profile(profile_path)
    assert (profile.model, profile.backend, profile.device, profile.threads) == (SMALL, "llamacpp", "cpu", 2)
    assert profile.source == "measured" and profile.measured_at
    assert profile.batches == (1, 2) and profile.contexts == (16, 128)
    assert profile.memory is not None and profile.memory.rss_delta_bytes > 0


def test_curves_grow_with_tokens(profile_path):
    profile = load_profile(profile_path)
    for curve in profile.curves:
        costs = dict(curve.latency_ms)
        assert costs[32] > costs[1], curve  # 32 tokens per sequence cost more than 1
    assert profile.step_ms(2, 32, 16) > profile.step_ms(1, 1, 16)
    assert profile.step_ms(1, 32, 16) > profile.step_ms(1, 1, 16) > 0


def test_plan_reads_the_measured_profile(profile_path, tmp_path, capsys):
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(
        "workers:\n"
        f"  - {{name: small, role: both, model: {SMALL}, draft_model: {SMALL}, threads: 2, replicas: 2}}\n"
        f"profiles:\n  small: {profile_path}\n")
    assert main(["plan", "--cluster", str(cluster)]) == 0
    out = capsys.readouterr().out
    assert "Chosen: drafter" in out and "measured curve" in out
