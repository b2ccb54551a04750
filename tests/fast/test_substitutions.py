"""The copy drafter's substitutions (speculation/substitutions.py): an answer that renames an
identifier breaks its copy at the first two occurrences; from then on the copy proposes the new
name wherever the source has the old one, and drops the substitution where the answer keeps
the old name."""

from tandem.engine.events import SpeculationOptions
from tandem.engine.request import GenerationRequest
from tandem.engine.sequence import Sequence
from tandem.speculation.drafters.ngram import NgramDrafter
from tandem.speculation.substitutions import Substitution, Substitutions, learn

OLD, NEW = [50, 51], [60]  # an identifier of two tokens, renamed to one
SOURCE = [1, 2, *OLD, 3, 4, 5, 6, *OLD, 7, 8, 9, 10, *OLD, 11, 12, 13, 14, *OLD, 15, 16]


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


def test_a_substitution_applies_from_its_second_sighting_where_its_original_is_followed_by_no_excluded_token():
    subs = Substitutions()
    found = Substitution(tuple(OLD), tuple(NEW))
    subs.saw(found)
    assert subs.at(SOURCE, 2, len(SOURCE)) is None  # seen once: a one-off edit, maybe
    subs.saw(found)
    assert subs.at(SOURCE, 2, len(SOURCE)) == found and subs.at(SOURCE, 3, len(SOURCE)) is None
    assert subs.at(SOURCE, 2, 3) is None  # the original must lie before `end`
    subs.broken(found, 3)
    assert subs.at(SOURCE, 2, len(SOURCE)) is None and subs.at(SOURCE, 8, len(SOURCE)) is not None
    subs.broken(found, 7)
    assert len(subs) == 0  # struck out


def test_a_renamed_identifier_breaks_the_copy_twice_then_the_copy_writes_the_new_name():
    drafter = NgramDrafter(min_ngram=2, max_ngram=4)
    seq = sequence(SOURCE + [1, 2])  # the answer starts copying the source
    assert drafter.offer(seq, limit=4).copy == (*OLD, 3, 4)
    seq.tokens += NEW  # the first occurrence renamed (the round's bonus token): the copy departs ...
    assert drafter.offer(seq, limit=4).candidate.cap == 0
    seq.tokens += [3, 4]
    assert drafter.offer(seq, limit=4).copy == (5, 6, *OLD)  # ... and rejoins; seen once, not applied
    seq.tokens += [5, 6, *NEW, 7, 8]  # the second occurrence renamed too (in one round: another drafter's copy)
    second = drafter.offer(seq, limit=4)
    assert second.copy == (9, 10, *NEW, 11)  # from here on the copy writes the new name
    seq.tokens += [9, 10, *NEW, 11]
    followed = drafter.offer(seq, limit=4)
    assert followed.candidate.source.startswith("follow") and followed.copy == (12, 13, 14, *NEW)
    seq.tokens += [12, 13, 14, *OLD]  # here the answer keeps the old name: struck, not before 15
    drafter.offer(seq, limit=4)
    (kept,) = drafter.substitutions["s"].applied
    assert kept.unless_next == {15} and kept.strikes == 1
    drafter.forget(seq)
    assert not (drafter.substitutions or drafter.follows or drafter.departed or drafter.unjoined)


def test_without_substitutions_the_copy_is_the_source_verbatim():
    """A one-off edit is never applied elsewhere: the constant 50 changed once stays 50 later."""
    drafter = NgramDrafter(min_ngram=2, max_ngram=4)
    seq = sequence(SOURCE + [1, 2])
    drafter.offer(seq, limit=4)
    seq.tokens += [*NEW, 3, 4]
    drafter.offer(seq, limit=4)
    seq.tokens += [5, 6]
    assert drafter.offer(seq, limit=6).copy == (*OLD, 7, 8, 9, 10)


def test_what_the_copy_proposes_is_what_its_alignment_then_accepts():
    """Fast path against its own check: emitting `copy_ahead`'s tokens keeps the alignment, on
    random sources with substitutions applied; a different token departs."""
    import random

    from tandem.speculation.drafters.ngram import Departure, Follow, advance, copy_ahead

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
