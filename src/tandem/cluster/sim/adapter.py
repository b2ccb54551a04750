"""`simulation_from_cluster`: a Simulation from a cluster file (cluster/config/load.py), either with the
roles as the file writes them or with a placement chosen by the planner (cluster/planning/planner.py).

Each replica of a worker is one device, named `worker/i`. Costs are the worker's profile for the
model in question (cluster/profiles/profile_store.py: listed files, else the public-spec roofline of its
hardware class, else the default profile path), priced at the file's `context_tokens` and
scaled by slowdown / (1 - utilization), as the planner prices them (and by `device_speed`, the
speed a measured run found its devices at; validation.py). Roles as written:
- `verify` replicas verify; `draft` replicas draft for them, dealt out in turn, same network
  group first; `both` replicas verify with their own `draft_model` beside them (one device);
- the file's `drafter`: `none` decodes plainly, the copy drafters use the free n-gram drafter,
  `model`/`hybrid`/`auto` use draft models where there are any; without any, `auto` copies
  n-grams and `model`/`hybrid` are an error (as `tandem serve --cluster` refuses them).
With a plan, plan_adapter.py follows the placement instead. k: the file's `k` fixes it, else
the engine's E/T planner chooses (`use_plan_k` takes the placement's k). Acceptance per token:
the options, else the file's `acceptance`, else the drafter table's (speculation/drafters/registry.py).
The router sits where cluster/runtime/launch.py puts it (the first drafting worker's group, else
"local"; `router_group` overrides): requests and streamed tokens pay the round trip between it
and their replica, a replica's draft calls the round trip to its drafter; as written, each
verifier replica holds launch.DEFAULT_SLOTS sequences unless `max_batch` says otherwise.
With `host_cores`, every CPU worker is taken to run on one machine with that many cores (a local
cluster, emulation included), each replica keeping its `threads` busy: overlapping calls there
slow each other down (timeline.py).
Unlike the running replicas, which spread each *sequence* over all drafters by a hash of its
id, the simulator gives each *replica* one drafter; with one drafter (or one per verifier) the two
agree.
"""

from dataclasses import dataclass, replace

from tandem.cluster.config.cluster_spec import ClusterSpec, WorkerSpec
from tandem.cluster.planning.acceptance import DEFAULT_ACCEPTANCE
from tandem.cluster.runtime.launch import DEFAULT_SLOTS, router_group
from tandem.cluster.planning.planner import Plan
from tandem.cluster.profiles.profile_store import worker_profile
from tandem.cluster.sim.acceptance import GeometricAcceptance
from tandem.cluster.sim.config import Device, Network, SimDepth, SimDrafter, Simulation, Verifier, Workload
from tandem.cluster.sim.from_profile import device_from_profile
from tandem.errors import TandemError
from tandem.speculation.batch_depth import STEP_OVERHEAD_MS
from tandem.speculation.drafters.registry import DRAFTERS

NGRAM = "ngram"
LOCAL_HOST = "local-cpu"  # with host_cores: the one machine every CPU worker runs on
MODEL_DRAFTERS = (*(name for name, spec in DRAFTERS.items() if spec.uses_model), "auto")


@dataclass(frozen=True, slots=True)
class SimOptions:
    acceptance: float | None = None  # per-token acceptance of draft models (hybrid too)
    ngram_acceptance: float | None = None
    max_batch: int | None = None  # None: the plan's batch per replica, or the launcher's slots
    router_group: str | None = None  # None: where cluster/runtime/launch.py puts it
    fused: bool | None = None  # None: as the backends batch today (llama.cpp and torch's fused runner: fused)
    use_plan_k: bool = False
    step_overhead_ms: float = STEP_OVERHEAD_MS  # per step, besides the calls (Ray, bookkeeping)
    host_cores: int | None = None  # the CPU workers share one machine with this many cores
    fixed_k: int | None = None  # every round drafts this many (over the file's k and the plan's)
    device_speed: float = 1.0  # every device's time times this (a measured run's, validation.run_speed)
    max_running: int | None = None  # the router's cap on requests in flight (None: the replicas' slots)
    seed: int = 0

    def __post_init__(self):
        for name in ("acceptance", "ngram_acceptance"):
            value = getattr(self, name)
            if value is not None and not 0.0 <= value < 1.0:
                raise ValueError(f"per-token {name.replace('_', ' ')} must be in [0, 1), got {value}")
        if not self.device_speed > 0:
            raise ValueError(f"device_speed must be > 0, got {self.device_speed}")



def simulation_from_cluster(spec: ClusterSpec, workload: Workload, options: SimOptions = SimOptions(),
                            plan: Plan | None = None) -> Simulation:
    if plan is not None:
        from tandem.cluster.sim.plan_adapter import simulation_from_plan

        return simulation_from_plan(spec, plan, workload, options)
    alpha = acceptance_of(spec, "hybrid" if spec.drafter == "hybrid" else "model", options)
    pool = [SimDrafter(f"{w.name}/{i}", GeometricAcceptance(alpha), cluster_device(spec, w, w.model, i, options))
            for w in spec.workers if w.role == "draft" for i in range(w.replicas)]
    choose = _DrafterChoice(spec, options, pool, alpha, ngram_drafter(spec, options))
    batch = options.max_batch or DEFAULT_SLOTS
    verifiers = []
    for worker in (w for w in spec.workers if w.can_verify):
        for i in range(worker.replicas):
            device = cluster_device(spec, worker, worker.model, i, options)
            drafter = choose(worker, i, device)
            verifiers.append(Verifier(device, drafter.name if drafter else None, batch))
    return assemble(spec, verifiers, choose.used(), workload, options, None)


class _DrafterChoice:
    """Picks each verifier replica's drafter (roles as written) and remembers those in use."""

    def __init__(self, spec: ClusterSpec, options: SimOptions, pool: list[SimDrafter], alpha: float, ngram: SimDrafter):
        self.spec, self.options, self.pool, self.alpha, self.ngram = spec, options, pool, alpha, ngram
        self.turn = 0
        self.chosen: dict[str, SimDrafter] = {}

    def __call__(self, worker: WorkerSpec, index: int, device: Device) -> SimDrafter | None:
        drafter = self._pick(worker, index, device)
        if drafter is not None:
            self.chosen.setdefault(drafter.name, drafter)
        return drafter

    def _pick(self, worker: WorkerSpec, index: int, device: Device) -> SimDrafter | None:
        kind = self.spec.drafter
        if kind == "none":
            return None
        if kind not in MODEL_DRAFTERS:
            return self.ngram
        if worker.role == "both":
            return colocated_drafter(self.spec, worker, index, device, self.alpha, self.options)
        if self.pool:
            near = sorted(self.pool, key=lambda d: d.device.group != worker.group)
            self.turn += 1
            return near[(self.turn - 1) % len(near)]
        if kind != "auto":  # a model drafter is never silently replaced (speculation/drafters/registry.py)
            raise TandemError(f"cluster: drafter {kind!r} needs a draft or both worker, and there is none "
                              "(drafter: auto copies from the context instead)")
        return self.ngram

    def used(self) -> list[SimDrafter]:
        """Every drafter a verifier uses, and idle draft workers too (their utilisation is 0)."""
        idle = [d for d in self.pool if d.name not in self.chosen and self.spec.drafter in MODEL_DRAFTERS]
        return list(self.chosen.values()) + idle


# -- pieces shared with plan_adapter.py ------------------------------------------------------------

def cluster_device(spec: ClusterSpec, worker: WorkerSpec, model: str, index: int, options: SimOptions) -> Device:
    fused = True if options.fused is None else options.fused
    slowdown = worker.slowdown / (1.0 - worker.utilization) * options.device_speed
    device = device_from_profile(f"{worker.name}/{index}", worker_profile(spec, worker, model),
                                 group=worker.group, context=spec.context_tokens, slowdown=slowdown, fused=fused)
    if options.host_cores is None or worker.device != "cpu":
        return device
    return replace(device, host=LOCAL_HOST, threads=min(worker.threads or options.host_cores, options.host_cores))


def colocated_drafter(spec: ClusterSpec, worker: WorkerSpec, index: int, device: Device, alpha: float,
                      options: SimOptions) -> SimDrafter:
    """A `both` replica's own draft model: the same device (name), another cost curve."""
    own = cluster_device(spec, worker, worker.draft_model, index, options)
    return SimDrafter(f"{device.name}:draft", GeometricAcceptance(alpha), own)


def acceptance_of(spec: ClusterSpec, kind: str, options: SimOptions) -> float:
    option = options.ngram_acceptance if kind == NGRAM else options.acceptance
    return next(a for a in (option, spec.acceptance.get(kind), DEFAULT_ACCEPTANCE.get(kind)) if a is not None)


def ngram_drafter(spec: ClusterSpec, options: SimOptions) -> SimDrafter:
    return SimDrafter(NGRAM, GeometricAcceptance(acceptance_of(spec, NGRAM, options)))


def assemble(spec: ClusterSpec, verifiers: list[Verifier], drafters: list[SimDrafter], workload: Workload,
             options: SimOptions, plan_k: int | None) -> Simulation:
    fixed_k = plan_k if options.use_plan_k and plan_k is not None else spec.k
    if options.fixed_k is not None:
        fixed_k = options.fixed_k
    network = Network(tuple((a, b, ms) for (a, b), ms in spec.network.latency_ms.items()))
    return Simulation(tuple(verifiers), workload, tuple(drafters), network, SimDepth(fixed_k=fixed_k),
                      router_group=options.router_group or router_group(spec),
                      step_overhead_ms=options.step_overhead_ms, max_running=options.max_running, seed=options.seed,
                      host_cores=() if options.host_cores is None else ((LOCAL_HOST, options.host_cores),))
