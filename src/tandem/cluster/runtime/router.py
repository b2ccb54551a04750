"""The cluster router: the batching engine's interface (add / cancel / step) over verifier
replicas in Ray actors, each running the one engine (cluster/runtime/replica.py), so the HTTP
server runs unchanged on top. No model runs here and no round is planned here. The router
- places each request by the cost rule (cluster/planning/stream_placement.py) or, where a
  replica holds its prefix, there (cluster/planning/affinity.py),
- relays each replica's updates (one poll in flight per replica), checking stop strings on the
  whole output (a stop cancels the placement),
- moves a stream to a replica holding fewer streams where it finishes sooner (an idle replica,
  a fast one at a run's tail; detached with the output it committed and, where the runners can
  save it, its KV state; re-submitted with both),
- watches health, hands every replica the live drafters, and when a replica dies re-submits
  each of its requests to a live one with the tokens already relayed appended to its prompt
  (nothing lost; greedy output unchanged; a seeded sampled request draws anew from there).
State is guarded by `lock`; worker calls are not waited for under it.
"""

import threading
from collections import Counter, deque
from typing import Callable

from tandem.cluster.planning.affinity import PrefixMemory
from tandem.cluster.runtime.endpoints import Pending, WorkerDiedError, wait_all, wait_any
from tandem.cluster.runtime.health import DEFAULT_PERIOD_S, HealthMonitor
from tandem.cluster.runtime.pool import Worker
from tandem.cluster.runtime.drafter_links import push_drafters
from tandem.cluster.runtime.replica import Detached, ReplicaNews
from tandem.cluster.runtime.replica_choice import choose_moves, choose_replica
from tandem.cluster.runtime.routed import Routed, client_report
from tandem.engine.events import SequenceUpdate, SpeculationOptions, StepReport, checked_options
from tandem.engine.request import GenerationRequest
from tandem.errors import TandemError
from tandem.models.cost import CostModel, CostView
from tandem.speculation.depth import Auto, Depth, parse_depth
from tandem.speculation.drafters.registry import USES_MODEL, check_drafter

NO_VERIFIER = ("no verifier is alive in the cluster, and none will restart (each is out of restarts): the "
               "server must be restarted")
NO_DRAFT_MODEL = "the cluster file has no worker with a draft_model"
MAX_EVENTS = 256  # failovers, moves and restarts kept for logs and tests
STEP_WAIT_S = 0.02  # how long step() waits for news before giving the engine thread back


class ClusterRouter:
    def __init__(self, verifiers: list[Worker], drafters: list[Worker], drafter: str = "hybrid",
                 depth: "Depth | str | int" = Auto(), max_running: int | None = None,
                 health_period_s: float = DEFAULT_PERIOD_S, rtt_between: Callable[[str, str], float] | None = None,
                 draft_ahead: bool = False):
        self.lock = threading.RLock()
        self.events: deque[str] = deque(maxlen=MAX_EVENTS)
        self.verifiers = verifiers
        self.drafter_workers = drafters
        self.default_drafter = check_drafter(drafter, bool(drafters), NO_DRAFT_MODEL)
        self.default_depth = parse_depth(depth)
        capacity = sum(w.max_slots for w in verifiers)
        self.max_running = min(max_running or capacity, capacity)
        self.context_length = min(w.context_length for w in verifiers)
        self.rtt_between = rtt_between or (lambda a, b: 0.0)
        self.draft_ahead = draft_ahead  # drafters draft round i+1 while round i verifies
        self.waiting: deque[Routed] = deque()
        self.routed: dict[str, Routed] = {}  # placed on a replica
        self._by_placement: dict[str, Routed] = {}
        self._polls: dict[str, Pending] = {}
        self._reports: deque[StepReport] = deque()
        self._prefixes = {w.name: PrefixMemory() for w in verifiers}
        self.decisions: Counter = Counter()  # (replica, reason) -> placements
        self.health = HealthMonitor(verifiers + drafters, self._worker_died, self.lock, self.events, health_period_s,
                                    self._worker_up)
        self._push_drafters(verifiers)

    # -- the engine worker's interface ----------------------------------------------------------

    @property
    def has_work(self) -> bool:
        with self.lock:
            return bool(self.waiting or self.routed or self._reports)

    @property
    def num_running(self) -> int:
        return len(self.routed)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def drafters(self) -> tuple[str, ...]:
        """The drafters a request may ask for: those needing a model only with drafter workers."""
        return tuple(name for name, uses_model in USES_MODEL.items() if self.drafter_workers or not uses_model)

    @property
    def kv_slots_in_use(self) -> int:
        return sum(len(w.sequences) for w in self.verifiers)

    @property
    def unavailable_reason(self) -> str | None:
        return None if any(w.alive or w.restarting for w in self.verifiers) else NO_VERIFIER

    def worker_states(self) -> list[dict]:
        states = [w.state() for w in self.verifiers + self.drafter_workers]
        decisions = dict(self.decisions)  # one copy (atomic): the health thread reads it beside the engine's
        for state in states:
            state["routed"] = {reason: n for (name, reason), n in decisions.items() if name == state["name"]}
        return states

    def validate(self, request: GenerationRequest, options: SpeculationOptions | None = None) -> None:
        options = checked_options(options)
        if len(request.prompt_ids) >= self.context_length:
            raise TandemError(f"a {len(request.prompt_ids)}-token prompt leaves no room for an answer in the context "
                              f"of {self.context_length} tokens: shorten the prompt")
        check_drafter(options.drafter or self.default_drafter, bool(self.drafter_workers), NO_DRAFT_MODEL)

    def add(self, seq_id: str, request: GenerationRequest, options: SpeculationOptions | None = None) -> None:
        options = checked_options(options)
        self.validate(request, options)
        options = SpeculationOptions(options.drafter or self.default_drafter,
                                     self.default_depth if options.k is None else options.k)
        with self.lock:
            self.waiting.append(Routed(seq_id, request, options))

    def cancel(self, seq_id: str) -> SequenceUpdate | None:
        with self.lock:
            routed = self.routed.get(seq_id) or next((r for r in self.waiting if r.seq_id == seq_id), None)
            if routed is None:
                return None
            if routed in self.waiting:
                self.waiting.remove(routed)
            else:
                self._end(routed, cancel=True)
            return SequenceUpdate(seq_id, (), finished=True, finish_reason="cancelled")

    def step(self) -> tuple[list[SequenceUpdate], StepReport | None]:
        """Place what waits, relay what the replicas sent (waiting up to STEP_WAIT_S for some);
        one replica step's report at a time."""
        self.health.start()  # launch_cluster starts it; a router built by hand starts it here
        updates: list[SequenceUpdate] = []
        with self.lock:
            self.health.revive()
            self._place(updates)
            self._rebalance()
            pending = self._start_polls() + [r.moving[2] for r in self.routed.values() if r.moving]
        if not updates and not self._reports:
            wait_any(pending, STEP_WAIT_S)
        with self.lock:
            self._take_news(updates)
            self._settle_moves(updates)
            return updates, self._reports.popleft() if self._reports else None

    def clear_caches(self) -> None:
        """Every replica forgets its retained prompt caches and the answers its drafters would
        copy, the router what they held (a benchmark starts each run cold)."""
        with self.lock:
            calls = [w.endpoint.call("clear_caches") for w in self.verifiers if w.alive]
            self._prefixes = {w.name: PrefixMemory() for w in self.verifiers}
        wait_all(calls)

    def close(self) -> None:
        """Stop the health monitor and take the polls in flight (the workers stay up, and a later
        router over them gets all their news)."""
        self.health.stop()
        with self.lock:
            polls, self._polls = list(self._polls.values()), {}
        wait_all(polls)

    # -- placement ------------------------------------------------------------------------------

    def _place(self, updates: list[SequenceUpdate]) -> None:
        if self.waiting and self.unavailable_reason:
            updates.extend(SequenceUpdate(r.seq_id, (), finished=True, finish_reason="unavailable", error=NO_VERIFIER)
                           for r in self.waiting)
            self.waiting.clear()
            return
        while self.waiting and len(self.routed) < self.max_running:
            replica, reason = choose_replica(self.verifiers, self.waiting[0], self._prefixes, self.routed.values())
            if replica is None:
                return  # replicas full or restarting: next step
            self._submit(self.waiting.popleft(), replica, reason)

    def _submit(self, routed: Routed, replica: Worker, reason: str, moved: Detached | None = None) -> None:
        replica.sequences.add(routed.next_placement(replica))
        self.routed[routed.seq_id] = routed
        self._by_placement[routed.placement] = routed
        self._prefixes[replica.name].add(routed.placement, routed.affinity_tokens)
        self.decisions[(replica.name, reason)] += 1
        replica.endpoint.call("add", routed.placement, routed.placement_request(), routed.options, moved)

    def _unplace(self, routed: Routed) -> None:
        """Take routed off its replica's books (what it computed stays remembered there)."""
        self._by_placement.pop(routed.placement, None)
        if routed.replica is not None:
            routed.replica.sequences.discard(routed.placement)
            self._prefixes[routed.replica.name].add(routed.placement, routed.affinity_tokens)
        if routed.moving is not None:
            routed.moving[0].sequences.discard(routed.slot_hold)
        routed.replica, routed.placement, routed.moving = None, None, None

    def _end(self, routed: Routed, cancel: bool = False) -> None:
        replica, placement = routed.replica, routed.placement
        self.routed.pop(routed.seq_id, None)
        self._unplace(routed)
        if cancel and replica is not None and replica.alive:
            replica.endpoint.call("cancel", [placement])

    def _requeue(self, routed: Routed, reason: str) -> None:
        """Back to the front of the queue, to be placed again with its output so far."""
        self.routed.pop(routed.seq_id, None)
        self._unplace(routed)
        routed.reason = reason
        self.waiting.appendleft(routed)

    # -- streams --------------------------------------------------------------------------------

    def _start_polls(self) -> list[Pending]:
        for replica in self.verifiers:
            if replica.alive and replica.name not in self._polls:
                self._polls[replica.name] = replica.endpoint.call("poll")
        return list(self._polls.values())

    def _take_news(self, updates: list[SequenceUpdate]) -> None:
        for replica in self.verifiers:
            pending = self._polls.get(replica.name)
            if pending is None or not pending.ready():
                continue
            del self._polls[replica.name]
            try:
                news: ReplicaNews = pending.result()
            except WorkerDiedError:
                self._worker_died(replica)
                continue
            replica.cost = CostView(CostModel.from_wire(news.cost_ms))
            for update in news.updates:
                routed = self._by_placement.get(update.seq_id)
                if routed is not None and routed.replica is replica:
                    self._relay(routed, update, updates)
            self._reports.extend(client_report(report, len(self.routed), len(self.waiting), tuple(self.worker_states()))
                                 for report in news.reports)

    def _relay(self, routed: Routed, update: SequenceUpdate, updates: list[SequenceUpdate]) -> None:
        updates.append(routed.take(update))
        if updates[-1].finished:
            self._end(routed, cancel=not update.finished)  # a stop string the replica did not see

    # -- moves ----------------------------------------------------------------------------------

    def _rebalance(self) -> None:
        """Detach, for each replica with fewer streams than another, the stream whose finish it
        brings forward most (replica_choice.choose_moves)."""
        if self.waiting:
            return  # waiting requests take an idle replica first
        for routed, target in choose_moves(self.verifiers, self.routed.values()):
            routed.moving = (target, routed.placement, routed.replica.endpoint.call("detach", routed.placement))
            target.sequences.add(routed.slot_hold)  # holds the slot: one move per idle replica at a time

    def _settle_moves(self, updates: list[SequenceUpdate]) -> None:
        for routed in [r for r in self.routed.values() if r.moving and r.moving[2].ready()]:
            target, placement, pending = routed.moving
            target.sequences.discard(routed.slot_hold)
            routed.moving = None
            try:
                detached = pending.result()
            except WorkerDiedError:
                continue  # the source died: the failover re-submits it
            if detached is None or routed.placement != placement:
                continue  # it finished there first: its last update comes with the next poll
            missing = detached.output[len(routed.output) - routed.base:]
            self._relay(routed, SequenceUpdate(placement, tuple(missing)), updates)
            if routed.seq_id not in self.routed:
                continue  # a stop string ended it
            self._requeue(routed, "move")  # already cancelled on its replica by the detach
            self.events.append(f"moved {routed.seq_id} to {target.name}")
            if target.alive and len(target.sequences) < target.max_slots:
                self._submit(self.waiting.popleft(), target, "move", detached)

    # -- health and failover --------------------------------------------------------------------

    def _worker_up(self, worker: Worker) -> None:
        """A restarted worker answered: a replica learns the drafters, replicas a drafter."""
        self.events.append(f"{worker.name} restarted (pid {worker.pid})")
        self._push_drafters([worker] if worker.role == "verify" else self.verifiers)

    def _push_drafters(self, replicas: list[Worker]) -> None:
        push_drafters(replicas, self.drafter_workers, self.rtt_between, self.draft_ahead)

    def set_draft_ahead(self, on: bool) -> None:
        with self.lock:
            self.draft_ahead = on
            self._push_drafters(self.verifiers)

    def _worker_died(self, worker: Worker) -> None:
        """The health monitor or a failed call found a worker dead (called with the lock held)."""
        if not worker.alive:
            return
        worker.mark_dead()  # forgets its placements, starts a replacement
        if worker.role != "verify":
            self.events.append(f"{worker.name} died; its sequences draft elsewhere")
            self._push_drafters(self.verifiers)
            return
        replica = worker
        self._polls.pop(replica.name, None)
        self._prefixes[replica.name] = PrefixMemory()  # a new process holds nothing
        orphans = [r for r in self.routed.values() if r.replica is replica]
        for routed in reversed(orphans):
            self._requeue(routed, "failover")
        self.events.append(f"{replica.name} died; re-submitting {len(orphans)} requests with their committed tokens")
