"""The drafters behind `offer` / `propose_batch`, without a model: the n-gram drafter's sources
(a copy from the context, or from the shared store), hybrid's copy with the model as fallback,
the registry's errors, and the lock-step draft model stopping at a stop token or where
`keep_drafting` says."""

import numpy as np
import pytest

from tandem.engine.events import SpeculationOptions
from tandem.engine.request import GenerationRequest
from tandem.engine.sequence import Sequence
from tandem.errors import TandemError
from tandem.models.batch_runner import BatchItem
from tandem.models.cost import CostModel, CostView, catch_up_ms
from tandem.speculation.batch_depth import DraftCandidate
from tandem.speculation.drafters.base import DraftJob, DraftOffer, SequenceDraft
from tandem.speculation.drafters.hybrid import HybridDrafter
from tandem.speculation.drafters.lockstep import LocalDraftModel
from tandem.speculation.drafters.model import ModelDrafter
from tandem.speculation.drafters.ngram import NgramDrafter, find_ngram_match
from tandem.speculation.drafters.registry import build_drafters, check_drafter

VOCAB = 16


def sequence(tokens, k=4, stop_token_ids=frozenset(), max_tokens=32) -> Sequence:
    request = GenerationRequest(tuple(tokens), max_tokens=max_tokens, stop_token_ids=stop_token_ids)
    seq = Sequence.create("s", request, SpeculationOptions(k=k), "ngram")
    seq.slot = 0
    return seq


class FakeStore:
    """A shared n-gram store that always knows `continuation` after a match of `length`."""

    def __init__(self, length: int, continuation: list[int]):
        self.length = length
        self.continuation_ids = continuation

    def continuation(self, context, max_tokens: int):
        return self.length, self.continuation_ids[:max_tokens]


class FakeDraftModel:
    """A DraftModel that is always available and costs nothing to catch up."""

    def cost_view(self, seq):
        return CostView(CostModel(), fused=False)

    def catch_up_ms(self, seq):
        return 0.0

    def draft(self, jobs, keep_drafting):
        raise AssertionError("offers never draft")


# --- n-gram and hybrid offers -----------------------------------------------------------------


def test_ngram_offer_names_its_source_by_match_length():
    offer = NgramDrafter(min_ngram=2, max_ngram=4).offer(sequence([1, 2, 3, 9, 9, 1, 2, 3]), limit=4)
    assert (offer.candidate.source, offer.copy, offer.uses_model) == ("ngram3", (9, 9, 1, 2), False)
    assert offer.candidate.cap == 4 and offer.candidate.fixed_k == 4
    assert NgramDrafter().offer(sequence([1, 2, 3]), limit=4).candidate.cap == 0  # no match, no offer


def test_ngram_offer_respects_the_limit_and_proposes_its_copy():
    seq = sequence([1, 2, 3, 4, 5, 6, 7, 1, 2])
    drafter = NgramDrafter()
    assert drafter.offer(seq, limit=2).copy == (3, 4)
    offer = drafter.offer(seq, limit=8)
    (draft,) = drafter.propose_batch([DraftJob(seq, offer, 3)])
    assert (draft.source, draft.token_ids, draft.q_draft) == ("ngram2", [3, 4, 5], None)


def test_a_copy_follows_its_source_where_a_fresh_lookup_would_jump_elsewhere():
    """The answer copies the prompt from its start; the tail [2, 3] occurs twice in the prompt.
    Once the emitted tokens confirm the alignment, the copy goes on from its own source (40, 8,
    ...) as source "follow0", where the most recent match of the tail would say 50."""
    prompt = [7, 1, 2, 3, 40, 8, 1, 2, 3, 50]
    seq = sequence(prompt + [7, 1])
    drafter = NgramDrafter(min_ngram=2, max_ngram=2)
    first = drafter.offer(seq, limit=4)
    assert (first.candidate.source, first.copy) == ("ngram2", (2, 3, 40, 8))
    seq.tokens += [2, 3]  # one draft accepted, and the target's own token agrees with the source
    followed = drafter.offer(seq, limit=4)
    assert (followed.candidate.source, followed.copy) == ("follow0", (40, 8, 1, 2))
    assert NgramDrafter(min_ngram=2, max_ngram=2).offer(seq, limit=4).copy[0] == 50  # a fresh lookup
    seq.tokens += [40, 8, 1, 2, 3, 50, 7, 1]  # a long run later: the next bucket
    assert drafter.offer(seq, limit=4).candidate.source == "follow1"
    drafter.forget(seq)
    assert not drafter.follows and not drafter.departed


def test_after_an_edit_the_copy_rejoins_its_source_nearest_after_where_it_left():
    """The answer (which already wrote 5, 6, 77) copies the prompt from [1, 2], departs from it
    (an edit: 99 for 30), then rejoins with [5, 6]: of the two equally long matches, the one just
    after the departure (31) wins over the most recent one (the answer's own 77)."""
    seq = sequence([1, 2, 30, 5, 6, 31] + [5, 6, 77, 1, 2])
    drafter = NgramDrafter(min_ngram=2, max_ngram=2)
    assert drafter.offer(seq, limit=3).copy == (30, 5, 6)
    seq.tokens += [99, 5, 6]
    rejoined = drafter.offer(seq, limit=2)
    assert (rejoined.candidate.source, rejoined.copy) == ("ngram2", (31, 5))
    assert NgramDrafter(min_ngram=2, max_ngram=2).offer(seq, limit=2).copy == (77, 1)  # a fresh lookup
    assert find_ngram_match([5, 6, 7, 5, 6, 8, 5, 6], 1, 2, 2).continuation == [8]
    assert find_ngram_match([5, 6, 7, 5, 6, 8, 5, 6], 1, 2, 2, near=1).continuation == [7]


def test_ngram_offer_falls_back_to_the_shared_store():
    seq = sequence([1, 2, 3, 4])  # no match in the context
    offer = NgramDrafter(store=FakeStore(5, [8, 9, 10])).offer(seq, limit=2)
    assert (offer.candidate.source, offer.copy) == ("shared5", (8, 9))
    assert NgramDrafter(store=FakeStore(2, [8, 9])).offer(seq, limit=2).candidate.cap == 0  # too short to trust
    in_context = NgramDrafter(store=FakeStore(5, [8])).offer(sequence([1, 2, 3, 1, 2]), limit=2)
    assert in_context.candidate.source == "ngram2"  # the context's own match comes first


def test_hybrid_offers_a_long_copy_with_the_model_as_fallback():
    hybrid = HybridDrafter(ModelDrafter(FakeDraftModel()), NgramDrafter(3, 8))
    offer = hybrid.offer(sequence([1, 2, 3, 4, 8, 1, 2, 3]), limit=4)
    assert (offer.candidate.source, offer.copy) == ("ngram3", (4, 8, 1, 2))
    assert offer.fallback is not None and offer.fallback.candidate.source == "model"
    assert offer.fallback.uses_model and offer.fallback.candidate.cap == 4
    only_model = hybrid.offer(sequence([5, 2, 3, 4, 8, 1, 2, 3]), limit=4)  # only "2 3" repeats
    assert only_model.candidate.source == "model" and only_model.fallback is None


def test_hybrid_copies_for_copy_jobs_and_asks_the_model_for_the_rest():
    class CountingModel(FakeDraftModel):
        def draft(self, jobs, keep_drafting):
            self.jobs = jobs
            return [SequenceDraft("model", [42]) for _ in jobs]

    model = CountingModel()
    hybrid = HybridDrafter(ModelDrafter(model), NgramDrafter(3, 8))
    copy_seq, model_seq = sequence([1, 2, 3, 4, 8, 1, 2, 3]), sequence([5, 6])
    copy_offer, model_offer = hybrid.offer(copy_seq, 4), hybrid.offer(model_seq, 4)
    drafts = hybrid.propose_batch([DraftJob(copy_seq, copy_offer, 2), DraftJob(model_seq, model_offer, 2)])
    assert [d.token_ids for d in drafts] == [[4, 8], [42]]
    assert [job.seq for job in model.jobs] == [model_seq]


def test_hybrid_without_a_model_is_its_copy_part_alone():
    """As bench/ceiling/drafting_replay.py replays it: the copy where there is one, never a model offer."""
    hybrid = HybridDrafter(None, NgramDrafter(3, 8))
    assert not hybrid.uses_model
    copy_seq, plain_seq = sequence([1, 2, 3, 4, 8, 1, 2, 3]), sequence([5, 2, 3, 4, 8, 1, 2, 3])
    offer = hybrid.offer(copy_seq, limit=4)
    assert (offer.candidate.source, offer.copy, offer.fallback) == ("ngram3", (4, 8, 1, 2), None)
    assert hybrid.offer(plain_seq, limit=4).candidate.cap == 0  # nothing to copy: no offer at all
    assert [d.token_ids for d in hybrid.propose_batch([DraftJob(copy_seq, offer, 2)])] == [[4, 8]]


# --- the registry -------------------------------------------------------------------------------


def test_registry_builds_by_name_and_explains_mistakes():
    assert set(build_drafters(None)) == {"none", "ngram", "suffix"}
    assert set(build_drafters(FakeDraftModel())) == {"none", "ngram", "suffix", "model", "hybrid"}
    with_model = build_drafters(FakeDraftModel())
    assert with_model["hybrid"].suffix is with_model["suffix"]  # one shared index of recent outputs
    assert check_drafter("ngram", has_draft_model=False) == "ngram"
    for name in ("hybrid", "model"):
        with pytest.raises(TandemError, match="draft model"):
            check_drafter(name, has_draft_model=False)
    with pytest.raises(TandemError, match="unknown drafter"):
        check_drafter("medusa")


# --- the lock-step draft model ------------------------------------------------------------------


class CountingRunner:
    """A batch runner double whose greedy next token is always the last token fed plus one."""

    name = "counting"
    vocab_size = VOCAB
    context_length = 256
    max_slots = 1
    fused = False
    can_copy_prefix = False

    def __init__(self):
        self.cost = CostModel()
        self.fed: list[list[BatchItem]] = []  # the items of every forward, in order

    def forward_batch(self, items: list[BatchItem], views: bool = False) -> list[np.ndarray]:
        self.fed.append(list(items))
        eye = np.eye(VOCAB, dtype=np.float32) * 10
        return [eye[[(item.token_ids[-1] + 1) % VOCAB] * item.num_logits] for item in items]

    def rollback(self, slot: int, length: int) -> None:
        pass


def model_job(seq: Sequence, k: int) -> DraftJob:
    return DraftJob(seq, DraftOffer(DraftCandidate("model", 8, True, fixed_k=seq.fixed_k)), k)


def test_local_draft_model_stops_at_a_stop_token_and_at_k():
    model = LocalDraftModel(CountingRunner())
    (plain,) = model.draft([model_job(sequence([1, 2, 3], k=5), 5)])
    assert plain.token_ids == [4, 5, 6, 7, 8]
    (stopped,) = model.draft([model_job(sequence([1, 2, 3], k=5, stop_token_ids=frozenset({6})), 5)])
    assert stopped.token_ids == [4, 5, 6]  # a draft past a stop token could never be emitted
    assert model.forwards == 5 + 3


def test_local_draft_model_goes_as_deep_as_keep_drafting_says_for_auto_depth():
    model = LocalDraftModel(CountingRunner())
    asked = []

    def keep_drafting(seq, confidences):
        asked.append(len(confidences))
        return len(confidences) < 3

    (draft,) = model.draft([model_job(sequence([1, 2], k="auto"), 1)], keep_drafting)
    assert draft.token_ids == [3, 4, 5] and asked == [1, 2, 3]  # beyond the planned k = 1
    (fixed,) = model.draft([model_job(sequence([1, 2], k=1), 1)], keep_drafting)
    assert fixed.token_ids == [3]  # a fixed k ignores confidence


def test_a_short_catch_up_goes_a_token_at_a_time_where_the_curve_prices_single_calls_lower():
    """A round's catch-up of 2-4 tokens for one sequence is fed as one-token calls where the
    draft model's curve says n of them cost less than one call of n (tiled multi-row kernels on
    a CPU), and in one call where it does not; the drafts are the same either way."""
    tiled = CostModel({1: 10.0, 2: 35.0, 4: 45.0, 8: 60.0})  # 2 rows: 3.5 single rows' time
    for synced, singly in ((2, True), (4, True), (8, False)):
        runner = CountingRunner()
        runner.cost = tiled
        model = LocalDraftModel(runner)
        tokens = list(range(1, 11))
        seq = sequence(tokens, k=2)
        seq.draft_cached = tokens[:len(tokens) - synced]  # the draft has seen all but `synced` of them
        (draft,) = model.draft([model_job(seq, 2)])
        assert draft.token_ids == [11, 12]
        assert seq.draft_cached == tokens + [11]
        calls = [[(item.token_ids, item.num_logits) for item in items] for items in runner.fed]
        if singly:
            assert calls[:synced] == [[((t,), 0)] for t in tokens[-synced:-1]] + [[((10,), 1)]]
        else:
            assert calls[0] == [(tuple(tokens[-synced:]), 1)]
        assert calls[-1] == [((11,), 1)]  # then one token deeper, as before
    assert catch_up_ms(tiled, 2) == pytest.approx(2 * 10.0 - 10.0)  # the planner prices the cheaper way
    assert catch_up_ms(tiled, 8) == pytest.approx(60.0 - 10.0)
    runner = CountingRunner()  # a curve without the penalty (an unmeasured one: proportional)
    model = LocalDraftModel(runner)
    seq = sequence([1, 2, 3, 4], k=1)
    seq.draft_cached = [1, 2]
    model.draft([model_job(seq, 1)])
    assert runner.fed[0] == [BatchItem(0, (3, 4), 1)]


def test_local_draft_model_catches_up_in_chunks_where_the_job_allows_fewer_tokens():
    runner = CountingRunner()
    model = LocalDraftModel(runner)
    seq = sequence([1, 2, 3, 4, 5, 6, 7])  # the draft slot has seen none of it
    busy = sequence([1, 2], k=1)
    first = model.draft([DraftJob(seq, model_job(seq, 2).offer, 2, catch_up=4), model_job(busy, 1)])
    assert first[0].token_ids == [] and first[1].token_ids == [3]  # seq only caught up
    assert [(item.token_ids, item.num_logits) for item in runner.fed[0]] == [((1, 2, 3, 4), 0), ((1, 2), 1)]
    assert seq.draft_cached == [1, 2, 3, 4]
    forwards = len(runner.fed)
    none_left = model.draft([DraftJob(seq, model_job(seq, 2).offer, 2, catch_up=0)])
    assert none_left[0].token_ids == [] and len(runner.fed) == forwards  # nothing fed at all
    (caught_up,) = model.draft([DraftJob(seq, model_job(seq, 2).offer, 2, catch_up=2)])  # the rest fits
    assert runner.fed[-2][0].token_ids == (5, 6, 7) and caught_up.token_ids == [8, 9]
