"""Hybrid drafting: an n-gram match from the context when there is a good one, else the model.

A match of at least `min_ngram` tokens whose source is expected to pay off (the depth policy
gives it k > 0) is copied; otherwise the draft model drafts. The default when a draft model is
given.
"""

from typing import Sequence

from tandem.spec.drafters.base import Draft, DraftRequest
from tandem.spec.drafters.model import ModelDrafter
from tandem.spec.drafters.ngram import NgramDrafter, find_ngram_match


class HybridDrafter:
    name = "hybrid"

    def __init__(self, model: ModelDrafter, ngram: NgramDrafter | None = None):
        self.model = model
        self.ngram = ngram or NgramDrafter(min_ngram=3, max_ngram=8)

    def cost_ms(self, num_tokens: int) -> float:
        return self.model.cost_ms(num_tokens)

    def reset(self) -> None:
        self.model.reset()

    def propose(self, token_ids: Sequence[int], request: DraftRequest) -> Draft:
        match = find_ngram_match(token_ids, request.limit, self.ngram.min_ngram, self.ngram.max_ngram)
        if match is not None and match.continuation:
            draft = self.ngram.draft_from(match, request)
            if draft.k:
                return draft
        return self.model.propose(token_ids, request)
