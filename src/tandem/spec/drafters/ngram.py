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
    tokens = np.asarray(token_ids, dtype=np.int64)  # [length]
    length = tokens.shape[0]
    for n in range(min(max_ngram, length - 1), min_ngram - 1, -1):
        tail = tokens[length - n :]  # [n]
        windows = np.lib.stride_tricks.sliding_window_view(tokens[: length - 1], n)  # [L-n, n]
        hits = np.flatnonzero((windows == tail).all(axis=1))
        if hits.size:
            start = int(hits[-1]) + n
            return NgramMatch(n, tokens[start : start + k].tolist())
    return None


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
