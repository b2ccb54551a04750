"""`simulate(Simulation) -> SimResult`: run a cluster through a workload on the event loop.

Requests arrive (Poisson, or closed-loop clients that send the next request when one finishes;
with conversations a client's next request is its conversation's next turn, until it ends),
are placed by the router on a verifier replica with a free batch slot (routing.py; while all are
full they wait in the router's queue) and are stepped by their replica's engine (step.py) until
they have emitted their output length. While none waits, the router moves a stream to a replica
holding fewer where it finishes sooner (moves.py), looking whenever a replica's load changes (a
placement, a finish): the runtime's router looks every step, but its rule only turns on the
loads, and looking after every step of 64 replicas made a scaling sweep 30x slower. Time is
simulated in milliseconds.

Two random streams come from the seed: one draws the workload (arrival times, prompt and output
lengths, all drawn up front), one draws acceptance. So two clusters simulated with one seed see
the same requests, and a run is a pure function of its Simulation.
Calls are priced at the mean context their sequences hold (from_profile.py, step.py). Not
modelled: KV-cache limits beyond max_batch, stop tokens (every request runs to its output
length), failures, the prompt cache's byte bound (a replica holds every history and opening it
scored: step.py).
"""

from collections import deque

import numpy as np

from tandem.cluster.sim.config import Simulation, Workload
from tandem.cluster.sim.events import EventQueue
from tandem.cluster.sim.metrics import Recorder, SimResult
from tandem.cluster.sim.moves import choose_moves
from tandem.cluster.sim.planning import make_planner
from tandem.cluster.sim.routing import route
from tandem.cluster.sim.state import Replica, SimSequence
from tandem.cluster.sim.step import ReplicaSteps, StepContext
from tandem.cluster.sim.timeline import Host, Timeline


def simulate(sim: Simulation) -> SimResult:
    return Simulator(sim).run()


def draw_requests(workload: Workload, seed: int) -> list[tuple[float | None, int, int]]:
    """(arrival ms or None for closed loop, prompt tokens, output tokens) per request."""
    rng = np.random.default_rng([seed, 0])
    n = workload.num_requests
    if workload.rate_per_s is not None:
        arrivals = np.cumsum(rng.exponential(1000.0 / workload.rate_per_s, n)).tolist()
    else:
        arrivals = [None] * n
    if workload.conversations:
        return conversation_turns(workload, rng)
    return [(arrival, max(2, workload.prompt_tokens.draw(rng, i)), workload.output_tokens.draw(rng, i))
            for i, arrival in enumerate(arrivals)]


def conversation_turns(workload: Workload, rng: np.random.Generator) -> list[tuple[None, int, int]]:
    """The conversations' turns in order: a turn's prompt is the turn before's prompt and answer,
    then its own new tokens."""
    requests = []
    for new_tokens in workload.conversations:
        history = 0
        for new in new_tokens:
            output = workload.output_tokens.draw(rng, len(requests))
            prompt = max(2, history + new)
            requests.append((None, prompt, output))
            history = prompt + output
    return requests


def turn_of(workload: Workload) -> list[tuple[int | None, int]]:
    """(conversation, turn) of every request: (None, 1) without conversations."""
    if not workload.conversations:
        return [(None, 1)] * workload.num_requests
    return [(c, t) for c, turns in enumerate(workload.conversations) for t in range(1, len(turns) + 1)]


class Simulator:
    def __init__(self, sim: Simulation):
        self.sim = sim
        self.events = EventQueue()
        self.recorder = Recorder()
        self.timelines = self._timelines()
        self.replicas = [self._replica(i) for i in range(len(sim.verifiers))]
        ctx = StepContext(sim, self.events, np.random.default_rng([sim.seed, 1]), self.recorder, self._finished,
                          self._detached, self._rebalance)
        self.steps = {id(r): self._steps(ctx, r) for r in self.replicas}
        self.requests = draw_requests(sim.workload, sim.seed)
        self.turns = turn_of(sim.workload)
        self.openers = deque(i for i, (_, turn) in enumerate(self.turns) if turn == 1)  # what a free client sends
        self.backlog: deque[SimSequence] = deque()  # requests waiting for a free batch slot
        self.in_flight = 0  # placed and not finished (the router's cap, `max_running`, counts them)

    def run(self) -> SimResult:
        if self.sim.workload.concurrency is not None:
            for _ in range(min(self.sim.workload.concurrency, len(self.openers))):
                self._send(0.0, self.openers.popleft())
        else:
            for index, (arrival, _, _) in enumerate(self.requests):
                self.events.push(arrival, lambda now, index=index: self._send(now, index))
        end = self.events.run()
        if self.recorder.finished != len(self.requests):
            raise RuntimeError(f"simulation ended with {self.recorder.finished} of {len(self.requests)} requests done")
        utilisation = {name: t.utilisation(end) for name, t in self.timelines.items()}
        return self.recorder.result(utilisation, self.events.processed)

    # -- set-up -------------------------------------------------------------------------------

    def _timelines(self) -> dict[str, Timeline]:
        devices = [v.device for v in self.sim.verifiers] + [d.device for d in self.sim.drafters if d.device]
        hosts = {name: Host(name, cores) for name, cores in self.sim.host_cores}
        timelines: dict[str, Timeline] = {}
        for device in devices:
            if device.name not in timelines:
                timelines[device.name] = Timeline(device.name, threads=device.threads, host=hosts.get(device.host))
        return timelines

    def _replica(self, index: int) -> Replica:
        spec = self.sim.verifiers[index]
        drafter = self.sim.drafter(spec.drafter)
        planner = make_planner(spec.device, drafter, self.sim.depth, self.sim.step_overhead_ms)
        planner.draft_call_ms = self._draft_rtt_ms(spec.device.group, drafter)
        drafter_device = self.timelines[drafter.device.name] if drafter and drafter.device else None
        return Replica(index, spec, self.timelines[spec.device.name], planner, drafter, drafter_device)

    def _draft_rtt_ms(self, group: str, drafter) -> float:
        return self.sim.network.rtt_ms(group, drafter.device.group) if drafter and drafter.device else 0.0

    def _steps(self, ctx: StepContext, replica: Replica) -> ReplicaSteps:
        group = replica.spec.device.group
        router = self.sim.router_group or self.sim.verifiers[0].device.group
        return ReplicaSteps(ctx, replica, self.sim.network.rtt_ms(router, group) / 2,
                            self._draft_rtt_ms(group, replica.drafter))

    # -- arrivals and completions -------------------------------------------------------------

    def _send(self, now: float, index: int) -> None:
        _, prompt, output = self.requests[index]
        conversation, turn = self.turns[index]
        prefix = self.sim.workload.prompt_prefix(index)
        if prefix is not None:  # at most all but the prompt's last token, which is always scored
            prefix = (prefix[0], min(prefix[1], prompt - 1))
        seq = SimSequence(index, now, prompt, output, prefix=prefix,
                          conversation=conversation, turn=turn, requested=self.sim.workload.requested_tokens or 0)
        self.recorder.arrival(now)
        self.backlog.append(seq)
        self._place(now)

    def _place(self, now: float) -> None:
        while self.backlog and (self.sim.max_running is None or self.in_flight < self.sim.max_running):
            placed = route(self.replicas, self.backlog[0])
            if placed is None:
                return
            replica, reason = placed
            seq = self.backlog.popleft()
            self.in_flight += 1
            self.recorder.placements[reason] += 1
            steps = self.steps[id(replica)]
            seq.ready_ms = now + steps.relay_ms
            replica.waiting.append(seq)
            steps.kick(now)
        self._rebalance(now)

    def _rebalance(self, now: float) -> None:
        """While no request waits, mark the streams to move (each leaves at its replica's next
        step boundary: `_detached`)."""
        if self.backlog:
            return
        for seq, target in choose_moves(self.replicas):
            seq.moving_to = target
            target.incoming.append(seq)

    def _detached(self, seq: SimSequence, source: Replica, now: float) -> None:
        """The stream left `source`: it reaches its target after the router's relay both ways,
        with its KV state."""
        target, seq.moving_to = seq.moving_to, None
        target.incoming.remove(seq)
        seq.moved, seq.drafter_seen = True, 0
        steps = self.steps[id(target)]
        seq.ready_ms = now + self.steps[id(source)].relay_ms + steps.relay_ms
        target.waiting.append(seq)
        self.recorder.moves += 1
        steps.kick(now)

    def _finished(self, seq: SimSequence, now: float) -> None:
        if seq.moving_to is not None:  # it finished before it could leave
            seq.moving_to.incoming.remove(seq)
            seq.moving_to = None
        self.recorder.finish(seq, now)
        self.in_flight -= 1
        # A closed loop's client sends its next request before the router looks for moves again
        # (bench-cluster's driver adds it before the router's next step, which places what waits
        # and then rebalances): a replica whose last stream just ended is not empty to the router,
        # so no stream moves into the gap (3 streams ending in one step emptied the fast replica
        # for an instant, and a move into it left the slow one idle for seconds).
        follow = seq.request_id + 1  # the same client's next request: its conversation's next turn,
        if self.sim.workload.concurrency is None:
            self._place(now)
        elif seq.conversation is not None and follow < len(self.turns) and self.turns[follow][0] == seq.conversation:
            self._send(now, follow)
        elif self.openers:  # or the next conversation (the next request, without conversations)
            self._send(now, self.openers.popleft())
        else:
            self._place(now)
