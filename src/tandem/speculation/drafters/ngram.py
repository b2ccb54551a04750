"""Copy drafting: propose what followed an earlier occurrence of the context's tail.

Model-free. Prompt lookup: for n from `max_ngram` down to `min_ngram`, find the most recent
earlier position where the last n tokens also occur, and propose the tokens that followed it
(source "ngram<n>"). Failing that, the shared n-gram store (what earlier requests produced;
speculation/shared_store/store.py) may have a continuation (source "shared<n>"). Code edits and extraction
copy long spans from the prompt, which is where this shines.

The copy follows its source: each sequence remembers where in its own tokens (prompt or output)
its last copy came from. While what the target emitted is what that source says next, the next
proposal continues from there (source "follow<b>", b growing with the tokens this alignment has
had accepted: a copy that has held for a hundred tokens is trusted with long drafts), instead
of looking up the tail again, which in repetitive text (keys of a config, similar lines of
code) may jump to another place. After the answer departs from its source (an edit), the
lookup re-aligns as soon as its tail matches again, preferring among equally long matches the
one nearest after the old source position: an edited file rejoins its original just past the
edit.
"""

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from tandem.speculation.batch_depth import DraftCandidate
from tandem.speculation.drafters.base import NO_OFFER, DraftJob, DraftOffer, SequenceDraft, copy_drafts

SHARED_MIN_NGRAM = 3  # shorter matches in the shared store are too often coincidences
FOLLOW_BUCKETS = (8, 32, 128)  # tokens an alignment has had accepted: follow0 below 8, follow1 below 32, ...


@dataclass(frozen=True, slots=True)
class Follow:
    """Where a sequence's copy comes from: tokens[position] is what the source says comes after
    tokens[:length]; `run`: tokens emitted along this alignment so far."""

    length: int
    position: int
    run: int


def follow_source(run: int) -> str:
    return f"follow{sum(run >= edge for edge in FOLLOW_BUCKETS)}"


def agreed(follow: Follow, tokens: Sequence[int]) -> int:
    """How many of the tokens emitted since `follow` was made are what its source says."""
    count = 0
    while (follow.length + count < len(tokens) and follow.position + count < len(tokens)
           and tokens[follow.length + count] == tokens[follow.position + count]):
        count += 1
    return count


def advance(follow: Follow | None, tokens: Sequence[int]) -> Follow | None:
    """The alignment after the tokens emitted since it was made, if they are what its source
    said (None where they departed from it)."""
    if follow is None:
        return None
    grown = len(tokens) - follow.length
    end = follow.position + grown
    if grown < 0 or end >= len(tokens) or agreed(follow, tokens) < grown:
        return None
    return Follow(len(tokens), end, follow.run + grown)


@dataclass(frozen=True, slots=True)
class NgramMatch:
    ngram_len: int
    continuation: list[int]


def find_ngram_match(token_ids: Sequence[int], k: int, min_ngram: int, max_ngram: int,
                     near: int | None = None) -> NgramMatch | None:
    """The longest earlier match (at most max_ngram) of the context's tail, the most recent among
    equally long ones (or, given `near`, the one whose continuation starts nearest after that
    position); None if shorter than min_ngram. The tail never matches itself."""
    found = _ngram_match_end(token_ids, min_ngram, max_ngram, near)
    if found is None:
        return None
    length, end = found
    return NgramMatch(length, list(token_ids[end + 1: end + 1 + k]))


def _ngram_match_end(token_ids: Sequence[int], min_ngram: int, max_ngram: int,
                     near: int | None) -> tuple[int, int] | None:
    tokens = token_ids if isinstance(token_ids, list) else list(token_ids)
    last = len(tokens) - 1
    if last < min_ngram:
        return None
    candidates = np.flatnonzero(np.asarray(tokens[:last]) == tokens[last])  # ends of 1-token matches
    best_len, best_end, best_distance = 0, -1, 0
    for end in candidates[::-1].tolist():  # most recent first
        n = 1
        while n < max_ngram and end - n >= 0 and tokens[end - n] == tokens[last - n]:
            n += 1
        distance = _distance(end + 1, near)
        if n > best_len or (n == best_len and distance < best_distance):
            best_len, best_end, best_distance = n, end, distance
            if n == max_ngram and near is None:
                break
    if best_len < min_ngram:
        return None
    return best_len, best_end


def _distance(position: int, near: int | None) -> int:
    """How far a continuation at `position` is from `near`: positions at or after it first."""
    if near is None:
        return 0
    return position - near if position >= near else (1 << 30) + near - position


class NgramDrafter:
    name = "ngram"
    uses_model = False

    def __init__(self, min_ngram: int = 2, max_ngram: int = 4, store=None):
        self.min_ngram = min_ngram
        self.max_ngram = max_ngram
        self.store = store  # shared n-gram store, or None
        self.follows: dict[str, Follow] = {}  # seq_id -> where its copy comes from
        self.departed: dict[str, int] = {}  # seq_id -> the source position its copy departed from

    def offer(self, seq, limit: int) -> DraftOffer:
        tokens = seq.tokens
        previous = self.follows.pop(seq.seq_id, None)
        follow = advance(previous, tokens)
        if follow is not None and follow.run > 0:
            self.follows[seq.seq_id] = follow
            return _copy_offer(follow_source(follow.run), list(tokens[follow.position: follow.position + limit]), seq)
        if previous is not None and follow is None:
            self.departed[seq.seq_id] = previous.position + agreed(previous, tokens)  # where it left
        found = _ngram_match_end(tokens, self.min_ngram, self.max_ngram, self.departed.get(seq.seq_id))
        if found is not None and found[1] + 1 < len(tokens):
            length, end = found
            self.follows[seq.seq_id] = Follow(len(tokens), end + 1, 0)
            return _copy_offer(f"ngram{length}", list(tokens[end + 1: end + 1 + limit]), seq)
        if self.store is not None:
            length, continuation = self.store.continuation(seq.tokens, limit)
            if length >= SHARED_MIN_NGRAM and continuation:
                return _copy_offer(f"shared{length}", continuation, seq)
        return NO_OFFER

    def propose_batch(self, jobs: list[DraftJob], keep_drafting=None) -> list[SequenceDraft]:
        return copy_drafts(jobs)

    def forget(self, seq) -> None:
        self.follows.pop(seq.seq_id, None)
        self.departed.pop(seq.seq_id, None)


def _copy_offer(source: str, continuation: list[int], seq) -> DraftOffer:
    return DraftOffer(DraftCandidate(source, len(continuation), False, fixed_k=seq.fixed_k), tuple(continuation))
