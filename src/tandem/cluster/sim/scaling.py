"""The scaling sweep: one device mix at 1, 2, 4, ... devices, planned and then simulated.

At each size every worker keeps its share of the devices (largest remainder; at least one
device that can verify), network links to groups left empty are dropped, the planner chooses a
placement (cluster/planning/planner.py) and the simulator runs it at the planned load: closed-loop
clients, one per planned batch slot, `waves` requests each, with every verifier replica
stepping on its own behind the router (`independent`, the one mode left since the lock-step
coordinator went). Accelerators are simulated with fused batches by default: Tandem's torch runner
verifies a batch one sequence at a time today, which no 64-device deployment would keep.
"""

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass

from tandem.bench.workload import DEFAULT_WORKLOAD
from tandem.cluster.config.cluster_spec import ClusterSpec, NetworkSpec
from tandem.cluster.planning.planner import Plan, options_for, plan_cluster
from tandem.cluster.profiles.profile_store import cluster_profiles
from tandem.cluster.sim.adapter import SimOptions, simulation_from_cluster
from tandem.cluster.sim.config import Workload
from tandem.cluster.sim.lengths import FixedLength, LengthModel, workload_prompt_lengths
from tandem.cluster.sim.simulator import simulate
from tandem.errors import TandemError

SWEEP_SIZES = (1, 2, 4, 8, 16, 32, 64)
MODES = ("independent",)


@dataclass(frozen=True, slots=True)
class SweepOptions:
    sizes: tuple[int, ...] = SWEEP_SIZES
    waves: int = 3  # requests per planned batch slot
    output_tokens: int = 128
    prompt_tokens: LengthModel | None = None  # None: estimated from the default bench workload
    acceptance: float | None = None  # per-token, draft models
    fused: bool = True
    modes: tuple[str, ...] = MODES
    use_plan_k: bool = True  # False: the engine's E/T planner picks k (slower to simulate)
    seed: int = 0

    def __post_init__(self):
        if not self.sizes or min(self.sizes) < 1:
            raise TandemError(f"sweep sizes must be >= 1 device (got {self.sizes})")
        if self.waves < 1 or self.output_tokens < 1:
            raise TandemError("waves and output_tokens must be >= 1")
        unknown = [m for m in self.modes if m not in MODES]
        if unknown or not self.modes:
            raise TandemError(f"modes must be among {', '.join(MODES)} (got {self.modes})")


def apportion(weights: list[int], total: int) -> list[int]:
    """Split `total` in proportion to `weights` (largest remainder; ties to the first)."""
    whole = sum(weights)
    shares = [w * total / whole for w in weights]
    counts = [int(s) for s in shares]
    order = sorted(range(len(weights)), key=lambda i: (-(shares[i] - counts[i]), i))
    for i in order[: total - sum(counts)]:
        counts[i] += 1
    return counts


def scaled_spec(spec: ClusterSpec, devices: int) -> ClusterSpec:
    """The cluster with `devices` devices in its workers' proportions."""
    counts = apportion([w.replicas for w in spec.workers], devices)
    if not any(n and w.can_verify for n, w in zip(counts, spec.workers)):
        verifier = max((i for i, w in enumerate(spec.workers) if w.can_verify), key=lambda i: spec.workers[i].replicas)
        counts[max(range(len(counts)), key=lambda i: counts[i])] -= 1
        counts[verifier] += 1
    # mappings are handed back as plain dicts: the specs' rules reject their own read-only views
    workers = tuple(dataclasses.replace(w, replicas=n, resources=None if w.resources is None else dict(w.resources))
                    for w, n in zip(spec.workers, counts) if n)
    groups = {w.group for w in workers}
    latency = {pair: ms for pair, ms in spec.network.latency_ms.items() if set(pair) <= groups}
    names = {w.name for w in workers} | {w.hardware for w in workers if w.hardware}
    return dataclasses.replace(spec, workers=workers, network=NetworkSpec(latency), acceptance=dict(spec.acceptance),
                               profiles={k: v for k, v in spec.profiles.items() if k in names})


def check_sizes(spec: ClusterSpec, sizes: tuple[int, ...]) -> None:
    """Refuse, before any work, a size whose scaled cluster is no valid cluster (a worker past
    its replica bound), naming the size."""
    for devices in sizes:
        try:
            scaled_spec(spec, devices)
        except (TandemError, ValueError) as error:
            raise TandemError(f"--sizes {devices}: the cluster at that size is not one Tandem runs ({error})") from None


def sweep(spec: ClusterSpec, options: SweepOptions = SweepOptions(),
          said: Callable[[str], None] | None = None, on_row: Callable[[dict], None] | None = None) -> dict:
    """Rows of the sweep (one per size and mode) and what they rest on. `said` hears a line as
    each size starts (a large one simulates for minutes), `on_row` each row as it is done."""
    prompts = options.prompt_tokens or workload_prompt_lengths(DEFAULT_WORKLOAD)
    rows = []
    for devices in options.sizes:
        scaled = scaled_spec(spec, devices)
        plan = plan_cluster(scaled, cluster_profiles(scaled), _plan_options(scaled, options))
        for mode in options.modes:
            if said is not None:
                slots = _slots(plan)
                said(f"{devices} device{'s' if devices != 1 else ''}: {options.waves * slots} requests at "
                     f"concurrency {slots}, simulating ...")
            rows.append(_point(scaled, plan, devices, mode, prompts, options))
            if on_row is not None:
                on_row(rows[-1])
    profiles = cluster_profiles(spec)
    return {"cluster": spec.source, "rows": rows, "options": _describe(options, prompts),
            "profiles": {f"{w}:{m}": {"source": p.source, "hardware": p.hardware, "citation": p.citation}
                         for (w, m), p in profiles.items()}}


def _plan_options(spec: ClusterSpec, options: SweepOptions):
    acceptance = None if options.acceptance is None else {"model": options.acceptance, "hybrid": options.acceptance}
    return options_for(spec, acceptance=acceptance)


def _point(spec: ClusterSpec, plan: Plan, devices: int, mode: str, prompts: LengthModel, options: SweepOptions) -> dict:
    placement = plan.chosen
    slots = _slots(plan)
    workload = Workload(options.waves * slots, prompts, FixedLength(options.output_tokens), concurrency=slots)
    cluster_options = SimOptions(acceptance=options.acceptance, fused=options.fused,
                                 use_plan_k=options.use_plan_k, seed=options.seed)
    started = time.perf_counter()
    result = simulate(simulation_from_cluster(spec, workload, cluster_options, plan=plan))
    return {
        "devices": devices, "mode": mode, "workers": {w.name: w.replicas for w in spec.workers},
        "plan": {"drafter": placement.label(), "verifying": placement.verifying, "meets_target": plan.meets_target,
                 "predicted_tok_s": round(placement.tokens_per_s, 1)},
        "concurrency": slots, "requests": workload.num_requests,
        "throughput_tok_s": result.throughput_tok_s, "steady_tok_s": result.steady_tok_s,
        "latency_ms": result.latency_ms, "ttft_ms": result.ttft_ms,
        "itl_ms": result.itl_ms, "mean_k": result.mean_k, "acceptance": result.acceptance,
        "utilisation": _by_worker(result.utilisation), "wall_s": round(time.perf_counter() - started, 2),
    }


def _slots(plan: Plan) -> int:
    """The planned batch slots of every verifier: the sweep's concurrency."""
    return sum(a.replicas * a.step.batch for a in plan.chosen.assignments)


def _by_worker(utilisation: dict[str, float]) -> dict[str, float]:
    """Mean utilisation of each worker's devices (`worker/i` -> worker)."""
    groups: dict[str, list[float]] = {}
    for name, u in utilisation.items():
        groups.setdefault(name.split("/")[0], []).append(u)
    return {name: round(sum(us) / len(us), 3) for name, us in groups.items()}


def _describe(options: SweepOptions, prompts: LengthModel) -> dict:
    return {"sizes": list(options.sizes), "waves": options.waves, "output_tokens": options.output_tokens,
            "prompt_tokens": "estimated from the default bench workload" if options.prompt_tokens is None
            else repr(prompts), "acceptance": options.acceptance, "fused": options.fused,
            "modes": list(options.modes), "k": "plan" if options.use_plan_k else "engine E/T planner",
            "seed": options.seed}
