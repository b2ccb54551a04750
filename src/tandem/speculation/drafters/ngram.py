"""Copy drafting: propose what followed an earlier occurrence of the context's tail.

Model-free. Prompt lookup: for n from `max_ngram` down to `min_ngram`, find the most recent
earlier position where the last n tokens also occur, and propose the tokens that followed it
(source "ngram<n>"). Failing that, the shared n-gram store (what earlier requests produced;
serve/ngram_store.py) may have a continuation (source "shared<n>"). Code edits and extraction
copy long spans from the prompt, which is where this shines.
"""

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from tandem.speculation.batch_depth import DraftCandidate
from tandem.speculation.drafters.base import NO_OFFER, DraftJob, DraftOffer, SequenceDraft, copy_drafts

SHARED_MIN_NGRAM = 3  # shorter matches in the shared store are too often coincidences


@dataclass(frozen=True, slots=True)
class NgramMatch:
    ngram_len: int
    continuation: list[int]


def find_ngram_match(token_ids: Sequence[int], k: int, min_ngram: int, max_ngram: int) -> NgramMatch | None:
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
    uses_model = False

    def __init__(self, min_ngram: int = 2, max_ngram: int = 4, store=None):
        self.min_ngram = min_ngram
        self.max_ngram = max_ngram
        self.store = store  # shared n-gram store, or None

    def offer(self, seq, limit: int) -> DraftOffer:
        match = find_ngram_match(seq.tokens, limit, self.min_ngram, self.max_ngram)
        if match is not None and match.continuation:
            return _copy_offer(f"ngram{match.ngram_len}", match.continuation, seq)
        if self.store is not None:
            length, continuation = self.store.continuation(seq.tokens, limit)
            if length >= SHARED_MIN_NGRAM and continuation:
                return _copy_offer(f"shared{length}", continuation, seq)
        return NO_OFFER

    def propose_batch(self, jobs: list[DraftJob], keep_drafting=None) -> list[SequenceDraft]:
        return copy_drafts(jobs)


def _copy_offer(source: str, continuation: list[int], seq) -> DraftOffer:
    return DraftOffer(DraftCandidate(source, len(continuation), False, fixed_k=seq.fixed_k), tuple(continuation))
