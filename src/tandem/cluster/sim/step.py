"""One coordinator stepping its verifier replicas: the simulated twin of an engine step.

A step, as cluster/runtime/coordinator.py runs it (engine/batch_engine.py now prefills in
chunks under --step-tokens; the coordinator and this twin admit whole prompts):
1. admit: each replica takes waiting sequences into free batch slots (PREFILL_TOKEN_BUDGET
   prompt tokens a step, at least one sequence) and prefills them in one call,
2. plan: each replica's depth planner picks k for every running sequence,
3. draft: one lock-step call per drafter for the sequences that need fresh drafts (n-gram
   drafts are free); with draft_ahead, drafts made ahead and still valid are used instead,
4. verify: one batched call per replica,
5. commit: acceptance is drawn per sequence, tokens are emitted, finished sequences leave;
   the next step starts after the step overhead.
Every call pays the round trip between the coordinator and the device it runs on. The parts of
phases 1, 3 and 4 run in parallel and each phase waits for its slowest part.
"""

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import numpy as np

from tandem.cluster.sim.config import Simulation
from tandem.cluster.sim.events import EventQueue, Join
from tandem.cluster.sim.metrics import Recorder
from tandem.cluster.sim.planning import candidate, draft_call_ms, levels, verify_ms
from tandem.cluster.sim.state import Predraft, Replica, SimSequence
from tandem.cluster.sim.timeline import remote_call


@dataclass(slots=True)
class StepContext:
    """What every step group shares with the simulator."""

    sim: Simulation
    events: EventQueue
    rng: np.random.Generator  # acceptance draws
    recorder: Recorder
    on_finish: Callable[[SimSequence, float], None]


class StepGroup:
    def __init__(self, ctx: StepContext, replicas: list[Replica], router_group: str):
        self.ctx = ctx
        self.replicas = replicas
        self.router_group = router_group
        self.busy = False
        self._round: list[tuple[Replica, SimSequence, int]] = []  # (replica, sequence, k)

    def rtt_ms(self, group: str) -> float:
        return self.ctx.sim.network.rtt_ms(self.router_group, group)

    def kick(self, now: float) -> None:
        """Start a step if none is running and there is work."""
        if not self.busy and any(r.has_work for r in self.replicas):
            self.busy = True
            self._admit(now)

    # -- 1. admission and prefill -------------------------------------------------------------

    def _admit(self, now: float) -> None:
        calls = [(r, self._take_waiting(r)) for r in self.replicas]
        calls = [(r, seqs) for r, seqs in calls if seqs]
        if not calls:
            self._plan(now)
            return
        join = Join(len(calls), self._plan)
        for replica, seqs in calls:
            prefill_ms = replica.spec.device.prompt_ms([s.prompt_tokens - 1 for s in seqs])
            remote_call(self.ctx.events, now, self.rtt_ms(replica.spec.device.group), replica.device,
                        prefill_ms, join.done)

    def _take_waiting(self, replica: Replica) -> list[SimSequence]:
        taken, budget = [], self.ctx.sim.prefill_token_budget
        while replica.waiting and len(replica.running) < replica.spec.max_batch:
            seq = replica.waiting[0]
            if taken and seq.prompt_tokens > budget:
                break
            replica.waiting.popleft()
            replica.running.append(seq)
            taken.append(seq)
            budget -= seq.prompt_tokens
        return taken

    # -- 2-3. planning and drafting -----------------------------------------------------------

    def _plan(self, now: float) -> None:
        self._round = []
        for replica in self.replicas:
            if replica.running:
                depth = self.ctx.sim.depth
                ks, _ = replica.planner.plan([candidate(s, replica.drafter, depth) for s in replica.running])
                self._round += [(replica, seq, k) for seq, k in zip(replica.running, ks)]
        parts = self._draft_parts(now)
        join = Join(len(parts) + 1, self._verify)
        for start in parts:
            start(join.done)  # each part calls back when its drafts reach the coordinator
        join.done(now)

    def _draft_parts(self, now: float) -> list[Callable]:
        """One part per drafter call and per set of drafts made ahead; each calls back when its
        drafts reach the coordinator."""
        fresh: dict[int, list[tuple[Replica, SimSequence, int]]] = {}
        ahead: dict[int, list[tuple[Replica, SimSequence, int]]] = {}
        for job in self._round:
            replica, seq, k = job
            made, seq.predraft, seq.pending = seq.predraft, None, None
            if made is not None and not made.job.done_by(now):
                replica.drafter_device.cancel(made.job, now)  # still drafting: too late, dropped
                made = None
            if k == 0 or not replica.drafter.uses_model:
                continue
            if made is not None and made.k >= k:
                seq.pending = made
                ahead.setdefault(id(replica.drafter_device), []).append(job)
            else:
                fresh.setdefault(id(replica.drafter_device), []).append(job)
        parts = [self._fresh_call(now, jobs) for jobs in fresh.values()]
        return parts + [self._made_ahead(now, jobs) for jobs in ahead.values()]

    def _fresh_call(self, now: float, jobs: list) -> Callable:
        replica = jobs[0][0]
        drafter = replica.drafter
        ks = [k for _, _, k in jobs]
        call_ms = draft_call_ms(drafter.device, [s.unseen_by_drafter() for _, s, _ in jobs], ks)
        rtt = self.rtt_ms(drafter.device.group)
        ahead = None
        if self.ctx.sim.draft_ahead and replica.can_draft_ahead:
            ahead = partial(self._draft_ahead, jobs, rtt=rtt)
        return partial(remote_call, self.ctx.events, now, rtt, replica.drafter_device, call_ms,
                       on_device_done=ahead)

    def _made_ahead(self, now: float, jobs: list) -> Callable:
        """Drafts already made: ready when they arrive; the drafter goes on one round ahead."""
        ready = max(seq.pending.ready_ms for _, seq, _ in jobs)
        finished = max(seq.pending.job.end_ms for _, seq, _ in jobs)
        self._draft_ahead(jobs, finished, self.rtt_ms(jobs[0][0].drafter.device.group))
        return partial(self.ctx.events.push, max(ready, now))

    def _draft_ahead(self, jobs: list, device_free_ms: float, rtt: float) -> None:
        """The drafter drafts the next round of these sequences in the background, assuming
        every draft of this round is accepted; a call that arrives meanwhile preempts it."""
        replica = jobs[0][0]
        draft_ms = replica.drafter.device.lockstep_draft_ms(levels([k for _, _, k in jobs]))
        work = replica.drafter_device.reserve_background(device_free_ms, draft_ms)
        for _, seq, k in jobs:
            seq.pending = Predraft(k, work, work.end_ms + rtt / 2)

    # -- 4. verification ----------------------------------------------------------------------

    def _verify(self, now: float) -> None:
        busy = [r for r in self.replicas if r.running]
        if not busy:
            self._commit(now)
            return
        join = Join(len(busy), self._commit)
        for replica in busy:
            ks = [k for r, _, k in self._round if r is replica]
            remote_call(self.ctx.events, now, self.rtt_ms(replica.spec.device.group), replica.device,
                        verify_ms(replica.spec.device, ks), join.done)

    # -- 5. commit ----------------------------------------------------------------------------

    def _commit(self, now: float) -> None:
        for replica, seq, k in self._round:
            run = replica.drafter.acceptance.draw_run(self.ctx.rng) if k else 0
            accepted = min(run, k)
            if k:
                replica.planner.record(replica.drafter.source, k, accepted)
            made_ahead, seq.pending = seq.pending, None
            if made_ahead is not None:
                if run > k:
                    seq.predraft = made_ahead  # the whole round and the bonus token matched
                else:  # the drafter hears of the rejection half a round trip later
                    replica.drafter_device.cancel(made_ahead.job, now + self.rtt_ms(replica.drafter.device.group) / 2)
            if replica.drafter is not None and replica.drafter.uses_model and k:
                seq.drafter_seen = seq.context + accepted
            emitted = min(accepted + 1, seq.remaining)
            self.ctx.recorder.round(seq, now, k, accepted, emitted)
            seq.emitted += emitted
            if seq.remaining == 0:
                replica.running.remove(seq)
                self.ctx.on_finish(seq, now)
        self._round = []
        self.ctx.events.push(now + self.ctx.sim.step_overhead_ms, self._next)

    def _next(self, now: float) -> None:
        self.busy = False
        self.kick(now)
