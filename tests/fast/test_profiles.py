"""The cached cost profile (models/backends.py): measured once, on a short cache and, for batch
runners, on a deep one too, and read back whole; the folder bounded by bytes, least recently
used evicted first."""

import json
import os

import numpy as np

from tandem.models import backends
from tandem.models.backends import DEEP_PROFILE_LENGTH, PROFILE_BASE_LENGTH, RunnerSpec, cached_profile
from tandem.models.cost import CostModel


class CacheTimedRunner:
    """A runner double whose call of n tokens on c cached ones takes no time but records (n, c)."""

    name = "cache-timed"
    vocab_size = 4

    def __init__(self, context_length: int):
        self.context_length = context_length
        self.cost = CostModel()
        self.length = 0
        self.calls: list[tuple[int, int]] = []

    @property
    def num_cached_tokens(self) -> int:
        return self.length

    def forward(self, token_ids, num_logits=None) -> np.ndarray:
        self.calls.append((len(token_ids), self.length))
        self.length += len(token_ids)
        return np.zeros((num_logits or 0, self.vocab_size), np.float32)

    def rollback(self, length: int) -> None:
        self.length = min(self.length, length)

    def reset(self) -> None:
        self.length = 0


def test_a_batch_profile_is_measured_on_a_deep_cache_too_and_read_back(tmp_path, monkeypatch):
    monkeypatch.setenv("TANDEM_HOME", str(tmp_path))
    spec = RunnerSpec(str(tmp_path / "model"), backend="torch", device="cpu", threads=1)
    runner = CacheTimedRunner(context_length=4096)
    cost = cached_profile(spec, runner, (1, 4, 64), deep=True)
    measured_at = {c for n, c in runner.calls if n in (1, 4, 64) and c}
    assert measured_at == {PROFILE_BASE_LENGTH, DEEP_PROFILE_LENGTH}
    assert (cost.base_context, cost.deep_context) == (PROFILE_BASE_LENGTH, DEEP_PROFILE_LENGTH)
    assert set(cost.deep_ms) == {1, 4, 64}
    record = json.loads(next((tmp_path / "profiles").iterdir()).read_text())
    assert record["deep_context"] == DEEP_PROFILE_LENGTH and set(record["deep_latency_ms"]) == {"1", "4", "64"}

    again = CacheTimedRunner(context_length=4096)
    assert cached_profile(spec, again, (1, 4, 64), deep=True).deep_ms == cost.deep_ms
    assert again.calls == []  # read from the cache, not measured again


def test_a_profile_without_its_deep_curve_is_measured_again_and_a_short_context_caps_the_depth(tmp_path, monkeypatch):
    monkeypatch.setenv("TANDEM_HOME", str(tmp_path))
    spec = RunnerSpec(str(tmp_path / "model"), backend="torch", device="cpu", threads=1, context_length=256)
    cached_profile(spec, CacheTimedRunner(256), (1, 64))  # a single-sequence profile: no deep curve
    runner = CacheTimedRunner(256)
    cost = cached_profile(spec, runner, (1, 64), deep=True)
    assert runner.calls  # measured again
    assert cost.deep_context == 256 - 64 - 1  # the largest call still fits after it
    assert max(n + c for n, c in runner.calls) <= 256


def test_a_context_too_short_for_the_base_and_the_largest_call_is_profiled_on_fewer_cached_tokens(tmp_path,
                                                                                                   monkeypatch):
    """--context-length 64 to 127 on torch: the profile timed 64-token calls on 64 cached tokens,
    past the context, and every first start failed ("slot 0 would exceed the context of 100")."""
    monkeypatch.setenv("TANDEM_HOME", str(tmp_path))
    for context in (64, 100, 127, 128):
        spec = RunnerSpec(str(tmp_path / "model"), backend="torch", device="cpu", threads=1, context_length=context)
        runner = CacheTimedRunner(context)
        cost = cached_profile(spec, runner, (1, 4, 64))
        assert max(n + c for n, c in runner.calls) <= context
        assert cost.base_context == min(PROFILE_BASE_LENGTH, context - 64)


def test_the_profiles_folder_stays_within_its_bound_evicting_the_least_recently_used(tmp_path, monkeypatch):
    monkeypatch.setenv("TANDEM_HOME", str(tmp_path))
    folder = tmp_path / "profiles"
    specs = [RunnerSpec(str(tmp_path / f"model{i}"), backend="torch", device="cpu", threads=1) for i in range(5)]
    cached_profile(specs[0], CacheTimedRunner(4096), (1, 4))
    one = sum(p.stat().st_size for p in folder.glob("*.json"))  # one profile's bytes
    monkeypatch.setattr(backends, "PROFILE_CACHE_BYTES", int(3.5 * one))  # room for three
    for spec in specs[1:3]:
        cached_profile(spec, CacheTimedRunner(4096), (1, 4))
    for path in folder.glob("*.json"):  # all three written long ago
        os.utime(path, (1000, 1000))
    cached_profile(specs[0], CacheTimedRunner(4096), (1, 4))  # read back: model0 is now the most recent
    for spec in specs[3:]:
        cached_profile(spec, CacheTimedRunner(4096), (1, 4))
        assert sum(p.stat().st_size for p in folder.glob("*.json")) <= 3.5 * one
    kept, evicted = CacheTimedRunner(4096), CacheTimedRunner(4096)
    cached_profile(specs[0], kept, (1, 4))
    assert kept.calls == []  # the one read recently survived the evictions
    cached_profile(specs[1], evicted, (1, 4))
    assert evicted.calls  # an old one went, and is measured again


def test_another_model_written_at_the_same_path_is_profiled_again(tmp_path, monkeypatch):
    """Profiles were keyed by the model's path: a re-quantized file at the same path planned on
    the old file's curve. The key holds the file's size and time (no hashing: it only steers
    speed), so the same file reads its profile back and a rewritten one is measured."""
    monkeypatch.setenv("TANDEM_HOME", str(tmp_path / "home"))
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF one")
    spec = RunnerSpec(str(model), backend="torch", device="cpu", threads=1)
    cached_profile(spec, CacheTimedRunner(context_length=4096), (1, 4))
    again = CacheTimedRunner(context_length=4096)
    cached_profile(spec, again, (1, 4))
    assert again.calls == []
    model.write_bytes(b"GGUF two, re-quantized")
    os.utime(model, ns=(10**18, 10**18))
    rewritten = CacheTimedRunner(context_length=4096)
    cached_profile(spec, rewritten, (1, 4))
    assert rewritten.calls != []


def test_a_damaged_profile_is_measured_again_not_a_failed_start(tmp_path, monkeypatch, capsys):
    """A profile cut short (a full disk, a killed writer) raised JSONDecodeError at every start.
    It is now removed with a warning and measured again; the new one reads back."""
    monkeypatch.setenv("TANDEM_HOME", str(tmp_path))
    spec = RunnerSpec(str(tmp_path / "model"), backend="torch", device="cpu", threads=1)
    cached_profile(spec, CacheTimedRunner(4096), (1, 4))
    (path,) = (tmp_path / "profiles").glob("*.json")
    for damage, said in (('{"latency_ms": {"1": 3', "JSONDecodeError"), ("[]", "TypeError"),
                         ('{"latency_ms": {"one": 3}}', "ValueError"), ("{}", "no 'latency_ms' field")):
        path.write_text(damage)
        runner = CacheTimedRunner(4096)
        cost = cached_profile(spec, runner, (1, 4))
        assert runner.calls and set(cost.latency_ms) == {1, 4}  # measured again
        assert f"cannot be read ({said}" in capsys.readouterr().err  # a bare ('latency_ms') said nothing
        again = CacheTimedRunner(4096)
        cached_profile(spec, again, (1, 4))
        assert again.calls == []  # and written whole
    assert [p.name for p in (tmp_path / "profiles").iterdir()] == [path.name]  # no temp file left


def test_a_catalog_model_and_the_path_of_its_pulled_file_share_one_profile(tmp_path, monkeypatch):
    """A user naming the pulled file instead of its catalog name profiled the same model again (~80 s)."""
    from tandem.models.pull import catalog_name_of

    monkeypatch.setenv("TANDEM_HOME", str(tmp_path))
    pulled = tmp_path / "models" / "smollm2-135m-instruct" / "model.gguf"
    pulled.parent.mkdir(parents=True)
    pulled.write_bytes(b"GGUF")
    copy = tmp_path / "elsewhere" / "smollm2-135m-instruct" / "model.gguf"  # the same name, not the pulled file
    copy.parent.mkdir(parents=True)
    copy.write_bytes(b"GGUF")
    assert catalog_name_of(str(pulled)) == catalog_name_of("smollm2-135m-instruct") == "smollm2-135m-instruct"
    assert catalog_name_of(str(copy)) is None and catalog_name_of(str(tmp_path / "missing.gguf")) is None
    key = lambda model: backends._profile_key(RunnerSpec(model, "llamacpp", threads=1), None)  # noqa: E731
    assert key(str(pulled)) == key("smollm2-135m-instruct") != key(str(copy))


def test_cpus_of_one_name_and_another_kind_keep_profiles_apart(tmp_path, monkeypatch):
    """VMs that all say "AMD EPYC" (Zen 3, 4, 5) shared one profile: a home carried between them
    planned on another CPU's curves."""
    from tandem import hardware

    monkeypatch.setenv("TANDEM_HOME", str(tmp_path))
    key = lambda: backends._profile_key(RunnerSpec(str(tmp_path / "m.gguf"), "llamacpp", threads=2), None)  # noqa: E731
    monkeypatch.setattr(backends, "cpu_model", lambda: "AMD EPYC")
    monkeypatch.setattr(backends, "cpu_family_model", lambda: "family 25 model 1")
    zen3 = key()
    monkeypatch.setattr(backends, "cpu_family_model", lambda: "family 25 model 17")
    assert key() != zen3
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 17\n"
                       "model name\t: AMD EPYC\n\nprocessor\t: 1\ncpu family\t: 99\n")
    real_path = hardware.Path
    monkeypatch.setattr(hardware, "Path", lambda p: cpuinfo if p == "/proc/cpuinfo" else real_path(p))
    assert hardware.cpu_family_model() == "family 25 model 17"


def test_a_profile_that_cannot_be_saved_is_used_for_this_run_with_a_warning(tmp_path, monkeypatch, capsys):
    """A read-only home (its profiles folder there, the file not): `tandem serve` measured for
    20 s, then died of the PermissionError writing it."""
    monkeypatch.setenv("TANDEM_HOME", str(tmp_path))
    (tmp_path / "profiles").mkdir()
    os.chmod(tmp_path / "profiles", 0o555)

    def refused(path, text):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(backends, "write_text_atomic", refused)  # root ignores the folder's mode
    try:
        cost = cached_profile(RunnerSpec(str(tmp_path / "model"), backend="torch", device="cpu", threads=1),
                              CacheTimedRunner(context_length=4096), (1, 4))
    finally:
        os.chmod(tmp_path / "profiles", 0o755)
    assert set(cost.latency_ms) == {1, 4}
    assert "warning: cannot save the profile" in capsys.readouterr().err


def test_a_home_without_a_profiles_folder_that_cannot_make_one_still_serves(tmp_path, monkeypatch, capsys):
    """A read-only home holding its models but no profiles folder refused to start ("cannot
    create the folder .../profiles"), where one with the folder measured and served, warned."""
    from tandem.errors import TandemError

    monkeypatch.setenv("TANDEM_HOME", str(tmp_path))

    def read_only(folder):
        raise TandemError(f"cannot create the folder {folder}: Permission denied")

    monkeypatch.setattr(backends, "make_dir", read_only)  # root ignores a folder's mode
    cost = cached_profile(RunnerSpec(str(tmp_path / "model"), backend="torch", device="cpu", threads=1),
                          CacheTimedRunner(context_length=4096), (1, 4))
    assert set(cost.latency_ms) == {1, 4} and not (tmp_path / "profiles").exists()
    err = capsys.readouterr().err
    assert "warning: cannot create the folder" in err and "measured at each start" in err and "(once, not kept;" in err
