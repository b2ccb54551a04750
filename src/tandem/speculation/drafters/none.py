"""The `none` drafter: proposes nothing, so the engine decodes with the target alone."""

from typing import Sequence

from tandem.spec.drafters.base import EMPTY_DRAFT, Draft, DraftRequest


class NoDrafter:
    name = "none"

    def propose(self, token_ids: Sequence[int], request: DraftRequest) -> Draft:
        return EMPTY_DRAFT

    def cost_ms(self, num_tokens: int) -> float:
        return 0.0
