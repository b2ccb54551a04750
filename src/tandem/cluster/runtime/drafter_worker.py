"""A drafter worker: the draft model with a KV slot per sequence it drafts for, drafting for
many sequences in lock-step (speculation/drafters/lockstep.py). A plain class; the Ray actor wraps it.

It is stateless apart from caches: it holds each sequence's token ids as built from the deltas
a replica sends, and when it has lost a sequence (restarted, evicted) it answers
`needs_sync` and the replica resends the sequence whole. When all slots are taken, the
least recently used sequence is evicted.
"""

import os
from collections import OrderedDict

import numpy as np

from tandem.cluster.runtime.emulation import Emulation
from tandem.cluster.runtime.messages import DraftItem, DraftReply
from tandem.engine.request import GenerationRequest
from tandem.engine.sequence import Sequence
from tandem.models.batch_runner import BatchRunner
from tandem.speculation.batch_depth import DraftCandidate
from tandem.speculation.depth import Fixed
from tandem.speculation.drafters.base import DraftJob, DraftOffer
from tandem.speculation.drafters.lockstep import LocalDraftModel


class DrafterWorker:
    def __init__(self, runner: BatchRunner, emulation: Emulation = Emulation()):
        self.runner = runner
        self.model = LocalDraftModel(runner)
        self.emulation = emulation
        self._seqs: OrderedDict[str, Sequence] = OrderedDict()  # least recently used first
        self._free = list(range(runner.max_slots))

    def info(self) -> dict:
        cost = self.runner.cost.scaled(self.emulation.slowdown).to_wire()
        return {"pid": os.getpid(), "name": self.runner.name, "sequences": len(self._seqs), "cost_ms": cost}

    def ping(self) -> int:
        """A call that does nothing but travel: the router times it to learn the round trip."""
        with self.emulation.call():
            return os.getpid()

    def forget(self, seq_ids: list[str]) -> None:
        for seq_id in seq_ids:
            seq = self._seqs.pop(seq_id, None)
            if seq is not None:
                self.runner.rollback(seq.slot, 0)  # its cells freed now, as the verifier does
                self._free.append(seq.slot)

    def propose(self, items: list[DraftItem]) -> list[DraftReply]:
        with self.emulation.call():
            replies: dict[str, DraftReply] = {}
            jobs = []
            for item in items:
                seq = self._update(item)
                if seq is None:
                    replies[item.seq_id] = DraftReply(item.seq_id, (), needs_sync=True)
                elif item.k > 0:
                    seq.rng = np.random.default_rng(item.seed)
                    jobs.append(DraftJob(seq, DraftOffer(DraftCandidate("model", item.k, True)), item.k))
            for job, draft in zip(jobs, self.model.draft(jobs)):
                replies[job.seq.seq_id] = DraftReply(job.seq.seq_id, tuple(draft.token_ids), draft.q_draft)
            return [replies.get(item.seq_id, DraftReply(item.seq_id, ())) for item in items]

    def _update(self, item: DraftItem) -> Sequence | None:
        """Apply the delta; None when this drafter cannot rebuild the sequence from it."""
        seq = self._seqs.get(item.seq_id)
        if seq is None:
            if item.base_length != 0:
                return None
            seq = self._new_sequence(item)
        elif item.base_length > len(seq.tokens):
            return None
        else:
            del seq.tokens[item.base_length:]
            seq.tokens += item.delta
            self._seqs.move_to_end(item.seq_id)
        return seq

    def _new_sequence(self, item: DraftItem) -> Sequence:
        if not self._free:
            oldest = next(iter(self._seqs))
            self.forget([oldest])
        # the whole first delta stands as the prompt, output included: its positions count from output_start
        offset = max(0, len(item.delta) - item.output_start)
        request = GenerationRequest(tuple(item.delta), 1, item.sampling, output_offset=offset)
        seq = Sequence(item.seq_id, request, "model", Fixed(0), np.random.default_rng(item.seed),
                       slot=self._free.pop(), tokens=list(item.delta))  # a free slot holds no cache (forget)
        self._seqs[item.seq_id] = seq
        return seq
