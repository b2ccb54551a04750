"""Continuous batching with speculation, on token ids: the one engine behind `tandem generate`
(one sequence), `tandem bench` and `tandem serve`.

Requests join and leave the running batch at every step. A step's target forward scores at most
`step_token_budget` tokens (chunked prefill), and on a fused runner, while streams decode and
prompts do not outnumber them (nor, with `prefill_waves`, belong to a wave that did), no more
than costs STALL_FACTOR (engine/step_budget.py) times their rounds alone or the floor chunk alone (`prefill_floor`
tokens: THROUGHPUT_PREFILL_FLOOR for `tandem serve` on one engine; by default here, and on a
cluster's replicas, the smallest call near the device's batch speed), whichever is more (read
off the measured cost curve): the decoding sequences' rounds come first, and prompts are scored
in chunks, oldest first, in what they leave, so a long prompt joining does not stall the
running streams. A step
1. admits waiting requests into free slots, reusing the longest cached prompt prefix: in a
   running or a resident finished sequence's slot (copied where the runner shares cells), or
   restored from the host or disk tier (engine/host_cache.py, disk_cache.py); what their slot
   lacks of the prompt is `unprefilled`,
2. splits the running sequences: those verifying a round (decoding ones, and prefilling ones
   whose remaining prompt fits the budget left: it is scored in front of their round) and those
   still prefilling,
3. plans the rounds: each drafter offers what it could draft, and the load-aware planner
   chooses every k at once (engine/stages.py; k = 0 is plain decoding),
4. drafts: n-gram copies are free, the draft model runs in lock-step over its sequences (beside
   other streams it catches up on a new prompt in chunks, as the target prefills one),
5. fits the budget: drafts come first, so where the rounds outgrow it, prompts that were to
   finish without a draft wait; what is left goes to chunks of the still-prefilling prompts,
6. verifies every round's [rest of prompt] + last committed token + drafts, and scores the
   prompt chunks, in ONE target call,
7. per round: acceptance rule, stops, rollback of its own slot to its committed tokens. A
   sequence still prefilling commits nothing: its slot caches one more chunk.
Each sequence keeps its own rng, acceptance and cache, so a request's greedy output does not
depend on what else is running or how its prompt was chunked (fused llama.cpp batches can still
differ on near-ties: measured in the tests and docs/design.md).
"""

import logging
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import replace

from tandem.engine.events import SequenceUpdate, SpeculationOptions, StepReport
from tandem.engine.request import GenerationRequest
from tandem.engine.disk_cache import DiskPromptCache
from tandem.engine.host_cache import HostPromptCache
from tandem.engine.prompt_cache import PromptCache
from tandem.engine.sequence import Sequence
from tandem.engine.sequence_pool import SequencePool
from tandem.engine.slots import MIN_COPY_TOKENS
from tandem.engine.stages import commit_round, draft_all, plan_drafts
from tandem.engine.step_budget import (STEP_TOKEN_BUDGET, Chunk, check_prefill_floor, check_step_token_budget,
                                       drafts_within, held_back_budget, largest_within, prompt_chunks, round_tokens)
from tandem.errors import TandemError
from tandem.models.batch_runner import KV_HEADROOM_TOKENS, BatchItem, BatchRunner, KvPoolFullError, cached_context
from tandem.models.cost import catch_up_ms
from tandem.speculation.acceptance import accept_round
from tandem.speculation.batch_depth import BatchDepthPlanner
from tandem.speculation.depth import Auto, Depth, parse_depth
from tandem.speculation.drafters.base import Drafter, DraftJob, SequenceDraft
from tandem.speculation.drafters.lockstep import LocalDraftModel, reusable
from tandem.speculation.drafters.registry import build_drafters
from tandem.token_ids import common_prefix

log = logging.getLogger(__name__)
PREEMPTIONS_SAID_EVERY = 50  # a warning at the first preemption, then once every this many (as vLLM's)
STUCK_STEPS = 2  # failed target calls in a row with nothing left to free before their sequences fail
CATCH_UP_SHARE = 1.0  # beside other streams, a step's draft catch-up costs at most this share of its target call
MIN_CATCH_UP = 8  # prompt tokens the draft model may always catch up on in a step
SHARE_WAIT_TOKENS = MIN_COPY_TOKENS  # a new prompt waits for a running prefill that will compute this many of its tokens


class BatchEngine(SequencePool):
    def __init__(self, target: BatchRunner, draft: BatchRunner | None = None, drafter: str = "hybrid",
                 depth: "Depth | str | int" = Auto(), ngram_store=None, max_running: int | None = None,
                 drafters: dict[str, Drafter] | None = None, step_token_budget: int = STEP_TOKEN_BUDGET,
                 host_cache: HostPromptCache | None = None, disk_cache: DiskPromptCache | None = None,
                 prefill_floor: int | None = None, prefill_waves: bool = False):
        check_step_token_budget(step_token_budget)
        check_prefill_floor(prefill_floor)
        self.draft_model = LocalDraftModel(draft) if draft is not None else None
        super().__init__(drafters or build_drafters(self.draft_model, ngram_store), ngram_store)
        self.target = target
        self.draft = draft
        self.default_drafter = drafter
        self.default_depth = parse_depth(depth)
        self.max_running = min(max_running or target.max_slots, target.max_slots)
        self.context_length = target.context_length
        self.step_token_budget = step_token_budget
        self.prefill_floor = prefill_floor  # None: floor_chunk of the target's profile
        self.prefill_waves = prefill_waves  # a wave let through keeps the whole budget (`_step_budget`)
        self.planner = BatchDepthPlanner(target, draft)
        self.prompt_cache = PromptCache(target, draft, host_cache, disk_cache)
        self.slots = self.prompt_cache.slots
        self.kv_tight = False  # the pool overflowed since a sequence last finished: admit nothing
        self.failed_unfreed = 0  # target calls failed in a row where nothing could be freed for the next
        self.preempted = 0  # sequences put back in the queue for KV room, since the engine started
        self.wave: set[str] = set()  # prompts let through together, still prefilling: nothing held back
        # called on the engine's thread right before a step's model calls, where it leaves Python
        # for the kernels (EngineWorker hands the last step's updates to the event loop there)
        self.on_model_call: Callable[[], None] | None = None
        self._holding = threading.Lock()  # guards the two below
        self._holder: int | None = None  # the thread using the engine (`exclusive`), and how many times over
        self._hold_count = 0
        self.streaming = False  # a stream_tokens request is running (one at a time: their updates are each other's)

    # -- the worker's interface (the rest is SequencePool's) --------------------------------

    def validate(self, request: GenerationRequest, options: SpeculationOptions | None = None) -> None:
        super().validate(request, options)
        if max(request.prompt_ids) >= self.vocabulary:  # llama.cpp hung on one
            raise TandemError(f"prompt token id {max(request.prompt_ids)} is outside the model's vocabulary "
                              f"(ids 0 to {self.vocabulary - 1})")

    @property
    def vocabulary(self) -> int:
        """Token ids both models score: 0 to this, less one."""
        return min(runner.vocab_size for runner in (self.target, self.draft) if runner is not None)

    @property
    def kv_slots_in_use(self) -> int:
        """Target KV slots owned by a sequence (retained prompt caches of free slots not counted)."""
        return len(self.slots.owner) - self.slots.num_free

    @property
    def host_cache_bytes(self) -> int:
        return self.prompt_cache.host_bytes

    @property
    def disk_cache_bytes(self) -> int:
        return self.prompt_cache.disk_bytes

    def close(self) -> None:
        """After the last step: the free slots' caches go to the disk tier, if there is one."""
        self.prompt_cache.close()

    def clear_caches(self) -> None:
        """Forget every retained prompt cache, host tier included (a benchmark starts each
        prompt cold)."""
        with self.exclusive():
            self.prompt_cache.clear()

    @contextmanager
    def exclusive(self):
        """Hold the engine for this thread: one thread at a time adds, steps and cancels (two at
        once aborted the process inside llama.cpp). Re-entrant; another thread that holds it
        makes this a TandemError, at once. `stream_tokens` holds it for its whole request, an
        EngineWorker's thread for its whole life: share an engine across threads through one.
        Let go from any thread (a stream closed elsewhere, or by the garbage collector)."""
        me = threading.get_ident()
        with self._holding:
            if self._holder not in (None, me):
                raise TandemError("this engine is in use on another thread (a generate, a stream or an EngineWorker): "
                                  "one thread uses an engine at a time; share it across threads or an event loop "
                                  "through engine/worker.py's EngineWorker")
            self._holder, self._hold_count = me, self._hold_count + 1
        try:
            yield self
        finally:
            with self._holding:
                self._hold_count -= 1
                if self._hold_count == 0:
                    self._holder = None

    def add(self, seq_id: str, request: GenerationRequest, options: SpeculationOptions | None = None) -> None:
        with self.exclusive():
            super().add(seq_id, request, options)

    def cancel(self, seq_id: str, *, held_by_caller: bool = False) -> SequenceUpdate | None:
        """held_by_caller: a stream's own clean-up (run_request.py), which holds the engine even
        where another thread closes it (a suspended stream steps nothing meanwhile)."""
        if held_by_caller:
            return super().cancel(seq_id)
        with self.exclusive():
            return super().cancel(seq_id)

    def step(self) -> tuple[list[SequenceUpdate], StepReport]:
        """One step of every running sequence, on the thread that holds the engine (`exclusive`)."""
        with self.exclusive():
            return self._step()

    def _step(self) -> tuple[list[SequenceUpdate], StepReport]:
        started_at, start, preempted = time.time(), time.perf_counter(), self.preempted
        self.prompt_cache.evict_idle(len(self.running))
        self._admit()
        budget = self._step_budget()
        rounds, prefilling = self._split(budget)
        drafts, draft_seconds, draft_forwards = self._draft(rounds)
        rounds, drafts, chunks = self._fit(rounds, drafts, prefilling, budget)
        prefilled = tuple(seq.seq_id for seq in [*rounds, *(seq for seq, _ in chunks)] if not seq.output)
        prefill_tokens = sum(len(seq.unprefilled) for seq in rounds) + sum(n for _, n in chunks)
        updates, reports, verify_seconds = [], [], 0.0
        if rounds or chunks:
            ahead = self._ahead_model()  # a draft model elsewhere drafts round i+1 while this one verifies
            tickets = ahead.start_ahead(rounds, drafts) if ahead is not None else []
            verify_start = time.perf_counter()
            try:
                logits = self._verify(rounds, drafts, chunks)
                self.failed_unfreed = 0
            except KvPoolFullError as error:
                updates += self._free_kv(rounds + [seq for seq, _ in chunks], error)
                rounds, logits = [], []
            verify_seconds = time.perf_counter() - verify_start
            made_ahead = ahead.gather_ahead(tickets) if tickets else {}
            for seq, draft, seq_logits in zip(rounds, drafts, logits):
                before = len(seq.tokens)
                update, round_report = self._commit(seq, draft, seq_logits)
                updates.append(update)
                reports.append(round_report)
                if seq.seq_id in made_ahead and seq.seq_id in self.running:
                    ahead.keep_ahead(seq, draft, before, round_report.accepted, made_ahead[seq.seq_id])
        step_seconds = time.perf_counter() - start
        self.planner.observe_overhead((step_seconds - draft_seconds - verify_seconds) * 1000)
        report = StepReport(started_at, step_seconds, 0.0, draft_seconds, verify_seconds, len(self.running),
                            len(self.waiting), sum(len(d.token_ids) + 1 for d in drafts), tuple(reports),
                            prefilled, draft_forwards=draft_forwards, prefill_tokens=prefill_tokens,
                            preempted=self.preempted - preempted,
                            kv_cells_used=sum(len(self.slots.cached[seq.slot]) for seq in self.running.values()),
                            kv_pool_cells=getattr(self.target, "pool_tokens", 0))
        return updates, report

    def _ahead_model(self):
        """The draft model, where it drafts elsewhere and was asked to draft ahead (a cluster
        replica's drafter workers, `--draft-ahead`); None otherwise."""
        model = getattr(self.drafters.get("model"), "model", None)
        return model if getattr(model, "draft_ahead", False) else None

    # -- 1. admission -----------------------------------------------------------------------

    def _admit(self) -> None:
        """Place waiting requests while slots are free; the step budget spreads their prefill. A
        request whose prompt shares a prefix that a running sequence is still prefilling waits
        for it (the ones behind it go first), then copies that prefix instead of computing it
        again: users arriving together behind one system prompt prefill it once."""
        deferred = []
        while self.waiting and len(self.running) < self.max_running and self.slots.num_free:
            if self.kv_tight and self.running:  # the pool overflowed: wait for a sequence to finish
                break
            if self.target.can_copy_prefix and self._prefill_to_share(self.waiting[0]):
                deferred.append(self.waiting.popleft())
                continue
            if not self._make_room(self.waiting[0]):
                break
            self._place(self.waiting.popleft())
        self.waiting.extendleft(reversed(deferred))

    def _prefill_to_share(self, seq: Sequence) -> bool:
        """Whether a running sequence is still prefilling at least SHARE_WAIT_TOKENS of seq's prompt."""
        prefix = seq.tokens[:-1]
        for other in self.running.values():
            if other.unprefilled and other.request.cache_salt == seq.request.cache_salt:
                done = len(self.slots.cached[other.slot])
                if common_prefix(other.tokens[:-1], prefix) - done >= SHARE_WAIT_TOKENS:
                    return True
        return False

    def _place(self, seq: Sequence) -> None:
        """Give seq a slot holding as much of its prompt as is cached (engine/prompt_cache.py);
        the rest is unprefilled."""
        first = seq.cached_tokens is None  # not a preempted sequence's return
        slot, reuse, seq.draft_cached = self.prompt_cache.place(seq.seq_id, seq.tokens[:-1], first,
                                                                self._running_draft, seq.request.cache_salt)
        seq.slot = slot
        self.running[seq.seq_id] = seq
        seq.unprefilled = tuple(seq.tokens[reuse:-1])
        if first:
            seq.cached_tokens = reuse

    def _running_draft(self, slot: int) -> list[int]:
        return self.running[self.slots.owner[slot]].draft_cached

    def _make_room(self, seq: Sequence) -> bool:
        """Keep the KV pool from overflowing before seq is placed: evict free slots' caches to the
        host tier, least recently used first, if needed. The slot seq will take gives up its
        cells (its cached prompt is extended, restored over, or saved away), so they are not
        counted twice and that slot is never evicted for room; a slot it copies a prefix from
        goes last. Counted as new and evicted first, a repeated long prompt lost its cache
        wherever the pool was small."""
        pool = getattr(self.target, "pool_tokens", None)
        if pool is None or self._kv_needed(len(seq.tokens) - 1) <= pool:  # fits as if nothing were cached
            return True
        choice = self.slots.choose(seq.tokens[:-1], self.target.can_copy_prefix, seq.request.cache_salt)
        taken = choice.slot
        def fits() -> bool:  # the taken slot's cells that no other slot shares are the ones it gives up
            shared = max((common_prefix(self.slots.cached[taken], cached) for slot, cached in
                          enumerate(self.slots.cached) if slot != taken), default=0)
            return self._kv_needed(len(seq.tokens) - 1) - len(self.slots.cached[taken]) + shared <= pool

        retained = [s for s in self.slots.retained_slots() if s != taken]
        self._evict_until(fits, [s for s in retained if s != choice.copy_from] + [s for s in retained
                                                                                   if s == choice.copy_from])
        return fits() or not self.running

    def _evict_until(self, fits: Callable[[], bool], slots: list[int], at_least: int = 0) -> int:
        """Evict `slots`' caches to the host tier, in that order, until `fits()` (and at least
        `at_least` went); how many went."""
        evicted = 0
        for slot in slots:
            if evicted >= at_least and fits():
                break
            self.prompt_cache.evict(slot)
            evicted += 1
        return evicted

    def _kv_needed(self, new_tokens: int) -> int:
        pending = sum(len(seq.unprefilled) for seq in self.running.values())  # prompts not yet cached
        return self.slots.cached_total() + pending + new_tokens + KV_HEADROOM_TOKENS * (len(self.running) + 1)

    # -- 2. who verifies a round, who goes on prefilling ------------------------------------

    def _step_budget(self) -> int:
        """step_token_budget, held back while streams decode on a fused runner, so a prompt chunk
        slows their step (a bounded inter-token gap) instead of stalling it for a whole prefill:
        a step then scores no more tokens than cost, on the target's curve, the larger of
        STALL_FACTOR times the decoding rounds alone and the floor chunk alone. The floor keeps
        chunks near the device's full batch speed where single rounds are cheap and a call's
        fixed cost is large (llama.cpp 1.5B on two CPU threads: a 16-token call costs ~35% more
        a token than a 64-token one; the floor is 33 tokens), and little where a few tokens
        already run near batch speed (smollm2 on one core: 12 tokens) or the curve is flat (one
        round costs about what the floor does), so it lengthens gaps only where that buys
        prefill speed (`--prefill-floor N` fixes it; `tandem serve` on one engine passes
        THROUGHPUT_PREFILL_FLOOR). While more sequences wait on their prompt
        than decode, nothing is held back: the many first tokens outweigh the few streams' gaps
        (a closed loop's wave of new requests goes in at full speed). With `prefill_waves` a
        wave let through keeps the whole budget until its prompts are all in (`self.wave`):
        held back again once the prompts no longer outnumber the streams, half a wave of 16 goes
        in 70 tokens a step, shared (16 streams of short answers, 1.5B Q4 on two CPU threads, in
        process: 1.06-1.13x tok/s). It is opt-in: on two smollm2 replicas at C=8 it stalled the
        streams beside each wave, ITL p99/p50 19.6x and 21x against 4.7x and 2.7x without
        (docs/vs-llama-server.md#waves-run-through). With nothing prefilling there is no chunk to
        hold back, and the whole budget is returned unpriced: the rounds fit either way."""
        decoding = [seq for seq in self.running.values() if not seq.unprefilled]
        prefilling = {seq.seq_id for seq in self.running.values() if seq.unprefilled}
        outnumbered = len(prefilling) > len(decoding)
        self.wave = (prefilling if outnumbered and self.prefill_waves else self.wave) & prefilling
        if not decoding or not prefilling or not self.target.fused or outnumbered or self.wave:
            return self.step_token_budget
        rounds = sum(self._round_bound(seq) for seq in decoding)
        return held_back_budget(self.target.cost, rounds, self.step_token_budget, self.prefill_floor)

    def _split(self, budget: int) -> tuple[list[Sequence], list[Sequence]]:
        """The running sequences that verify a round this step and those still prefilling, both
        oldest first. Decoding ones always verify; a prefilling one does when its whole round
        fits in the budget left by the decoding ones and the older prompts (to keep the order,
        none after the first that does not)."""
        left = budget - sum(self._round_bound(s) for s in self.running.values() if not s.unprefilled)
        rounds, prefilling = [], []
        for seq in self.running.values():
            if seq.unprefilled and (prefilling or self._round_bound(seq) > left):
                prefilling.append(seq)
                continue
            rounds.append(seq)
            if seq.unprefilled:
                left -= self._round_bound(seq)
        return rounds, prefilling

    def _round_bound(self, seq: Sequence) -> int:
        """Tokens seq's round scores, at most: its rest of prompt, its last token and the drafts
        a fixed k allows (an auto-depth round's drafts are not known before drafting)."""
        return len(seq.unprefilled) + 1 + min(seq.fixed_k or 0, seq.draft_limit(self.context_length))

    # -- 3-4. planning and drafting ---------------------------------------------------------

    def _draft(self, seqs: list[Sequence]) -> tuple[list[SequenceDraft], float, int]:
        if not seqs:
            return [], 0.0, 0
        start = time.perf_counter()
        forwards = self.draft_model.forwards if self.draft_model else 0
        jobs = self._pace_catch_up(plan_drafts(seqs, self.drafters, self.planner, self.context_length))
        if any(job.k and job.offer.uses_model for job in jobs):  # draft_all calls the draft model
            self._model_call()
        vocabulary = self.vocabulary
        drafts = [within_vocabulary(draft, vocabulary) for draft in draft_all(jobs, self.drafters, self.planner)]
        forwards = (self.draft_model.forwards if self.draft_model else 0) - forwards
        return drafts, time.perf_counter() - start, forwards

    def _pace_catch_up(self, jobs: list[DraftJob]) -> list[DraftJob]:
        """Beside other streams, the draft model catches up on prompts it has not seen in
        chunks, oldest first: at most what costs CATCH_UP_SHARE of the step's target call on the
        draft's curve (at least MIN_CATCH_UP tokens), so a sequence starting to draft slows the
        others' step instead of stalling it for a whole draft prefill. A sequence still catching
        up drafts nothing. Alone, a sequence catches up at once (it only delays itself)."""
        model_jobs = [i for i, job in enumerate(jobs) if job.k and job.offer.uses_model]
        if self.draft is None or len(jobs) < 2 or not model_jobs:
            return jobs
        target_ms = self.planner.target_ms([job.k + 1 + len(job.seq.unprefilled) for job in jobs])
        catch_up = lambda n: catch_up_ms(self.draft.cost, n)  # noqa: E731
        budget = max(MIN_CATCH_UP, largest_within(catch_up, CATCH_UP_SHARE * target_ms, 0, self.context_length))
        paced = list(jobs)
        for i in model_jobs:
            seq = jobs[i].seq
            allowed = min(len(seq.tokens) - reusable(seq) - 1, budget)
            budget -= allowed
            paced[i] = replace(jobs[i], catch_up=allowed)
        return paced

    # -- 5. fitting the budget --------------------------------------------------------------

    def _fit(self, rounds: list[Sequence], drafts: list[SequenceDraft], prefilling: list[Sequence],
             budget: int) -> tuple[list[Sequence], list[SequenceDraft], list[Chunk]]:
        """The rounds that fit, their drafts, and the prompt chunks. Drafts come first: while the
        rounds outgrow the budget, the youngest round that was to finish a prompt without a
        draft waits, prefilling on (one that drafted keeps its round: its drafts may have drawn
        on its rng). A budget held back beside decoding streams bounds what the prompts add to
        their rounds (`_step_budget`), so auto-depth drafts do not shrink the chunks there
        (within step_token_budget): the planner judged each draft token worth its cost in the
        rounds' call, while a chunk cut short costs its prompt one more step, and each step
        beside it the decoding rounds' whole call (16 streams of short answers, 1.5B Q4 on two
        CPU threads: ~300 ms a step of rounds, ~7 ms a prompt token)."""
        over = round_tokens(rounds, drafts) - budget
        rounds, drafts, waits = list(rounds), list(drafts), []
        for i in reversed(range(len(rounds))):
            if over <= 0:
                break
            if rounds[i].unprefilled and not drafts[i].token_ids:
                over -= len(rounds[i].unprefilled) + 1
                waits.insert(0, rounds.pop(i))
                drafts.pop(i)
        drafts = drafts_within(rounds, drafts, self.step_token_budget)
        scored = round_tokens(rounds, drafts)
        left = budget - scored
        if budget < self.step_token_budget:  # held back: auto drafts beyond the rounds' bounds ride on top
            left = min(budget - sum(self._round_bound(seq) for seq in rounds), self.step_token_budget - scored)
        return rounds, drafts, prompt_chunks(waits + prefilling, left, any(seq.unprefilled for seq in rounds))

    # -- 6. verification --------------------------------------------------------------------

    def _verify(self, rounds: list[Sequence], drafts: list[SequenceDraft], chunks: list[Chunk]):
        """One target call; per round its logits [k + 1, vocab]. Chunks ask for no logits."""
        items = [BatchItem(seq.slot, (*seq.unprefilled, seq.tokens[-1], *d.token_ids), len(d.token_ids) + 1)
                 for seq, d in zip(rounds, drafts)]
        items += [BatchItem(seq.slot, seq.unprefilled[:n], 0) for seq, n in chunks]
        context = cached_context(self.target, items)
        self._model_call()
        start = time.perf_counter()
        logits = self.target.forward_batch(items, views=True)  # per item [num_logits, vocab], read before the next call
        for seq in rounds:
            seq.unprefilled = ()
        if self.target.fused:
            self.target.cost.observe(sum(len(i.token_ids) for i in items), (time.perf_counter() - start) * 1000,
                                     context)
        for seq, n in chunks:
            seq.unprefilled = seq.unprefilled[n:]
            self.slots.cached[seq.slot] = seq.tokens[: len(seq.tokens) - 1 - len(seq.unprefilled)]
        return logits[: len(rounds)]

    def _model_call(self) -> None:
        if self.on_model_call is not None:
            self.on_model_call()

    def _free_kv(self, seqs: list[Sequence], error: KvPoolFullError) -> list[SequenceUpdate]:
        """The pool could not hold the step: undo any partial write, then free room for the next
        step: retained prompt caches first, least recently used first, until the running
        sequences' caches and headroom fit (at least one), else the youngest sequence goes back to
        the front of the queue (preempted: its prompt and output are recomputed when it is placed
        again). Where nothing is left to free (one sequence, no retained cache) the call failed for
        another reason than room, or the pool cannot hold that sequence: after STUCK_STEPS such
        calls in a row its sequences fail, with the runner's error, instead of the same call
        being retried for ever. Returns their updates."""
        for seq in seqs:
            self.target.rollback(seq.slot, len(seq.tokens) - 1 - len(seq.unprefilled))
        pool = getattr(self.target, "pool_tokens", 0)  # retained caches first, least recently used first
        if self._evict_until(lambda: self._kv_needed(0) <= pool, self.slots.retained_slots(), at_least=1):
            self.failed_unfreed = 0
            return []
        if len(self.running) < 2:
            self.failed_unfreed += 1
            if self.failed_unfreed < STUCK_STEPS:
                return []
            self.failed_unfreed = 0
            return [self._fail(seq, f"the target could not score this request ({error})") for seq in seqs]
        youngest = list(self.running.values())[-1]
        self.running.pop(youngest.seq_id)
        self.slots.owner[youngest.slot] = None
        self.prompt_cache.forget(youngest.slot)
        youngest.slot, youngest.unprefilled, youngest.draft_cached = -1, (), []
        self.waiting.appendleft(youngest)
        self.kv_tight = True
        self.failed_unfreed = 0
        self.preempted += 1
        if self.preempted % PREEMPTIONS_SAID_EVERY == 1:
            log.warning("a request went back to the queue for KV room (%d so far): its prompt and output are "
                        "recomputed when it runs again; a larger pool avoids it (on torch --kv-memory; on "
                        "llama.cpp half of every slot's --context-length, at most 32,768 cells)", self.preempted)
        return []

    def _fail(self, seq: Sequence, message: str) -> SequenceUpdate:
        """Retire seq with finish_reason "error" (what it streamed so far stands)."""
        self._finish(seq)
        return SequenceUpdate(seq.seq_id, (), finished=True, finish_reason="error", error=message)

    # -- 7. acceptance, stops, rollback -----------------------------------------------------

    def _commit(self, seq: Sequence, draft: SequenceDraft, logits):
        result = accept_round(draft.token_ids, draft.q_draft, logits, seq.request.sampling, seq.rng,
                              position=seq.output_position)
        update, report, reason = commit_round(seq, draft, result.emitted(draft.token_ids), result.accepted,
                                              self.planner, self.context_length)
        self.target.rollback(seq.slot, len(seq.tokens) - 1)  # the invariant
        self.slots.cached[seq.slot] = seq.tokens[:-1]
        if reason is not None:
            self._finish(seq)
        return update, report

    def _finish(self, seq: Sequence) -> None:
        """Free seq's slot; its cache (the prompt chunks so far, mid-prefill) stays for reuse."""
        self.retire(seq)
        self.kv_tight = False
        self.failed_unfreed = 0  # a failed call counts towards the sequence it was made for alone
        self.prompt_cache.release(seq.slot, seq.draft_cached)


def within_vocabulary(draft: SequenceDraft, vocabulary: int) -> SequenceDraft:
    """The draft cut before its first token id the models cannot score. A shared n-gram store
    holds what any writer put there (another app's or tokenizer's keys under the same names in
    Redis): llama.cpp failed on such an id, the failure read as a full KV pool, and the next
    step drafted the same id again, for ever."""
    bad = next((i for i, token in enumerate(draft.token_ids) if not 0 <= token < vocabulary), None)
    if bad is None:
        return draft
    q_draft = None if draft.q_draft is None else draft.q_draft[:bad]
    return replace(draft, token_ids=draft.token_ids[:bad], q_draft=q_draft)
