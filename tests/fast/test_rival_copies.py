"""Copies offered beside the one drafted learn from the round as if they had drafted it
(engine/stages.py): a fresh alignment that loses its first rounds to a short, confident suffix
match still earns the acceptance it would have had, and wins once it would do better."""

from tandem.engine.events import SpeculationOptions
from tandem.engine.request import GenerationRequest
from tandem.engine.sequence import Sequence
from tandem.engine.stages import commit_round, draft_all, plan_drafts
from tandem.models.cost import CostModel, CostView
from tandem.speculation.batch_depth import BatchDepthPlanner, DraftCandidate
from tandem.speculation.drafters.base import DraftOffer, copy_drafts

LONG_COPY = tuple(range(200, 263))  # a 63-token alignment with the source
SHORT_COPY = LONG_COPY[:4]  # a suffix match that agrees with it, four tokens long


class TwoCopies:
    """A drafter offering a long copy from a weak-prior source with a short, confident one beside it."""

    name = "two-copies"
    uses_model = False

    def __init__(self, long_copy=LONG_COPY):
        self.long_copy = long_copy

    def offer(self, seq, limit):
        long = DraftOffer(DraftCandidate("follow0", len(self.long_copy), False), self.long_copy)
        short = DraftOffer(DraftCandidate("suffix9", len(SHORT_COPY), False), SHORT_COPY)
        return DraftOffer(long.candidate, long.copy, alternatives=(short,))

    def propose_batch(self, jobs, keep_drafting=None):
        return copy_drafts(jobs)


def one_round(planner, drafter, answer):
    """Plan, draft and commit one round of a sequence whose target emits `answer`'s tokens."""
    seq = Sequence.create("s", GenerationRequest((1, 2, 3), max_tokens=512), SpeculationOptions(), "two-copies")
    seq.slot = 0
    (job,) = plan_drafts([seq], {"two-copies": drafter}, planner, 4096)
    (draft,) = draft_all([job], {"two-copies": drafter})
    accepted = 0
    while accepted < len(draft.token_ids) and draft.token_ids[accepted] == answer[accepted]:
        accepted += 1
    emitted = list(draft.token_ids[:accepted]) + [answer[accepted]]
    commit_round(seq, draft, emitted, accepted, planner, 4096)
    return draft


def planner() -> BatchDepthPlanner:
    curve = {1: 80.0, 2: 130.0, 4: 150.0, 8: 190.0, 16: 250.0, 32: 420.0, 64: 620.0}
    return BatchDepthPlanner(CostView(CostModel(curve), True))


def test_a_long_copy_that_agrees_with_the_drafted_short_one_learns_and_takes_over():
    p = planner()
    answer = list(LONG_COPY) + [999]
    first = one_round(p, TwoCopies(), answer)
    assert first.source == "suffix9" and [r.source for r in first.rivals] == ["follow0"]
    before = p.acceptance("follow0")
    one_round(p, TwoCopies(), answer)
    assert p.acceptance("follow0") > before  # it agreed with every emitted token
    rounds = [one_round(p, TwoCopies(), answer).source for _ in range(4)]
    assert rounds[-1] == "follow0" and len(one_round(p, TwoCopies(), answer).token_ids) > len(SHORT_COPY)


def test_a_rival_that_would_have_been_rejected_learns_that_too():
    p = planner()
    wrong = LONG_COPY[:2] + (7,) + LONG_COPY[3:]  # breaks at its third token
    answer = list(LONG_COPY) + [999]
    before = p.acceptance("follow0")
    for _ in range(3):
        one_round(p, TwoCopies(wrong), answer)
    assert p.acceptance("follow0") < before
    estimate = p.estimates["follow0"]
    assert estimate.trials - estimate.accepted > 2.5  # three rejections recorded


def test_only_copies_that_follow_their_source_are_rivals():
    """A suffix match that loses its turn learns nothing from the round (its evidence, cut at
    the round's end, would speak only for its first tokens)."""
    p = planner()
    answer = list(LONG_COPY) + [999]
    for _ in range(3):
        one_round(p, TwoCopies(), answer)
    before = p.acceptance("suffix9")
    assert one_round(p, TwoCopies(), answer).source == "follow0"  # the follow copy took over
    assert p.acceptance("suffix9") == before
