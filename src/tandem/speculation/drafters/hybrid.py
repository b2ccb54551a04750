"""Hybrid drafting: a copy where the context (or the shared store) repeats, the model elsewhere.

A match of at least `min_ngram` tokens is offered as a copy with the draft model as its
fallback: when the planner gives the copy k = 0 (its acceptance does not pay here), the model
drafts instead. With no match the model is offered directly. The default drafter.
"""

from dataclasses import replace

from tandem.speculation.drafters.base import DraftJob, SequenceDraft, copy_drafts
from tandem.speculation.drafters.model import ModelDrafter
from tandem.speculation.drafters.ngram import NgramDrafter

HYBRID_NGRAM = (3, 8)  # hybrid only trusts longer matches: the model is its fallback


class HybridDrafter:
    name = "hybrid"
    uses_model = True

    def __init__(self, model: ModelDrafter, ngram: NgramDrafter):
        self.model = model
        self.ngram = ngram

    def offer(self, seq, limit: int):
        model_offer = self.model.offer(seq, limit)
        copy = self.ngram.offer(seq, limit)
        if copy.candidate.cap == 0:
            return model_offer
        if not model_offer.uses_model:
            return copy
        return replace(copy, fallback=model_offer)

    def propose_batch(self, jobs: list[DraftJob], keep_drafting=None) -> list[SequenceDraft]:
        by_model = [job for job in jobs if job.offer.uses_model]
        from_model = iter(self.model.propose_batch(by_model, keep_drafting))
        copies = iter(copy_drafts([job for job in jobs if not job.offer.uses_model]))
        return [next(from_model) if job.offer.uses_model else next(copies) for job in jobs]
