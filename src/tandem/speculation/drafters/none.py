"""The `none` drafter: proposes nothing, so the engine decodes with the target alone."""

from tandem.speculation.drafters.base import NO_OFFER, DraftJob, DraftOffer, SequenceDraft


class NoDrafter:
    name = "none"
    uses_model = False

    def offer(self, seq, limit: int) -> DraftOffer:
        return NO_OFFER

    def propose_batch(self, jobs: list[DraftJob], keep_drafting=None) -> list[SequenceDraft]:
        return [SequenceDraft("none", []) for _ in jobs]
