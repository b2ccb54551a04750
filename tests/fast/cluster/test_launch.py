"""From a cluster file to workers (without starting Ray): roles, replicas, round trips, and the
model `tandem serve --cluster` serves."""

import argparse

import pytest

from tandem.cli.serve_cmd import cluster_options, cluster_engine_config
from tandem.cluster.config.cluster_spec import ClusterSpec, WorkerSpec
from tandem.cluster.runtime.launch import (ClusterOptions, local_cluster_resources, prepare_models, replica_cache_ram,
                                          router_group, roles_of, shared_cores_note)
from tandem.engine.host_cache import default_cache_ram_bytes
from tandem.cluster.config.load import load_cluster
from tandem.errors import TandemError

CROSS_REGION = "examples/clusters/cross-region.yaml"
LOCAL = "examples/clusters/local-2cpu.yaml"


def test_roles_and_replicas_from_the_example_files():
    spec = load_cluster(LOCAL)
    roles = [(w.name, r.role, r.model) for w in spec.workers for r in roles_of(w)]
    assert ("draft", "draft", "qwen2.5-coder-0.5b-instruct") in roles
    assert ("verify", "verify", "qwen2.5-coder-1.5b-instruct") in roles
    assert spec.worker("verify").replicas == 2


def test_a_local_cluster_asking_for_more_cpus_than_the_machine_has_says_so():
    """Workers whose `resources:` or threads add up past this machine's CPUs started without a
    word (Ray was told the sum); they still start (emulation shares the cores), with a note."""
    spec = ClusterSpec([WorkerSpec("v", "verify", "m", replicas=2, resources={"CPU": 4, "npu": 1}),
                        WorkerSpec("d", "draft", "m2", threads=3)])
    cpus, gpus, custom = local_cluster_resources(spec)
    assert (gpus, custom) == (0, {"npu": 2.0}) and cpus >= 11
    assert shared_cores_note(11, 2) == ("note: the cluster file's workers ask for 11 CPUs in all and this machine "
                                        "has 2: on one machine they share its cores (Ray is told 11)")
    assert shared_cores_note(2, 2) is None


def test_a_model_that_cannot_be_found_is_an_error_at_its_line_in_the_file(tmp_path, capsys):
    """`serve --cluster` said only the resolver's message for a misspelt model: which worker, which
    line, was left to the reader (every other mistake in the file names its line)."""
    path = tmp_path / "cluster.yaml"
    path.write_text("workers:\n  - name: d\n    role: draft\n    model: no-such-model-here\n"
                    "  - name: v\n    role: verify\n    model: no-such-model-here\n")
    with pytest.raises(TandemError) as error:
        prepare_models(load_cluster(path))
    assert str(error.value).startswith(f"{path}:4: workers[0].model: ")
    assert "no-such-model-here" in str(error.value)

    from tandem.cli.main import main

    assert main(["serve", "--cluster", str(path), "--port", "0"]) == 2  # before the server reads its tokenizer
    assert f"error: {path}:4: workers[0].model: unknown model 'no-such-model-here'" in capsys.readouterr().err


def test_the_router_sits_with_the_drafter_and_verifiers_pay_the_round_trip():
    spec = load_cluster(CROSS_REGION)
    home = router_group(spec)
    assert home == "edge"
    assert spec.network.rtt_ms(home, spec.worker("central-verify").group) == 12.0


def test_replicas_share_one_process_default_host_cache_unless_the_file_sizes_it():
    """Three verifier replicas (a worker with two, one with one) on what may be one machine:
    each gets a third of what one `tandem serve` would take; `cache_ram: 512M` (or 0) wins."""
    two = WorkerSpec("a", "verify", "m", replicas=2)
    spec = ClusterSpec([two, WorkerSpec("b", "verify", "m"), WorkerSpec("d", "draft", "m2")])
    share = default_cache_ram_bytes() // 3
    assert replica_cache_ram(spec) == {"a": share, "b": share, "d": share}
    sized = ClusterSpec([WorkerSpec("a", "verify", "m", replicas=2, cache_ram="512M"), WorkerSpec("b", "verify", "m", cache_ram=0)])
    assert replica_cache_ram(sized) == {"a": 512 << 20, "b": 0}


def test_a_replica_host_sizes_its_host_tier_and_opens_its_ngram_store_as_told(tiny_target):
    """What launch hands a replica's actor: its host tier's capacity, the n-gram store's URL,
    `tandem serve`'s step budget, prefill floor and waves (the plain class, no Ray)."""
    from tandem.cluster.runtime.actors import ReplicaHost
    from tandem.cluster.runtime.emulation import Emulation
    from tandem.models.backends import RunnerSpec

    from tandem.cluster.runtime.replica import ReplicaSettings

    settings = ReplicaSettings(3 << 20, "memory", "tiny", step_token_budget=100, prefill_floor=24, prefill_waves=True)
    host = ReplicaHost(RunnerSpec(str(tiny_target), backend="torch", context_length=256), 2, Emulation(), settings)
    try:
        engine = host.worker.engine
        assert engine.prompt_cache.host.capacity_bytes == 3 << 20
        assert engine.ngram_store is not None  # its own in-process n-gram store
        assert (engine.step_token_budget, engine.prefill_floor, engine.prefill_waves) == (100, 24, True)
    finally:
        host.worker.close()


def serve_args(**overrides) -> argparse.Namespace:
    values = dict(cluster=None, ray_address=None, draft_ahead=False, drafter="hybrid", k="auto", health_period=None,
                  step_tokens=512, prefill_floor=None, prefill_waves=False)
    values.update(overrides)
    return argparse.Namespace(**values)


def test_serve_cluster_serves_the_first_verifiers_model():
    args = serve_args(cluster=CROSS_REGION)
    options = cluster_options(args)
    config = cluster_engine_config(options, args)
    assert isinstance(options, ClusterOptions)
    assert config.target.model == "qwen2.5-coder-1.5b-instruct"
    assert config.draft.model == "qwen2.5-coder-0.5b-instruct" and config.drafter == "hybrid"
    assert options.health_period_s == 2.0
    fixed = cluster_engine_config(options, serve_args(cluster=CROSS_REGION, step_tokens=256, prefill_floor=48,
                                                      prefill_waves=True))
    assert (fixed.step_token_budget, fixed.prefill_floor, fixed.prefill_waves) == (256, 48, True)  # to the replicas
    assert not config.prefill_waves  # off unless asked
    assert config.prefill_floor is None  # unset: the replicas read theirs off the profile (their gap bound)
    assert cluster_engine_config(options, serve_args(cluster=CROSS_REGION, prefill_floor="auto")).prefill_floor is None


def test_the_health_period_is_read_and_checked():
    options = cluster_options(serve_args(cluster=CROSS_REGION, health_period="0.5"))
    assert options.health_period_s == 0.5
    for bad in ("soon", "0", "-1"):
        with pytest.raises(TandemError, match="health"):
            cluster_options(serve_args(cluster=CROSS_REGION, health_period=bad))


def test_ray_options_without_a_cluster_are_refused():
    with pytest.raises(TandemError, match="need --cluster"):
        cluster_options(serve_args(ray_address="127.0.0.1:6379"))
    with pytest.raises(TandemError, match="need --cluster"):
        cluster_options(serve_args(draft_ahead=True))
    with pytest.raises(TandemError, match="need --cluster"):
        cluster_options(serve_args(health_period="1"))


def test_an_emulated_slower_replica_keeps_both_curves_scaled():
    """SlowedRunner used to rebuild the cost from its short curve alone, so a slowed replica's
    engine lost the deep curve it reads at long contexts."""
    from types import SimpleNamespace

    from tandem.cluster.runtime.emulation import SlowedRunner
    from tandem.models.cost import CostModel

    runner = SimpleNamespace(cost=CostModel({1: 30.0, 4: 90.0}, deep_ms={1: 40.0, 4: 120.0},
                                            base_context=64, deep_context=1024))
    SlowedRunner(runner, 3.0)
    assert runner.cost.deep_context == 1024
    assert runner.cost.cost_ms(4, 1024) == pytest.approx(360.0) and runner.cost.cost_ms(4, 64) == pytest.approx(270.0)


def test_models_of_another_tokenizer_are_refused_before_ray_starts():
    """Token ids pass between a cluster's workers: a drafter or verifier of another tokenizer
    failed every request with a drafter worker's traceback (or left requests unanswered). Two
    models of one family share a tokenizer and pass; the loader reads each model's once."""
    from tandem.cluster.runtime.launch import check_one_tokenizer

    family, other = {"a": 0, "b": 1}, {"a": 0, "c": 1}
    vocabularies = {"big": family, "small": family, "smollm": other}
    read = []

    def vocabulary(model):
        read.append(model)
        return vocabularies[model]

    def spec(verify: str, draft: str) -> ClusterSpec:
        return ClusterSpec((WorkerSpec("v", "verify", verify), WorkerSpec("d", "draft", draft),
                            WorkerSpec("v2", "verify", "big")))

    check_one_tokenizer(spec("big", "small"), vocabulary)
    assert sorted(read) == ["big", "small"]
    with pytest.raises(TandemError, match="smollm .* and the served big .* map 2 entries differently"):
        check_one_tokenizer(spec("big", "smollm"), vocabulary)
    with pytest.raises(TandemError, match="every verifier holds the one model"):
        spec("smollm", "small")  # a second verifier of another model: refused by the file's rules first


def test_a_failed_start_stops_every_process_it_started_grandchildren_too():
    """As a SIGTERM inside ray.init: the raylet's agents (grandchildren) outlived Ray's shutdown."""
    import subprocess
    import sys

    import psutil

    from tandem.cluster.runtime.reap import stopping_what_it_started

    kept = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])  # started before: not ours
    spawned = []
    try:
        with pytest.raises(SystemExit), stopping_what_it_started():
            parent = subprocess.Popen(["sh", "-c", "sleep 60 & sleep 60"])
            spawned.append(psutil.Process(parent.pid))
            while len(spawned[0].children()) < 1:
                pass
            spawned += spawned[0].children()
            raise SystemExit(15)
        _, alive = psutil.wait_procs(spawned, timeout=5)
        assert alive == [] and len(spawned) >= 2  # sh and its sleeps
        assert kept.poll() is None
        with stopping_what_it_started():  # a block that succeeds leaves its processes be
            survivor = subprocess.Popen(["sleep", "60"])
        assert survivor.poll() is None
        survivor.kill()
        survivor.wait()
    finally:
        kept.kill()
        kept.wait()


def test_a_failed_start_shuts_down_first_while_its_processes_live(caplog):
    """Ray's shutdown runs before the reaping (a driver whose GCS was killed under it crashed the
    process at exit); what it stopped is not counted again, and what outlived it is stopped."""
    import subprocess

    from tandem.cluster.runtime.reap import stopping_what_it_started

    children, seen_alive = [], []

    def shutdown():  # as ray.shutdown: stops the first process it started, not the second
        seen_alive.extend(child.poll() is None for child in children)
        children[0].kill()
        children[0].wait()

    with pytest.raises(KeyboardInterrupt), stopping_what_it_started(shutdown):
        children += [subprocess.Popen(["sleep", "60"]), subprocess.Popen(["sleep", "60"])]
        raise KeyboardInterrupt
    assert seen_alive == [True, True]
    assert children[1].wait(timeout=5) is not None  # stopped after the shutdown
    assert "stopping 1 processes a failed start left" in caplog.text


def test_ctrl_c_within_ray_start_is_held_until_the_start_ends():
    """A Ctrl-C inside ray.init's core-worker constructor left a driver that crashed the process
    at exit (SIGSEGV after `interrupted`); it is now raised once the block ends."""
    import os
    import signal

    from tandem.sigterm import deferring_ctrl_c

    before = signal.getsignal(signal.SIGINT)
    finished = []
    with pytest.raises(KeyboardInterrupt):
        with deferring_ctrl_c():
            os.kill(os.getpid(), signal.SIGINT)
            finished.append("the block ran to its end")
    assert finished and signal.getsignal(signal.SIGINT) is before
    with deferring_ctrl_c():  # no Ctrl-C: nothing raised
        pass
