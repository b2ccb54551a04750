"""What a cluster file describes, as frozen dataclasses: workers, the network between their
groups, where their profiles are, and the planner's defaults. `spec.load_cluster` builds these
from YAML with line-numbered errors; building them by hand runs the same field rules.

Terms: a *worker* is a pool of `replicas` identical model instances, each needing `resources`
from Ray. Its `role` says what it may do: `verify` (hold the target model), `draft` (hold a
draft model and propose tokens for verifiers) or `both` (hold the target `model` and a
`draft_model`: it may verify with its own drafter beside it, or draft for others). A *group* is
a network location; two workers in different groups pay the listed round trip per call.
"""

import re
from dataclasses import MISSING, dataclass, field
from types import MappingProxyType
from typing import Any, Mapping

from tandem.cluster.config import rules
from tandem.errors import TandemError
from tandem.speculation.depth import K_LIMIT
from tandem.speculation.drafters.registry import DRAFTER_NAMES, DRAFTERS

ROLES = ("draft", "verify", "both")
BACKENDS = ("llamacpp", "torch")
DTYPES = ("fp32", "bf16", "fp16")
DEVICE_KINDS = ("cpu", "cuda", "npu", "mps", "xpu", "hpu", "mlu", "musa")
ACCEPTANCE_SOURCES = tuple(name for name, spec in DRAFTERS.items() if spec.drafts)  # acceptance given per drafter
DEFAULT_CONTEXT_TOKENS = 512  # context the planner prices steps at
NAME = r"[A-Za-z0-9][A-Za-z0-9_.-]*"
_DEVICE = re.compile(r"([a-z]+)(?::(\d+))?")


def device_rule(value: object) -> str:
    """`cpu`, `mps`, or an accelerator kind with an optional index: `cuda`, `cuda:1`, `npu:0`."""
    match = _DEVICE.fullmatch(value) if isinstance(value, str) else None
    if not match or match.group(1) not in DEVICE_KINDS:
        kind = match.group(1) if match else str(value)
        raise rules.RuleError(f"must be a device like cpu, cuda:0, npu:0, mps, xpu:0 (got {value!r})"
                              f"{rules.did_you_mean(kind, DEVICE_KINDS)}")
    if match.group(2) is not None and match.group(1) in ("cpu", "mps"):
        raise rules.RuleError(f"{match.group(1)} takes no device index (got {value!r})")
    return value


def cache_ram_rule(value: object) -> int:
    """A replica's prompt-cache host tier: '2G', '512M', a plain number of MiB (as `--cache-ram`),
    or 0 for none; bytes."""
    from tandem.engine.host_cache import parse_cache_ram

    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise rules.RuleError(f"must be a size like 2G or 512M, or 0 (got {value!r})")
    try:
        return parse_cache_ram(str(value))
    except TandemError as error:
        raise rules.RuleError(str(error)) from None


def device_kind(device: str) -> str:
    """'cuda:1' -> 'cuda'."""
    return device.split(":", 1)[0]


RAY_BUILTIN_RESOURCES = {name.lower(): name for name in ("CPU", "GPU", "memory", "object_store_memory")}
MAX_THREADS = 4096  # bounds that catch a typo (an extra digit) before a planner or Ray meets it
MAX_REPLICAS = 4096
MAX_CONTEXT_TOKENS = 1 << 24

WORKER_RULES: Mapping[str, rules.Rule] = MappingProxyType({
    "name": rules.text(NAME, "a name of letters, digits, '_', '.', '-'"),
    "role": rules.one_of(*ROLES),
    "model": rules.text(),
    "draft_model": rules.optional(rules.text()),
    "backend": rules.one_of(*BACKENDS),
    "device": device_rule,
    "dtype": rules.one_of(*DTYPES),
    "threads": rules.optional(rules.integer(minimum=1, maximum=MAX_THREADS)),
    "replicas": rules.integer(minimum=1, maximum=MAX_REPLICAS),
    "resources": rules.optional(rules.mapping_of(rules.text(NAME, "a resource name"), rules.number(minimum=0))),
    "hardware": rules.optional(rules.text(NAME, "a device class name")),
    "slowdown": rules.number(minimum=1.0),
    "utilization": rules.number(minimum=0.0, below=1.0),
    "group": rules.text(NAME, "a group name of letters, digits, '_', '.', '-'"),
    "cache_ram": rules.optional(cache_ram_rule),
})


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    name: str
    role: str  # draft | verify | both
    model: str  # verify/both: the target model; draft: the draft model
    draft_model: str | None = None  # both only: the draft model it holds beside the target
    backend: str = "llamacpp"
    device: str = "cpu"
    dtype: str = "fp32"
    threads: int | None = None  # CPU threads per replica (None: all)
    replicas: int = 1
    resources: Mapping[str, float] | None = None  # Ray resources per replica (None: derived)
    hardware: str | None = None  # device class: public-spec profiles and `profiles:` keys
    slowdown: float = 1.0  # emulation: each call takes slowdown x its measured time
    utilization: float = 0.0  # share of the device busy with other work
    group: str = "local"  # network group
    cache_ram: int | None = None  # bytes of each replica's prompt-cache host tier (None: a share of the default)

    def __post_init__(self):
        for name, rule in WORKER_RULES.items():
            try:
                object.__setattr__(self, name, rule(getattr(self, name)))
            except rules.RuleError as error:
                raise TandemError(f"worker {self.name!r}: {name}: {error}") from None
        for name, message in worker_problems(_values(self)):
            raise TandemError(f"worker {self.name!r}: {name}: {message}")
        if self.resources is not None:
            object.__setattr__(self, "resources", MappingProxyType(dict(self.resources)))

    @property
    def can_verify(self) -> bool:
        return self.role in ("verify", "both")

    @property
    def can_draft(self) -> bool:
        return self.role in ("draft", "both")

    @property
    def drafting_model(self) -> str | None:
        """The model it drafts with (None: it cannot draft)."""
        return self.model if self.role == "draft" else self.draft_model

    @property
    def ray_resources(self) -> dict[str, float]:
        """Per replica: as written, or one CPU per thread plus the accelerator it names."""
        if self.resources is not None:
            return dict(self.resources)
        derived = {"CPU": float(self.threads or 1)}
        kind = device_kind(self.device)
        if kind == "cuda":
            derived["GPU"] = 1.0
        elif kind not in ("cpu", "mps"):
            derived[kind] = 1.0  # a custom Ray resource: Ray does not know npu, xpu, ...
        return derived


def defaults(cls: type) -> dict[str, Any]:
    """A dataclass's field defaults (factories called)."""
    return {name: f.default_factory() if f.default_factory is not MISSING else f.default
            for name, f in cls.__dataclass_fields__.items()
            if f.default is not MISSING or f.default_factory is not MISSING}


def _values(instance: object) -> dict[str, Any]:
    return {name: getattr(instance, name) for name in type(instance).__dataclass_fields__}


def worker_problems(worker: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Checks across a worker's fields (given as a mapping of values), as (field, message)."""
    problems = []
    role, draft_model = worker["role"], worker["draft_model"]
    if role == "both" and draft_model is None:
        problems.append(("draft_model", "a worker with role both needs a draft_model"))
    if role != "both" and draft_model is not None:
        problems.append(("draft_model", f"only a worker with role both has a draft_model (role is {role})"))
    if role == "draft" and worker.get("cache_ram") is not None:
        problems.append(("cache_ram", "sizes a verifier replica's prompt cache; a draft worker has none"))
    if worker["backend"] == "llamacpp" and worker["device"] != "cpu":
        problems.append(("device", f"the llamacpp backend runs on cpu (got {worker['device']!r}); use backend torch"))
    if worker["backend"] == "llamacpp" and worker["dtype"] != "fp32":
        problems.append(("dtype", f"the llamacpp backend computes in the GGUF file's own types (got "
                                  f"{worker['dtype']!r}); dtype is torch's: leave it out"))
    for name in worker.get("resources") or {}:
        builtin = RAY_BUILTIN_RESOURCES.get(name.lower())
        if builtin is not None and name != builtin:
            problems.append(("resources", f"Ray's resource names are case-sensitive: {name!r} would be a "
                                          f"custom resource no node has (did you mean {builtin!r}?)"))
    return problems


@dataclass(frozen=True, slots=True)
class NetworkSpec:
    """Round-trip times between groups: keys are sorted (group, group) pairs; same group = 0."""

    latency_ms: Mapping[tuple[str, str], float] = field(default_factory=dict)

    def __post_init__(self):
        for pair, ms in self.latency_ms.items():
            if len(pair) != 2 or pair[0] == pair[1] or ms < 0:
                raise TandemError(f"network: latency between {pair} must be >= 0 between two groups")
        object.__setattr__(self, "latency_ms", MappingProxyType({tuple(sorted(p)): float(ms)
                                                                 for p, ms in self.latency_ms.items()}))

    def rtt_ms(self, a: str, b: str) -> float:
        if a == b:
            return 0.0
        pair = tuple(sorted((a, b)))
        if pair not in self.latency_ms:
            raise TandemError(f"network: no latency_ms between groups {a} and {b}")
        return self.latency_ms[pair]


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    workers: tuple[WorkerSpec, ...]
    network: NetworkSpec = field(default_factory=NetworkSpec)
    profiles: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # worker or hardware -> files
    drafter: str = "auto"  # auto, or fix the planner's drafter kind
    k: int | None = None  # None: the planner chooses
    latency_target_ms: float | None = None  # per generated token, at the planned load
    context_tokens: int = DEFAULT_CONTEXT_TOKENS
    acceptance: Mapping[str, float] = field(default_factory=dict)  # model/ngram/hybrid overrides
    source: str | None = None  # the file it came from

    def __post_init__(self):
        for path, message in cluster_problems(_values(self)):
            raise TandemError(f"cluster: {format_path(path)}: {message}")
        object.__setattr__(self, "workers", tuple(self.workers))
        object.__setattr__(self, "profiles", MappingProxyType({k: tuple(v) for k, v in self.profiles.items()}))
        object.__setattr__(self, "acceptance", MappingProxyType(dict(self.acceptance)))

    def worker(self, name: str) -> WorkerSpec:
        for worker in self.workers:
            if worker.name == name:
                return worker
        raise TandemError(f"no worker named {name!r}{rules.did_you_mean(name, [w.name for w in self.workers])}")

    @property
    def groups(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(w.group for w in self.workers))

    @property
    def has_draft_model(self) -> bool:
        """Whether some worker holds a draft model (drafters that need one can run)."""
        return any(w.can_draft and w.drafting_model for w in self.workers)


TOP_RULES: Mapping[str, rules.Rule] = MappingProxyType({
    "drafter": rules.one_of("auto", *DRAFTER_NAMES),
    "k": rules.optional(rules.integer(minimum=0, maximum=K_LIMIT)),
    "latency_target_ms": rules.optional(rules.number(minimum=0.001)),
    "context_tokens": rules.integer(minimum=1, maximum=MAX_CONTEXT_TOKENS),
    "acceptance": rules.mapping_of(rules.one_of(*ACCEPTANCE_SOURCES), rules.number(minimum=0.0, below=1.0)),
})


Path = tuple[str | int, ...]  # ("workers", 2, "group"): where a problem is, for messages and lines


def format_path(path: Path) -> str:
    """("workers", 2, "group") -> "workers[2].group"."""
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else part)
    return text


def cluster_problems(spec: Mapping[str, Any]) -> list[tuple[Path, str]]:
    """Checks across workers (the cluster's fields given as a mapping of values), as
    (path, message)."""
    problems: list[tuple[Path, str]] = []
    for name, rule in TOP_RULES.items():
        try:
            rule(spec[name])
        except rules.RuleError as error:
            problems.append(((name,), str(error)))
    workers = spec["workers"]
    if not workers:
        problems.append((("workers",), "at least one worker is needed"))
    seen: set[str] = set()
    for i, worker in enumerate(workers):
        if worker.name in seen:
            problems.append((("workers", i, "name"), f"worker name {worker.name!r} is used twice"))
        seen.add(worker.name)
    if workers and not any(w.can_verify for w in workers):
        problems.append((("workers",), "at least one worker must have role verify or both"))
    verifiers = [(i, w) for i, w in enumerate(workers) if w.can_verify]
    for i, worker in verifiers[1:]:  # one served model: the router moves a stream between replicas
        if worker.model != verifiers[0][1].model:
            problems.append((("workers", i, "model"), f"verifier {worker.name!r} holds {worker.model!r}, verifier "
                             f"{verifiers[0][1].name!r} {verifiers[0][1].model!r}: every verifier holds the one "
                             "model the cluster serves (a stream moves between them)"))
    return problems + _network_problems(spec) + _profile_problems(spec)


def _network_problems(spec: Mapping[str, Any]) -> list[tuple[Path, str]]:
    problems: list[tuple[Path, str]] = []
    workers, latency = spec["workers"], spec["network"].latency_ms
    groups = list(dict.fromkeys(w.group for w in workers))
    for pair in latency:
        for group in pair:
            if group not in groups:
                problems.append((("network", "latency_ms", f"{pair[0]}<->{pair[1]}"),
                                 f"no worker is in group {group!r}{rules.did_you_mean(group, groups)}"))
    firsts = {}
    for i, worker in enumerate(workers):
        firsts.setdefault(worker.group, i)
    for i, a in enumerate(groups):
        for b in groups[i + 1:]:
            if tuple(sorted((a, b))) not in latency:
                hint = f"add \"{a}<->{b}\": MS under network.latency_ms"
                problems.append((("workers", firsts[b], "group"), f"no round trip between groups {a} and {b}: {hint}"))
    return problems


def _profile_problems(spec: Mapping[str, Any]) -> list[tuple[Path, str]]:
    known = [w.name for w in spec["workers"]] + [w.hardware for w in spec["workers"] if w.hardware]
    return [(("profiles", key), f"names no worker or hardware class{rules.did_you_mean(key, known)}")
            for key in spec["profiles"] if key not in known]
