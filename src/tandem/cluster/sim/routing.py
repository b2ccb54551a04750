"""Where a new sequence goes, as the router (cluster/runtime/router.py) places it: among the replicas
with a free batch slot, the one with the least expected completion time, unless a replica would
otherwise idle and one stream there is worth more (cluster/planning/stream_placement.py).

A replica holding n sequences (running, or admitted and about to prefill) runs them all in one
batch once it takes one more, so its expected completion is its profiled step cost for a batch
of n + 1: a fast fused device takes sequences until its batch is full before a slow one gets
any; on compute-bound curves sequences spread until their steps cost the same, and an idle
replica gets a stream where one stream there serves more requests per second than one more
adds to the cheapest. When every replica is full the sequence waits in the cluster's queue and
is placed as soon as a slot frees. Ties go to the replica listed first. (The router's prefix
affinity is not modelled; its moves are, in moves.py.)
"""

from tandem.cluster.planning.stream_placement import Candidate, choose
from tandem.cluster.sim.state import Replica, SimSequence


def has_room(replica: Replica) -> bool:
    return replica.load < replica.spec.max_batch


def candidate(replica: Replica, seq: SimSequence) -> Candidate:
    device = replica.spec.device
    return Candidate(replica.load, device.forward_ms([seq.prompt_tokens - 1]), lambda n: device.forward_ms([1] * n))


def route(replicas: list[Replica], seq: SimSequence) -> Replica | None:
    """The replica to take seq now; None when every batch is full."""
    free = [r for r in replicas if has_room(r)]
    chosen = choose([candidate(r, seq) for r in free], seq.remaining)
    return None if chosen is None else free[chosen]
