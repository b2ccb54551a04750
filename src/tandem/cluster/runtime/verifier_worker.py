"""A verifier worker: the target model with one KV slot per sequence; verifies the drafts of
many sequences in one batched forward and applies the acceptance rule. A plain class (the Ray
actor in cluster/runtime/actors.py only wraps it), testable without Ray.

Per sequence it keeps the committed token ids it knows and the invariant of the engine: its slot
caches every committed token but the last. Sampled acceptance draws from an rng seeded by the
request's seed and the committed length, so a replica that takes over after a failure draws
the same numbers the dead one would have.
"""

import os
from dataclasses import dataclass, field, replace

import numpy as np

from tandem.cluster.runtime.emulation import Emulation
from tandem.cluster.runtime.messages import VerifyItem, VerifyResult
from tandem.errors import TandemError
from tandem.models.batch_runner import BatchItem, BatchRunner
from tandem.speculation.acceptance import accept_round


@dataclass
class _Held:
    slot: int
    tokens: list[int] = field(default_factory=list)


class VerifierWorker:
    def __init__(self, runner: BatchRunner, emulation: Emulation = Emulation()):
        self.runner = runner
        self.emulation = emulation
        self._held: dict[str, _Held] = {}
        self._free = list(range(runner.max_slots))

    def info(self) -> dict:
        """`cost_ms` is the device this worker is: an emulated slower one reports its slower curve."""
        cost = {n: ms * self.emulation.slowdown for n, ms in self.runner.cost.to_json().items()}
        return {"pid": os.getpid(), "name": self.runner.name, "running": len(self._held),
                "free_slots": len(self._free), "cost_ms": cost,
                "context_length": self.runner.context_length, "max_slots": self.runner.max_slots}

    def ping(self) -> int:
        """A call that does nothing but travel: the coordinator times it to learn the round trip."""
        with self.emulation.call():
            return os.getpid()

    def open(self, seq_id: str, token_ids: list[int]) -> int:
        """Prefill a sequence (new, or re-prefilled after a failure); returns its slot."""
        with self.emulation.call():
            if seq_id in self._held:
                self.close([seq_id])
            if not self._free:
                raise TandemError(f"verifier {self.runner.name} has no free slot")
            held = _Held(self._free.pop(), list(token_ids))  # a free slot holds no cache (close)
            if len(token_ids) > 1:
                self.runner.forward_batch([BatchItem(held.slot, tuple(token_ids[:-1]), 0)])
            self._held[seq_id] = held
            return held.slot

    def close(self, seq_ids: list[str]) -> None:
        """Free the sequences' slots and their cache now: cells left to the next open of the
        slot keep a shared pool (llama.cpp's unified KV) fragmented, and every later call
        attends over the spread (docs/cluster.md, mixed replicas)."""
        for seq_id in seq_ids:
            held = self._held.pop(seq_id, None)
            if held is not None:
                self.runner.rollback(held.slot, 0)
                self._free.append(held.slot)

    def verify(self, items: list[VerifyItem]) -> list[VerifyResult]:
        """One batched forward for all items; each result carries the call's time and size, from
        which the coordinator keeps this replica's cost curve current."""
        with self.emulation.call() as timing:
            held = [self._sync(item) for item in items]
            batch = [BatchItem(h.slot, (h.tokens[-1], *item.draft_tokens), len(item.draft_tokens) + 1)
                     for h, item in zip(held, items)]
            logits = self.runner.forward_batch(batch)  # per item [k + 1, vocab]
            results = [self._accept(h, item, rows) for h, item, rows in zip(held, items, logits)]
        tokens = sum(len(item.token_ids) for item in batch)
        return [replace(r, step_ms=timing.compute_ms, batch_tokens=tokens) for r in results]

    def _sync(self, item: VerifyItem) -> _Held:
        held = self._held.get(item.seq_id)
        if held is None:
            raise TandemError(f"sequence {item.seq_id} is not open on this verifier")
        if item.committed_length != len(held.tokens):  # the coordinator cut a round at a stop
            if item.committed_length > len(held.tokens):
                raise TandemError(f"sequence {item.seq_id}: verifier is behind the coordinator")
            del held.tokens[item.committed_length:]
            self.runner.rollback(held.slot, item.committed_length - 1)
        return held

    def _accept(self, held: _Held, item: VerifyItem, logits: np.ndarray) -> VerifyResult:
        draft = list(item.draft_tokens)
        rng = np.random.default_rng(None if item.sampling.seed is None else [item.sampling.seed, len(held.tokens)])
        result = accept_round(draft, item.q_draft, logits, item.sampling, rng)
        emitted = result.emitted(draft)
        held.tokens += emitted
        self.runner.rollback(held.slot, len(held.tokens) - 1)
        return VerifyResult(item.seq_id, tuple(emitted), result.accepted)
