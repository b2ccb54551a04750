"""Load a cluster file: `load_cluster(path) -> ClusterSpec`, every error naming line and field.

Schema (docs/cluster.md has the full description and examples/clusters/ has samples):

    workers:                          # required, at least one verify or both
      - name: verify                  # required, unique
        role: verify                  # required: draft | verify | both
        model: qwen2.5-coder-1.5b-instruct   # required: catalog name, .gguf file or HF folder
        draft_model: NAME             # role both only, required there: its draft model
        backend: llamacpp             # llamacpp (cpu) | torch          default llamacpp
        device: cpu                   # cpu | cuda[:N] | npu[:N] | mps | xpu[:N] | ...  default cpu
        dtype: fp32                   # fp32 | bf16 | fp16 (torch)      default fp32
        threads: 1                    # CPU threads per replica         default all
        replicas: 2                   # identical instances             default 1
        resources: {CPU: 1, npu: 1}   # Ray resources per replica       default derived
        hardware: h100-sxm            # device class (public-spec profiles, profiles: keys)
        slowdown: 1.0                 # >= 1, emulation: slowdown x measured time
        utilization: 0.0              # [0, 1): share of the device busy with other work
        group: local                  # network group                   default local
        cache_ram: 2G                 # verify/both: each replica's prompt-cache host tier; 0: none
    network:
      latency_ms: {"edge<->central": 12}   # round trip between two groups; same group = 0
    profiles:                         # worker name or hardware class -> profile file(s)
      verify: profiles/verify.json    # relative to the cluster file
    drafter: auto                     # auto | none | ngram | suffix | model | hybrid
    k: null                           # null (planner chooses) | 0..64
    latency_target_ms: 50             # per generated token at the planned load
    context_tokens: 512               # context length steps are priced at
    acceptance: {model: 0.6}          # overrides of the planner's acceptance assumptions

Errors read `FILE:LINE: workers[2].role: must be one of draft, verify, both (got 'verfy')`.
"""

from pathlib import Path

from tandem.cluster.config import rules
from tandem.cluster.config.cluster_spec import (
    TOP_RULES,
    WORKER_RULES,
    ClusterSpec,
    NetworkSpec,
    WorkerSpec,
    cluster_problems,
    defaults,
    worker_problems,
)
from tandem.cluster.config.yaml_nodes import Located, compose_file
from tandem.errors import TandemError

__all__ = ["ClusterSpec", "NetworkSpec", "WorkerSpec", "load_cluster"]

TOP_KEYS = ("workers", "network", "profiles", *TOP_RULES)
WORKER_REQUIRED = ("name", "role", "model")
NETWORK_KEYS = ("latency_ms",)
_PAIR = rules.text(r"[A-Za-z0-9][A-Za-z0-9_.-]*<->[A-Za-z0-9][A-Za-z0-9_.-]*", "a group pair like 'edge<->central'")
_PROFILE_FILES = rules.either(rules.text(), lambda v: [rules.text()(x) for x in _as_list(v)],
                              "a file path or a list of file paths")


def load_cluster(path: str | Path) -> ClusterSpec:
    root = compose_file(path)
    top = root.mapping(TOP_KEYS, required=("workers",))
    items = top["workers"].sequence()
    if not items:
        raise top["workers"].error("at least one worker is needed")
    kwargs = {name: top[name].read(rule) for name, rule in TOP_RULES.items() if name in top}
    kwargs.update(
        workers=tuple(_worker(item) for item in items),
        network=_network(top["network"]) if "network" in top else NetworkSpec(),
        profiles=_profiles(top["profiles"], Path(path).parent) if "profiles" in top else {},
        source=str(path),
    )
    for problem_path, message in cluster_problems({**defaults(ClusterSpec), **kwargs}):
        raise _locate(root, problem_path).error(message)
    return ClusterSpec(**kwargs)


def located_error(spec: ClusterSpec, path: tuple, message: str) -> TandemError:
    """`message` at the line of `path` (("workers", 2, "model")) in the file `spec` was loaded
    from, for a problem found after loading (a model that cannot be found); unlocated where the
    spec was built by hand or its file is gone."""
    try:
        return _locate(compose_file(spec.source), path).error(message)
    except (TandemError, OSError, TypeError):
        return TandemError(message)


def _worker(item: Located) -> WorkerSpec:
    fields = item.mapping(tuple(WORKER_RULES), required=WORKER_REQUIRED)
    kwargs = {name: node.read(WORKER_RULES[name]) for name, node in fields.items()}
    for name, message in worker_problems({**defaults(WorkerSpec), **kwargs}):
        raise fields[name].error(message) if name in fields else item.child_error(name, message)
    return WorkerSpec(**kwargs)


def _network(node: Located) -> NetworkSpec:
    fields = node.mapping(NETWORK_KEYS)
    latency: dict[tuple[str, str], float] = {}
    if "latency_ms" in fields:
        for key, value in fields["latency_ms"].free_mapping().items():
            pair = _group_pair(value, key)
            if pair in latency:
                raise value.error(f"the pair {pair[0]}<->{pair[1]} is given twice")
            latency[pair] = value.read(rules.number(minimum=0.0))
    return NetworkSpec(latency)


def _group_pair(value: Located, key: str) -> tuple[str, str]:
    """'edge<->central' -> ('central', 'edge')."""
    try:
        a, b = _PAIR(key).split("<->")
    except rules.RuleError as error:
        raise value.error(str(error)) from None
    if a == b:
        raise value.error("a round trip needs two different groups; inside one group it costs 0")
    return (a, b) if a < b else (b, a)


def _profiles(node: Located, base: Path) -> dict[str, tuple[str, ...]]:
    files = {}
    for key, value in node.free_mapping().items():
        paths = value.read(_PROFILE_FILES)
        files[key] = tuple(str((base / p).resolve()) for p in _as_list(paths))
    return files


def _as_list(value) -> list:
    if isinstance(value, list):
        return value
    if isinstance(value, str):
        return [value]
    raise rules.RuleError(f"must be a list (got {value!r})")


def _locate(root: Located, path: tuple) -> Located:
    """The deepest node along `path` (a missing key stops at its parent)."""
    node = root
    for part in path:
        try:
            children = node.sequence() if isinstance(part, int) else node.free_mapping()
        except TandemError:
            break
        if isinstance(part, str) and part not in children and "<->" in part:
            part = "<->".join(reversed(part.split("<->")))  # group pairs are stored sorted
        if isinstance(part, int) and part >= len(children) or isinstance(part, str) and part not in children:
            break
        node = children[part]
    return node
