"""The cluster coordinator: the batching engine's interface (add / cancel / step) over verifier
and drafter workers in other processes (Ray actors), so the HTTP server runs unchanged on top.

It owns every sequence's token ids and sends deltas (cluster/messages.py). A step
1. re-places sequences whose verifier died and admits new ones: each goes to the live verifier
   replica with the least expected completion time (its sequences x its profiled step cost,
   among those with a free slot), which prefills it from the coordinator's token ids,
2. plans k per sequence with each replica's cost curve plus the network round trips of the
   step (spec/batch_depth.py: a long round trip makes longer drafts pay),
3. drafts: n-gram copies locally, model drafts on drafter workers (all drafters concurrently),
4. verifies on every replica concurrently, one batched call per replica,
5. commits the returned tokens after stops, like the single-process engine.
With `pipeline`, while a replica verifies round i the drafter already drafts round i+1 as if
all of round i were accepted, one token longer (its first token is the drafter's guess of the
target's bonus token). If the whole round is accepted and the bonus token equals that guess,
round i+1's draft is ready without waiting for the drafter; otherwise it is discarded.
A verifier that dies mid-step loses nothing: its sequences' rounds are dropped (the coordinator
had not committed them) and they re-prefill on another replica next step. A drafter that dies
only costs its sequences their drafts for a round. Dead workers are restarted in the background;
only when no verifier is left do requests fail (the server answers 503).
"""

import time
import zlib

from tandem.cluster.endpoints import WorkerDiedError
from tandem.cluster.messages import DraftItem, VerifyItem, VerifyResult
from tandem.cluster.pool import Worker
from tandem.engine.batch_drafting import SequenceDraft, candidate_for, draft_limit
from tandem.engine.events import RoundReport, SequenceUpdate, StepReport
from tandem.engine.sequence import Sequence
from tandem.engine.sequence_pool import SequencePool
from tandem.spec.batch_depth import BatchDepthPlanner

NO_VERIFIER = "no verifier is alive in the cluster"


class ClusterEngine(SequencePool):
    def __init__(self, verifiers: list[Worker], drafters: list[Worker], drafter: str = "hybrid",
                 k: int | str = "auto", ngram_store=None, max_running: int | None = None,
                 pipeline: bool = False):
        super().__init__()
        self.verifiers = verifiers
        self.drafters = drafters
        self.default_drafter = drafter
        self.default_k = k
        self.ngram_store = ngram_store
        capacity = sum(w.max_slots for w in verifiers)
        self.max_running = min(max_running or capacity, capacity)
        self.context_length = min(w.context_length for w in verifiers)
        self.planners = {w.name: BatchDepthPlanner(w.cost, None) for w in verifiers}
        self.replica_of: dict[str, Worker] = {}
        self.drafter_of: dict[str, Worker] = {}
        self.drafter_length: dict[str, int] = {}  # committed tokens the sequence's drafter holds
        self.events: list[str] = []  # failovers and restarts, for logs and tests
        self.pipeline = pipeline
        self.ready_drafts: dict[str, SequenceDraft] = {}  # pipelined drafts for the next round
        self.pipeline_hits = 0
        self.pipeline_misses = 0

    # -- the worker thread's interface (the rest is SequencePool's) --------------------------

    @property
    def unavailable_reason(self) -> str | None:
        if any(w.alive or w.restarting for w in self.verifiers):
            return None
        return NO_VERIFIER

    def worker_states(self) -> list[dict]:
        return [w.state() for w in self.verifiers + self.drafters]

    def cancel(self, seq_id: str) -> SequenceUpdate | None:
        update = self.cancel_waiting(seq_id)
        if update is not None:
            return update
        seq = self.running.get(seq_id)
        if seq is None:
            return None
        self._finish(seq)
        return SequenceUpdate(seq_id, (), finished=True, finish_reason="cancelled")

    def step(self) -> tuple[list[SequenceUpdate], StepReport]:
        started_at, start = time.time(), time.perf_counter()
        self._revive()
        updates: list[SequenceUpdate] = []
        prefilled = self._place(updates)
        prefill_seconds = time.perf_counter() - start
        placed = [seq for seq in self.running.values() if seq.seq_id in self.replica_of]
        draft_start = time.perf_counter()
        drafts = self._draft(placed)
        verify_start = time.perf_counter()
        verify_calls = self._start_verify(placed, drafts)
        ahead = self._start_predraft(placed, drafts) if self.pipeline else []
        results = self._gather_verify(verify_calls)
        predrafts = self._gather_predraft(ahead)
        verify_seconds = time.perf_counter() - verify_start
        rounds = []
        for seq in placed:
            result = results.get(seq.seq_id)
            if result is not None:
                self._keep_predraft(seq, drafts[seq.seq_id], result, predrafts.get(seq.seq_id))
                update, report = self._commit(seq, drafts[seq.seq_id], result)
                updates.append(update)
                rounds.append(report)
        report = StepReport(started_at, time.perf_counter() - start, prefill_seconds, verify_start - draft_start,
                            verify_seconds, len(self.running), len(self.waiting),
                            sum(len(d.token_ids) + 1 for d in drafts.values()), tuple(rounds), tuple(prefilled),
                            tuple(self.worker_states()))
        return updates, report

    # -- 1. placement and failover ------------------------------------------------------------

    def _revive(self) -> None:
        for worker in self.verifiers + self.drafters:
            if worker.restarting and worker.poll_ready():
                self.events.append(f"{worker.name} restarted (pid {worker.pid})")

    def _place(self, updates: list[SequenceUpdate]) -> list[str]:
        """Open orphaned and waiting sequences on replicas; fail them if no verifier is left."""
        orphans = [seq for seq in self.running.values() if seq.seq_id not in self.replica_of]
        while self.waiting and len(self.running) < self.max_running:
            seq = self.waiting.popleft()
            self.running[seq.seq_id] = seq
            orphans.append(seq)
        if not orphans:
            return []
        if self.unavailable_reason:
            for seq in orphans:
                del self.running[seq.seq_id]
                updates.append(SequenceUpdate(seq.seq_id, (), finished=True, finish_reason="error", error=NO_VERIFIER))
            return []
        pending = []
        for seq in orphans:
            replica = self._least_loaded()
            if replica is None:
                break  # replicas restarting or full: try again next step
            replica.sequences.add(seq.seq_id)
            pending.append((seq, replica, replica.endpoint.call("open", seq.seq_id, list(seq.tokens))))
        opened = []
        for seq, replica, call in pending:
            try:
                call.result()
            except WorkerDiedError:
                self._verifier_died(replica)
                continue
            if replica.alive:
                self.replica_of[seq.seq_id] = replica
                opened.append(seq.seq_id)
        return opened

    def _least_loaded(self) -> Worker | None:
        """Least expected completion time: (its sequences + 1) x its cost of one step."""
        live = [w for w in self.verifiers if w.alive and len(w.sequences) < w.max_slots]
        return min(live, key=lambda w: (len(w.sequences) + 1) * w.cost.cost.cost_ms(len(w.sequences) + 1),
                   default=None)

    def _verifier_died(self, replica: Worker) -> None:
        if not replica.alive:
            return
        orphans = replica.mark_dead()
        for seq_id in orphans:
            self.replica_of.pop(seq_id, None)
        self.events.append(f"{replica.name} died; re-placing {len(orphans)} sequences")

    def _drafter_died(self, drafter: Worker) -> None:
        if not drafter.alive:
            return
        for seq_id in drafter.mark_dead():
            self.drafter_of.pop(seq_id, None)
            self.drafter_length.pop(seq_id, None)
        self.events.append(f"{drafter.name} died; its sequences draft elsewhere")

    # -- 2-3. planning and drafting ------------------------------------------------------------

    def _draft(self, seqs: list[Sequence]) -> dict[str, SequenceDraft]:
        drafts: dict[str, SequenceDraft] = {}
        jobs: dict[str, list[tuple[Sequence, int]]] = {}
        for replica in self.verifiers:
            group = [seq for seq in seqs if self.replica_of.get(seq.seq_id) is replica]
            if group:
                self._plan_group(replica, group, drafts, jobs)
        self._draft_remotely(jobs, drafts)
        return drafts

    def _plan_group(self, replica: Worker, group: list[Sequence], drafts, jobs) -> None:
        planner = self.planners[replica.name]
        planner.target = replica.cost  # replaced when the replica restarts
        drafter_for = {seq.seq_id: self._drafter_for(seq) for seq in group}
        planner.overhead_ms = replica.rtt_ms + max((d.rtt_ms for d in drafter_for.values() if d), default=0.0)
        candidates, copies = [], []
        for seq in group:
            drafter = drafter_for[seq.seq_id]
            seq.draft_cached = seq.tokens[: self.drafter_length.get(seq.seq_id, 0)]
            limit = draft_limit(seq, self.context_length, planner.k_max)
            candidate, copy = candidate_for(seq, limit, self.ngram_store, drafter.cost if drafter else None)
            candidates.append(candidate)
            copies.append(copy)
        planner.draft = next((d.cost for d in drafter_for.values() if d), None)
        for seq, candidate, copy, k in zip(group, candidates, copies, planner.plan(candidates)):
            drafts[seq.seq_id] = SequenceDraft(candidate.source, list(copy[:k]))
            ready = self.ready_drafts.pop(seq.seq_id, None)
            if candidate.uses_model and k > 0 and ready is not None:
                drafts[seq.seq_id] = SequenceDraft("model", ready.token_ids[:k],
                                                   None if ready.q_draft is None else ready.q_draft[:k])
            elif candidate.uses_model and k > 0:
                jobs.setdefault(drafter_for[seq.seq_id].name, []).append((seq, k))

    def _drafter_for(self, seq: Sequence) -> Worker | None:
        """The sequence's drafter (sticky, for its cache), or the next live one."""
        if seq.drafter not in ("model", "hybrid"):
            return None
        current = self.drafter_of.get(seq.seq_id)
        if current is not None and current.alive:
            return current
        live = [d for d in self.drafters if d.alive]
        if not live:
            return None
        chosen = live[zlib.crc32(seq.seq_id.encode()) % len(live)]
        self.drafter_of[seq.seq_id] = chosen
        self.drafter_length[seq.seq_id] = 0
        chosen.sequences.add(seq.seq_id)
        return chosen

    def _draft_remotely(self, jobs: dict[str, list[tuple[Sequence, int]]], drafts) -> None:
        by_name = {d.name: d for d in self.drafters}
        calls = []
        for name, group in jobs.items():
            items = [self._draft_item(seq, k) for seq, k in group]
            calls.append((by_name[name], group, by_name[name].endpoint.call("propose", items)))
        for drafter, group, call in calls:
            try:
                replies = call.result()
            except WorkerDiedError:
                self._drafter_died(drafter)
                for seq, _ in group:
                    drafts[seq.seq_id] = SequenceDraft("none", [])
                continue
            for (seq, _), reply in zip(group, replies):
                if reply.needs_sync:
                    self.drafter_length[seq.seq_id] = 0
                    drafts[seq.seq_id] = SequenceDraft("none", [])
                    continue
                self.drafter_length[seq.seq_id] = len(seq.tokens)
                drafts[seq.seq_id] = SequenceDraft("model", list(reply.token_ids), reply.q_draft)

    def _draft_item(self, seq: Sequence, k: int) -> DraftItem:
        base = self.drafter_length.get(seq.seq_id, 0)
        seed = zlib.crc32(f"{seq.request.sampling.seed}/{seq.seq_id}/{len(seq.tokens)}".encode())
        return DraftItem(seq.seq_id, base, tuple(seq.tokens[base:]), k, seq.request.sampling, seed)

    # -- 4. verification ------------------------------------------------------------------------

    def _start_verify(self, seqs: list[Sequence], drafts: dict[str, SequenceDraft]) -> list:
        calls = []
        for replica in self.verifiers:
            group = [seq for seq in seqs if self.replica_of.get(seq.seq_id) is replica]
            if group and replica.alive:
                items = [VerifyItem(seq.seq_id, len(seq.tokens), tuple(drafts[seq.seq_id].token_ids),
                                    seq.request.sampling, drafts[seq.seq_id].q_draft) for seq in group]
                calls.append((replica, replica.endpoint.call("verify", items)))
        return calls

    def _gather_verify(self, calls: list) -> dict[str, VerifyResult]:
        results = {}
        for replica, call in calls:
            try:
                replies = call.result()
            except WorkerDiedError:
                self._verifier_died(replica)  # its rounds are dropped; nothing was committed
                continue
            results.update({r.seq_id: r for r in replies})
            if replies and replies[0].batch_tokens:  # a replica that slows down is noticed
                replica.cost.cost.observe(replies[0].batch_tokens, replies[0].step_ms)
        return results

    # -- pipelining -----------------------------------------------------------------------------

    def _start_predraft(self, seqs: list[Sequence], drafts: dict[str, SequenceDraft]) -> list:
        """Ask each drafter for round i+1 now, assuming round i is accepted whole."""
        jobs: dict[str, list] = {}
        for seq in seqs:
            draft, drafter = drafts[seq.seq_id], self.drafter_of.get(seq.seq_id)
            if draft.source != "model" or not draft.token_ids or drafter is None or not drafter.alive:
                continue
            base = self.drafter_length.get(seq.seq_id, 0)
            delta = (*seq.tokens[base:], *draft.token_ids)
            seed = zlib.crc32(f"{seq.request.sampling.seed}/{seq.seq_id}/{len(seq.tokens)}/ahead".encode())
            item = DraftItem(seq.seq_id, base, delta, len(draft.token_ids) + 1, seq.request.sampling, seed)
            jobs.setdefault(drafter.name, []).append(item)
        by_name = {d.name: d for d in self.drafters}
        return [(by_name[name], by_name[name].endpoint.call("propose", items)) for name, items in jobs.items()]

    def _gather_predraft(self, calls: list) -> dict:
        replies = {}
        for drafter, call in calls:
            try:
                replies.update({r.seq_id: r for r in call.result()})
            except WorkerDiedError:
                self._drafter_died(drafter)
        return replies

    def _keep_predraft(self, seq: Sequence, draft: SequenceDraft, result: VerifyResult, reply) -> None:
        """Keep the pipelined draft if its assumption held; tell what the drafter now holds."""
        if reply is None or reply.needs_sync:
            return
        k = len(draft.token_ids)
        self.drafter_length[seq.seq_id] = len(seq.tokens) + result.accepted  # what agrees
        guess = reply.token_ids[:1]
        if result.accepted == k and tuple(result.emitted[-1:]) == tuple(guess) and len(reply.token_ids) > 1:
            q = None if reply.q_draft is None else reply.q_draft[1:]
            self.ready_drafts[seq.seq_id] = SequenceDraft("model", list(reply.token_ids[1:]), q)
            self.pipeline_hits += 1
        else:
            self.pipeline_misses += 1

    # -- 5. commit ------------------------------------------------------------------------------

    def _commit(self, seq: Sequence, draft: SequenceDraft, result: VerifyResult):
        k = len(draft.token_ids)
        self.planners[self.replica_of[seq.seq_id].name].record(draft.source, k, result.accepted)
        emitted, reason = seq.commit(list(result.emitted), k, result.accepted, self.context_length)
        if reason is not None:
            self._finish(seq)
        update = SequenceUpdate(seq.seq_id, tuple(emitted), k, result.accepted, reason is not None, reason)
        return update, RoundReport(seq.seq_id, draft.source, k, result.accepted)

    def _finish(self, seq: Sequence) -> None:
        self.running.pop(seq.seq_id, None)
        self.ready_drafts.pop(seq.seq_id, None)
        if self.ngram_store is not None:
            self.ngram_store.add(seq.tokens)
        replica = self.replica_of.pop(seq.seq_id, None)
        if replica is not None:
            replica.sequences.discard(seq.seq_id)
            if replica.alive:
                replica.endpoint.call("close", [seq.seq_id])
        drafter = self.drafter_of.pop(seq.seq_id, None)
        self.drafter_length.pop(seq.seq_id, None)
        if drafter is not None:
            drafter.sequences.discard(seq.seq_id)
            if drafter.alive:
                drafter.endpoint.call("forget", [seq.seq_id])
