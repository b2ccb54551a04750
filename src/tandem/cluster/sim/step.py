"""One verifier replica's engine step, simulated: the twin of `BatchEngine.step`
(engine/batch_engine.py), which every replica of the cluster runs (cluster/runtime/replica.py).

A step:
1. admit: waiting sequences that have reached the replica take free batch slots; what they
   lack of their prompt is unprefilled: all but its last token, less what the replica's prompt
   cache holds of it: its conversation's history where the replica served the turn before
   (all of that turn but its last token), or the opening it shares with other prompts (a
   system prompt; a sequence of its group scored past it there); the engine reuses
   MIN_COPY_TOKENS or more, engine/slots.py.
   One whose opening a running sequence is still prefilling waits for it, as the engine's does,
2. split: decoding sequences verify a round; prefilling ones whose rest of prompt fits the step
   token budget left by the rounds finish it in front of their round, the others score a chunk
   of it (oldest first, in what the budget leaves; the oldest at least MIN_PREFILL_CHUNK). The
   budget is held back beside decoding streams as the engine's is (`held_back_budget`),
3. plan: the replica's depth planner picks k for every round,
4. draft: one lock-step call per drafter device for the rounds drafting with a model, paying
   the round trip between the replica and the drafter (n-gram drafts are free),
5. verify: ONE call scores every round (its rest of prompt, last token and drafts) and every
   chunk, priced at the mean context the call's sequences hold, its prompt tokens without the
   logits rows the engine does not ask of them (planning.py `verify_ms`),
6. commit: acceptance is drawn per round, tokens are emitted, finished sequences leave, and so
   do those the router is moving (detached with their KV state, as a replica does between
   steps); the router, once it hears of the step (and of the requests its finished streams'
   clients send next), looks for moves, as it does every step of its own (a prompt finished: a
   stream may now move); the next step starts after the step overhead.
The router relays: a request reaches its replica half a router round trip after it is placed,
and each round's tokens reach the client half a round trip after they are committed. Not
modelled: prefixes shared by some prompts other than a conversation's own history (a system
prompt), evictions from the prompt cache.
"""

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from tandem.cluster.sim.config import Simulation
from tandem.cluster.sim.events import EventQueue
from tandem.cluster.sim.metrics import Recorder
from tandem.cluster.sim.planning import candidate, draft_call_ms, verify_ms
from tandem.cluster.sim.state import Replica, SimSequence
from tandem.cluster.sim.timeline import remote_call
from tandem.cluster.sim.routing import held_prefix
from tandem.engine.batch_engine import SHARE_WAIT_TOKENS
from tandem.engine.step_budget import MIN_PREFILL_CHUNK, held_back_budget
from tandem.engine.slots import MIN_COPY_TOKENS


@dataclass(slots=True)
class StepContext:
    """What every replica's steps share with the simulator."""

    sim: Simulation
    events: EventQueue
    rng: np.random.Generator  # acceptance draws
    recorder: Recorder
    on_finish: Callable[[SimSequence, float], None]
    on_detach: Callable[[SimSequence, Replica, float], None]  # a moving stream left its replica
    on_step: Callable[[float], None]  # a step ended: the router looks for moves, as it does each step


class ReplicaSteps:
    def __init__(self, ctx: StepContext, replica: Replica, relay_ms: float, draft_rtt_ms: float):
        self.ctx = ctx
        self.replica = replica
        self.relay_ms = relay_ms  # router <-> replica, one way
        self.draft_rtt_ms = draft_rtt_ms  # replica <-> its drafter, a round trip
        self.busy = False
        self._rounds: list[tuple[SimSequence, int]] = []  # (sequence, k)
        self._chunks: list[tuple[SimSequence, int]] = []  # (sequence, prompt tokens scored)

    def kick(self, now: float) -> None:
        """Start a step if none is running and a sequence is there to step; else wake when the
        next placed one arrives."""
        if self.busy:
            return
        replica = self.replica
        if replica.running or any(seq.ready_ms <= now for seq in replica.waiting):
            self.busy = True
            self._step(now)
        elif replica.waiting:
            self.ctx.events.push(min(seq.ready_ms for seq in replica.waiting), self.kick)

    # -- 1-3. admission, split, plan -------------------------------------------------------------

    def _step(self, now: float) -> None:
        replica, budget = self.replica, self.ctx.sim.step_token_budget
        deferred = []
        while replica.waiting and replica.waiting[0].ready_ms <= now and len(replica.running) < replica.spec.max_batch:
            seq = replica.waiting.popleft()
            if not seq.moved and self._waits_to_share(seq):
                deferred.append(seq)
                continue
            seq.unprefilled = 0 if seq.moved else seq.prompt_tokens - 1 - self._reused(seq)
            replica.running.append(seq)
        replica.waiting.extendleft(reversed(deferred))
        decoding = [seq for seq in replica.running if not seq.unprefilled]
        prefilling = [seq for seq in replica.running if seq.unprefilled]
        device = replica.spec.device
        fixed_k = (self.ctx.sim.depth.fixed_k or 0) if replica.spec.drafter else 0  # a plain replica drafts nothing
        if decoding and device.fused and len(prefilling) <= len(decoding):  # held back, as the engine's
            budget = held_back_budget(device.cost, len(decoding) * (1 + fixed_k), budget, device.prefill_floor)
        left = budget - len(decoding)
        rounds = list(decoding)
        for seq in prefilling:  # oldest first: those whose rest fits finish it with their round
            if seq.unprefilled + 1 <= left:
                rounds.append(seq)
                left -= seq.unprefilled + 1
        still = [seq for seq in prefilling if seq not in rounds]
        self._chunks = []
        for i, seq in enumerate(still):
            n = min(seq.unprefilled, max(left, MIN_PREFILL_CHUNK if i == 0 else 0))
            if n > 0:
                self._chunks.append((seq, n))
                left -= n
        ks = []
        if rounds:
            ks, _ = replica.planner.plan([candidate(s, replica.drafter, self.ctx.sim.depth) for s in rounds])
        self._rounds = list(zip(rounds, ks))
        self._draft(now)

    def _waits_to_share(self, seq: SimSequence) -> bool:
        """Whether a running sequence is still prefilling SHARE_WAIT_TOKENS or more of seq's
        shared opening: seq then waits for it (those behind it go first) and reuses it, as the
        engine's admission does (users arriving together behind one system prompt prefill it once)."""
        if seq.prefix is None or seq.prefix[0] in self.replica.prefixes_held:
            return False
        for other in self.replica.running:
            if other.unprefilled and other.prefix is not None and other.prefix[0] == seq.prefix[0]:
                done = other.prompt_tokens - 1 - other.unprefilled
                if min(seq.prefix[1], other.prefix[1]) - done >= SHARE_WAIT_TOKENS:
                    return True
        return False

    def _reused(self, seq: SimSequence) -> int:
        """Prompt tokens seq finds in its replica's prompt cache: its conversation's history or its
        shared opening, if held."""
        shared = held_prefix(self.replica, seq)
        if shared < MIN_COPY_TOKENS:
            return 0
        self.ctx.recorder.reused_tokens += shared
        return shared

    # -- 4. drafting ------------------------------------------------------------------------------

    def _draft(self, now: float) -> None:
        replica = self.replica
        jobs = [(seq, k) for seq, k in self._rounds if k and replica.drafter is not None and replica.drafter.uses_model]
        if not jobs:
            self._verify(now)
            return
        call_ms = draft_call_ms(replica.drafter.device, [s.unseen_by_drafter() for s, _ in jobs], [k for _, k in jobs])
        remote_call(self.ctx.events, now, self.draft_rtt_ms, replica.drafter_device, call_ms, self._verify)

    # -- 5. verification --------------------------------------------------------------------------

    def _verify(self, now: float) -> None:
        if not self._rounds and not self._chunks:
            self._commit(now)
            return
        device = self.replica.spec.device
        prompt_parts = [s.unprefilled for s, _ in self._rounds] + [n for _, n in self._chunks]
        held = [s.prompt_tokens - 1 - s.unprefilled + s.emitted for s, _ in self._rounds + self._chunks]
        call_ms = verify_ms(device, [k for _, k in self._rounds], prompt_parts, sum(held) / len(held))
        self.ctx.recorder.scored_tokens += sum(k + 1 for _, k in self._rounds) + sum(prompt_parts)
        self.ctx.events.push(self.replica.device.reserve(now, call_ms), self._commit)

    # -- 6. commit --------------------------------------------------------------------------------

    def _commit(self, now: float) -> None:
        replica, client_at = self.replica, now + self.relay_ms
        for seq, n in self._chunks:
            seq.unprefilled -= n
        for seq, _ in self._rounds:
            seq.unprefilled = 0
        self._hold_openings()
        for seq, k in self._rounds:
            run = replica.drafter.acceptance.draw_run(self.ctx.rng) if k else 0
            accepted = min(run, k)
            if k:
                replica.planner.record(replica.drafter.source, k, accepted)
            if replica.drafter is not None and replica.drafter.uses_model and k:
                seq.drafter_seen = seq.context + accepted
            emitted = min(accepted + 1, seq.remaining)
            self.ctx.recorder.round(seq, client_at, k, accepted, emitted)
            seq.emitted += emitted
            if seq.remaining == 0:
                replica.running.remove(seq)
                if seq.conversation is not None:  # its slot keeps all but the last token, for the next turn
                    replica.histories[seq.conversation] = seq.context - 1
                self.ctx.events.push(client_at, lambda at, seq=seq: self.ctx.on_finish(seq, at))
        for seq in [s for s in replica.running if s.moving_to is not None]:  # detached at the step's end
            replica.running.remove(seq)
            self.ctx.on_detach(seq, replica, now)
        self._rounds, self._chunks = [], []
        self.ctx.events.push(client_at, self.ctx.on_step)  # after the finishes it hears of, and their clients' next requests
        self.ctx.events.push(now + self.ctx.sim.step_overhead_ms, self._next)

    def _hold_openings(self) -> None:
        """An opening scored is an opening held: the replica's prompt cache keeps it."""
        for seq in [s for s, _ in self._chunks + self._rounds]:
            if seq.prefix is not None and seq.prompt_tokens - 1 - seq.unprefilled >= seq.prefix[1]:
                self.replica.prefixes_held.add(seq.prefix[0])

    def _next(self, now: float) -> None:
        self.busy = False
        self.kick(now)
