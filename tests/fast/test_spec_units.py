"""Unit tests of the spec pieces that need no model: n-gram matching, drafter source names, the
cost curve, depth control, and the validation of requests and sampling parameters."""

import numpy as np
import pytest

from tandem.engine.request import GenerationRequest
from tandem.errors import TandemError
from tandem.models.cost import OBSERVATION_WEIGHT, CostModel, measure_cost
from tandem.spec.depth import PROBE_BUDGET, AutoDepth, FixedDepth
from tandem.spec.drafters.base import Draft, DraftRequest
from tandem.spec.drafters.hybrid import HybridDrafter
from tandem.spec.drafters.ngram import NgramDrafter, find_ngram_match
from tandem.spec.drafters.registry import build_drafter
from tandem.spec.sampling import SamplingParams

CPU_CURVE = CostModel({1: 27.0, 5: 111.0, 16: 173.0})  # llama.cpp 1.5B on this CPU, ms
GPU_CURVE = CostModel({1: 20.0, 16: 20.0})  # verification nearly free
NGRAM_COST = lambda num_tokens: 0.05  # noqa: E731


# --- find_ngram_match ----------------------------------------------------------------------


def test_longest_ngram_wins():
    # "4 3 2" occurs once before (-> 6 1), the shorter "3 2" more recently (-> 8 4): n = 3 wins
    tokens = [4, 3, 2, 6, 1, 3, 2, 8, 4, 3, 2]
    match = find_ngram_match(tokens, k=2, min_ngram=1, max_ngram=4)
    assert (match.ngram_len, match.continuation) == (3, [6, 1])
    match = find_ngram_match(tokens, k=2, min_ngram=1, max_ngram=2)  # capped at n = 2
    assert (match.ngram_len, match.continuation) == (2, [8, 4])


def test_most_recent_occurrence_wins():
    tokens = [5, 6, 1, 5, 6, 2, 5, 6, 3, 5, 6]
    match = find_ngram_match(tokens, k=1, min_ngram=2, max_ngram=2)
    assert match.continuation == [3]


def test_tail_never_matches_itself():
    assert find_ngram_match([1, 2, 3, 4], k=4, min_ngram=1, max_ngram=4) is None
    # an overlapping earlier occurrence is fine: in a run the continuation is the run itself
    match = find_ngram_match([7, 7, 7], k=4, min_ngram=2, max_ngram=2)
    assert (match.ngram_len, match.continuation) == (2, [7])


def test_continuation_capped_by_k():
    tokens = [1, 2, 3, 4, 5, 6, 1, 2]
    assert find_ngram_match(tokens, k=3, min_ngram=2, max_ngram=3).continuation == [3, 4, 5]
    assert find_ngram_match(tokens, k=0, min_ngram=2, max_ngram=3).continuation == []
    # the continuation may also end at the context's end, short of k
    assert find_ngram_match([8, 9, 8], k=5, min_ngram=1, max_ngram=1).continuation == [9, 8]


def test_no_match_returns_none():
    assert find_ngram_match([1, 2, 3, 1, 4], k=4, min_ngram=2, max_ngram=3) is None
    assert find_ngram_match([1], k=4, min_ngram=1, max_ngram=3) is None
    assert find_ngram_match([1, 2, 1, 2], k=4, min_ngram=3, max_ngram=3) is None  # only n=2


# --- drafter sources ------------------------------------------------------------------------


def request(depth, limit=8):
    return DraftRequest(SamplingParams(), np.random.default_rng(0), depth, limit)


class FakeModelDrafter:
    name = "model"

    def __init__(self):
        self.calls = 0

    def cost_ms(self, num_tokens):
        return 2.0 * num_tokens

    def reset(self):
        pass

    def propose(self, token_ids, request):
        self.calls += 1
        return Draft([42], None, source=self.name, draft_forwards=1)


def test_ngram_drafter_names_its_source_by_match_length():
    depth = FixedDepth(4)
    draft = NgramDrafter(min_ngram=2, max_ngram=4).propose([1, 2, 3, 9, 9, 1, 2, 3], request(depth))
    assert (draft.source, draft.token_ids, draft.q_draft) == ("ngram3", [9, 9, 1, 2], None)
    assert NgramDrafter().propose([1, 2, 3], request(depth)).k == 0


def test_ngram_drafter_respects_limit_and_depth():
    tokens = [1, 2, 3, 4, 5, 6, 7, 1, 2]
    assert NgramDrafter().propose(tokens, request(FixedDepth(8), limit=2)).token_ids == [3, 4]
    assert NgramDrafter().propose(tokens, request(FixedDepth(1), limit=8)).token_ids == [3]


def test_hybrid_copies_a_long_match_else_asks_the_model():
    model = FakeModelDrafter()
    hybrid = HybridDrafter(model)  # n-gram part: 3 to 5 tokens
    draft = hybrid.propose([1, 2, 3, 4, 8, 1, 2, 3], request(FixedDepth(4)))
    assert (draft.source, draft.token_ids, model.calls) == ("ngram3", [4, 8, 1, 2], 0)
    draft = hybrid.propose([5, 2, 3, 4, 8, 1, 2, 3], request(FixedDepth(4)))  # only "2 3" repeats
    assert (draft.source, draft.token_ids, model.calls) == ("model", [42], 1)


def test_hybrid_falls_back_to_the_model_when_the_ngram_source_gets_k_0():
    depth = AutoDepth(CPU_CURVE)  # on the CPU curve a prior-level source is not worth drafting
    model = FakeModelDrafter()
    draft = HybridDrafter(model).propose([1, 2, 3, 4, 8, 1, 2, 3], request(depth))
    assert draft.source == "model" and model.calls == 1


def test_registry_builds_by_name_and_explains_mistakes():
    assert build_drafter("ngram", None).name == "ngram"
    assert build_drafter("none", None).name == "none"
    with pytest.raises(TandemError, match="draft model"):
        build_drafter("hybrid", None)
    with pytest.raises(TandemError, match="unknown drafter"):
        build_drafter("medusa", None)


# --- CostModel ------------------------------------------------------------------------------


def test_cost_interpolates_and_extrapolates():
    curve = CostModel({1: 27.0, 5: 111.0, 16: 173.0})
    assert curve.cost_ms(0) == 0.0
    assert curve.cost_ms(1) == 27.0
    assert curve.cost_ms(3) == pytest.approx(69.0)  # halfway between 27 and 111
    assert curve.cost_ms(10) == pytest.approx(111.0 + 5 * 62.0 / 11)
    assert curve.cost_ms(20) == pytest.approx(173.0 + 4 * 62.0 / 11)  # last segment's slope
    assert CostModel().cost_ms(7) == 7.0  # unmeasured: proportional


def test_measured_points_are_read_as_measured_even_when_a_larger_call_is_cheaper():
    torch_cpu = CostModel({1: 61.0, 2: 98.0, 3: 120.0, 4: 84.0, 8: 78.0})  # re-profiled, reproducibly
    assert torch_cpu.cost_ms(4) == 84.0  # a planner may draft 3 tokens for 23 ms over plain decoding
    assert torch_cpu.cost_ms(16) == pytest.approx(78.0 * 2)  # a falling last segment: proportional
    depth = AutoDepth(torch_cpu)
    assert depth.choose_k("ngram3", NGRAM_COST, limit=8) > 0


def test_observe_moves_toward_observations():
    curve = CostModel({1: 27.0, 5: 111.0})
    curve.observe(5, 211.0)
    assert 111.0 < curve.cost_ms(5) < 211.0
    for _ in range(200):
        curve.observe(5, 211.0)
    assert curve.cost_ms(5) == pytest.approx(211.0, abs=0.1)
    assert curve.latency_ms == {1: 27.0, 5: 111.0}  # the profile stays; a ratio corrects it
    interpolated = curve.cost_ms(3)
    curve.observe(3, 0.0)  # an unmeasured size starts from the interpolated correction
    assert curve.cost_ms(3) == pytest.approx((1 - OBSERVATION_WEIGHT) * interpolated)
    fresh = CostModel()
    fresh.observe(2, 30.0)
    assert fresh.cost_ms(2) == 30.0 and fresh.cost_ms(4) == 60.0  # unprofiled: proportional, scaled
    assert CostModel.from_json(curve.to_json()).cost_ms(4) == pytest.approx(curve.cost_ms(4), rel=0.02)


def test_observations_at_one_size_keep_the_curves_slope_just_above_it():
    """Serving many long sequences made the plain batch (16 tokens) half again as dear as its
    profile. Moving only the point at 16 left 17..23 at their profiled values, and the
    non-decreasing read made them cost the same as 16: drafts looked free."""
    profile = {8: 200.0, 16: 260.0, 24: 380.0, 32: 420.0}
    curve = CostModel(dict(profile))
    for _ in range(100):
        curve.observe(16, 390.0)  # 1.5x the profile
    assert curve.cost_ms(16) == pytest.approx(390.0, rel=0.01)
    marginal = curve.cost_ms(20) - curve.cost_ms(16)
    assert marginal == pytest.approx(1.5 * (380.0 - 260.0) / 2, rel=0.02)  # the profile's slope, scaled
    for _ in range(5):
        curve.observe(24, 570.0)  # now and then a step with drafts
    for _ in range(100):
        curve.observe(16, 480.0)  # the contexts grow: everything dearer
    assert curve.cost_ms(24) - curve.cost_ms(16) > 0.8 * (480.0 / 260.0) * (380.0 - 260.0)  # 24 moved too
    assert curve.ratio_at(1000) == curve.ratio_at(64)  # a prefill-sized step: the nearest correction


def test_prefill_sized_observations_share_a_few_places_per_octave():
    curve = CostModel({1: 30.0, 64: 800.0})
    for total in range(17, 2048):  # every prompt length a server might prefill
        curve.observe(total, 12.5 * total)
    assert len(curve.ratio) <= 8 * 7  # 8 places per octave from 16 to 2048
    assert curve.cost_ms(1000) == pytest.approx(12500.0, rel=0.02)


def test_profiles_sweep_every_size_in_each_repeat():
    order = []
    measure_cost(lambda tokens: order.append(len(tokens)), lambda length: None, 0, sizes=(1, 2, 4), repeats=2)
    assert order == [1, 1, 2, 4, 1, 2, 4]  # warm-up, then whole sweeps


# --- depth control --------------------------------------------------------------------------


def test_auto_depth_chooses_plain_decoding_when_verifying_costs_like_decoding():
    depth = AutoDepth(CPU_CURVE)  # prior acceptance 0.6: mediocre
    assert depth.choose_k("ngram3", NGRAM_COST, limit=16) == 0
    assert depth.choose_k("model", lambda n: 8.0 * n, limit=16) == 0


def test_auto_depth_drafts_deep_when_verifying_is_nearly_free():
    depth = AutoDepth(GPU_CURVE)
    for _ in range(20):
        depth.record("ngram3", drafted=8, accepted=8, overhead_ms=0.5)
    assert depth.acceptance("ngram3") > 0.95
    assert depth.choose_k("ngram3", NGRAM_COST, limit=64) == depth.k_max
    assert depth.choose_k("ngram3", NGRAM_COST, limit=5) == 5
    assert depth.choose_k("model", lambda n: 1.0 * n, limit=64) >= 3  # prior only, still pays


def test_auto_depth_grows_k_for_a_source_with_high_recorded_acceptance():
    depth = AutoDepth(CostModel({1: 22.0, 16: 52.0}))  # 2 ms per extra verified token
    before = depth.choose_k("ngram4", NGRAM_COST, limit=16)
    for _ in range(10):
        depth.record("ngram4", drafted=6, accepted=6, overhead_ms=0.5)
    after = depth.choose_k("ngram4", NGRAM_COST, limit=16)
    assert 0 < before < after
    fresh = AutoDepth(CostModel({1: 22.0, 16: 52.0}))
    assert depth.choose_k("ngram5", NGRAM_COST, limit=16) == fresh.choose_k("ngram5", NGRAM_COST, limit=16)  # per source
    assert fresh.choose_k("ngram2", NGRAM_COST, limit=16) <= before <= fresh.choose_k("ngram8", NGRAM_COST, limit=16)
    for _ in range(60):
        depth.record("ngram4", drafted=6, accepted=0, overhead_ms=0.5)
    assert depth.choose_k("ngram4", NGRAM_COST, limit=16) < before  # and it follows the text


def test_keep_drafting_stops_when_confidence_collapses():
    depth = AutoDepth(GPU_CURVE)
    draft_cost = lambda n: 1.0 * n  # noqa: E731
    assert depth.keep_drafting("model", [0.95, 0.95], draft_cost)
    assert not depth.keep_drafting("model", [0.95, 0.95, 0.01], draft_cost)


def test_fixed_depth_respects_the_limit():
    depth = FixedDepth(5)
    assert [depth.choose_k("model", NGRAM_COST, limit) for limit in (0, 2, 5, 9)] == [0, 2, 5, 5]
    assert depth.keep_drafting("model", [0.0], NGRAM_COST)
    depth.record("model", 5, 3, 0.1)
    assert list(depth.history) == [("model", 5, 3)]


# --- validation -------------------------------------------------------------------------------


@pytest.mark.parametrize("kwargs", [{"prompt_ids": ()}, {"max_tokens": 0}, {"max_tokens": -3},
                                    {"max_tokens": 2.5}])
def test_generation_request_rejects_bad_input(kwargs):
    with pytest.raises(TandemError):
        GenerationRequest(**{"prompt_ids": (1, 2), **kwargs})


@pytest.mark.parametrize("kwargs", [{"temperature": -0.1}, {"top_p": 0.0}, {"top_p": 1.5},
                                    {"top_k": -1}])
def test_sampling_params_reject_bad_input(kwargs):
    with pytest.raises(TandemError):
        SamplingParams(**kwargs)


def test_valid_params_are_accepted():
    assert SamplingParams().greedy
    assert not SamplingParams(temperature=0.7, top_k=5, top_p=0.9, seed=1).greedy
    assert GenerationRequest((1,), max_tokens=1).max_tokens == 1


def test_a_source_that_cannot_pay_is_never_probed():
    """On a CPU llama.cpp target a 22 ms/token draft model loses even at 99% acceptance."""
    llama_target = CostModel({1: 34.6, 2: 66.1, 3: 100.8, 4: 122.1, 8: 233.6, 16: 279.4})
    depth = AutoDepth(llama_target)
    chosen = [depth.choose_k("model", lambda n: 22.2 * n, limit=49) for _ in range(5000)]
    assert max(chosen) == 0
    free_drafts = [depth.choose_k("ngram3", lambda n: 0.05, limit=49) for _ in range(5000)]
    probes = sum(k > 0 for k in free_drafts)
    probe_extra_ms = llama_target.cost_ms(2) - llama_target.cost_ms(1) + 0.05
    assert probes > 0  # a free n-gram source could pay, so it is probed ...
    assert probes * probe_extra_ms <= PROBE_BUDGET * 5000 * llama_target.cost_ms(1) + probe_extra_ms  # ... within budget
