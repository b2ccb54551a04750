"""The planner on hand-built profiles where the right answer is known, and on the examples."""

from pathlib import Path

import pytest
from profile_doubles import CHEAP_DRAFT, CONTEXT, FLAT, STEEP, both_worker, cluster, drafter, fused_profile, verifier

from tandem.cluster.planning.acceptance import expected_tokens
from tandem.cluster.planning.placement import PlacementPricer
from tandem.cluster.planning.planner import PlanOptions, options_for, plan_cluster
from tandem.cluster.planning.prediction import IN_REPLICA, DraftSource, WorkerCost, predict_step
from tandem.cluster.profiles.profile_store import cluster_profiles
from tandem.cluster.config.load import load_cluster
from tandem.speculation.batch_depth import STEP_OVERHEAD_MS
from tandem.speculation.drafters.registry import drafter_spec

EXAMPLES = Path(__file__).parents[3] / "examples" / "clusters"


def profiles_for(spec, target_ms, draft_ms=None, **draft_more):
    profiles = {}
    for w in spec.workers:
        if w.can_verify:
            profiles[(w.name, w.model)] = fused_profile(target_ms, w.model)
        if w.drafting_model:
            profiles[(w.name, w.drafting_model)] = fused_profile(draft_ms, w.drafting_model, **draft_more)
    return profiles


def plan(spec, target_ms, draft_ms=None, **options):
    options.setdefault("acceptance", {"model": 0.7, "ngram": 0.4, "hybrid": 0.7})
    return plan_cluster(spec, profiles_for(spec, target_ms, draft_ms), options_for(spec, **options))


def test_step_prediction_adds_up():
    kind = drafter_spec("model")
    verify = WorkerCost("v", "t", fused_profile(STEEP))
    draft = WorkerCost("d", "d", fused_profile(CHEAP_DRAFT), factor=2.0)
    step = predict_step(verify, DraftSource(kind, 0.5, "d", draft, rtt_ms=12.0), 3, 2, CONTEXT, 1.0)
    assert step.verify_ms == pytest.approx(STEEP[4] * 2)  # 2 sequences x 4 tokens = 8 tokens
    assert step.draft_ms == pytest.approx(3 * 2.0 * draft.profile.step_ms(2, 1, CONTEXT))
    assert (step.network_ms, step.overhead_ms) == (12.0, 1.0)
    assert step.tokens_per_sequence == pytest.approx(1 + 0.5 + 0.25 + 0.125)
    assert step.tokens_per_s == pytest.approx(1000 * 2 * 1.875 / step.step_ms)
    assert step.latency_ms == pytest.approx(step.step_ms / 1.875)
    assert expected_tokens(0.0, 5) == 1.0 and expected_tokens(0.9, 0) == 1.0


def test_fast_verifier_and_slow_drafter_drafts_without_the_model():
    spec = cluster(verifier(), drafter())
    result = plan(spec, FLAT, {1: 60.0, 128: 200.0})
    assert result.chosen.drafter_kind in ("none", "ngram")
    model_plans = [p for p in result.runners_up if p.drafter_kind == "model"]  # none: plain decoding beat them
    assert all(p.tokens_per_s < result.chosen.tokens_per_s for p in model_plans)
    fixed = plan(cluster(verifier(), drafter(), drafter="model"), FLAT, {1: 60.0, 128: 200.0})
    assert fixed.chosen.drafter_kind == "model" and fixed.chosen.tokens_per_s < result.chosen.tokens_per_s


def test_cheap_verification_drafts_deep_and_dear_verification_shallow():
    spec = cluster(verifier(), drafter(), drafter="model")
    deep = plan(spec, FLAT, CHEAP_DRAFT)
    shallow = plan(spec, STEEP, CHEAP_DRAFT)
    assert deep.chosen.k >= 4
    assert shallow.chosen.k < deep.chosen.k
    assert all(a.drafter == "d" for a in deep.chosen.assignments)


def test_cross_group_round_trip_raises_k():
    moderate = {1: 10.0, 8: 14.0, 16: 20.0, 64: 60.0, 128: 110.0}
    near = cluster(verifier(), drafter(), drafter="model")
    far = cluster(verifier(group="central"), drafter(group="edge"), drafter="model",
                  rtt={("central", "edge"): 40.0})
    k_near = plan(near, moderate, CHEAP_DRAFT).chosen
    k_far = plan(far, moderate, CHEAP_DRAFT).chosen
    assert k_far.assignments[0].step.network_ms == 40.0
    assert k_far.k > k_near.k


def test_naive_placement_is_predicted_worse_on_a_designed_case():
    # The naive score favours peak numbers: "big" has the highest peaks but a large fixed cost
    # per call; "nimble" (role both) has lower peaks and verifies fast. The naive rule makes
    # nimble draft for big; the planner lets both verify.
    big = verifier("big")
    nimble = both_worker("nimble")
    spec = cluster(big, nimble)
    profiles = {
        ("big", "target"): fused_profile({1: 40.0, 128: 45.0}, "target", peak_tflops=900.0, bandwidth_gbs=3000.0),
        ("nimble", "target"): fused_profile({1: 8.0, 128: 30.0}, "target", peak_tflops=100.0, bandwidth_gbs=800.0),
        ("nimble", "draft"): fused_profile({1: 2.0, 128: 8.0}, "draft", peak_tflops=100.0, bandwidth_gbs=800.0),
    }
    result = plan_cluster(spec, profiles, options_for(spec))
    naive = result.naive
    assert max(naive.scores, key=lambda s: s.score).worker == "big"
    assert naive.article.verifying == {"big": 1} and naive.article.k == 5
    assert result.chosen.verifying == {"big": 1, "nimble": 1}
    assert result.chosen.tokens_per_s > 1.5 * naive.article.tokens_per_s
    assert result.chosen.tokens_per_s > naive.tuned.tokens_per_s


def test_latency_target_is_respected_and_trades_throughput():
    spec = cluster(verifier(replicas=2), drafter())
    free = plan(spec, STEEP, CHEAP_DRAFT)
    target = free.chosen.latency_ms / 2
    bounded = plan(spec, STEEP, CHEAP_DRAFT, latency_target_ms=target)
    assert bounded.meets_target
    assert bounded.chosen.latency_ms <= target
    assert all(a.step.latency_ms <= target for p in bounded.runners_up for a in p.assignments)
    assert bounded.chosen.tokens_per_s < free.chosen.tokens_per_s


def test_an_impossible_target_returns_the_lowest_latency_plan():
    spec = cluster(verifier(), drafter())
    result = plan(spec, STEEP, CHEAP_DRAFT, latency_target_ms=0.5)
    assert not result.meets_target
    assert result.chosen.tokens_per_s > 0
    assert result.chosen.latency_ms <= min((p.latency_ms for p in result.runners_up), default=float("inf"))


def test_one_drafter_replica_serves_verifiers_while_it_has_time():
    spec = cluster(verifier(replicas=6), drafter(replicas=1), drafter="model", k=4)
    profiles = profiles_for(spec, FLAT, {1: 4.0, 128: 8.0})
    options = PlanOptions(drafters=("model",), ks=(4,), acceptance={"model": 0.7})
    result = plan_cluster(spec, profiles, options)
    served = sum(a.replicas for a in result.chosen.assignments if a.drafter == "d")
    plain = sum(a.replicas for a in result.chosen.assignments if a.drafter == "none")
    share = next(a.step.drafter_share for a in result.chosen.assignments if a.drafter == "d")
    assert served == int(1 / share) and served + plain == 6
    assert result.chosen.drafting[0][0] == "d" and result.chosen.drafting[0][2] <= 1.0


def test_slowdown_and_utilization_scale_costs():
    fast = cluster(verifier())
    slow = cluster(verifier(slowdown=2.0, utilization=0.5))
    a = plan(fast, STEEP, drafter="none").chosen.assignments[0].step
    b = plan(slow, STEEP, drafter="none").chosen.assignments[0].step
    assert b.verify_ms == pytest.approx(4 * a.verify_ms)


def test_both_workers_split_between_verifying_and_drafting():
    # v has no drafter of its own; b (role both) can verify beside its own draft model or draft
    # for v. The best split gives up one b replica to draft for all of v.
    spec = cluster(both_worker("b", replicas=4), verifier("v", replicas=4))
    options = options_for(spec, drafter="model", acceptance={"model": 0.9})
    chosen = plan_cluster(spec, profiles_for(spec, FLAT, CHEAP_DRAFT), options).chosen
    by_drafter = {(a.verifier, a.drafter): a.replicas for a in chosen.assignments}
    assert by_drafter == {("v", "b"): 4, ("b", "colocated"): 3}
    assert [(name, n) for name, n, _ in chosen.drafting] == [("b", 1)]


def test_hetero_example_plans_from_public_profiles_and_beats_naive():
    spec = load_cluster(EXAMPLES / "hetero-64.yaml")
    result = plan_cluster(spec, cluster_profiles(spec))
    assert result.meets_target and result.chosen.latency_ms <= spec.latency_target_ms
    assert result.chosen.tokens_per_s > result.naive.article.tokens_per_s
    assert sum(result.chosen.verifying.values()) >= 16


def test_pricer_caches_best_batches():
    spec = cluster(verifier())
    costs = {("v", "target"): WorkerCost("v", "target", fused_profile(STEEP))}
    pricer = PlacementPricer(spec, costs, {"ngram": 0.4}, CONTEXT, STEP_OVERHEAD_MS, None, None)
    source = DraftSource(drafter_spec("ngram"), 0.4, IN_REPLICA)
    first = pricer.best_step(spec.workers[0], source, 2)
    assert pricer.best_step(spec.workers[0], source, 2) is first


def test_where_no_placement_meets_the_target_the_naive_one_is_priced_as_ours_is():
    """Ours fell back to one sequence a replica while the naive placement kept its best batch:
    the report then read "ours / naive = 0.55x", its own pick the worse."""
    spec = load_cluster(EXAMPLES / "hetero-64.yaml")
    result = plan_cluster(spec, cluster_profiles(spec), options_for(spec, latency_target_ms=0.001))
    assert not result.meets_target
    assert all(a.step.batch == 1 for a in result.chosen.assignments)
    assert all(a.step.batch == 1 for a in result.naive.article.assignments + result.naive.tuned.assignments)


def test_a_replica_on_which_drafting_loses_decodes_plainly_beside_ones_that_draft():
    """One k for every replica put a CPU beside a GPU at k=8: 5x slower per token and 5x fewer
    tokens a second on the CPU than decoding plainly there (a trial's plan and simulation)."""
    spec = cluster(verifier("g"), verifier("c", replicas=2))
    profiles = {("g", "target"): fused_profile(FLAT, "target"), ("c", "target"): fused_profile(STEEP, "target")}
    result = plan_cluster(spec, profiles, options_for(spec))
    by_worker = {a.verifier: a for a in result.chosen.assignments}
    assert result.chosen.k > 0 and by_worker["g"].step.k == result.chosen.k
    assert by_worker["c"].drafter == "none" and by_worker["c"].step.k == 0
    plain = plan_cluster(spec, profiles, options_for(spec, drafter="none"))
    assert by_worker["c"].tokens_per_s == pytest.approx({a.verifier: a for a in plain.chosen.assignments}["c"].tokens_per_s)
    fixed = plan_cluster(spec, profiles, options_for(spec, drafter="ngram"))  # the file's kind drafts everywhere
    assert all(a.step.k > 0 for a in fixed.chosen.assignments)
