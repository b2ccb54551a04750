"""Continuous batching with speculation, on token ids.

Requests join and leave the running batch at every step. A step
1. admits waiting requests into free slots (reusing cached prompt prefixes); their uncached
   prompt tokens are scored in step 4's forward, beside the other sequences' drafts (one call),
2. asks each running sequence where its draft would come from and lets the load-aware planner
   choose every k at once (spec/batch_depth.py; k = 0 is plain decoding),
3. drafts: n-gram copies are free, the draft model runs in lock-step over its sequences,
4. verifies every sequence's [last committed token] + drafts in ONE target call,
5. per sequence: acceptance rule, stops, rollback of its own slot to its committed tokens.
Each sequence keeps its own rng, acceptance and cache, so a request's greedy output does not
depend on what else is running (fused llama.cpp batches can still differ on near-ties: measured
in the tests and the README).
"""

import time
from dataclasses import replace

from tandem.engine.batch_drafting import SequenceDraft, candidate_for, draft_limit, draft_with_model
from tandem.engine.events import RoundReport, SequenceUpdate, SpeculationOptions, StepReport
from tandem.engine.generator import fit_vocab
from tandem.engine.request import GenerationRequest
from tandem.engine.sequence import Sequence
from tandem.engine.sequence_pool import SequencePool
from tandem.engine.slots import SlotTable
from tandem.errors import TandemError
from tandem.models.batch_runner import BatchItem, BatchRunner
from tandem.spec.acceptance import accept_greedy, accept_sampling
from tandem.spec.batch_depth import BatchDepthPlanner
from tandem.spec.sampling import probs_from_logits

PREFILL_TOKEN_BUDGET = 2048  # prompt tokens admitted per step (at least one request always)
KV_HEADROOM_TOKENS = 64  # per running sequence, for drafts being verified


class BatchEngine(SequencePool):
    def __init__(self, target: BatchRunner, draft: BatchRunner | None = None, drafter: str = "hybrid",
                 k: int | str = "auto", ngram_store=None, max_running: int | None = None):
        super().__init__()
        self.target = target
        self.draft = draft
        self.default_drafter = drafter
        self.default_k = k
        self.ngram_store = ngram_store
        self.max_running = min(max_running or target.max_slots, target.max_slots)
        self.context_length = target.context_length
        self.planner = BatchDepthPlanner(target, draft)
        self.slots = SlotTable(target.max_slots)
        self.retained_draft: dict[int, list[int]] = {}  # draft cache of each free slot

    # -- the worker's interface (the rest is SequencePool's) --------------------------------

    def validate(self, request: GenerationRequest, options: SpeculationOptions = SpeculationOptions()) -> None:
        super().validate(request, options)
        drafter = options.drafter or self.default_drafter
        if drafter in ("model", "hybrid") and self.draft is None:
            raise TandemError(f"drafter {drafter!r} needs a draft model, and this server has none")

    def cancel(self, seq_id: str) -> SequenceUpdate | None:
        update = self.cancel_waiting(seq_id)
        if update is not None:
            return update
        seq = self.running.pop(seq_id, None)
        if seq is None:
            return None
        self._release(seq)
        return SequenceUpdate(seq_id, (), finished=True, finish_reason="cancelled")

    def step(self) -> tuple[list[SequenceUpdate], StepReport]:
        started_at, start = time.time(), time.perf_counter()
        prefilled, prefill_seconds = self._admit()
        updates, rounds, draft_seconds, verify_seconds, batch_tokens = [], [], 0.0, 0.0, 0
        if self.running:
            seqs = list(self.running.values())
            drafts, draft_seconds = self._draft(seqs)
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
                            len(self.running), len(self.waiting), batch_tokens, tuple(rounds), tuple(prefilled))
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

    def _draft(self, seqs: list[Sequence]) -> tuple[list[SequenceDraft], float]:
        start = time.perf_counter()
        k_max = self.planner.k_max
        candidates, copies = zip(*(candidate_for(seq, draft_limit(seq, self.context_length, k_max),
                                                 self.ngram_store, self.draft) for seq in seqs))
        candidates = [replace(c, prefill_tokens=len(seq.unprefilled)) if seq.unprefilled else c
                      for c, seq in zip(candidates, seqs)]
        ks = self.planner.plan(candidates)
        drafts = [SequenceDraft(c.source, list(copy[:k])) for c, copy, k in zip(candidates, copies, ks)]
        jobs = [(seq, k) for seq, c, k in zip(seqs, candidates, ks) if c.uses_model and k > 0]
        if jobs:
            by_id, _ = draft_with_model(self.draft, jobs)
            drafts = [by_id.get(seq.seq_id, d) for seq, d in zip(seqs, drafts)]
        return drafts, time.perf_counter() - start

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

    def _commit(self, seq: Sequence, draft: SequenceDraft, logits) -> tuple[SequenceUpdate, RoundReport]:
        sampling = seq.request.sampling
        if sampling.greedy:
            result = accept_greedy(draft.token_ids, logits)
        else:
            p_target = probs_from_logits(logits, sampling)  # [k + 1, vocab]
            result = accept_sampling(draft.token_ids, fit_vocab(draft.q_draft, p_target.shape[-1]), p_target, seq.rng)
        k = len(draft.token_ids)
        self.planner.record(draft.source, k, result.accepted)
        emitted, reason = seq.commit(result.emitted(draft.token_ids), k, result.accepted, self.context_length)
        self.target.rollback(seq.slot, len(seq.tokens) - 1)  # the invariant
        self.slots.cached[seq.slot] = seq.tokens[:-1]
        if reason is not None:
            self._finish(seq)
        update = SequenceUpdate(seq.seq_id, tuple(emitted), k, result.accepted, reason is not None, reason)
        return update, RoundReport(seq.seq_id, draft.source, k, result.accepted)

    def _finish(self, seq: Sequence) -> None:
        del self.running[seq.seq_id]
        if self.ngram_store is not None:
            self.ngram_store.add(seq.tokens)
        self._release(seq)

    def _release(self, seq: Sequence) -> None:
        self.slots.owner[seq.slot] = None
        self.retained_draft[seq.slot] = seq.draft_cached
