"""Drafting with a small model, for many sequences at once.

`ModelDrafter` offers the draft model to every sequence (priced with its catch-up on tokens the
draft has not seen yet) and hands the chosen jobs to a `DraftModel`: where the model runs. Here
that is `LocalDraftModel` (a batch runner in this process, drafting in lock-step); a cluster
replica plugs in the drafter workers instead (cluster/runtime/remote_draft.py).
"""

from typing import Protocol

from tandem.models.cost import CostView
from tandem.speculation.batch_depth import DraftCandidate
from tandem.speculation.drafters.base import DraftJob, DraftOffer, KeepDrafting, SequenceDraft


class DraftModel(Protocol):
    def cost_view(self, seq) -> CostView | None:
        """The cost curve of the draft model that would draft for seq (None: none is available)."""
        ...

    def catch_up_ms(self, seq) -> float:
        """seq's one-time catch-up before its first draft token (tokens the draft has not seen)."""
        ...

    def draft(self, jobs: list[DraftJob], keep_drafting: KeepDrafting | None) -> list[SequenceDraft]: ...


class ModelDrafter:
    name = "model"
    uses_model = True

    def __init__(self, model: DraftModel):
        self.model = model

    def offer(self, seq, limit: int) -> DraftOffer:
        if self.model.cost_view(seq) is None:
            return DraftOffer(DraftCandidate("none", 0, False, fixed_k=0))
        setup = self.model.catch_up_ms(seq)
        return DraftOffer(DraftCandidate("model", limit, True, setup, seq.fixed_k, seq.room))

    def propose_batch(self, jobs: list[DraftJob], keep_drafting: KeepDrafting | None = None) -> list[SequenceDraft]:
        return self.model.draft(jobs, keep_drafting) if jobs else []

    def forget(self, seq) -> None:
        """seq left the engine: a model that keeps per-sequence state elsewhere frees it (drafter
        workers' caches; a local model's slots are freed with the target's)."""
        forget = getattr(self.model, "forget", None)
        if forget is not None:
            forget(seq.seq_id)
