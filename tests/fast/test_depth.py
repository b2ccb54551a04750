"""The depth planner's single-sequence behaviour (what `tandem generate` gets): k per source
from its recorded acceptance and the cost curves, the fallback when a copy does not pay, and
how deep an auto-depth model draft goes given the draft's confidence. Batches:
test_batch_depth.py."""

from tandem.models.cost import CostModel, CostView
from tandem.speculation.batch_depth import BatchDepthPlanner, DraftCandidate

CPU_CURVE = {1: 27.0, 5: 111.0, 16: 173.0}  # llama.cpp 1.5B on a CPU, ms
GPU_CURVE = {1: 20.0, 16: 20.0}  # verification nearly free
CHEAP_DRAFT = {1: 1.0, 16: 16.0}


def planner(target_curve, draft_curve=None, fused=True) -> BatchDepthPlanner:
    draft = CostView(CostModel(dict(draft_curve)), fused) if draft_curve else None
    return BatchDepthPlanner(CostView(CostModel(dict(target_curve)), fused), draft)


def k_for(p: BatchDepthPlanner, source: str, cap: int = 16, uses_model: bool = False) -> int:
    ks, used = p.plan([DraftCandidate(source, cap, uses_model)])
    assert used == [False]
    return ks[0]


def test_plain_decoding_when_verifying_costs_like_decoding():
    p = planner(CPU_CURVE, {1: 8.0, 16: 128.0})  # prior acceptance: mediocre
    assert k_for(p, "ngram3") == 0
    assert k_for(p, "model", uses_model=True) == 0


def test_deep_drafts_when_verifying_is_nearly_free():
    p = planner(GPU_CURVE, CHEAP_DRAFT)
    for _ in range(20):
        p.record("ngram3", drafted=8, accepted=8)
    assert p.acceptance("ngram3") > 0.95
    assert k_for(p, "ngram3", cap=64) == p.copy_k_max  # a copy may go past the model limit
    assert k_for(p, "ngram3", cap=5) == 5
    assert k_for(p, "model", uses_model=True) >= 3  # prior only, still pays


def test_k_follows_each_sources_recorded_acceptance():
    p = planner({1: 22.0, 16: 52.0})  # 2 ms per extra verified token
    before = k_for(p, "ngram4")
    for _ in range(10):
        p.record("ngram4", drafted=6, accepted=6)
    assert 0 < before < k_for(p, "ngram4")
    fresh = planner({1: 22.0, 16: 52.0})
    assert k_for(fresh, "ngram2") <= before <= k_for(fresh, "ngram8")  # longer matches start higher
    for _ in range(60):
        p.record("ngram4", drafted=6, accepted=0)
    assert k_for(p, "ngram4") < before  # and it follows the text


def test_plan_uses_the_fallback_where_the_copy_gets_k_0():
    p = planner(GPU_CURVE, CHEAP_DRAFT)
    for _ in range(30):
        p.record("ngram3", drafted=4, accepted=0)  # the copies keep failing here
    copy, model = DraftCandidate("ngram3", 4, False), DraftCandidate("model", 8, True)
    ks, used = p.plan([copy], [model])
    assert used == [True] and ks[0] > 0  # the model drafts instead
    ks, used = planner(GPU_CURVE, CHEAP_DRAFT).plan([DraftCandidate("ngram8", 4, False)], [model])
    assert used == [False] and ks[0] > 0  # a copy that pays keeps its k
    ks, used = p.plan([DraftCandidate("ngram3", 4, False, fixed_k=0)], [model])
    assert (ks, used) == ([0], [False])  # a fixed k is never overridden


def test_keep_drafting_stops_when_confidence_collapses():
    p = planner(GPU_CURVE, CHEAP_DRAFT)
    assert p.keep_drafting("model", [0.95, 0.95])
    assert not p.keep_drafting("model", [0.95, 0.95, 0.01])
    assert not p.keep_drafting("model", [1.0] * p.k_max)  # never past k_max


def test_keep_drafting_needs_cheap_verification():
    confident = [0.9, 0.9]
    assert planner(GPU_CURVE, CHEAP_DRAFT).keep_drafting("model", confident)
    assert not planner(CPU_CURVE, {1: 20.0, 16: 320.0}).keep_drafting("model", confident)
