"""The draft model on drafter workers: the `DraftModel` behind the cluster's `model` and
`hybrid` drafters (speculation/drafters/model.py) in a cluster replica, which plans and drafts
through the same drafters and stages as the single-process engine.

Each sequence sticks to one live drafter (its KV cache is there); the drafter is sent deltas:
the committed tokens it has not seen. A drafter that lost a sequence answers `needs_sync` and
gets it whole next time; one that dies costs its sequences their drafts for a round. Remote
drafts go exactly as deep as planned (a worker cannot consult the planner mid-draft).

Draft ahead (`draft_ahead`): while the replica verifies round i, the drafter already drafts
round i+1 as if all of round i were accepted, one token longer (its first token is the
drafter's guess of the target's bonus token). If the whole round is accepted and the bonus token
equals that guess, round i+1's draft is ready without waiting for the drafter; otherwise it is
discarded. The engine's step calls `start_ahead` before its verify call and `keep_ahead` per
round after it (engine/batch_engine.py).

It runs inside a verifier replica (cluster/runtime/replica.py), which gets the live drafters
from the router (`set_drafters`). Calls go through one DraftBatcher per drafter
(cluster/runtime/draft_batcher.py). The bookkeeping is done under `lock`, the waiting outside it.
"""

import threading
import zlib

from tandem.cluster.runtime.draft_batcher import DraftBatcher
from tandem.cluster.runtime.endpoints import WorkerDiedError
from tandem.cluster.runtime.messages import DraftItem
from tandem.cluster.runtime.pool import Worker
from tandem.engine.sequence import Sequence
from tandem.models.cost import CostView, catch_up_ms
from tandem.speculation.drafters.base import DraftJob, SequenceDraft


class RemoteDraftModel:
    def __init__(self, drafters: list[Worker]):
        self.drafters = drafters
        self.lock = threading.RLock()
        self.batchers = {d.name: DraftBatcher(d) for d in drafters}
        self.drafter_of: dict[str, Worker] = {}
        self.drafter_length: dict[str, int] = {}  # committed tokens the sequence's drafter holds
        self.draft_ahead = False
        self.ready: dict[str, SequenceDraft] = {}  # drafts made ahead for the next round
        self.ahead_hits = 0
        self.ahead_misses = 0

    # -- the DraftModel interface ---------------------------------------------------------------

    def cost_view(self, seq: Sequence) -> CostView | None:
        with self.lock:
            drafter = self._drafter_for(seq)
        return None if drafter is None else drafter.cost

    def catch_up_ms(self, seq: Sequence) -> float:
        with self.lock:
            drafter = self._drafter_for(seq)
            if drafter is None:
                return 0.0
            held = min(self.drafter_length.get(seq.seq_id, 0), len(seq.tokens) - 1)
        return catch_up_ms(drafter.cost.cost, len(seq.tokens) - held)

    def draft(self, jobs: list[DraftJob], keep_drafting=None) -> list[SequenceDraft]:
        """Drafts made ahead where still valid; the rest from every drafter concurrently."""
        drafts: dict[str, SequenceDraft] = {}
        calls: dict[str, list[tuple[Sequence, int]]] = {}
        with self.lock:
            for job in jobs:
                ready = self.ready.pop(job.seq.seq_id, None)
                if ready is not None and len(ready.token_ids) >= job.k:
                    q = None if ready.q_draft is None else ready.q_draft[: job.k]
                    drafts[job.seq.seq_id] = SequenceDraft("model", ready.token_ids[: job.k], q)
                elif (drafter := self._drafter_for(job.seq)) is not None:
                    calls.setdefault(drafter.name, []).append((job.seq, job.k))
        self._call_drafters(calls, drafts)
        return [drafts.get(job.seq.seq_id, SequenceDraft("none", [])) for job in jobs]

    def set_drafters(self, drafters: list[Worker]) -> None:
        """The live drafters now (one restarted is a new process: its sequences sync whole)."""
        with self.lock:
            known = {d.name: d for d in self.drafters}
            self.drafters = drafters
            for drafter in drafters:
                old = known.get(drafter.name)
                if old is None or old.restarts != drafter.restarts:
                    self.batchers[drafter.name] = DraftBatcher(drafter)
                else:  # the same process: keep its batcher, and its sequences stay with it
                    drafters[drafters.index(drafter)] = old
            for seq_id, old in list(self.drafter_of.items()):
                if all(d is not old for d in drafters):
                    del self.drafter_of[seq_id]
                    self.drafter_length.pop(seq_id, None)

    # -- assignment and failure -------------------------------------------------------------------

    def _drafter_for(self, seq: Sequence) -> Worker | None:
        """The sequence's drafter (sticky, for its cache), or the next live one."""
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

    def drafter_died(self, drafter: Worker) -> None:
        with self.lock:
            if not drafter.alive:
                return
            for seq_id in drafter.mark_dead():
                self.drafter_of.pop(seq_id, None)
                self.drafter_length.pop(seq_id, None)

    def forget(self, seq_id: str) -> None:
        """The sequence left the cluster: free its drafter's cache."""
        with self.lock:
            self.drafter_length.pop(seq_id, None)
            self.ready.pop(seq_id, None)
            drafter = self.drafter_of.pop(seq_id, None)
            if drafter is not None:
                drafter.sequences.discard(seq_id)
                if drafter.alive:
                    drafter.endpoint.call("forget", [seq_id])

    def _call_drafters(self, calls: dict[str, list[tuple[Sequence, int]]], drafts: dict[str, SequenceDraft]) -> None:
        with self.lock:
            tickets = [(name, group, self.batchers[name].submit([self._item(s, k) for s, k in group]))
                       for name, group in calls.items()]
        for name, group, ticket in tickets:
            try:
                replies = self.batchers[name].wait(ticket)
            except WorkerDiedError:
                self.drafter_died(self.batchers[name].drafter)
                continue
            with self.lock:
                for (seq, _), reply in zip(group, replies):
                    if reply.needs_sync:
                        self.drafter_length[seq.seq_id] = 0
                        continue
                    self.drafter_length[seq.seq_id] = len(seq.tokens)
                    drafts[seq.seq_id] = SequenceDraft("model", list(reply.token_ids), reply.q_draft)

    def _item(self, seq: Sequence, k: int, extra: tuple[int, ...] = (), tag: str = "") -> DraftItem:
        base = self.drafter_length.get(seq.seq_id, 0)
        seed = zlib.crc32(f"{seq.request.sampling.seed}/{seq.seq_id}/{len(seq.tokens)}{tag}".encode())
        output_start = len(seq.request.prompt_ids) - seq.request.output_offset
        return DraftItem(seq.seq_id, base, (*seq.tokens[base:], *extra), k, seq.request.sampling, seed, output_start)

    # -- drafting ahead -------------------------------------------------------------------------

    def start_ahead(self, seqs: list[Sequence], drafts: list[SequenceDraft]) -> list:
        """Ask each drafter for round i+1 now, assuming round i is accepted whole (drafts made
        ahead before this round are stale by now: dropped)."""
        jobs: dict[str, list[DraftItem]] = {}
        with self.lock:
            for seq, draft in zip(seqs, drafts):
                self.ready.pop(seq.seq_id, None)
                drafter = self.drafter_of.get(seq.seq_id)
                if draft.source != "model" or not draft.token_ids or drafter is None or not drafter.alive:
                    continue
                item = self._item(seq, len(draft.token_ids) + 1, tuple(draft.token_ids), "/ahead")
                jobs.setdefault(drafter.name, []).append(item)
            return [(name, self.batchers[name].submit(items)) for name, items in jobs.items()]

    def gather_ahead(self, tickets: list) -> dict:
        replies = {}
        for name, ticket in tickets:
            try:
                replies.update({r.seq_id: r for r in self.batchers[name].wait(ticket)})
            except WorkerDiedError:
                self.drafter_died(self.batchers[name].drafter)
        return replies

    def keep_ahead(self, seq: Sequence, draft: SequenceDraft, before: int, accepted: int, reply) -> None:
        """After seq's round (it had `before` tokens; `accepted` of the draft were accepted): keep
        the draft made ahead if its assumption held; note what the drafter now holds."""
        if reply is None or reply.needs_sync:
            return
        with self.lock:
            k = len(draft.token_ids)
            self.drafter_length[seq.seq_id] = before + accepted  # what agrees
            bonus = seq.tokens[before + k: before + k + 1]
            if accepted == k and tuple(bonus) == tuple(reply.token_ids[:1]) and len(reply.token_ids) > 1:
                q = None if reply.q_draft is None else reply.q_draft[1:]
                self.ready[seq.seq_id] = SequenceDraft("model", list(reply.token_ids[1:]), q)
                self.ahead_hits += 1
            else:
                self.ahead_misses += 1
