"""Where a conversation's next turn goes, and when a stream moves: the router's two rules on
top of the cost rule (cluster/planning/stream_placement.py).

- **Prefix affinity.** The router remembers what each replica served lately (`PrefixMemory`:
  prompts and outputs, a block-hash index, the oldest forgotten first past PREFIX_MEMORY sequences
  or PREFIX_MEMORY_TOKENS tokens). A
  request goes to the replica holding at least AFFINITY_SHARE of its prompt beyond what the
  cost rule's choice holds (a conversation's history, a long shared system prompt; not a chat
  template's few tokens, which every replica soon holds and which would pull every request to
  one replica), unless serving it there is expected to cost more: its prefill of what each
  replica lacks plus its decode at each replica's step with it (`prefer_prefix`), each read at
  the contexts the replica would then hold.
- **Moves.** A replica holding fewer streams than another (idle, or at a run's tail) takes the
  stream whose finish it brings forward most: what it must compute first there (its whole
  history, or nothing but a restore where its KV state travels with it) plus its remaining
  tokens at its step with one stream more, MOVE_MARGIN times, against its remaining tokens at
  its own replica's step (`move_gain_ms`).
"""

from collections import OrderedDict
from collections.abc import Callable, Sequence

from tandem.engine.prefix_index import BLOCK, PrefixIndex
from tandem.models.cost import CostModel

PREFIX_MEMORY = 256  # token sequences remembered per replica
PREFIX_MEMORY_TOKENS = 1 << 20  # and their tokens at most (a few long histories weigh as much as many chats)
AFFINITY_SHARE = 0.5  # of the prompt a replica must hold (beyond the cost rule's choice) to draw it
MOVE_MARGIN = 1.25  # a stream moves only where it is expected to finish this many times sooner

CostMs = Callable[[int], float]  # a replica's forward over n tokens


class PrefixMemory:
    def __init__(self):
        self.index: PrefixIndex[str] = PrefixIndex()
        self.order: OrderedDict[str, None] = OrderedDict()
        self.num_tokens = 0

    def add(self, key: str, tokens: Sequence[int]) -> None:
        if key in self.order:
            self._forget(key)
        self.order[key] = None
        self.index.add(key, tokens)
        self.num_tokens += len(tokens)
        while len(self.order) > PREFIX_MEMORY or (self.num_tokens > PREFIX_MEMORY_TOKENS and len(self.order) > 1):
            self._forget(next(iter(self.order)))

    def _forget(self, key: str) -> None:
        del self.order[key]
        self.num_tokens -= len(self.index.tokens[key])
        self.index.remove(key)

    def longest(self, tokens: Sequence[int]) -> int:
        """Tokens of the longest remembered prefix of `tokens` (0 under one block)."""
        match = self.index.longest(tokens)
        return 0 if match is None else match[1]


def prefer_prefix(chosen: int, held: list[int], streams: list[int], prefill_ms: list[float],
                  step_costs: list[CostMs], tokens: int, room: int) -> int | None:
    """The candidate holding the longest prefix, where it holds AFFINITY_SHARE of the prompt
    more than `chosen` (the cost rule's pick) and is expected to serve it no dearer: each
    candidate's prefill of what it lacks (`prefill_ms`), then `room` steps of its batch with the
    new stream (`step_costs`, read at the contexts it would hold); else None."""
    best = max(range(len(held)), key=lambda i: (held[i], -i))
    if best == chosen or held[best] < BLOCK or held[best] - held[chosen] < AFFINITY_SHARE * tokens:
        return None

    def expected_ms(i: int) -> float:
        return prefill_ms[i] + room * step_costs[i](streams[i] + 1)

    return best if expected_ms(best) <= expected_ms(chosen) else None


def step_at_lengths(cost: CostModel, lengths: Sequence[int]) -> CostMs:
    """A replica's call over n tokens, read at the mean of `lengths` (the streams it would hold),
    as its engine reads a step (`BatchDepthPlanner.plan`'s context)."""
    context = sum(lengths) / len(lengths) if lengths else 0.0
    return lambda n: cost.cost_ms(n, context)


def move_gain_ms(room: int, refill_ms: float, stay_step_ms: float, move_step_ms: float) -> float:
    """How much sooner a stream with `room` tokens to go is expected to finish where it would
    first compute `refill_ms` and then step at `move_step_ms`, than where it steps at
    `stay_step_ms` (<= 0: stay)."""
    return room * stay_step_ms - (refill_ms + room * move_step_ms) * MOVE_MARGIN
