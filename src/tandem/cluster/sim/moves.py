"""Which streams the router moves, as cluster/runtime/replica_choice.py `choose_moves` picks them,
over the simulator's replicas: for each replica with a free slot (fewest sequences first), the
decoding stream of a replica holding more sequences whose finish it brings forward most
(cluster/planning/affinity.py `move_gain_ms`), if any does. Steps are read off the replicas'
curves at the mean length of the streams each would hold, as the router reads them.

A move carries the stream's KV state (the launched replicas keep a host tier of their prompt
cache, which a move fills), so the router prices its refill as one token's step at the stream's
depth, and the simulator lets it decode on arrival. It leaves its replica at that replica's next
step boundary and reaches the target after the router's relay both ways (simulator.py).
"""

from tandem.cluster.planning.affinity import move_gain_ms, step_at_lengths
from tandem.cluster.sim.routing import has_room
from tandem.cluster.sim.state import Replica, SimSequence


def choose_moves(replicas: list[Replica]) -> list[tuple[SimSequence, Replica]]:
    moves: list[tuple[SimSequence, Replica]] = []
    taken: set[int] = set()
    for target in sorted((r for r in replicas if has_room(r)), key=lambda r: r.load):
        gains: dict[int, tuple[float, SimSequence]] = {}
        for source in replicas:
            if source is target or source.load <= target.load:
                continue
            stay_ms = step_at_lengths(source.spec.device.cost, [s.context for s in source.sequences])(source.load)
            for seq in source.running:
                if seq.moving_to is not None or id(seq) in taken or seq.unprefilled or seq.remaining <= 1:
                    continue
                held = [s.context for s in target.sequences] + [seq.context]
                move_ms = step_at_lengths(target.spec.device.cost, held)(target.load + 1)
                refill_ms = target.spec.device.cost.cost_ms(1, seq.context)
                gains[id(seq)] = (move_gain_ms(seq.remaining, refill_ms, stay_ms, move_ms), seq)
        best = max((g for g in gains.values() if g[0] > 0), default=None, key=lambda g: g[0])
        if best is not None:
            taken.add(id(best[1]))
            moves.append((best[1], target))
    return moves
