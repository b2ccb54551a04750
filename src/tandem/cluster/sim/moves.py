"""Which streams the router moves, as cluster/runtime/replica_choice.py `choose_moves` picks them,
over the simulator's replicas: for each replica with a free slot (fewest sequences first), the
decoding stream of a replica holding more sequences whose finish it brings forward most
(cluster/planning/affinity.py `move_gain_ms`, over the tokens it may still take as the router
knows them: `SimSequence.room`), if any does. Steps are read off the replicas'
curves at the mean length of the streams each would hold, as the router reads them.

A move carries the stream's KV state (the launched replicas keep a host tier of their prompt
cache, which a move fills), so the router prices its refill as one token's step at the stream's
depth, and the simulator lets it decode on arrival. It leaves its replica at that replica's next
step boundary and reaches the target after the router's relay both ways (simulator.py).

A scaling sweep holds up to 64 replicas of dozens of streams, so a source none of whose streams
could gain is passed over whole (`_hopeless`): a stream gains only where its replica's step
costs more than MOVE_MARGIN times the target's step with it, and that step, monotone in the
context (models/cost.py reads it linearly between two curves), is cheapest at one end of the
contexts the source's streams would give it.
"""

from tandem.cluster.planning.affinity import MOVE_MARGIN, move_gain_ms, step_at_lengths
from tandem.cluster.sim.routing import has_room
from tandem.cluster.sim.state import Replica, SimSequence


def choose_moves(replicas: list[Replica]) -> list[tuple[SimSequence, Replica]]:
    moves: list[tuple[SimSequence, Replica]] = []
    taken: set[int] = set()
    stay_ms = {id(r): step_at_lengths(r.spec.device.cost, [s.context for s in r.sequences])(r.load) for r in replicas}
    for target in sorted((r for r in replicas if has_room(r)), key=lambda r: r.load):
        cost = target.spec.device.cost
        held_tokens, move_streams = sum(s.context for s in target.sequences), target.load + 1
        gains: dict[int, tuple[float, SimSequence]] = {}
        for source in replicas:
            if source is target or source.load <= target.load or not source.running:
                continue
            stay = stay_ms[id(source)]
            if _hopeless(source, stay, cost, held_tokens, move_streams):
                continue
            for seq in source.running:
                if seq.moving_to is not None or id(seq) in taken or seq.unprefilled or seq.room <= 1:
                    continue
                move_context = (held_tokens + seq.context) / move_streams  # as step_at_lengths reads it
                move_ms = cost.cost_ms(move_streams, move_context)
                refill_ms = cost.cost_ms(1, seq.context)
                gains[id(seq)] = (move_gain_ms(seq.room, refill_ms, stay, move_ms), seq)
        best = max((g for g in gains.values() if g[0] > 0), default=None, key=lambda g: g[0])
        if best is not None:
            taken.add(id(best[1]))
            moves.append((best[1], target))
    return moves


def _hopeless(source: Replica, stay_ms: float, cost, held_tokens: int, move_streams: int) -> bool:
    """No stream of `source` can gain on the target: its step with any of them (read at its
    cheaper end of their contexts) costs at least stay_ms / MOVE_MARGIN."""
    contexts = [s.context for s in source.running]
    cheapest = min(cost.cost_ms(move_streams, (held_tokens + c) / move_streams) for c in (min(contexts), max(contexts)))
    return stay_ms <= MOVE_MARGIN * cheapest
