"""Placement planning: `plan_cluster(spec, profiles) -> Plan`.

The planner tries every drafter kind (none, ngram, suffix, model, hybrid) with every k (1..8; none
means k = 0) and, for workers with role `both`, several splits of their replicas between
verifying and drafting (all, none, quarters). Each candidate is priced by placement.py from the
workers' cost curves (prediction.py has the step formula). The chosen plan has the most tokens/s
at saturation among those whose every verifier replica keeps its per-token latency at the
planned load within the latency target; the runners-up (best of each other kind and k) and the
naive article rule (naive_score.py), priced by the same model, come with it for explanation.
If no candidate meets the target, the plan with the lowest latency (one sequence per verifier
replica) is returned and marked so.
"""

import copy
import itertools
import math
from dataclasses import dataclass, field
from typing import Mapping

from tandem.cluster.config.cluster_spec import ClusterSpec
from tandem.cluster.planning.acceptance import DEFAULT_ACCEPTANCE
from tandem.cluster.planning.naive_score import NAIVE_DRAFTER, NAIVE_K, DeviceScore, device_scores, naive_roles
from tandem.cluster.planning.placement import Placement, PlacementPricer
from tandem.cluster.planning.prediction import WorkerCost
from tandem.cluster.profiles.profile import DeviceProfile
from tandem.errors import TandemError
from tandem.speculation.batch_depth import STEP_OVERHEAD_MS
from tandem.speculation.drafters.registry import DRAFTERS, drafter_spec

PLAN_K_MAX = 8
MAX_SPLITS = 64  # role splits of `both` workers tried per (kind, k)
SPLIT_FRACTIONS = (0.0, 0.25, 0.5, 0.75, 1.0)  # of a both worker's replicas that verify


@dataclass(frozen=True, slots=True)
class PlanOptions:
    latency_target_ms: float | None = None  # per generated token, at the planned load
    drafters: tuple[str, ...] = tuple(DRAFTERS)
    ks: tuple[int, ...] = tuple(range(1, PLAN_K_MAX + 1))  # tried for drafting kinds
    acceptance: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_ACCEPTANCE))
    context_tokens: int = 512
    max_batch: int | None = None  # cap on sequences per verifier step (None: profiled batches)
    overhead_ms: float = STEP_OVERHEAD_MS
    runners_up: int = 6

    def __post_init__(self):
        for name in self.drafters:
            drafter_spec(name)
        if not self.ks or min(self.ks) < 0:
            raise TandemError(f"plan ks must be a non-empty set of k >= 0 (got {self.ks})")
        for source, a in self.acceptance.items():
            if not 0.0 <= a < 1.0:
                raise TandemError(f"acceptance of {source} must be in [0, 1) (got {a})")
        if self.latency_target_ms is not None and self.latency_target_ms <= 0:
            raise TandemError(f"latency target must be > 0 ms (got {self.latency_target_ms})")
        if self.max_batch is not None and self.max_batch < 1:
            raise TandemError(f"max_batch must be >= 1 (got {self.max_batch})")


def options_for(spec: ClusterSpec, latency_target_ms: float | None = None, drafter: str | None = None,
                k: int | None = None, acceptance: Mapping[str, float] | None = None, **more) -> PlanOptions:
    """The cluster file's planner defaults, overridden by whatever is given here."""
    drafter = drafter or spec.drafter
    k = spec.k if k is None else k
    return PlanOptions(
        latency_target_ms=spec.latency_target_ms if latency_target_ms is None else latency_target_ms,
        drafters=tuple(DRAFTERS) if drafter == "auto" else (drafter,),
        ks=tuple(range(1, PLAN_K_MAX + 1)) if k is None else (k,),
        acceptance={**DEFAULT_ACCEPTANCE, **spec.acceptance, **(acceptance or {})},
        context_tokens=spec.context_tokens, **more)


@dataclass(frozen=True, slots=True)
class NaiveComparison:
    scores: tuple[DeviceScore, ...]
    article: Placement  # the naive roles with the article's drafter and k
    tuned: Placement  # the naive roles with the planner's best kind and k for them
    # a placement that cannot meet the latency target is priced without it (latency shows it)


@dataclass(frozen=True, slots=True)
class Plan:
    chosen: Placement
    runners_up: tuple[Placement, ...]
    naive: NaiveComparison | None
    naive_note: str | None  # why there is no naive comparison
    options: PlanOptions
    meets_target: bool


def plan_cluster(spec: ClusterSpec, profiles: Mapping[tuple[str, str], DeviceProfile],
                 options: PlanOptions | None = None) -> Plan:
    """The best placement for `spec`, given a profile per (worker name, model) it may run
    (profile_store.cluster_profiles builds that mapping)."""
    options = options or options_for(spec)
    costs = {(w.name, m): WorkerCost.of(w, m, profiles[(w.name, m)])
             for w in spec.workers for m in (w.model, w.drafting_model) if (w.name, m) in profiles}
    pricer = _pricer(spec, costs, options, options.latency_target_ms)
    placements = _search(spec, pricer, options, _splits(spec))
    feasible = [p for p in placements if p.tokens_per_s > 0]
    meets = bool(feasible)
    if not meets:  # nothing meets the target: the lowest-latency plans, one sequence per replica
        alone = PlacementPricer(spec, costs, options.acceptance, options.context_tokens, options.overhead_ms,
                                None, max_batch=1, plain_where_better=_chooses_drafter(options), by_latency=True)
        feasible = _search(spec, alone, options, _splits(spec))
    ranked = _without_fallbacks(_best_per_label(feasible, by_latency=not meets))
    naive, note = _naive(spec, profiles, costs, options, None if meets else alone)
    return Plan(ranked[0], _runners_up(ranked, options.runners_up), naive, note, options, meets)


def _without_fallbacks(ranked: list[Placement]) -> list[Placement]:
    """Drop drafting placements in which every replica fell back to plain decoding: they repeat
    the `none` placement under another name (kept when there is no `none` placement)."""
    if not any(p.drafter_kind == "none" for p in ranked):
        return ranked
    return [p for p in ranked if p.drafter_kind == "none" or p.drafts]


def _runners_up(ranked: list[Placement], count: int) -> tuple[Placement, ...]:
    """The best of every other drafter kind, then the next best overall, in rank order."""
    kinds = {ranked[0].drafter_kind}
    picked = []
    for placement in ranked[1:]:
        if placement.drafter_kind not in kinds:
            kinds.add(placement.drafter_kind)
            picked.append(placement)
    picked += [p for p in ranked[1:] if p not in picked][:max(0, count - len(picked))]
    return tuple(sorted(picked, key=ranked.index))


def _pricer(spec, costs, options: PlanOptions, target: float | None) -> PlacementPricer:
    return PlacementPricer(spec, costs, options.acceptance, options.context_tokens, options.overhead_ms,
                           target, options.max_batch, plain_where_better=_chooses_drafter(options))


def _as_written(pricer: PlacementPricer) -> PlacementPricer:
    """The same pricer drafting wherever it can: the article's rule as it is written."""
    written = copy.copy(pricer)
    written.plain_where_better = False
    return written


def _chooses_drafter(options: PlanOptions) -> bool:
    """Whether the planner picks the drafter (the file's `drafter: auto`), rather than the file."""
    return len(options.drafters) > 1


def _search(spec: ClusterSpec, pricer: PlacementPricer, options: PlanOptions,
            splits: list[tuple[dict[str, int], dict[str, int]]]) -> list[Placement]:
    placements = []
    for name in options.drafters:
        kind = drafter_spec(name)
        for k in (options.ks if kind.drafts else (0,)):
            plain = drafter_spec("none") if k == 0 else kind  # drafting 0 tokens is plain decoding
            placements += [pricer.price(plain, k, verify, draft) for verify, draft in splits]
    return placements


def _splits(spec: ClusterSpec) -> list[tuple[dict[str, int], dict[str, int]]]:
    """(verify replicas, draft replicas) per worker, for each split of the `both` workers tried."""
    fixed_verify = {w.name: w.replicas for w in spec.workers if w.role == "verify"}
    fixed_draft = {w.name: w.replicas for w in spec.workers if w.role == "draft"}
    both = [w for w in spec.workers if w.role == "both"]
    choices = [sorted({round(w.replicas * f) for f in SPLIT_FRACTIONS}) for w in both]
    if math.prod(len(c) for c in choices) > MAX_SPLITS:
        choices = [[0, w.replicas] for w in both]
    if math.prod(len(c) for c in choices) > MAX_SPLITS:
        choices = [[w.replicas] for w in both]
    splits = []
    for counts in itertools.product(*choices):
        verify = {**fixed_verify, **{w.name: n for w, n in zip(both, counts)}}
        draft = {**fixed_draft, **{w.name: w.replicas - n for w, n in zip(both, counts)}}
        if any(verify.values()):
            splits.append((verify, draft))
    return splits


def _best_per_label(placements: list[Placement], by_latency: bool) -> list[Placement]:
    """The best placement of each drafter kind and k, best first."""
    def key(p: Placement):
        return (p.latency_ms, -p.tokens_per_s) if by_latency else (-p.tokens_per_s, p.latency_ms)

    best: dict[str, Placement] = {}
    for placement in sorted(placements, key=key):
        best.setdefault(placement.label(), placement)
    return list(best.values())


def _naive(spec, profiles, costs, options: PlanOptions,
           alone: PlacementPricer | None = None) -> tuple[NaiveComparison | None, str | None]:
    """The article's rule and our kind/k on its roles; where nothing meets the latency target,
    priced as our plan then is (`alone`: one sequence a replica), so the two compare."""
    try:
        scores = device_scores(spec, profiles)
    except TandemError as error:
        return None, f"no naive score: {error}"
    roles = [naive_roles(spec, scores)]
    within = _pricer(spec, costs, options, options.latency_target_ms)
    fallback = alone or _pricer(spec, costs, options, None)  # where the target rules every placement out
    article = _as_written(within).price(drafter_spec(NAIVE_DRAFTER), NAIVE_K, *roles[0])
    if article.tokens_per_s == 0:
        article = _as_written(fallback).price(drafter_spec(NAIVE_DRAFTER), NAIVE_K, *roles[0])
    tuned = [p for p in _search(spec, within, options, roles) if p.tokens_per_s > 0]
    if tuned:
        best = _best_per_label(tuned, by_latency=False)[0]
    else:
        best = _best_per_label(_search(spec, fallback, options, roles), by_latency=True)[0]
    return NaiveComparison(scores, article, best), None
