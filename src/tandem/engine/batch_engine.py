"""Continuous batching with speculation, on token ids: the one engine behind `tandem generate`
(one sequence), `tandem bench` and `tandem serve`.

Requests join and leave the running batch at every step. A step
1. admits waiting requests into free slots (reusing cached prompt prefixes); their uncached
   prompt tokens are scored in step 4's forward, beside the other sequences' drafts (one call),
2. plans: each running sequence's drafter offers what it could draft, and the load-aware
   planner chooses every k at once (engine/stages.py; k = 0 is plain decoding),
3. drafts: n-gram copies are free, the draft model runs in lock-step over its sequences,
4. verifies every sequence's [last committed token] + drafts in ONE target call,
5. per sequence: acceptance rule, stops, rollback of its own slot to its committed tokens.
Each sequence keeps its own rng, acceptance and cache, so a request's greedy output does not
depend on what else is running (fused llama.cpp batches can still differ on near-ties: measured
in the tests and docs/design.md).
"""

import time

from tandem.engine.events import SequenceUpdate, StepReport
from tandem.engine.sequence import Sequence
from tandem.engine.sequence_pool import SequencePool
from tandem.engine.slots import SlotTable
from tandem.engine.stages import commit_round, draft_all, plan_drafts
from tandem.models.batch_runner import BatchItem, BatchRunner
from tandem.speculation.acceptance import accept_round
from tandem.speculation.batch_depth import BatchDepthPlanner
from tandem.speculation.depth import Auto, Depth, parse_depth
from tandem.speculation.drafters.base import Drafter, SequenceDraft
from tandem.speculation.drafters.lockstep import LocalDraftModel
from tandem.speculation.drafters.registry import build_drafters

PREFILL_TOKEN_BUDGET = 2048  # prompt tokens admitted per step (at least one request always)
KV_HEADROOM_TOKENS = 64  # per running sequence, for drafts being verified


class BatchEngine(SequencePool):
    def __init__(self, target: BatchRunner, draft: BatchRunner | None = None, drafter: str = "hybrid",
                 depth: "Depth | str | int" = Auto(), ngram_store=None, max_running: int | None = None,
                 drafters: dict[str, Drafter] | None = None):
        self.draft_model = LocalDraftModel(draft) if draft is not None else None
        super().__init__(drafters or build_drafters(self.draft_model, ngram_store), ngram_store)
        self.target = target
        self.draft = draft
        self.default_drafter = drafter
        self.default_depth = parse_depth(depth)
        self.max_running = min(max_running or target.max_slots, target.max_slots)
        self.context_length = target.context_length
        self.planner = BatchDepthPlanner(target, draft)
        self.slots = SlotTable(target.max_slots)
        self.retained_draft: dict[int, list[int]] = {}  # draft cache of each free slot

    # -- the worker's interface (the rest is SequencePool's) --------------------------------

    def clear_caches(self) -> None:
        """Forget every retained prompt cache (a benchmark starts each prompt cold)."""
        for slot, owner in enumerate(self.slots.owner):
            if owner is None:
                self._forget(slot)

    def step(self) -> tuple[list[SequenceUpdate], StepReport]:
        started_at, start = time.time(), time.perf_counter()
        prefilled, prefill_seconds = self._admit()
        updates, rounds, draft_seconds, verify_seconds, batch_tokens, draft_forwards = [], [], 0.0, 0.0, 0, 0
        if self.running:
            seqs = list(self.running.values())
            drafts, draft_seconds, draft_forwards = self._draft(seqs)
            verify_start = time.perf_counter()
            logits = self._verify(seqs, drafts)
            verify_seconds = time.perf_counter() - verify_start
            batch_tokens = sum(len(d.token_ids) + 1 for d in drafts)
            for seq, draft, seq_logits in zip(seqs, drafts, logits):
                update, report = self._commit(seq, draft, seq_logits)
                updates.append(update)
                rounds.append(report)
        step_seconds = time.perf_counter() - start
        self.planner.observe_overhead((step_seconds - prefill_seconds - draft_seconds - verify_seconds) * 1000)
        report = StepReport(started_at, step_seconds, prefill_seconds, draft_seconds, verify_seconds,
                            len(self.running), len(self.waiting), batch_tokens, tuple(rounds), tuple(prefilled),
                            draft_forwards=draft_forwards)
        return updates, report

    # -- 1. admission and prefill -----------------------------------------------------------

    def _admit(self) -> tuple[list[str], float]:
        """Place waiting requests; their prefill happens in this step's verify call."""
        admitted, budget = [], PREFILL_TOKEN_BUDGET
        while self.waiting and len(self.running) < self.max_running and self.slots.num_free:
            seq = self.waiting[0]
            prefix = seq.tokens[:-1]
            if admitted and len(prefix) > budget:
                break
            if not self._make_room(len(prefix)):
                break
            self.waiting.popleft()
            self._place(seq, prefix)
            budget -= len(seq.unprefilled)
            admitted.append(seq.seq_id)
        return admitted, 0.0

    def _place(self, seq: Sequence, prefix: list[int]) -> None:
        """Give seq a slot holding as much of its prompt as is cached; the rest is unprefilled."""
        choice = self.slots.choose(prefix, self.target.can_copy_prefix)
        seq.slot = choice.slot
        if choice.copy_from is not None:
            self.target.copy_prefix(choice.copy_from, choice.slot, choice.reuse_tokens)
        else:
            self.target.rollback(choice.slot, choice.reuse_tokens)
        seq.draft_cached = self.retained_draft.get(choice.slot, [])
        self.slots.owner[choice.slot] = seq.seq_id
        self.slots.cached[choice.slot] = prefix[: choice.reuse_tokens]  # until prefilled
        self.running[seq.seq_id] = seq
        seq.unprefilled = tuple(prefix[choice.reuse_tokens:])

    def _make_room(self, new_tokens: int) -> bool:
        """Keep the KV pool from overflowing: drop retained caches of free slots if needed."""
        pool = getattr(self.target, "pool_tokens", None)
        if pool is None:
            return True
        for slot in self.slots.retained_slots():
            if self._kv_needed(new_tokens) <= pool:
                break
            self._forget(slot)
        return self._kv_needed(new_tokens) <= pool or not self.running

    def _kv_needed(self, new_tokens: int) -> int:
        return self.slots.cached_total() + new_tokens + KV_HEADROOM_TOKENS * (len(self.running) + 1)

    def _forget(self, slot: int) -> None:
        self.target.rollback(slot, 0)
        self.slots.cached[slot] = []
        if self.draft is not None:
            self.draft.rollback(slot, 0)
        self.retained_draft.pop(slot, None)

    # -- 2-3. planning and drafting ---------------------------------------------------------

    def _draft(self, seqs: list[Sequence]) -> tuple[list[SequenceDraft], float, int]:
        start = time.perf_counter()
        forwards = self.draft_model.forwards if self.draft_model else 0
        jobs = plan_drafts(seqs, self.drafters, self.planner, self.context_length)
        drafts = draft_all(jobs, self.drafters, self.planner)
        forwards = (self.draft_model.forwards if self.draft_model else 0) - forwards
        return drafts, time.perf_counter() - start, forwards

    # -- 4. verification --------------------------------------------------------------------

    def _verify(self, seqs: list[Sequence], drafts: list[SequenceDraft]):
        items = [BatchItem(seq.slot, (*seq.unprefilled, seq.tokens[-1], *d.token_ids), len(d.token_ids) + 1)
                 for seq, d in zip(seqs, drafts)]
        for seq in seqs:
            seq.unprefilled = ()
        start = time.perf_counter()
        logits = self.target.forward_batch(items)  # per sequence [k + 1, vocab]
        if self.target.fused:
            self.target.cost.observe(sum(len(i.token_ids) for i in items), (time.perf_counter() - start) * 1000)
        return logits

    # -- 5. acceptance, stops, rollback -----------------------------------------------------

    def _commit(self, seq: Sequence, draft: SequenceDraft, logits):
        result = accept_round(draft.token_ids, draft.q_draft, logits, seq.request.sampling, seq.rng)
        update, report, reason = commit_round(seq, draft, result.emitted(draft.token_ids), result.accepted,
                                              self.planner, self.context_length)
        self.target.rollback(seq.slot, len(seq.tokens) - 1)  # the invariant
        self.slots.cached[seq.slot] = seq.tokens[:-1]
        if reason is not None:
            self._finish(seq)
        return update, report

    def _finish(self, seq: Sequence) -> None:
        self.retire(seq)
        self.slots.owner[seq.slot] = None
        self.retained_draft[seq.slot] = seq.draft_cached
