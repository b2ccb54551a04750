"""The cluster coordinator: the batching engine's interface (add / cancel / step) over verifier
and drafter workers in other processes (Ray actors), so the HTTP server runs unchanged on top.

It owns every sequence's token ids and sends deltas (cluster/runtime/messages.py). A sequence is
placed on the live verifier replica, among those with a free slot, with the least expected
completion time (its cost of a step with one more sequence), unless a replica would otherwise
idle and one stream there is worth more (cluster/planning/stream_placement.py); that replica
prefills it from the coordinator's token ids. Then each round of that replica
1. plans k per sequence with the replica's planner, whose costs are the replica's curve plus
   the network round trips (a long round trip makes longer drafts pay),
2. drafts through the same drafters as the single-process engine (engine/stages.py): n-gram
   copies locally, model drafts on drafter workers (cluster/runtime/remote_draft.py),
3. verifies on the replica, one batched call,
4. commits the returned tokens through the engine's commit stage (stops, planner, reports).

Two loops run these rounds (`loop`):
- `independent` (default): each replica runs its rounds on its own clock, in its own thread
  (cluster/runtime/replica_loop.py); drafters take draft requests from any replica as they come,
  batching those that wait (cluster/runtime/draft_batcher.py). `step()` places sequences and
  hands the engine thread one finished round at a time.
- `lockstep`: `step()` runs one round of every replica together; the fastest waits for the
  slowest. Kept as the reference the independent loop is measured against.
With `draft_ahead`, drafters draft round i+1 while round i verifies (remote_draft.py).

State shared between the engine thread, the replica loops and the health monitor is guarded by
`lock`; no call to a worker is waited for while holding it, except in the lock-step loop.
A verifier that dies mid-round loses nothing: its rounds are dropped (the coordinator had not
committed them) and its sequences re-prefill on another replica. A drafter that dies only costs
its sequences their drafts for a round. The health monitor (cluster/runtime/health.py) pings
every worker on a fixed period, busy or idle, and restarts dead ones in the background; only
when no verifier is left do requests fail (the server answers 503).
"""

import threading
import time
from collections import deque

from tandem.cluster.planning.stream_placement import Candidate, choose
from tandem.cluster.runtime.endpoints import WorkerDiedError
from tandem.cluster.runtime.health import DEFAULT_PERIOD_S, HealthMonitor
from tandem.cluster.runtime.messages import VerifyItem, VerifyResult
from tandem.cluster.runtime.pool import Worker
from tandem.cluster.runtime.remote_draft import MAX_EVENTS, RemoteDraftModel
from tandem.cluster.runtime.replica_loop import ReplicaLoop
from tandem.engine.events import SequenceUpdate, SpeculationOptions, StepReport
from tandem.engine.request import GenerationRequest
from tandem.engine.sequence import Sequence
from tandem.engine.sequence_pool import SequencePool
from tandem.engine.stages import commit_round, draft_all, plan_drafts
from tandem.errors import TandemError
from tandem.speculation.batch_depth import BatchDepthPlanner
from tandem.speculation.depth import Auto, Depth, parse_depth
from tandem.speculation.drafters.base import SequenceDraft
from tandem.speculation.drafters.registry import build_drafters

NO_VERIFIER = "no verifier is alive in the cluster"
LOOPS = ("independent", "lockstep")
ROUND_WAIT_S = 0.02  # how long step() waits for a replica's round before giving the engine thread back
REFILL_WAIT_S = 0.05  # how long a replica that freed slots waits for the engine thread to refill them


def check_loop(loop: str) -> str:
    if loop not in LOOPS:
        raise TandemError(f"unknown cluster loop {loop!r}; choose from {', '.join(LOOPS)}")
    return loop


class ClusterEngine(SequencePool):
    def __init__(self, verifiers: list[Worker], drafters: list[Worker], drafter: str = "hybrid",
                 depth: "Depth | str | int" = Auto(), ngram_store=None, max_running: int | None = None,
                 draft_ahead: bool = False, loop: str = "independent", health_period_s: float = DEFAULT_PERIOD_S):
        self.lock = threading.RLock()
        self.events: deque[str] = deque(maxlen=MAX_EVENTS)  # failovers and restarts, for logs and tests
        self.remote = RemoteDraftModel(drafters, self.events, self.lock)
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
        self.loop = check_loop(loop)
        self._rounds_done: deque[tuple[list[SequenceUpdate], StepReport]] = deque()
        self._round_done = threading.Condition(self.lock)
        self._loops: dict[str, ReplicaLoop] = {}
        self._steps_entered = 0  # step() calls so far: replica loops wait for the next after freeing slots
        # per replica: sequences placed there and not yet prefilled; sequences gone whose slot the
        # replica's loop frees before its next calls
        self._to_open: dict[str, list[str]] = {w.name: [] for w in verifiers}
        self._closing: dict[str, list[str]] = {w.name: [] for w in verifiers}
        self.health = HealthMonitor(verifiers + drafters, self._worker_died, self.lock, self.events, health_period_s)

    # -- the worker thread's interface (the rest is SequencePool's) --------------------------

    @property
    def has_work(self) -> bool:
        """Sequences to run, or finished rounds the engine thread has not taken yet."""
        with self.lock:
            return bool(self.waiting or self.running or self._rounds_done)

    @property
    def kv_slots_in_use(self) -> int:
        """Sequences holding a KV slot on a verifier replica."""
        return sum(len(replica.sequences) for replica in self.verifiers)

    @property
    def unavailable_reason(self) -> str | None:
        if any(w.alive or w.restarting for w in self.verifiers):
            return None
        return NO_VERIFIER

    def worker_states(self) -> list[dict]:
        return [w.state() for w in self.verifiers + self.drafter_workers]

    def add(self, seq_id: str, request: GenerationRequest, options: SpeculationOptions = SpeculationOptions()) -> None:
        with self.lock:
            super().add(seq_id, request, options)

    def cancel(self, seq_id: str) -> SequenceUpdate | None:
        with self.lock:
            return super().cancel(seq_id)

    def step(self) -> tuple[list[SequenceUpdate], StepReport | None]:
        """Independent loop: place sequences, then hand back one replica round that finished
        (waiting up to ROUND_WAIT_S for one; None when none did). Lock-step: one round of all."""
        self.health.start()  # launch_cluster starts it; a coordinator built by hand starts it here
        if self.loop == "lockstep":
            if self._loops:  # switched from the independent loop: its threads must not run rounds too
                self._stop_loops()
            with self.lock:
                return self._lockstep_step()
        with self.lock:
            self._steps_entered += 1
            self._revive()
            updates: list[SequenceUpdate] = []
            self._place(updates)
            self._start_loops()
            self._round_done.notify_all()  # loops waiting for this step (and its placements) go on
            if not self._rounds_done and not updates:
                self._round_done.wait(ROUND_WAIT_S)
            if self._rounds_done:
                more, report = self._rounds_done.popleft()
                return updates + more, report
            return updates, None

    def close(self) -> None:
        """Stop the replica loops and the health monitor (the workers stay up; a later step
        starts them again)."""
        self.health.stop()
        self._stop_loops()

    def _stop_loops(self) -> None:
        with self.lock:
            loops, self._loops = list(self._loops.values()), {}
            for loop in loops:
                loop.stop()
            self._round_done.notify_all()
        for loop in loops:
            loop.join()
        calls = []
        with self.lock:  # slots of sequences that left after their loop's last round
            for replica in self.verifiers:
                closing, self._closing[replica.name] = self._closing[replica.name], []
                if closing and replica.alive:
                    calls.append(replica.endpoint.call("close", closing))
        for call in calls:  # done when close() returns: the next user finds the slots and caches free
            try:
                call.result()
            except WorkerDiedError:
                pass  # a new process holds nothing

    # -- placement and failover ---------------------------------------------------------------

    def _revive(self) -> None:
        for worker in self.verifiers + self.drafter_workers:
            if worker.restarting and worker.poll_ready():
                self.events.append(f"{worker.name} restarted (pid {worker.pid})")

    def _place(self, updates: list[SequenceUpdate]) -> None:
        """Place orphaned and waiting sequences on replicas (they prefill there); fail them if no
        verifier is left."""
        orphans = [seq for seq in self.running.values() if seq.seq_id not in self.replica_of]
        while self.waiting and len(self.running) < self.max_running:
            seq = self.waiting.popleft()
            self.running[seq.seq_id] = seq
            orphans.append(seq)
        if not orphans:
            return
        if self.unavailable_reason:
            for seq in orphans:
                del self.running[seq.seq_id]
                updates.append(SequenceUpdate(seq.seq_id, (), finished=True, finish_reason="error", error=NO_VERIFIER))
            return
        for seq in orphans:
            replica = self._choose_replica(seq)
            if replica is None:
                break  # replicas restarting or full: try again next step
            replica.sequences.add(seq.seq_id)
            self._to_open[replica.name].append(seq.seq_id)
            self.replica_of[seq.seq_id] = replica
        self._round_done.notify_all()  # wakes idle replica loops

    def _choose_replica(self, seq: Sequence) -> Worker | None:
        """Least expected completion time for the new sequence, the cost of the step it would
        share with the replica's sequences (a flat accelerator curve fills the fast replica
        first; a compute-bound one spreads sequences until their steps cost the same), unless a
        replica would otherwise idle and one stream there serves more requests per second
        (cluster/planning/stream_placement.py). Ties go to the replica listed first."""
        live = [w for w in self.verifiers if w.alive and len(w.sequences) < w.max_slots]
        candidates = [Candidate(len(w.sequences), w.cost.cost.cost_ms(len(seq.tokens)), w.cost.cost.cost_ms)
                      for w in live]
        chosen = choose(candidates, seq.room)
        return None if chosen is None else live[chosen]

    def _worker_died(self, worker: Worker) -> None:
        """The health monitor or a failed call found a worker dead (called with the lock held)."""
        if worker.role == "verify":
            self._verifier_died(worker)
        else:
            self.remote.drafter_died(worker)

    def _verifier_died(self, replica: Worker) -> None:
        if not replica.alive:
            return
        orphans = replica.mark_dead()
        self._to_open[replica.name], self._closing[replica.name] = [], []  # a new process holds nothing
        for seq_id in orphans:
            self.replica_of.pop(seq_id, None)
        self.events.append(f"{replica.name} died; re-placing {len(orphans)} sequences")

    def _open(self, replica: Worker) -> list[str]:
        """Free the slots of sequences that left, prefill those placed here; the opened ids.
        Called by the loop that owns the replica, without the lock while the calls run."""
        return self._opened(replica, self._start_open(replica))

    def _start_open(self, replica: Worker) -> list:
        with self.lock:
            closing, self._closing[replica.name] = self._closing[replica.name], []
            to_open, self._to_open[replica.name] = self._to_open[replica.name], []
            if closing and replica.alive:
                replica.endpoint.call("close", closing)  # first: the opens need the slots
            calls = []
            for seq_id in to_open:
                seq = self.running.get(seq_id)
                if seq is not None and self.replica_of.get(seq_id) is replica:
                    calls.append((seq_id, replica.endpoint.call("open", seq_id, list(seq.tokens))))
            return calls

    def _opened(self, replica: Worker, calls: list) -> list[str]:
        opened = []
        for seq_id, call in calls:
            try:
                call.result()
            except WorkerDiedError:
                with self.lock:
                    self._verifier_died(replica)
                return []
            opened.append(seq_id)
        return opened

    # -- planning and drafting ------------------------------------------------------------------

    def _ready_group(self, replica: Worker) -> list[Sequence]:
        """The replica's sequences that are prefilled and still running (lock held)."""
        return [self.running[s] for s in replica.sequences
                if s in self.running and s not in self._to_open[replica.name] and self.replica_of.get(s) is replica]

    def _plan(self, replica: Worker, group: list[Sequence]) -> list:
        return plan_drafts(group, self.drafters, self._planner_for(replica, group), self.context_length)

    def _planner_for(self, replica: Worker, group: list[Sequence]) -> BatchDepthPlanner:
        planner = self.planners[replica.name]
        planner.target = replica.cost  # replaced when the replica restarts
        drafters = [self.remote.drafter_of.get(seq.seq_id) for seq in group]
        drafters = [d for d in drafters if d is not None and d.alive] or [d for d in self.drafter_workers if d.alive]
        planner.draft = drafters[0].cost if drafters else None
        planner.overhead_ms = replica.rtt_ms + max((d.rtt_ms for d in drafters), default=0.0)
        return planner

    def _drafts(self, jobs: list) -> dict[str, SequenceDraft]:
        """Draft for jobs (no lock held: model drafts wait on drafter workers)."""
        drafts = draft_all(jobs, self.drafters)
        with self.lock:  # drafts made ahead that this round did not use are stale
            self.remote.discard_ready([job.seq.seq_id for job in jobs])
        return {job.seq.seq_id: draft for job, draft in zip(jobs, drafts)}

    # -- verification and commit ----------------------------------------------------------------

    @staticmethod
    def _verify_items(group: list[Sequence], drafts: dict[str, SequenceDraft]) -> list[VerifyItem]:
        return [VerifyItem(seq.seq_id, len(seq.tokens), tuple(drafts[seq.seq_id].token_ids), seq.request.sampling,
                           drafts[seq.seq_id].q_draft) for seq in group]

    def _observe_cost(self, replica: Worker, replies: list[VerifyResult]) -> None:
        if replies and replies[0].batch_tokens:  # a replica that slows down is noticed
            replica.cost.cost.observe(replies[0].batch_tokens, replies[0].step_ms)

    def _commit(self, replica: Worker, seq: Sequence, draft: SequenceDraft, result: VerifyResult):
        update, report, reason = commit_round(seq, draft, list(result.emitted), result.accepted,
                                              self.planners[replica.name], self.context_length)
        if reason is not None:
            self._finish(seq)
        return update, report

    def _finish(self, seq: Sequence) -> None:
        self.retire(seq)
        replica = self.replica_of.pop(seq.seq_id, None)
        if replica is not None:
            replica.sequences.discard(seq.seq_id)
            if replica.alive:
                self._closing[replica.name].append(seq.seq_id)  # freed by the replica's loop, after its calls
        self.remote.forget(seq.seq_id)

    def _report(self, started_at: float, start: float, prefill_s: float, draft_s: float, verify_s: float,
                drafts: dict[str, SequenceDraft], rounds: list, prefilled: list[str]) -> StepReport:
        return StepReport(started_at, time.perf_counter() - start, prefill_s, draft_s, verify_s, len(self.running),
                          len(self.waiting), sum(len(d.token_ids) + 1 for d in drafts.values()), tuple(rounds),
                          tuple(prefilled), tuple(self.worker_states()))

    # -- the independent loop -------------------------------------------------------------------

    def _start_loops(self) -> None:
        for replica in self.verifiers:
            if replica.name not in self._loops:
                self._loops[replica.name] = ReplicaLoop(self, replica).start()

    def wait_for_work(self, replica: Worker, timeout: float) -> None:
        """A replica loop with nothing to do sleeps until a placement (or timeout)."""
        with self.lock:
            if not self._to_open[replica.name] and not self._closing[replica.name] and not self._ready_group(replica):
                self._round_done.wait(timeout)

    def replica_round(self, replica: Worker) -> bool:
        """One round of one replica, on its loop's thread; False when it had nothing to do."""
        started_at, start = time.time(), time.perf_counter()
        prefilled = self._open(replica)
        prefill_s = time.perf_counter() - start
        with self.lock:
            group = self._ready_group(replica) if replica.alive else []
            jobs = self._plan(replica, group) if group else []
        if not group:
            if prefilled:
                self._post([], self._report(started_at, start, prefill_s, 0.0, 0.0, {}, [], prefilled))
            return bool(prefilled)
        draft_start = time.perf_counter()
        drafts = self._drafts(jobs)
        verify_start = time.perf_counter()
        with self.lock:
            call = replica.endpoint.call("verify", self._verify_items(group, drafts))
        ahead = self.remote.start_ahead(group, drafts) if self.draft_ahead else []
        try:
            replies = call.result()
        except WorkerDiedError:
            self.remote.gather_ahead(ahead)
            with self.lock:
                self._verifier_died(replica)  # its rounds are dropped; nothing was committed
            return True
        predrafts = self.remote.gather_ahead(ahead)
        verify_s = time.perf_counter() - verify_start
        with self.lock:
            self._observe_cost(replica, replies)
            updates, rounds = [], []
            for seq, result in zip(group, replies):
                if self.running.get(seq.seq_id) is not seq or self.replica_of.get(seq.seq_id) is not replica:
                    continue  # cancelled meanwhile
                self.remote.keep_ahead(seq, drafts[seq.seq_id], result, predrafts.get(seq.seq_id))
                update, report = self._commit(replica, seq, drafts[seq.seq_id], result)
                updates.append(update)
                rounds.append(report)
            self._post(updates, self._report(started_at, start, prefill_s, verify_start - draft_start, verify_s,
                                             drafts, rounds, prefilled))
            if any(update.finished for update in updates):
                self._let_slots_refill()
        return True

    def _let_slots_refill(self) -> None:
        """A round freed slots: before the replica's next round, let the engine thread take this
        one and come back to step(), so requests added meanwhile (a closed loop's next one) are
        placed and join that round rather than the one after (lock held)."""
        target = self._steps_entered + 1
        deadline = time.monotonic() + REFILL_WAIT_S
        while self._steps_entered < target and (left := deadline - time.monotonic()) > 0:
            self._round_done.wait(left)

    def round_failed(self, replica: Worker, message: str) -> None:
        """A round raised: its replica's sequences end with the error (the server keeps going)."""
        with self.lock:
            failed = [self.running[s] for s in list(replica.sequences) if s in self.running]
            for seq in failed:
                self._finish(seq)
            updates = [SequenceUpdate(seq.seq_id, (), finished=True, finish_reason="error", error=message)
                       for seq in failed]
            self._post(updates, self._report(time.time(), time.perf_counter(), 0.0, 0.0, 0.0, {}, [], []))

    def _post(self, updates: list[SequenceUpdate], report: StepReport) -> None:
        with self.lock:
            self._rounds_done.append((updates, report))
            self._round_done.notify_all()

    # -- the lock-step loop -----------------------------------------------------------------------

    def _lockstep_step(self) -> tuple[list[SequenceUpdate], StepReport]:
        started_at, start = time.time(), time.perf_counter()
        self._revive()
        updates: list[SequenceUpdate] = []
        self._place(updates)
        opening = [(replica, self._start_open(replica)) for replica in self.verifiers if replica.alive]
        prefilled = [seq_id for replica, calls in opening for seq_id in self._opened(replica, calls)]
        prefill_s = time.perf_counter() - start
        groups = [(replica, self._ready_group(replica)) for replica in self.verifiers if replica.alive]
        groups = [(replica, group) for replica, group in groups if group]
        draft_start = time.perf_counter()
        drafts = self._drafts([job for replica, group in groups for job in self._plan(replica, group)])
        verify_start = time.perf_counter()
        calls = [(replica, group, replica.endpoint.call("verify", self._verify_items(group, drafts)))
                 for replica, group in groups]
        placed = [seq for _, group in groups for seq in group]
        ahead = self.remote.start_ahead(placed, drafts) if self.draft_ahead else []
        results: dict[str, tuple[Worker, VerifyResult]] = {}
        for replica, group, call in calls:
            try:
                replies = call.result()
            except WorkerDiedError:
                self._verifier_died(replica)  # its rounds are dropped; nothing was committed
                continue
            self._observe_cost(replica, replies)
            results.update({r.seq_id: (replica, r) for r in replies})
        predrafts = self.remote.gather_ahead(ahead)
        verify_s = time.perf_counter() - verify_start
        rounds = []
        for seq in placed:
            if seq.seq_id in results:
                replica, result = results[seq.seq_id]
                self.remote.keep_ahead(seq, drafts[seq.seq_id], result, predrafts.get(seq.seq_id))
                update, report = self._commit(replica, seq, drafts[seq.seq_id], result)
                updates.append(update)
                rounds.append(report)
        return updates, self._report(started_at, start, prefill_s, verify_start - draft_start, verify_s, drafts,
                                     rounds, prefilled)
