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
edit. Where the answer rejoined after writing a short span of its own in place of the source's
(a rename), the copy proposes that replacement wherever the source holds the original further
on (speculation/substitutions.py), so a renamed identifier breaks the copy once, not at every
occurrence.
"""

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from tandem.speculation.batch_depth import DraftCandidate
from tandem.speculation.drafters.base import NO_OFFER, DraftJob, DraftOffer, SequenceDraft, copy_drafts
from tandem.speculation.substitutions import MAX_SPAN, Substitution, Substitutions, learn

SHARED_MIN_NGRAM = 3  # shorter matches in the shared store are too often coincidences
FOLLOW_BUCKETS = (8, 32, 128)  # tokens an alignment has had accepted: follow0 below 8, follow1 below 32, ...


@dataclass(frozen=True, slots=True)
class Follow:
    """Where a sequence's copy comes from: tokens[position] is what the source says comes after
    tokens[:length] (or, while `pending` holds the rest of a substitution's replacement, those
    first); `run`: tokens emitted along this alignment so far."""

    length: int
    position: int
    run: int
    pending: tuple[int, ...] = ()
    applying: Substitution | None = None  # the substitution `pending` is the rest of


@dataclass(frozen=True, slots=True)
class Departure:
    """Where an answer left its copy: the source position it left (the start of the original
    where it left inside a substitution's replacement), the answer's length then, and that
    substitution, if any (the answer did not follow it)."""

    position: int
    at: int
    broken: Substitution | None = None


def follow_source(run: int) -> str:
    return f"follow{sum(run >= edge for edge in FOLLOW_BUCKETS)}"


def advance(follow: Follow, tokens: Sequence[int], substitutions: Substitutions | None = None) -> Follow | Departure:
    """The alignment after the tokens emitted since it was made, where they are what its source
    (with the substitutions applied) said; else where they departed from it."""
    if len(tokens) < follow.length:
        return Departure(follow.position, len(tokens))
    position, pending, applying = follow.position, list(follow.pending), follow.applying
    for n in range(follow.length, len(tokens)):
        if not pending:
            applying = substitutions.at(tokens, position, n) if substitutions else None
            if applying is not None:
                pending, position = list(applying.replacement), position + len(applying.original)
            elif position < n and tokens[position] == tokens[n]:
                position += 1
                continue
            else:
                return Departure(position, n)
        if pending[0] != tokens[n]:
            return Departure(position - len(applying.original), n, applying)
        pending.pop(0)
    if position >= len(tokens):
        return Departure(position, len(tokens))
    return Follow(len(tokens), position, follow.run + len(tokens) - follow.length, tuple(pending),
                  applying if pending else None)


def copy_ahead(follow: Follow, tokens: Sequence[int], substitutions: Substitutions | None, limit: int) -> list[int]:
    """Up to `limit` tokens the source says come next, the substitutions applied."""
    ahead, position = list(follow.pending[:limit]), follow.position
    while len(ahead) < limit and position < len(tokens):
        found = substitutions.at(tokens, position, len(tokens)) if substitutions else None
        if found is not None:
            ahead.extend(found.replacement)
            position += len(found.original)
        else:
            ahead.append(tokens[position])
            position += 1
    return ahead[:limit]


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
        self.departed: dict[str, Departure] = {}  # seq_id -> where its copy last departed from its source
        self.unjoined: dict[str, Departure] = {}  # seq_id -> where a copy that had held (>= 8 tokens) departed, until it rejoins
        self.substitutions: dict[str, Substitutions] = {}  # seq_id -> what its answer writes for what

    def offer(self, seq, limit: int) -> DraftOffer:
        tokens = seq.tokens
        substitutions = self.substitutions.get(seq.seq_id)
        previous = self.follows.pop(seq.seq_id, None)
        moved = None if previous is None else advance(previous, tokens, substitutions)
        if isinstance(moved, Follow) and moved.run > 0:
            self.follows[seq.seq_id] = moved
            return _copy_offer(follow_source(moved.run), copy_ahead(moved, tokens, substitutions, limit), seq)
        if isinstance(moved, Departure):
            if moved.broken is not None:
                after = moved.position + len(moved.broken.original)
                substitutions.broken(moved.broken, tokens[after] if after < len(tokens) else None)
            self.departed[seq.seq_id] = moved
            if previous.run >= FOLLOW_BUCKETS[0]:
                self.unjoined[seq.seq_id] = moved
        departed = self.unjoined.get(seq.seq_id) or self.departed.get(seq.seq_id)
        found = _ngram_match_end(tokens, self.min_ngram, self.max_ngram, None if departed is None else departed.position)
        if found is not None and found[1] + 1 < len(tokens):
            length, end = found
            follow = Follow(len(tokens), end + 1, 0)
            if seq.seq_id in self.unjoined:
                self._rejoined(seq.seq_id, follow, length, tokens)
            substitutions = self.substitutions.get(seq.seq_id)
            self.follows[seq.seq_id] = follow
            return _copy_offer(f"ngram{length}", copy_ahead(follow, tokens, substitutions, limit), seq)
        if self.store is not None and seq.request.cache_salt is None:  # a salted request drafts from its own text
            length, continuation = self.store.continuation(seq.tokens, limit)
            if length >= SHARED_MIN_NGRAM and continuation:
                return _copy_offer(f"shared{length}", continuation, seq)
        return NO_OFFER

    def _rejoined(self, seq_id: str, rejoined: Follow, matched: int, tokens: Sequence[int]) -> None:
        """A lookup found a source again after a copy that had held departed. Where it is the
        same source just past the departure, what the answer wrote in place of the source's
        span, if a short substitution, is applied from now on (speculation/substitutions.py).
        A rejoin elsewhere (the prompt's instructions naming the new identifier) waits for the
        next, until the answer has written too much since the departure to be a substitution."""
        departed = self.unjoined[seq_id]
        longest = MAX_SPAN + matched + 1
        source_span = tokens[departed.position:rejoined.position]
        written = tokens[departed.at:]
        if len(written) > longest:
            del self.unjoined[seq_id]
        elif departed.position <= rejoined.position - matched and len(source_span) <= longest:
            del self.unjoined[seq_id]
            found = learn(source_span, written)
            if found is not None:
                self.substitutions.setdefault(seq_id, Substitutions()).saw(found)

    def propose_batch(self, jobs: list[DraftJob], keep_drafting=None) -> list[SequenceDraft]:
        return copy_drafts(jobs)

    def forget(self, seq) -> None:
        self.follows.pop(seq.seq_id, None)
        self.departed.pop(seq.seq_id, None)
        self.unjoined.pop(seq.seq_id, None)
        self.substitutions.pop(seq.seq_id, None)


def _copy_offer(source: str, continuation: list[int], seq) -> DraftOffer:
    return DraftOffer(DraftCandidate(source, len(continuation), False, fixed_k=seq.fixed_k), tuple(continuation))
