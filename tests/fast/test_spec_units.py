"""Unit tests of the speculation pieces that need no model: n-gram matching, the cost curve, and
the validation of requests, sampling parameters and depths. Drafters: test_drafters.py; the
depth planner: test_depth.py and test_batch_depth.py."""

import pytest

from tandem.engine.events import SpeculationOptions
from tandem.engine.request import GenerationRequest
from tandem.errors import TandemError
from tandem.models.cost import OBSERVATION_WEIGHT, CostModel, CostView, measure_cost
from tandem.speculation.batch_depth import BatchDepthPlanner, DraftCandidate
from tandem.speculation.depth import K_LIMIT, AcceptanceEstimate, Auto, Fixed, parse_depth
from tandem.speculation.drafters.ngram import find_ngram_match
from tandem.speculation.sampling import SamplingParams


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
    planner = BatchDepthPlanner(CostView(torch_cpu, fused=False))
    ks, _ = planner.plan([DraftCandidate("ngram3", 8, False)])
    assert ks[0] > 0


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


def test_a_read_after_an_observation_sees_it():
    """Reads are kept for the last context (the planner asks a hundred times a step); an
    observation, or a read at another context, must not be answered from them."""
    curve = CostModel({1: 30.0, 4: 90.0}, deep_ms={1: 40.0, 4: 120.0}, base_context=64, deep_context=1024)
    shallow, deep = curve.cost_ms(4, 64), curve.cost_ms(4, 1024)
    assert (shallow, deep) == (90.0, 120.0) and curve.cost_ms(4, 1024) == deep
    curve.observe(4, 240.0, 1024)
    assert curve.cost_ms(4, 1024) == pytest.approx(120.0 * (1 + OBSERVATION_WEIGHT))
    assert curve.cost_ms(4, 64) == pytest.approx(90.0 * (1 + OBSERVATION_WEIGHT))
    unprofiled = CostModel()
    unprofiled.observe(2, 30.0)
    assert unprofiled.cost_ms(2) == 30.0
    unprofiled.observe(2, 40.0)
    assert unprofiled.cost_ms(2) == pytest.approx(31.0)


def test_both_curves_travel_and_scale():
    """A replica's news carries its short and deep curves with what it learned (to_wire); an
    emulated slower device scales both (scaled), so its engine still reads costs at the context."""
    curve = CostModel({1: 30.0, 4: 90.0}, deep_ms={1: 40.0, 4: 120.0}, base_context=64, deep_context=1024)
    for _ in range(50):
        curve.observe(4, 1.5 * curve.profiled_ms(4, 1024), 1024)  # calls of 4 turned out dearer
    wired = CostModel.from_wire(curve.to_wire())
    for n, context in ((1, 64), (4, 64), (4, 1024), (4, 544), (4, 3000)):
        assert wired.cost_ms(n, context) == pytest.approx(curve.cost_ms(n, context), rel=0.01), (n, context)
    assert CostModel.from_wire(curve.to_json()).cost_ms(4) == pytest.approx(curve.cost_ms(4), rel=0.01)  # old form
    slower = curve.scaled(3.0)
    assert slower.cost_ms(4, 1024) == pytest.approx(3.0 * curve.cost_ms(4, 1024))
    assert slower.deep_context == 1024 and slower.cost_ms(1, 64) == pytest.approx(90.0 * curve.ratio_at(1))


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


def test_a_rare_size_keeps_what_its_own_observations_show():
    """Short answers at C=1 (1.5B Q4, 2 threads, AMD EPYC Zen 5): a plain step (1 token) now and
    then a round of two drafts (3 tokens) 15% dearer than the profile. Pulled toward every
    1-token observation, the ratio at 3 settled near 1.03: the planner priced the round 55 ms
    where it took 64, and drafted copies that lost. An observation moves its neighbours by part
    of its own change, not toward its value."""
    curve = CostModel({1: 26.7, 2: 47.3, 3: 55.7, 4: 68.3, 8: 122.7})
    for step in range(1100):
        if step % 19 == 0:
            curve.observe(3, 1.15 * 55.7 * (1.03 if step % 2 else 0.97))
        else:
            curve.observe(1, 26.7 * (1.03 if step % 2 else 0.97))
    assert curve.ratio_at(3) == pytest.approx(1.15, abs=0.03)
    assert curve.ratio_at(1) == pytest.approx(1.0, abs=0.03)
    before = curve.ratio_at(3)
    for _ in range(300):
        curve.observe(1, 1.2 * 26.7)  # the machine slows: the rare size follows part of the change
    assert before * 1.03 < curve.ratio_at(3) < before * 1.2


def test_prefill_sized_observations_share_a_few_places_per_octave():
    curve = CostModel({1: 30.0, 64: 800.0})
    for total in range(17, 2048):  # every prompt length a server might prefill
        curve.observe(total, 12.5 * total)
    assert len(curve.ratio) <= 8 * 7  # 8 places per octave from 16 to 2048
    assert curve.cost_ms(1000) == pytest.approx(12500.0, rel=0.02)


# measured, 1.5B Q4 target, AMD EPYC, 2 threads: on 64 cached tokens 48 tokens cost less than
# 64, on 1,024 more (llama.cpp's flash attention scores 64 positions as one tile)
SHORT_CACHE = {1: 30.0, 4: 95.0, 16: 254.0, 32: 410.0, 48: 559.0, 63: 846.0, 64: 744.0}
DEEP_CACHE = {1: 40.0, 4: 118.0, 16: 353.0, 32: 606.0, 48: 945.0, 63: 1302.0, 64: 869.0}


def deep_curve() -> CostModel:
    return CostModel(dict(SHORT_CACHE), deep_ms=dict(DEEP_CACHE), base_context=64, deep_context=1024)


def test_a_deep_profile_is_read_at_the_context_asked():
    curve = deep_curve()
    assert curve.cost_ms(48) == 559.0 and curve.cost_ms(48, None) == 559.0  # no context: the base
    assert curve.cost_ms(48, 1024) == pytest.approx(945.0)
    assert curve.cost_ms(48, 544) == pytest.approx((559.0 + 945.0) / 2)  # linear in the context
    assert curve.cost_ms(64, 1984) == pytest.approx(869.0 + (869.0 - 744.0))  # extrapolated past the deep one
    assert curve.cost_ms(64, 0) == 744.0  # never below the base
    assert curve.cost_ms(64, 1024) < curve.cost_ms(48, 1024) and curve.cost_ms(64, 64) > curve.cost_ms(48, 64)
    flat = CostModel(dict(SHORT_CACHE))
    assert flat.cost_ms(48, 1024) == 559.0  # without a deep profile the context changes nothing


def test_observations_correct_the_curve_at_their_context():
    """A step as dear as the deep profile says, at its context, is no news: the ratio stays 1,
    so reads at a short context stay at the short profile."""
    curve = deep_curve()
    for _ in range(50):
        curve.observe(64, 869.0, 1024)
    assert curve.ratio_at(64) == pytest.approx(1.0)
    assert curve.cost_ms(64, 64) == pytest.approx(744.0)
    for _ in range(200):
        curve.observe(64, 1.1 * 869.0, 1024)  # a slower machine: 10% dearer everywhere
    assert curve.cost_ms(64, 64) == pytest.approx(1.1 * 744.0, rel=0.01)


def test_a_long_copy_deep_in_an_answer_gets_the_one_tile_round():
    """Where 64 tokens cost less than 48 (a deep cache), a copy that holds drafts 63; on a short
    cache, where 48 are cheaper, fewer. Read at the short profile everywhere, the planner chose
    47-draft rounds at 1,000+ cached tokens: 1,000-1,100 ms for 48 tokens against ~870 for 64."""
    planner = BatchDepthPlanner(CostView(deep_curve()))
    planner.estimates["follow3"] = AcceptanceEstimate.with_prior(0.995)
    copy = DraftCandidate("follow3", 63, False)
    assert planner.plan([copy], context=1024)[0] == [63]
    assert planner.plan([copy], context=64)[0] == [47]


def test_profiles_sweep_every_size_in_each_repeat():
    order = []
    measure_cost(lambda tokens: order.append(len(tokens)), lambda length: None, 0, sizes=(1, 2, 4), repeats=2,
                 after_each=lambda: order.append("tick"))
    assert order == [1, "tick", 1, "tick", 2, "tick", 4, "tick", 1, "tick", 2, "tick", 4, "tick"]  # warm-up, sweeps


def test_costs_are_the_fastest_sample_unless_a_statistic_is_asked(monkeypatch):
    from statistics import median

    import tandem.models.cost as cost

    def measured(**kwargs):
        ticks = iter([0.0, 0.010, 0.0, 0.030, 0.0, 0.020])  # three timed calls: 10, 30 and 20 ms
        monkeypatch.setattr(cost.time, "perf_counter", lambda: next(ticks))
        return measure_cost(lambda tokens: None, lambda length: None, 0, sizes=(4,), repeats=3, **kwargs)

    assert measured().cost_ms(4) == pytest.approx(10.0)
    assert measured(statistic=median).cost_ms(4) == pytest.approx(20.0)


# --- validation -------------------------------------------------------------------------------


@pytest.mark.parametrize("kwargs", [{"prompt_ids": ()}, {"max_tokens": 0}, {"max_tokens": -3},
                                    {"max_tokens": 2.5}])
def test_generation_request_rejects_bad_input(kwargs):
    with pytest.raises(TandemError):
        GenerationRequest(**{"prompt_ids": (1, 2), **kwargs})


@pytest.mark.parametrize("kwargs", [{"temperature": -0.1}, {"temperature": 2.5}, {"top_p": -0.1}, {"top_p": 1.5},
                                    {"top_k": -1}])
def test_sampling_params_reject_bad_input(kwargs):
    with pytest.raises(TandemError):
        SamplingParams(**kwargs)


def test_valid_params_are_accepted():
    assert SamplingParams().greedy
    assert not SamplingParams(temperature=0.7, top_k=5, top_p=0.9, seed=1).greedy
    assert SamplingParams(temperature=2.0).temperature == 2.0  # the API's bound, the command line's too
    assert GenerationRequest((1,), max_tokens=1).max_tokens == 1


@pytest.mark.parametrize("value,depth", [("auto", Auto()), (0, Fixed(0)), ("5", Fixed(5)), (K_LIMIT, Fixed(K_LIMIT)),
                                         (Fixed(3), Fixed(3))])
def test_parse_depth_reads_auto_and_integers(value, depth):
    assert parse_depth(value) == depth
    assert SpeculationOptions(k=value).k == depth  # the API's options parse on creation


@pytest.mark.parametrize("value", [K_LIMIT + 1, -1, "deep", "2.5", 2.5, True, None])
def test_parse_depth_rejects_bad_values(value):
    with pytest.raises(TandemError, match=f"from 0 to {K_LIMIT}"):
        parse_depth(value)


@pytest.mark.parametrize("k", [K_LIMIT + 1, -1, 1.0, False])
def test_fixed_depth_validates_k(k):
    with pytest.raises(TandemError, match="k must be"):
        Fixed(k)
