"""Where a new sequence goes: the verifier replica, among those with a free batch slot, where
one more stream adds the most requests per second (cluster/planning/stream_rate.py), as
cluster/runtime/coordinator.py places it: its prompt's prefill and its output's decode steps,
shared with the n sequences the replica holds (running, or admitted and about to prefill). A
fast fused device takes sequences until its batch is large before a slow one gets any; on
compute-bound curves an idle replica gets a stream before a busy one gets another. When every
replica is full the sequence waits in the cluster's queue and is placed as soon as a slot frees.
Near-ties go to the cheapest step, then the replica listed first.
"""

from tandem.cluster.planning.stream_rate import option, pick
from tandem.cluster.sim.state import Replica, SimSequence


def has_room(replica: Replica) -> bool:
    return replica.load < replica.spec.max_batch


def route(replicas: list[Replica], seq: SimSequence) -> Replica | None:
    """The replica to take seq now; None when every batch is full."""
    free = [r for r in replicas if has_room(r)]
    options = []
    for replica in free:
        device = replica.spec.device
        options.append(option(device.forward_ms([seq.prompt_tokens - 1]), lambda n, d=device: d.forward_ms([1] * n),
                              replica.load, seq.remaining))
    chosen = pick(options)
    return None if chosen is None else free[chosen]
