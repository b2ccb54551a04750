"""Where a new sequence goes: the verifier replica with the least expected completion time,
among those with a free batch slot.

A replica holding n sequences (running, or admitted and about to prefill) runs them all in one
batch once it takes one more, so its expected completion is its profiled step cost for a batch
of n + 1, as cluster/runtime/coordinator.py scores it: a fast fused device takes sequences until
its batch is full before a slow one gets any; on compute-bound curves sequences spread until
their steps cost the same. When every replica is full the sequence waits in the cluster's queue
and is placed as soon as a slot frees. Ties go to the replica listed first.
"""

from tandem.cluster.sim.state import Replica


def has_room(replica: Replica) -> bool:
    return replica.load < replica.spec.max_batch


def expected_completion_ms(replica: Replica) -> float:
    """As the coordinator scores it: the cost of a step of n + 1 sequences."""
    return replica.spec.device.forward_ms([1] * (replica.load + 1))


def route(replicas: list[Replica]) -> Replica | None:
    """The replica to take a new sequence now; None when every batch is full."""
    return min((r for r in replicas if has_room(r)), key=lambda r: (expected_completion_ms(r), r.index), default=None)
