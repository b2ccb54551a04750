"""A Simulation of the placement a plan chose (cluster/planning/planner.py, placement.py).

Each Assignment (a verifier worker's replicas drafting from one source) becomes that many
verifier replicas, numbered per worker in order, each with at most the plan's batch (or the
options' max_batch). Their drafts come from
- `none`: nothing (plain decoding); `ngram`: the free n-gram drafter;
- `colocated`: the replica's own draft model, on its own device;
- a draft worker: the replicas of it the plan keeps busy (`placement.drafting`), dealt out in turn.
A hybrid plan is simulated as a draft model with the hybrid acceptance, drafting every token
(the planner prices only HYBRID_MODEL_SHARE of them on the model: a pessimistic reading).
"""

from tandem.cluster.config.cluster_spec import ClusterSpec
from tandem.cluster.planning.planner import Plan
from tandem.cluster.planning.prediction import IN_REPLICA
from tandem.cluster.sim.acceptance import GeometricAcceptance
from tandem.cluster.sim.adapter import (
    SimOptions,
    acceptance_of,
    assemble,
    cluster_device,
    colocated_drafter,
    ngram_drafter,
)
from tandem.cluster.sim.config import SimDrafter, Simulation, Verifier, Workload
from tandem.speculation.drafters.registry import drafter_spec


def simulation_from_plan(spec: ClusterSpec, plan: Plan, workload: Workload, options: SimOptions) -> Simulation:
    placement = plan.chosen
    kind = placement.drafter_kind
    alpha = acceptance_of(spec, kind if drafter_spec(kind).uses_model else "model", options)
    if options.acceptance is None and kind in plan.options.acceptance:
        alpha = plan.options.acceptance[kind]
    remote = {name: _drafters(spec, name, busy, placement.verifying.get(name, 0), alpha, options)
              for name, busy, _ in placement.drafting}
    ngram, turns, next_index = ngram_drafter(spec, options), dict.fromkeys(remote, 0), {}
    verifiers, used = [], {}
    for assignment in placement.assignments:
        worker = spec.worker(assignment.verifier)
        batch = options.max_batch or assignment.step.batch
        for _ in range(assignment.replicas):
            index = next_index.get(worker.name, 0)
            next_index[worker.name] = index + 1
            device = cluster_device(spec, worker, worker.model, index, options)
            where = assignment.drafter
            if where == "none":
                drafter = None
            elif where == IN_REPLICA:  # a copy drafter: the free n-gram drafter models it
                drafter = ngram
            elif where == "colocated":
                drafter = colocated_drafter(spec, worker, index, device, alpha, options)
            else:
                drafter = remote[where][turns[where] % len(remote[where])]
                turns[where] += 1
            if drafter is not None:
                used.setdefault(drafter.name, drafter)
            verifiers.append(Verifier(device, drafter.name if drafter else None, batch))
    return assemble(spec, verifiers, list(used.values()), workload, options, placement.k)


def _drafters(spec: ClusterSpec, name: str, busy: int, first: int, alpha: float,
              options: SimOptions) -> list[SimDrafter]:
    """The busy draft replicas of a worker, numbered after its verifying replicas (a `both`
    worker's replicas are split between the two roles)."""
    worker = spec.worker(name)
    return [SimDrafter(f"{name}/{i}", GeometricAcceptance(alpha),
                    cluster_device(spec, worker, worker.drafting_model, i, options))
            for i in range(first, first + busy)]
