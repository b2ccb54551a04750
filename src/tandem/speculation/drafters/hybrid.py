"""Hybrid drafting: a copy where the context (or recent outputs) repeats, the model elsewhere.

The copy is the n-gram match (at least 3 tokens) or the suffix proposal: both are offered, and
the planner keeps the one whose source is expected to have the most drafts accepted (its
acceptance so far, over the copy's length; engine/stages.py), so each request's rounds follow
whichever copy has been doing better on text like this, phase by phase (the sources are per
match length and confidence). The copy is offered with the draft model as its fallback: when
the planner gives the copy k = 0 (its acceptance does not pay here), the model drafts instead.
With no copy the model is offered directly. The default drafter. Built without a model it is
its copy part alone (bench/ceiling/drafting_replay.py replays it so).
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

    def __init__(self, model: ModelDrafter | None, ngram: NgramDrafter, suffix: SuffixDrafter | None = None):
        self.model = model
        self.uses_model = model is not None
        self.ngram = ngram
        self.suffix = suffix

    def offer(self, seq, limit: int):
        copy = self._copy(seq, limit)
        if self.model is None:
            return copy
        model_offer = self.model.offer(seq, limit)
        if copy.candidate.cap == 0:
            return model_offer
        if not model_offer.uses_model:
            return copy
        return replace(copy, fallback=model_offer)

    def _copy(self, seq, limit: int) -> DraftOffer:
        """The n-gram copy with the suffix copy as its alternative (either alone where the other
        found nothing; NO_OFFER's cap 0 where neither did)."""
        copy = self.ngram.offer(seq, limit)
        found = self.suffix.proposal(seq, limit) if self.suffix is not None and limit > 0 else None
        if found is None:
            return copy
        suffix = suffix_offer(found, seq)
        return suffix if copy.candidate.cap == 0 else replace(copy, alternatives=(suffix,))

    def forget(self, seq) -> None:
        """seq left: its copy's alignment goes (the suffix drafter is the registry's own, told apart)."""
        self.ngram.forget(seq)

    def propose_batch(self, jobs: list[DraftJob], keep_drafting=None) -> list[SequenceDraft]:
        by_model = [job for job in jobs if job.offer.uses_model]
        from_model = iter(self.model.propose_batch(by_model, keep_drafting) if by_model else [])
        copies = iter(copy_drafts([job for job in jobs if not job.offer.uses_model]))
        return [next(from_model) if job.offer.uses_model else next(copies) for job in jobs]
