"""The router's two choices over its live replicas (cluster/runtime/router.py), the rules
themselves being cluster/planning/stream_placement.py (cost) and affinity.py (prefix, moves):
where a request goes, and which streams move to a replica that idles.

Every price is read off the replica's own curves (short and deep, they travel with its news) at
the context the call would run on: a decode step at the mean length of the streams the replica
would then hold, as its engine reads its step (`BatchDepthPlanner.plan`'s context); a prompt's
prefill from an empty cache for the cost rule, and for the prefix rule on what the replica holds
of it. So a replica busy with long conversations
is priced as dear as it is, and a long conversation goes where depth is cheap (a GPU beside a
CPU).
"""

from collections.abc import Callable, Iterable

from tandem.cluster.planning.affinity import AFFINITY_SHARE, PrefixMemory, move_gain_ms, prefer_prefix, step_at_lengths
from tandem.cluster.planning.stream_placement import Candidate, choose
from tandem.cluster.runtime.pool import Worker
from tandem.cluster.runtime.routed import Routed
from tandem.engine.prefix_index import BLOCK


def choose_replica(verifiers: list[Worker], routed: Routed, prefixes: dict[str, PrefixMemory],
                   streams: Iterable[Routed]) -> tuple[Worker | None, str]:
    """The live replica with a free slot for `routed` and why (cost | prefix, or the failover
    or move label it carries); None where every replica is full or down. `streams`: those
    placed so far, whose lengths price each replica's step."""
    live = [w for w in verifiers if w.alive and len(w.sequences) < w.max_slots]
    if not live:
        return None, ""
    length = routed.num_tokens
    held_lengths = lengths_by_replica(streams)
    steps = [step_cost(w, held_lengths.get(w.name, []) + [length]) for w in live]
    chosen = choose([Candidate(len(w.sequences), prefill_ms(w, length, 0), step) for w, step in zip(live, steps)],
                    routed.room)
    affinity, mark = routed.affinity_tokens, routed.num_affinity_marks
    held_prefix = [max(0, prefixes[w.name].longest(affinity) - mark) for w in live]
    better = prefer_prefix(chosen, held_prefix, [len(w.sequences) for w in live],
                           [prefill_ms(w, length - h, h) for w, h in zip(live, held_prefix)], steps, length,
                           routed.room)
    if routed.reason != "cost":  # a failover or a move keeps its label wherever it goes
        return live[chosen if better is None else better], routed.reason
    if better is not None:
        return live[better], "prefix"
    return live[chosen], "prefix" if held_prefix[chosen] >= max(BLOCK, AFFINITY_SHARE * length) else "cost"


def choose_moves(verifiers: list[Worker], streams: Iterable[Routed]) -> list[tuple[Routed, Worker]]:
    """For each live replica with a free slot, fewest streams first, the stream (not already
    moving) of a replica holding more streams whose finish it brings forward most, if any does:
    an idle replica takes work from a busy one, and at a run's tail a fast replica that is down
    to one stream takes one of the two a slow one still holds. A replica never takes from one
    holding as few as it does, so streams do not move back and forth."""
    streams, moves = list(streams), []
    held_lengths = lengths_by_replica(streams)
    taken: set[int] = set()
    targets = sorted((w for w in verifiers if w.alive and len(w.sequences) < w.max_slots), key=lambda w: len(w.sequences))
    for target in targets:
        target_streams = len(target.sequences)
        gains = {}
        for r in streams:
            if r.moving or id(r) in taken or r.replica in (None, target) or r.room <= 1:
                continue
            if len(r.replica.sequences) <= target_streams:
                continue
            stay_ms = step_cost(r.replica, held_lengths[r.replica.name])(len(r.replica.sequences))
            move_ms = step_cost(target, held_lengths.get(target.name, []) + [r.num_tokens])(target_streams + 1)
            gains[id(r)] = move_gain_ms(r.room, refill_ms(r, target), stay_ms, move_ms)
        best = max((r for r in streams if gains.get(id(r), 0.0) > 0), default=None, key=lambda r: gains[id(r)])
        if best is not None:
            taken.add(id(best))
            moves.append((best, target))
    return moves


def lengths_by_replica(streams: Iterable[Routed]) -> dict[str, list[int]]:
    """Each replica's streams' lengths (prompt and output so far), by replica name: those placed
    there, and those moving there (each holds a slot of its target already, as it is counted in
    the target's sequences)."""
    lengths: dict[str, list[int]] = {}
    for r in streams:
        for replica in (r.replica, r.moving[0] if r.moving else None):
            if replica is not None:
                lengths.setdefault(replica.name, []).append(r.num_tokens)
    return lengths


def step_cost(worker: Worker, lengths: list[int]) -> Callable[[int], float]:
    """The replica's call over n tokens, read at the mean of `lengths` (the streams it would
    hold), as its engine reads a step."""
    return step_at_lengths(worker.cost.cost, lengths)


def prefill_ms(worker: Worker, new_tokens: int, cached: int) -> float:
    """The replica's forward over a prompt's `new_tokens` on the `cached` it already holds."""
    return worker.cost.cost.cost_ms(max(1, new_tokens), cached)


def refill_ms(routed: Routed, target: Worker) -> float:
    """What a move makes the target compute before decoding: nothing where the KV state travels
    (one token's step at the stream's depth stands for its restore), else the whole history (a
    salted stream's state never travels: replica.py)."""
    if routed.request.cache_salt is None and routed.replica.carries_state and target.carries_state:
        return target.cost.cost.cost_ms(1, routed.num_tokens)
    return prefill_ms(target, routed.num_tokens, 0)
