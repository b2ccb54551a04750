"""The cluster coordinator: the batching engine's interface (add / cancel / step) over verifier
and drafter workers in other processes (Ray actors), so the HTTP server runs unchanged on top.

It owns every sequence's token ids and sends deltas (cluster/runtime/messages.py). A step
1. re-places sequences whose verifier died and admits new ones: each goes to the live verifier
   replica with the least expected completion time (its sequences x its profiled step cost,
   among those with a free slot), which prefills it from the coordinator's token ids,
2. plans k per sequence with each replica's planner, whose costs are the replica's curve plus
   the network round trips of the step (a long round trip makes longer drafts pay),
3. drafts through the same drafters as the single-process engine (engine/stages.py): n-gram
   copies locally, model drafts on drafter workers (cluster/runtime/remote_draft.py),
4. verifies on every replica concurrently, one batched call per replica,
5. commits the returned tokens through the engine's commit stage (stops, planner, reports).
With `draft_ahead`, drafters draft round i+1 while round i verifies (remote_draft.py).
A verifier that dies mid-step loses nothing: its sequences' rounds are dropped (the coordinator
had not committed them) and they re-prefill on another replica next step. A drafter that dies
only costs its sequences their drafts for a round. Dead workers are restarted in the background;
only when no verifier is left do requests fail (the server answers 503).
"""

import time
from collections import deque

from tandem.cluster.runtime.endpoints import WorkerDiedError
from tandem.cluster.runtime.messages import VerifyItem, VerifyResult
from tandem.cluster.runtime.pool import Worker
from tandem.cluster.runtime.remote_draft import MAX_EVENTS, RemoteDraftModel
from tandem.engine.events import SequenceUpdate, StepReport
from tandem.engine.sequence import Sequence
from tandem.engine.sequence_pool import SequencePool
from tandem.engine.stages import commit_round, draft_all, plan_drafts
from tandem.speculation.batch_depth import BatchDepthPlanner
from tandem.speculation.depth import Auto, Depth, parse_depth
from tandem.speculation.drafters.base import SequenceDraft
from tandem.speculation.drafters.registry import build_drafters

NO_VERIFIER = "no verifier is alive in the cluster"


class ClusterEngine(SequencePool):
    def __init__(self, verifiers: list[Worker], drafters: list[Worker], drafter: str = "hybrid",
                 depth: "Depth | str | int" = Auto(), ngram_store=None, max_running: int | None = None,
                 draft_ahead: bool = False):
        self.events: deque[str] = deque(maxlen=MAX_EVENTS)  # failovers and restarts, for logs and tests
        self.remote = RemoteDraftModel(drafters, self.events)
        super().__init__(build_drafters(self.remote if drafters else None, ngram_store), ngram_store)
        self.verifiers = verifiers
        self.drafter_workers = drafters
        self.default_drafter = drafter
        self.default_depth = parse_depth(depth)
        capacity = sum(w.max_slots for w in verifiers)
        self.max_running = min(max_running or capacity, capacity)
        self.context_length = min(w.context_length for w in verifiers)
        self.planners = {w.name: BatchDepthPlanner(w.cost, None) for w in verifiers}
        self.replica_of: dict[str, Worker] = {}
        self.draft_ahead = draft_ahead

    # -- the worker thread's interface (the rest is SequencePool's) --------------------------

    @property
    def unavailable_reason(self) -> str | None:
        if any(w.alive or w.restarting for w in self.verifiers):
            return None
        return NO_VERIFIER

    def worker_states(self) -> list[dict]:
        return [w.state() for w in self.verifiers + self.drafter_workers]

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
        ahead = self.remote.start_ahead(placed, drafts) if self.draft_ahead else []
        results = self._gather_verify(verify_calls)
        predrafts = self.remote.gather_ahead(ahead)
        verify_seconds = time.perf_counter() - verify_start
        rounds = []
        for seq in placed:
            result = results.get(seq.seq_id)
            if result is not None:
                self.remote.keep_ahead(seq, drafts[seq.seq_id], result, predrafts.get(seq.seq_id))
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
        for worker in self.verifiers + self.drafter_workers:
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

    # -- 2-3. planning and drafting ------------------------------------------------------------

    def _draft(self, seqs: list[Sequence]) -> dict[str, SequenceDraft]:
        """Plan each replica's sequences with its own planner, then draft them all at once."""
        jobs = []
        for replica in self.verifiers:
            group = [seq for seq in seqs if self.replica_of.get(seq.seq_id) is replica]
            if group:
                jobs += plan_drafts(group, self.drafters, self._planner_for(replica, group), self.context_length)
        drafts = draft_all(jobs, self.drafters)
        self.remote.ready.clear()  # drafts made ahead that this round did not use are stale
        return {job.seq.seq_id: draft for job, draft in zip(jobs, drafts)}

    def _planner_for(self, replica: Worker, group: list[Sequence]) -> BatchDepthPlanner:
        planner = self.planners[replica.name]
        planner.target = replica.cost  # replaced when the replica restarts
        drafters = [self.remote.drafter_of.get(seq.seq_id) for seq in group]
        drafters = [d for d in drafters if d is not None and d.alive] or [d for d in self.drafter_workers if d.alive]
        planner.draft = drafters[0].cost if drafters else None
        planner.overhead_ms = replica.rtt_ms + max((d.rtt_ms for d in drafters), default=0.0)
        return planner

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

    # -- 5. commit ------------------------------------------------------------------------------

    def _commit(self, seq: Sequence, draft: SequenceDraft, result: VerifyResult):
        planner = self.planners[self.replica_of[seq.seq_id].name]
        update, report, reason = commit_round(seq, draft, list(result.emitted), result.accepted,
                                              planner, self.context_length)
        if reason is not None:
            self._finish(seq)
        return update, report

    def _finish(self, seq: Sequence) -> None:
        self.retire(seq)
        replica = self.replica_of.pop(seq.seq_id, None)
        if replica is not None:
            replica.sequences.discard(seq.seq_id)
            if replica.alive:
                replica.endpoint.call("close", [seq.seq_id])
        self.remote.forget(seq.seq_id)
