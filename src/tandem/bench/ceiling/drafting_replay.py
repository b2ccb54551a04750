"""Tandem's drafting, replayed: the engine's own copy drafting and depth planner run on a recorded
answer, each target call priced on the curves the copy ceiling is priced on (bench/ceiling/oracle.py).

The target is a double that emits the answer's next token wherever the cache agrees with the
prompt and the answer so far (teacher forcing: a greedy run that produced this answer would have
emitted the same), so the engine (engine/batch_engine.py) drafts, plans and verifies as it
would, one request at a time, and every call's tokens and cached length are recorded. The
drafter is the default one's copy part (the hybrid drafter without its model: a draft model's
proposals cannot be replayed without it). Priced like the ceiling, its rate separates what
drafting leaves on the table (replayed / ceiling: which copies are drafted, how deep) from what
the runtime costs beyond the curve (measured / replayed: step overheads, drafting time, a draft
model's rounds where it drafted). Measured in process on the AMD EPYC VM, a real engine's step
took 45.5 ms where its target call was priced at 44.7 (extraction and agent prompts, C=1), so
the replay's prices are what a step costs there.
"""

from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import numpy as np

from tandem.bench.ceiling.oracle import ContextCurves, CostMs
from tandem.bench.ceiling.report import CURVE_SIZES
from tandem.engine.batch_engine import BatchEngine
from tandem.engine.step_budget import THROUGHPUT_PREFILL_FLOOR
from tandem.engine.events import StepReport
from tandem.engine.request import GenerationRequest
from tandem.errors import TandemError
from tandem.models.batch_runner import BatchItem
from tandem.models.cost import CostModel
from tandem.speculation.drafters.hybrid import HYBRID_NGRAM, HybridDrafter
from tandem.speculation.drafters.ngram import NgramDrafter
from tandem.speculation.drafters.suffix import SuffixDrafter
from tandem.speculation.shared_store.store import open_ngram_store
from tandem.token_ids import common_prefix


class FrozenCostModel(CostModel):
    """A cost curve that ignores observations: the replay's calls take microseconds, and the
    planner must keep reading the curve the rounds are priced on."""

    def observe(self, num_tokens: int, elapsed_ms: float, context: float | None = None) -> None:
        pass


def replay_pricing(curves: Mapping[int, CostModel]) -> tuple[CostMs, FrozenCostModel]:
    """From verify curves by context (bench-ceiling's): the price of n tokens on c cached ones
    (between the curves, oracle.ContextCurves), and the planner's curve read off it at the lowest
    and highest context."""
    cost_ms = ContextCurves({context: curve.cost_ms for context, curve in curves.items()}).cost_ms
    return cost_ms, planner_curve(cost_ms, CURVE_SIZES, min(curves), max(curves))


def planner_curve(cost_ms: CostMs, sizes: Sequence[int], base_context: int, deep_context: int) -> FrozenCostModel:
    """The planner's curve, read off the pricing at two contexts (the engine's profile holds a
    short and a deep curve the same way, models/cost.py)."""
    return FrozenCostModel({n: cost_ms(n, base_context) for n in sizes},
                           deep_ms={n: cost_ms(n, deep_context) for n in sizes},
                           base_context=base_context, deep_context=deep_context)


@dataclass
class AnswerTarget:
    """A one-slot BatchRunner double emitting `expected[i + 1]` after `expected[:i + 1]` (the
    prompt and the recorded answer); `calls` records each call's (tokens scored, tokens cached
    before them)."""

    cost: CostModel
    vocab_size: int
    context_length: int
    name: str = "answer-replay"
    max_slots: int = 1
    fused: bool = True
    can_copy_prefix: bool = False
    expected: list[int] = field(default_factory=list)
    cache: list[int] = field(default_factory=list)
    calls: list[tuple[int, int]] = field(default_factory=list)

    def num_cached_tokens(self, slot: int) -> int:
        return len(self.cache)

    def forward_batch(self, items: Sequence[BatchItem], views: bool = False) -> list[np.ndarray]:
        out = []
        for item in items:
            before = len(self.cache)
            self.cache.extend(item.token_ids)
            self.calls.append((len(item.token_ids), before))
            agree = common_prefix(self.cache, self.expected)
            logits = np.zeros((item.num_logits, self.vocab_size), np.float32)  # [num_logits, vocab]
            for row, position in enumerate(range(len(self.cache) - item.num_logits, len(self.cache))):
                # after cache[:position + 1]: the answer's next token where the cache agrees with it
                known = position < agree and position + 1 < len(self.expected)
                logits[row, self.expected[position + 1] if known else 0] = 1.0
            out.append(logits)
        return out

    def rollback(self, slot: int, length: int) -> None:
        del self.cache[length:]

    def copy_prefix(self, source: int, destination: int, length: int) -> None:
        raise NotImplementedError("one slot: nothing to copy from")


class DraftingReplay:
    """One engine replaying a run's answers in order, as the server met them: what the planner
    learned of each copy source, the shared n-gram store and the suffix index of earlier
    answers carry on from one answer to the next, as in `tandem serve`'s engine."""

    def __init__(self, cost_ms: CostMs, planner_cost: CostModel, context_length: int = 32768):
        self.cost_ms = cost_ms
        self.target = AnswerTarget(planner_cost, 0, context_length)
        store = open_ngram_store(None)  # `tandem serve`'s default: in process
        suffix = SuffixDrafter()  # registered apart too, so finished answers join its shared index
        drafters = {"hybrid": HybridDrafter(None, NgramDrafter(*HYBRID_NGRAM, store=store), suffix), "suffix": suffix}
        self.engine = BatchEngine(self.target, None, "hybrid", ngram_store=store, drafters=drafters, max_running=1,
                                  prefill_floor=THROUGHPUT_PREFILL_FLOOR)
        # the planner would learn each step's bookkeeping from this machine's clock, which makes
        # the plans (and the priced figures) vary from run to run: it keeps the default instead
        self.engine.planner.learns_overhead = False
        self.answers = 0

    def replay_ms(self, prompt: Sequence[int], answer: Sequence[int],
                  on_step: Callable[[int, StepReport | None], object] | None = None) -> float:
        """Priced time of the answer's decode (every call after the prompt's prefill; the
        answer's first token comes from the prefill, as in the ceiling) with Tandem's copy
        drafting. `on_step(emitted, report)`, if given, sees each step's report with the answer
        tokens emitted before that step (a study of the rounds, scripts/declined_drafts.py)."""
        if not answer:
            return 0.0
        expected = list(prompt) + list(answer)
        if len(expected) >= self.target.context_length:
            raise TandemError(f"an answer of {len(expected)} tokens with its prompt is past the replay's context")
        self.target.expected = expected
        self.target.vocab_size = max(self.target.vocab_size, max(expected) + 1)
        self.target.calls.clear()
        self.answers += 1
        self.engine.add(f"replay-{self.answers}", GenerationRequest(tuple(prompt), max_tokens=len(answer)))
        emitted: list[int] = []
        while self.engine.has_work:
            before = len(emitted)
            updates, report = self.engine.step()
            for update in updates:
                emitted.extend(update.token_ids)
            if on_step is not None:
                on_step(before, report)
        if emitted != list(answer):
            raise TandemError(f"the replay emitted {len(emitted)} tokens that differ from the {len(answer)} recorded")
        return sum(self.cost_ms(n, before) for n, before in self.target.calls if before >= len(prompt))
