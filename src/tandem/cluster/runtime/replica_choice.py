"""The router's two choices over its live replicas (cluster/runtime/router.py), the rules
themselves being cluster/planning/stream_placement.py (cost) and affinity.py (prefix, moves):
where a request goes, and which streams move to a replica that idles.
"""

from collections.abc import Callable, Iterable

from tandem.cluster.planning.affinity import AFFINITY_SHARE, PrefixMemory, move_gain_ms, prefer_prefix
from tandem.cluster.planning.stream_placement import Candidate, choose
from tandem.cluster.runtime.pool import Worker
from tandem.cluster.runtime.routed import Routed
from tandem.engine.prefix_index import BLOCK


def choose_replica(verifiers: list[Worker], routed: Routed,
                   prefixes: dict[str, PrefixMemory]) -> tuple[Worker | None, str]:
    """The live replica with a free slot for `routed` and why (cost | prefix, or the failover
    or move label it carries); None where every replica is full or down."""
    live = [w for w in verifiers if w.alive and len(w.sequences) < w.max_slots]
    if not live:
        return None, ""
    tokens = routed.tokens
    costs = [cost_at(w, len(tokens)) for w in live]
    chosen = choose([Candidate(len(w.sequences), cost(len(tokens)), cost) for w, cost in zip(live, costs)],
                    routed.room)
    held = [prefixes[w.name].longest(tokens) for w in live]
    better = prefer_prefix(chosen, held, [len(w.sequences) for w in live], costs, len(tokens), routed.room)
    if routed.reason != "cost":  # a failover or a move keeps its label wherever it goes
        return live[chosen if better is None else better], routed.reason
    if better is not None:
        return live[better], "prefix"
    return live[chosen], "prefix" if held[chosen] >= max(BLOCK, AFFINITY_SHARE * len(tokens)) else "cost"


def choose_moves(verifiers: list[Worker], streams: Iterable[Routed]) -> list[tuple[Routed, Worker]]:
    """For each live replica with a free slot, fewest streams first, the stream (not already
    moving) of a replica holding more streams whose finish it brings forward most, if any does:
    an idle replica takes work from a busy one, and at a run's tail a fast replica that is down
    to one stream takes one of the two a slow one still holds. A replica never takes from one
    holding as few as it does, so streams do not move back and forth."""
    streams, moves = list(streams), []
    taken: set[int] = set()
    targets = sorted((w for w in verifiers if w.alive and len(w.sequences) < w.max_slots), key=lambda w: len(w.sequences))
    for target in targets:
        held = len(target.sequences)
        gains = {id(r): move_gain_ms(r.room, refill_tokens(r, target), len(r.replica.sequences),
                                     cost_at(r.replica, len(r.tokens)), cost_at(target, len(r.tokens)), held)
                 for r in streams if not r.moving and id(r) not in taken and r.replica not in (None, target)
                 and r.room > 1 and len(r.replica.sequences) > held}
        best = max((r for r in streams if gains.get(id(r), 0.0) > 0), default=None, key=lambda r: gains[id(r)])
        if best is not None:
            taken.add(id(best))
            moves.append((best, target))
    return moves


def cost_at(worker: Worker, context: int) -> Callable[[int], float]:
    """The replica's cost of one call over n tokens, read at `context` cached tokens (a stream's
    history): its short and deep curves travel with its news, so a long conversation is priced
    where it runs, not on the short curve (replicas of one device scale alike; a GPU and a CPU
    need not)."""
    cost = worker.cost.cost
    return lambda n: cost.cost_ms(n, context)


def refill_tokens(routed: Routed, target: Worker) -> int:
    """What a move makes the target compute before decoding: nothing where the KV state travels
    (one token's step stands for its restore), else the whole history."""
    return 1 if routed.replica.carries_state and target.carries_state else len(routed.tokens)
