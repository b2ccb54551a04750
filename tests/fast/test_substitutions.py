"""The copy drafter's substitutions (speculation/substitutions.py): an answer that renames an
identifier breaks its copy at the first occurrence; from then on the copy proposes the new
name wherever the source has the old one, and drops the substitution where the answer keeps
the old name."""

import random

from tandem.engine.events import SpeculationOptions
from tandem.engine.request import GenerationRequest
from tandem.engine.sequence import Sequence
from tandem.speculation.drafters.ngram import Departure, Follow, NgramDrafter, advance, copy_ahead
from tandem.speculation.substitutions import Substitution, Substitutions, learn

OLD, NEW = [50, 51], [60]  # an identifier of two tokens, renamed to one
LEAD = list(range(100, 110))
GAPS = [list(range(3 + 10 * i, 13 + 10 * i)) for i in range(3)]  # 3..12, 13..22, 23..32
SOURCE = [*LEAD, *OLD, *GAPS[0], *OLD, *GAPS[1], *OLD, *GAPS[2], *OLD, 90, 91]


def sequence(tokens) -> Sequence:
    seq = Sequence.create("s", GenerationRequest(tuple(tokens), max_tokens=64), SpeculationOptions(k=4), "ngram")
    seq.slot = 0
    return seq


def test_learn_takes_the_differing_middle_of_a_short_change():
    assert learn([50, 51, 3, 4], [60, 3, 4]) == Substitution((50, 51), (60,))
    assert learn([9, 50, 3], [9, 60, 61, 3]) == Substitution((50,), (60, 61))
    assert learn([3, 4], [70, 3, 4]) is None  # an insertion: nothing in the source to replace
    assert learn([50, 3, 4], [3, 4]) is None  # a deletion
    assert learn(list(range(20)) + [3], list(range(100, 120)) + [3]) is None  # too long to recur
    assert learn([50, 51], [60, 61]) is None  # nothing shared after it: not a rejoin


def test_a_substitution_applies_where_its_original_is_followed_by_no_excluded_token():
    subs, first, second = Substitutions(), len(LEAD), len(LEAD) + 12  # where OLD starts, twice
    found = Substitution(tuple(OLD), tuple(NEW))
    assert subs.at(SOURCE, first, len(SOURCE)) is None
    subs.saw(found)
    assert subs.at(SOURCE, first, len(SOURCE)) == found and subs.at(SOURCE, first + 1, len(SOURCE)) is None
    assert subs.at(SOURCE, first, first + 1) is None  # the original must lie before `end`
    subs.broken(found, 3)
    assert subs.at(SOURCE, first, len(SOURCE)) is None and subs.at(SOURCE, second, len(SOURCE)) is not None
    subs.broken(found, 13)
    assert len(subs) == 0  # struck out


def test_a_renamed_identifier_breaks_the_copy_once_then_the_copy_writes_the_new_name():
    drafter = NgramDrafter(min_ngram=2, max_ngram=4)
    seq = sequence(SOURCE + LEAD[:2])  # the answer starts copying the source
    assert drafter.offer(seq, limit=4).copy == tuple(LEAD[2:6])
    seq.tokens += LEAD[2:]
    assert drafter.offer(seq, limit=4).copy == (*OLD, 3, 4)  # the copy has held for 8 tokens
    seq.tokens += NEW  # the first occurrence renamed (the round's bonus token): the copy departs ...
    assert drafter.offer(seq, limit=4).candidate.cap == 0
    seq.tokens += [3, 4]
    assert drafter.offer(seq, limit=4).copy == (5, 6, 7, 8)  # ... and rejoins: a substitution seen
    seq.tokens += GAPS[0][2:]
    second = drafter.offer(seq, limit=4)
    assert second.copy == (*NEW, 13, 14, 15)  # from here on the copy writes the new name
    seq.tokens += [*NEW, *GAPS[1]]
    assert drafter.offer(seq, limit=4).copy == (*NEW, 23, 24, 25)
    seq.tokens += [*NEW, 23]
    followed = drafter.offer(seq, limit=10)
    assert followed.candidate.source.startswith("follow") and followed.copy == (*GAPS[2][1:], *NEW)
    seq.tokens += [*GAPS[2][1:], *OLD]  # here the answer keeps the old name: struck, not before 90
    drafter.offer(seq, limit=4)
    (kept,) = drafter.substitutions["s"].applied
    assert kept.unless_next == {90} and kept.strikes == 1
    drafter.forget(seq)
    assert not (drafter.substitutions or drafter.follows or drafter.departed or drafter.unjoined)


def test_a_rejoin_elsewhere_first_waits_for_the_rejoin_past_the_departure():
    """The prompt's instruction names the new identifier ([60, 3] before the file): right after
    the departure the lookup follows it there, which is no substitution; the rejoin into the
    file just past the old name is."""
    instruction = [98, 60, 3, 97, 96]
    drafter = NgramDrafter(min_ngram=2, max_ngram=4)
    seq = sequence(instruction + SOURCE + LEAD[:2])
    drafter.offer(seq, limit=4)
    seq.tokens += LEAD[2:]
    drafter.offer(seq, limit=4)
    seq.tokens += [*NEW, 3]
    assert drafter.offer(seq, limit=2).copy == (97, 96)  # the instruction's continuation
    assert "s" in drafter.unjoined and not drafter.substitutions
    seq.tokens += [4, 5]
    assert drafter.offer(seq, limit=2).copy == (6, 7)  # rejoined past the departure, and saw it
    assert drafter.substitutions["s"].applied == [Substitution(tuple(OLD), tuple(NEW))]


def test_a_departure_that_is_no_substitution_leaves_the_copy_verbatim():
    """An insertion (70 before 3, nothing replaced) teaches nothing: the old name stays."""
    drafter = NgramDrafter(min_ngram=2, max_ngram=4)
    seq = sequence(SOURCE + LEAD)
    drafter.offer(seq, limit=4)
    seq.tokens += [*OLD, 70, 3, 4]
    drafter.offer(seq, limit=4)
    seq.tokens += GAPS[0][2:]
    assert drafter.offer(seq, limit=4).copy == (*OLD, 13, 14)


def test_what_the_copy_proposes_is_what_its_alignment_then_accepts():
    """Fast path against its own check: emitting `copy_ahead`'s tokens keeps the alignment, on
    random sources with substitutions applied; a different token departs."""
    rng = random.Random(0)
    for _ in range(300):
        tokens = [rng.randrange(6) for _ in range(rng.randrange(8, 40))]
        subs = Substitutions()
        for _ in range(rng.randrange(3)):
            found = Substitution(tuple(rng.randrange(6) for _ in range(rng.randrange(1, 3))),
                                 tuple(rng.randrange(6, 9) for _ in range(rng.randrange(1, 3))))
            subs.saw(found)
            subs.saw(found)
        follow = Follow(len(tokens), rng.randrange(len(tokens) - 1), 1)
        ahead = copy_ahead(follow, tokens, subs, rng.randrange(1, 12))
        moved = advance(follow, tokens + ahead, subs)
        assert isinstance(moved, Follow) and moved.run == 1 + len(ahead), (tokens, ahead, moved)
        assert isinstance(advance(follow, tokens + ahead[:-1] + [99], subs), Departure)
