"""What the batching engine keeps of its requests (engine/batch_engine.py; the cluster router
keeps its own, cluster/runtime/router.py): the waiting queue, the running sequences, the
drafters, the counts the worker thread reads, the checks on submit, adding and cancelling
requests that are still queued, and retiring a finished or cancelled sequence (its committed
tokens feed the shared n-gram store)."""

from collections import deque

from tandem.engine.events import SequenceUpdate, SpeculationOptions, checked_options
from tandem.engine.request import GenerationRequest
from tandem.engine.sequence import Sequence
from tandem.errors import TandemError
from tandem.speculation.depth import Depth
from tandem.speculation.drafters.base import Drafter
from tandem.speculation.drafters.registry import check_drafter


class SequencePool:
    context_length: int
    default_drafter: str
    default_depth: Depth

    def __init__(self, drafters: dict[str, Drafter], ngram_store=None):
        self.drafters = drafters  # by name: the registry's, or a test's
        self.ngram_store = ngram_store
        self.waiting: deque[Sequence] = deque()
        self.running: dict[str, Sequence] = {}

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    def holds(self, seq_id: str) -> bool:
        """Whether this request is still waiting or running (not finished, not cancelled)."""
        return seq_id in self.running or any(seq.seq_id == seq_id for seq in self.waiting)

    def validate(self, request: GenerationRequest, options: SpeculationOptions | None = None) -> None:
        options = checked_options(options)
        if len(request.prompt_ids) >= self.context_length:
            raise TandemError(f"a {len(request.prompt_ids)}-token prompt leaves no room for an answer in the context "
                              f"of {self.context_length} tokens: shorten the prompt")
        drafter = options.drafter or self.default_drafter
        if drafter not in self.drafters:
            check_drafter(drafter)  # an unknown name gets its own message
            raise TandemError(f"drafter {drafter!r} needs a draft model, and this engine has none")

    def add(self, seq_id: str, request: GenerationRequest, options: SpeculationOptions | None = None) -> None:
        options = checked_options(options)  # None: the engine's drafter and depth
        self.validate(request, options)
        self.waiting.append(Sequence.create(seq_id, request, options, self.default_drafter, self.default_depth))

    def cancel(self, seq_id: str) -> SequenceUpdate | None:
        """Drop a request, waiting or running (its slot and caches are freed); None if unknown."""
        update = self._cancel_waiting(seq_id)
        if update is not None:
            return update
        seq = self.running.get(seq_id)
        if seq is None:
            return None
        self._finish(seq)
        return SequenceUpdate(seq_id, (), finished=True, finish_reason="cancelled")

    def _cancel_waiting(self, seq_id: str) -> SequenceUpdate | None:
        for seq in self.waiting:
            if seq.seq_id == seq_id:
                self.waiting.remove(seq)
                self._forget_drafts(seq)  # a preempted sequence waits with its drafters' state
                return SequenceUpdate(seq_id, (), finished=True, finish_reason="cancelled")
        return None

    def _finish(self, seq: Sequence) -> None:
        """Retire seq and free what it holds (its slot, or its place on a replica)."""
        raise NotImplementedError

    def retire(self, seq: Sequence) -> None:
        """Take a finished or cancelled sequence out of the batch; what it committed is target
        output, so it feeds the shared n-gram store (and the suffix drafter's index) either way."""
        self.running.pop(seq.seq_id, None)
        if self.ngram_store is not None and seq.request.cache_salt is None:  # a salted answer is its own
            self.ngram_store.add(seq.tokens)
        self._forget_drafts(seq)

    def forget_answers(self) -> None:
        """What earlier requests answered leaves the drafters' cross-request memory: the suffix
        index and an in-process n-gram store (one in Redis is other servers' too, and stays). A
        benchmark's runs on one engine start cold: none copies an earlier run's answers."""
        for drafter in self.drafters.values():
            forget_answers = getattr(drafter, "forget_answers", None)
            if forget_answers is not None:
                forget_answers()
        clear = getattr(self.ngram_store, "clear", None)
        if clear is not None:
            clear()

    @property
    def answers_bytes(self) -> int:
        """What the memory forget_answers empties is charged against its bounds (at or above what
        it holds): the suffix index's and an in-process n-gram store's bytes (hybrid wraps the one
        suffix drafter and reports nothing itself)."""
        held = sum(getattr(drafter, "answers_bytes", 0) for drafter in self.drafters.values())
        return held + getattr(self.ngram_store, "nbytes", 0)  # Redis holds its own, elsewhere

    def _forget_drafts(self, seq: Sequence) -> None:
        """Per-sequence drafter state (alignments, suffix indexes, a drafter worker's cache) goes."""
        for drafter in self.drafters.values():
            forget = getattr(drafter, "forget", None)
            if forget is not None:
                forget(seq)
