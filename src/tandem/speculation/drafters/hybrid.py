"""Hybrid drafting: a copy where the context (or recent outputs) repeats, the model elsewhere.

The copy is the n-gram match (at least `min_ngram` tokens) or the suffix proposal, whichever
matched more context (the suffix one on a tie: it knows how often its continuation followed);
it is offered with the draft model as its fallback: when the planner gives the copy k = 0 (its
acceptance does not pay here), the model drafts instead. With no copy the model is offered
directly. The default drafter.
"""

from dataclasses import replace

from tandem.speculation.drafters.base import DraftJob, DraftOffer, SequenceDraft, copy_drafts
from tandem.speculation.drafters.model import ModelDrafter
from tandem.speculation.drafters.ngram import NgramDrafter
from tandem.speculation.drafters.suffix import SuffixDrafter, suffix_offer

HYBRID_NGRAM = (3, 8)  # hybrid only trusts longer matches: the model is its fallback


class HybridDrafter:
    name = "hybrid"
    uses_model = True

    def __init__(self, model: ModelDrafter, ngram: NgramDrafter, suffix: SuffixDrafter | None = None):
        self.model = model
        self.ngram = ngram
        self.suffix = suffix

    def offer(self, seq, limit: int):
        model_offer = self.model.offer(seq, limit)
        copy = self._copy(seq, limit)
        if copy.candidate.cap == 0:
            return model_offer
        if not model_offer.uses_model:
            return copy
        return replace(copy, fallback=model_offer)

    def _copy(self, seq, limit: int) -> DraftOffer:
        copy = self.ngram.offer(seq, limit)
        if self.suffix is None:
            return copy
        found = self.suffix.proposal(seq, limit) if limit > 0 else None
        if found is not None and found.match_len >= _match_len(copy):
            return suffix_offer(found, seq)
        return copy

    def propose_batch(self, jobs: list[DraftJob], keep_drafting=None) -> list[SequenceDraft]:
        by_model = [job for job in jobs if job.offer.uses_model]
        from_model = iter(self.model.propose_batch(by_model, keep_drafting))
        copies = iter(copy_drafts([job for job in jobs if not job.offer.uses_model]))
        return [next(from_model) if job.offer.uses_model else next(copies) for job in jobs]


def _match_len(offer: DraftOffer) -> int:
    """Context tokens an n-gram offer matched ("ngram5", "shared3": 5, 3); 0 for none."""
    digits = offer.candidate.source.lstrip("abcdefghijklmnopqrstuvwxyz")
    return int(digits) if offer.candidate.cap and digits.isdigit() else 0
