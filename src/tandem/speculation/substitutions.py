"""Substitutions a copy has seen: where an answer copies its source but writes a short span of
its own in place of one of the source's (a renamed identifier), the source's later occurrences
of that span are likely replaced the same way.

A copy that departs from its source and rejoins it soon after (speculation/drafters/ngram.py)
gives a pair: what the source said from the departure to the rejoin, and what the answer wrote
over the same stretch; less what they share at both ends, both short, it is a substitution, and
from then on the copy proposes the replacement wherever the source holds the original. Where
the answer keeps the original, the token after it is excluded (a rename of `total` need not
rewrite `total_count`), and a substitution broken MAX_STRIKES times is dropped: a one-off edit
(a constant's value changed where it is defined) costs at most that many broken rounds.

Applied from the first sighting: replaying the edits workload's answers through the copy
drafter (bench-serve --prompts edits, 8 answers of the 1.5B, Intel Xeon, 2026-11-26), the three
renames took 24, 19 and 29 rounds, against 27, 19 and 34 when a second sighting was required
and 32, 19 and 42 with no substitutions; the constant and insertion answers took the same
rounds either way.
"""

from dataclasses import dataclass, field, replace
from typing import Sequence

MAX_SPAN = 8  # tokens on either side of a learned substitution
MAX_STRIKES = 2  # occurrences the answer may leave unreplaced before the substitution is dropped
MAX_KEPT = 8  # substitutions a sequence applies, the oldest dropped first


@dataclass(frozen=True, slots=True)
class Substitution:
    original: tuple[int, ...]  # what the source says
    replacement: tuple[int, ...]  # what the answer writes instead
    unless_next: frozenset[int] = field(default_factory=frozenset)  # not where the source goes on with these
    strikes: int = 0

    @property
    def key(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        return self.original, self.replacement


def learn(source: Sequence[int], written: Sequence[int]) -> Substitution | None:
    """The substitution that turns `source` into `written` (both from where the copy departed
    to where it rejoined, the rejoining tokens included): their differing middle, where both
    sides are 1..MAX_SPAN tokens and something shared follows; else None (an insertion, a
    deletion, or too long a change to recur)."""
    source, written = tuple(source), tuple(written)
    head = 0
    while head < min(len(source), len(written)) and source[head] == written[head]:
        head += 1
    tail = 0
    while (tail < min(len(source), len(written)) - head
           and source[len(source) - 1 - tail] == written[len(written) - 1 - tail]):
        tail += 1
    original, replacement = source[head:len(source) - tail], written[head:len(written) - tail]
    if tail == 0 or not (1 <= len(original) <= MAX_SPAN and 1 <= len(replacement) <= MAX_SPAN):
        return None
    return Substitution(original, replacement)


class Substitutions:
    """One sequence's substitutions, newest last."""

    def __init__(self):
        self.applied: list[Substitution] = []

    def __len__(self) -> int:
        return len(self.applied)

    def saw(self, found: Substitution) -> None:
        """A rejoin showed `found`: applied from now on (one already applied is kept as it is)."""
        if not any(s.key == found.key for s in self.applied):
            self.applied = [s for s in self.applied if s.original != found.original][-(MAX_KEPT - 1):] + [found]

    def broken(self, found: Substitution, next_token: int | None) -> None:
        """The answer did not write `found`'s replacement where the source went on with
        `next_token`: not applied before that token again, and dropped at MAX_STRIKES."""
        for i, s in enumerate(self.applied):
            if s.key == found.key:
                if s.strikes + 1 >= MAX_STRIKES:
                    del self.applied[i]
                else:
                    excluded = s.unless_next | ({next_token} if next_token is not None else set())
                    self.applied[i] = replace(s, unless_next=frozenset(excluded), strikes=s.strikes + 1)
                return

    def at(self, tokens: Sequence[int], position: int, end: int) -> Substitution | None:
        """The applied substitution whose original starts at tokens[position] and ends by
        `end` (the longest where several do), or None."""
        best = None
        for s in self.applied:
            stop = position + len(s.original)
            if (stop <= end and tokens[position] == s.original[0]
                    and (best is None or len(s.original) > len(best.original))
                    and tuple(tokens[position:stop]) == s.original
                    and (stop >= len(tokens) or tokens[stop] not in s.unless_next)):
                best = s
        return best
