"""What every batching engine keeps the same way (the single-process engine and the cluster
coordinator): the waiting queue, the running sequences, the counts the worker thread reads,
the context check on submit, and adding and cancelling requests that are still queued."""

from collections import deque

from tandem.engine.events import SequenceUpdate, SpeculationOptions
from tandem.engine.request import GenerationRequest
from tandem.engine.sequence import Sequence
from tandem.errors import TandemError


class SequencePool:
    context_length: int
    default_drafter: str
    default_k: int | str

    def __init__(self):
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

    def validate(self, request: GenerationRequest, options: SpeculationOptions = SpeculationOptions()) -> None:
        if len(request.prompt_ids) >= self.context_length:
            raise TandemError(f"the prompt has {len(request.prompt_ids)} tokens but the context holds "
                              f"{self.context_length}")

    def add(self, seq_id: str, request: GenerationRequest, options: SpeculationOptions = SpeculationOptions()) -> None:
        self.validate(request, options)
        self.waiting.append(Sequence.create(seq_id, request, options, self.default_drafter, self.default_k))

    def cancel_waiting(self, seq_id: str) -> SequenceUpdate | None:
        """Drop a request that was never admitted; None if it is not waiting."""
        for seq in self.waiting:
            if seq.seq_id == seq_id:
                self.waiting.remove(seq)
                return SequenceUpdate(seq_id, (), finished=True, finish_reason="cancelled")
        return None
