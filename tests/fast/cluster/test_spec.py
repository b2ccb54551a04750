"""Cluster files: the examples parse, and every kind of mistake names its line and field."""

import textwrap
from pathlib import Path

import pytest

from tandem.cluster.config.load import ClusterSpec, NetworkSpec, WorkerSpec, load_cluster
from tandem.errors import TandemError

EXAMPLES = Path(__file__).parents[3] / "examples" / "clusters"

VERIFY = """\
  - name: verify
    role: verify
    model: qwen2.5-coder-1.5b-instruct
"""


def write(tmp_path, text: str) -> Path:
    path = tmp_path / "cluster.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def error_of(tmp_path, text: str) -> str:
    path = write(tmp_path, text)
    with pytest.raises(TandemError) as caught:
        load_cluster(path)
    message = str(caught.value)
    assert message.startswith(f"{path}:"), message
    return message[len(str(path)) + 1:]


def test_local_example_parses():
    spec = load_cluster(EXAMPLES / "local-2cpu.yaml")
    draft, verify = spec.workers
    assert (draft.role, draft.threads, draft.resources) == ("draft", 1, {"CPU": 1})
    assert (verify.role, verify.replicas, verify.threads) == ("verify", 2, 1)
    assert spec.latency_target_ms == 400 and spec.drafter == "auto" and spec.k is None


def test_cross_region_example_has_the_round_trip():
    spec = load_cluster(EXAMPLES / "cross-region.yaml")
    assert spec.network.rtt_ms("edge", "central") == 12
    assert spec.network.rtt_ms("central", "edge") == 12
    assert spec.network.rtt_ms("edge", "edge") == 0
    assert spec.worker("edge-draft").slowdown == 2.0


def test_hetero_example_has_64_devices_in_three_classes():
    spec = load_cluster(EXAMPLES / "hetero-64.yaml")
    assert sum(w.replicas for w in spec.workers) == 64
    kinds = {w.device.split(":")[0] for w in spec.workers}
    assert kinds == {"cuda", "npu", "cpu"}
    ascend = spec.worker("ascend")
    assert ascend.can_verify and ascend.can_draft and ascend.drafting_model == "qwen2.5-coder-0.5b-instruct"
    assert ascend.ray_resources == {"CPU": 4, "npu": 1}


def test_defaults_and_derived_resources(tmp_path):
    spec = load_cluster(write(tmp_path, "workers:\n" + VERIFY + """\
  - name: npu-box
    role: verify
    model: qwen2.5-coder-1.5b-instruct
    backend: torch
    device: npu:1
    threads: 2
"""))
    verify, npu = spec.workers
    assert (verify.backend, verify.device, verify.group, verify.replicas, verify.slowdown) == \
        ("llamacpp", "cpu", "local", 1, 1.0)
    assert verify.ray_resources == {"CPU": 1.0}
    assert npu.ray_resources == {"CPU": 2.0, "npu": 1.0}


def test_profiles_paths_are_relative_to_the_file(tmp_path):
    spec = load_cluster(write(tmp_path, "workers:\n" + VERIFY + "profiles:\n  verify: [a.json, sub/b.json]\n"))
    assert spec.profiles["verify"] == (str(tmp_path / "a.json"), str(tmp_path / "sub" / "b.json"))


@pytest.mark.parametrize("text, expected", [
    ("workers:\n" + VERIFY.replace("role: verify", "role: verfy"),
     "3: workers[0].role: must be one of draft, verify, both (got 'verfy') (did you mean 'verify'?)"),
    ("workers:\n" + VERIFY + "    treads: 2\n",
     "5: workers[0]: unknown key 'treads' (did you mean 'threads'?)"),
    ("workers:\n  - name: verify\n    role: verify\n",
     "2: workers[0]: missing required key 'model'"),
    ("workers:\n" + VERIFY + "    threads: two\n",
     "5: workers[0].threads: must be an integer (got 'two')"),
    ("workers:\n" + VERIFY + "    slowdown: 0.5\n",
     "5: workers[0].slowdown: must be >= 1.0 (got 0.5)"),
    ("workers:\n" + VERIFY + "    utilization: 1.0\n",
     "5: workers[0].utilization: must be < 1.0 (got 1.0)"),
    ("workers:\n" + VERIFY + "    replicas: 0\n",
     "5: workers[0].replicas: must be >= 1 (got 0)"),
    ("workers:\n" + VERIFY + "    device: gpu:0\n",
     "5: workers[0].device: must be a device like cpu, cuda:0, npu:0, mps, xpu:0 (got 'gpu:0') (did you mean 'xpu'?)"),
    ("workers:\n" + VERIFY + "    device: cuda:0\n",
     "5: workers[0].device: the llamacpp backend runs on cpu (got 'cuda:0'); use backend torch"),
    ("workers:\n" + VERIFY.replace("role: verify", "role: both"),
     "2: workers[0].draft_model: a worker with role both needs a draft_model"),
    ("workers:\n" + VERIFY + "    resources: {CPU: -1}\n",
     "5: workers[0].resources: key 'CPU': must be >= 0 (got -1)"),
    ("workers:\n" + VERIFY + "    resources: {cpu: 1}\n",
     "5: workers[0].resources: Ray's resource names are case-sensitive: 'cpu' would be a custom resource "
     "no node has (did you mean 'CPU'?)"),
    ("workers:\n" + VERIFY + "    dtype: bf16\n",
     "5: workers[0].dtype: the llamacpp backend computes in the GGUF file's own types (got 'bf16')"),
    ("workers:\n" + VERIFY + VERIFY,
     "5: workers[1].name: worker name 'verify' is used twice"),
    ("workers:\n  - name: d\n    role: draft\n    model: qwen2.5-coder-0.5b-instruct\n",
     "2: workers: at least one worker must have role verify or both"),
    ("workers: []\n", "1: workers: at least one worker is needed"),
    ("workers:\n" + VERIFY + VERIFY.replace("name: verify", "name: other").replace("1.5b", "0.5b"),
     "7: workers[1].model: verifier 'other' holds 'qwen2.5-coder-0.5b-instruct', verifier 'verify' "
     "'qwen2.5-coder-1.5b-instruct': every verifier holds the one model"),
    ("workers:\n" + VERIFY + "drafter: modle\n",
     "5: drafter: must be one of auto, none, ngram, suffix, model, hybrid (got 'modle') (did you mean 'model'?)"),
    ("workers:\n" + VERIFY + "k: 99\n", "5: k: must be <= 64 (got 99)"),
    ("workers:\n" + VERIFY + "acceptance: {model: 1.5}\n",
     "5: acceptance: key 'model': must be < 1.0 (got 1.5)"),
    ("workers:\n" + VERIFY + "worker: {}\n",
     "5: unknown key 'worker' (did you mean 'workers'?)"),
    ("workers:\n" + VERIFY + "profiles:\n  verfy: p.json\n",
     "6: profiles.verfy: names no worker or hardware class (did you mean 'verify'?)"),
    ("workers:\n" + VERIFY + "    role: draft\n", "5: workers[0]: duplicate key 'role'"),
    ("workers:\n" + VERIFY + "  - name: edge\n    role: draft\n    model: m\n    group: edge\n",
     "8: workers[1].group: no round trip between groups local and edge"),
    ("workers:\n" + VERIFY + "network:\n  latency_ms: {\"local<->egde\": 5}\n",
     "6: network.latency_ms.local<->egde: no worker is in group 'egde'"),
    ("workers:\n" + VERIFY + "network:\n  latency_ms: {\"local-edge\": 5}\n",
     "6: network.latency_ms.local-edge: must be a group pair like 'edge<->central' (got 'local-edge')"),
    ("workers:\n" + VERIFY + "network:\n  latency_ms: {\"a<->a\": 5}\n",
     "6: network.latency_ms.a<->a: a round trip needs two different groups"),
    ("workers:\n" + VERIFY + "    cache_ram: lots\n",
     "5: workers[0].cache_ram: cannot read a memory size from 'lots'; write it like 512M, 2G or 1.5T"),
    ("workers:\n" + VERIFY + "  - name: d\n    role: draft\n    model: m\n    cache_ram: 1G\n",
     "8: workers[1].cache_ram: sizes a verifier replica's prompt cache; a draft worker has none"),
    ("workers:\n  - name: [\n", "3: not valid YAML"),
    ("workers: {name: x}\n", "1: workers: must be a list (got a mapping)"),
])
def test_errors_name_line_and_field(tmp_path, text, expected):
    assert error_of(tmp_path, text).startswith(expected)


def test_empty_and_missing_files(tmp_path):
    assert error_of(tmp_path, "") == "1: the file is empty"
    with pytest.raises(TandemError, match="cannot read cluster file"):
        load_cluster(tmp_path / "absent.yaml")


def test_dataclasses_run_the_same_rules():
    with pytest.raises(TandemError, match="worker 'w': role: must be one of draft, verify, both"):
        WorkerSpec("w", "verfy", "m")
    with pytest.raises(TandemError, match="worker 'w': draft_model: only a worker with role both"):
        WorkerSpec("w", "verify", "m", draft_model="d")
    edge = WorkerSpec("e", "draft", "m", group="edge")
    with pytest.raises(TandemError, match="at least one worker must have role verify"):
        ClusterSpec((edge,))
    with pytest.raises(TandemError, match="no round trip between groups local and edge"):
        ClusterSpec((WorkerSpec("v", "verify", "m"), edge))
    spec = ClusterSpec((WorkerSpec("v", "verify", "m"), edge), NetworkSpec({("local", "edge"): 7.0}))
    assert spec.network.rtt_ms("edge", "local") == 7.0
