"""Where a new sequence goes, as the router (cluster/runtime/router.py) places it: among the replicas
with a free batch slot, the one with the least expected completion time, unless a replica would
otherwise idle and one stream there is worth more (cluster/planning/stream_placement.py); then,
as the router's prefix affinity (cluster/planning/affinity.py), the replica holding at least
AFFINITY_SHARE of its prompt more than that one (a conversation's history, a long shared
opening) where serving it there is expected to cost no more.

A replica holding n sequences (running, or admitted and about to prefill) runs them all in one
batch once it takes one more, so its expected completion is its profiled step cost for a batch
of n + 1: a fast fused device takes sequences until its batch is full before a slow one gets
any; on compute-bound curves sequences spread until their steps cost the same, and an idle
replica gets a stream where one stream there serves more requests per second than one more
adds to the cheapest. When every replica is full the sequence waits in the cluster's queue and
is placed as soon as a slot frees. Ties go to the replica listed first. The router remembers
the token ids it sent each replica; here a replica's `histories` and `prefixes_held` (what its
prompt cache holds, step.py) stand in for that memory. Like the router, it weighs a request by
the tokens it may still take (`SimSequence.room`, the request's max_tokens), not by where its
answer will stop. Its moves are in moves.py.
"""

from tandem.cluster.planning.affinity import AFFINITY_SHARE, prefer_prefix
from tandem.cluster.planning.stream_placement import Candidate, choose
from tandem.cluster.sim.state import Replica, SimSequence
from tandem.engine.prefix_index import BLOCK


def has_room(replica: Replica) -> bool:
    return replica.load < replica.spec.max_batch


def candidate(replica: Replica, seq: SimSequence) -> Candidate:
    device = replica.spec.device
    return Candidate(replica.load, device.forward_ms([seq.prompt_tokens - 1]), lambda n: device.forward_ms([1] * n))


def held_prefix(replica: Replica, seq: SimSequence) -> int:
    """Prompt tokens of seq the replica holds: its conversation's history, or its shared opening."""
    history = replica.histories.get(seq.conversation, 0) if seq.conversation is not None else 0
    opening = seq.prefix[1] if seq.prefix is not None and seq.prefix[0] in replica.prefixes_held else 0
    return min(max(history, opening), seq.prompt_tokens - 1)


def route(replicas: list[Replica], seq: SimSequence) -> tuple[Replica, str] | None:
    """The replica to take seq now and why (cost | prefix, as the router labels it); None when
    every batch is full."""
    free = [r for r in replicas if has_room(r)]
    chosen = choose([candidate(r, seq) for r in free], seq.room)
    if chosen is None:
        return None
    held = [held_prefix(r, seq) for r in free]
    lacking_ms = [r.spec.device.forward_ms([max(1, seq.prompt_tokens - 1 - h)]) for r, h in zip(free, held)]
    steps = [lambda n, device=r.spec.device: device.forward_ms([1] * n) for r in free]
    better = prefer_prefix(chosen, held, [r.load for r in free], lacking_ms, steps, seq.prompt_tokens, seq.room)
    if better is not None:
        return free[better], "prefix"
    return free[chosen], "prefix" if held[chosen] >= max(BLOCK, AFFINITY_SHARE * seq.prompt_tokens) else "cost"
