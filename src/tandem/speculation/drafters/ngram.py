"""Prompt-lookup drafting: copy what followed the latest earlier occurrence of the context's tail.

Model-free. For n from `max_ngram` down to `min_ngram`, find the most recent earlier position
where the last n tokens also occur, and propose the tokens that followed it. Code edits and
extraction copy long spans from the prompt, which is where this shines.
"""

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from tandem.spec.drafters.base import EMPTY_DRAFT, Draft, DraftRequest

NGRAM_COST_MS = 0.05  # a numpy search over the context, measured well under 0.1 ms


@dataclass(frozen=True, slots=True)
class NgramMatch:
    ngram_len: int
    continuation: list[int]


def find_ngram_match(
    token_ids: Sequence[int], k: int, min_ngram: int, max_ngram: int
) -> NgramMatch | None:
    """The longest earlier match (at most max_ngram) of the context's tail, the most recent among
    equally long ones; None if shorter than min_ngram. The tail never matches itself."""
    tokens = token_ids if isinstance(token_ids, list) else list(token_ids)
    last = len(tokens) - 1
    if last < min_ngram:
        return None
    candidates = np.flatnonzero(np.asarray(tokens[:last]) == tokens[last])  # ends of 1-token matches
    best_len, best_end = 0, -1
    for end in candidates[::-1].tolist():  # most recent first
        n = 1
        while n < max_ngram and end - n >= 0 and tokens[end - n] == tokens[last - n]:
            n += 1
        if n > best_len:
            best_len, best_end = n, end
            if n == max_ngram:
                break
    if best_len < min_ngram:
        return None
    return NgramMatch(best_len, list(tokens[best_end + 1 : best_end + 1 + k]))


class NgramDrafter:
    name = "ngram"

    def __init__(self, min_ngram: int = 2, max_ngram: int = 4):
        self.min_ngram = min_ngram
        self.max_ngram = max_ngram

    def propose(self, token_ids: Sequence[int], request: DraftRequest) -> Draft:
        match = find_ngram_match(token_ids, request.limit, self.min_ngram, self.max_ngram)
        if match is None or not match.continuation:
            return EMPTY_DRAFT
        return self.draft_from(match, request)

    def draft_from(self, match: NgramMatch, request: DraftRequest) -> Draft:
        source = f"{self.name}{match.ngram_len}"
        k = request.depth.choose_k(source, self.cost_ms, len(match.continuation))
        return Draft(match.continuation[:k], None, source=source)

    def cost_ms(self, num_tokens: int) -> float:
        return NGRAM_COST_MS
