"""Price one placement: given which worker replicas verify and which draft, a drafter kind and
k, assign drafters to verifier replicas and predict the cluster's throughput and latency.

Each verifier replica gets its best draft source: its own draft model beside it (a `both`
worker, no round trip) or a draft worker's replica (paying the groups' round trip), as long as
that drafter has time left (a draft replica is shared by verifiers while their drafting keeps
it busy less than 100% of the time); replicas that gain most from drafting are served first. A
replica left without a drafter, or (where the planner chooses the drafter) on which drafting at
the placement's k would make fewer tokens a second than decoding plainly (a CPU beside a GPU,
where verifying k + 1 tokens costs nearly k + 1 decodes), decodes plainly (k = 0). Each replica
runs the batch size that gives the most tokens/s with its per-token latency within the target;
a replica that cannot meet the target even at batch 1 is left idle. Everything is a prediction (prediction.py).
"""

import math
from dataclasses import dataclass
from typing import Mapping

from tandem.cluster.config.cluster_spec import ClusterSpec, WorkerSpec
from tandem.cluster.planning.prediction import IN_REPLICA, DraftSource, StepPrediction, WorkerCost, predict_step
from tandem.speculation.drafters.registry import DRAFTERS, DrafterSpec

EPSILON = 1e-9


@dataclass(frozen=True, slots=True)
class Assignment:
    """`replicas` replicas of one verifier worker, drafting from the same source."""

    verifier: str
    replicas: int
    drafter: str  # "none", IN_REPLICA (a copy drafter), "colocated" or the draft worker's name
    step: StepPrediction  # at the planned batch
    batch1: StepPrediction  # the same source and k with one sequence

    @property
    def tokens_per_s(self) -> float:
        return self.replicas * self.step.tokens_per_s


@dataclass(frozen=True, slots=True)
class Placement:
    drafter_kind: str
    k: int
    assignments: tuple[Assignment, ...]
    drafting: tuple[tuple[str, int, float], ...]  # (draft worker, replicas busy, their busy share)
    idle: tuple[tuple[str, int, str], ...]  # (worker, replicas, why)

    @property
    def tokens_per_s(self) -> float:
        return sum(a.tokens_per_s for a in self.assignments)

    @property
    def latency_ms(self) -> float:
        """The slowest replica's per-token latency at its planned batch."""
        return max((a.step.latency_ms for a in self.assignments), default=math.inf)

    @property
    def latency_b1_ms(self) -> float:
        """The slowest replica's per-token latency with one sequence."""
        return max((a.batch1.latency_ms for a in self.assignments), default=math.inf)

    @property
    def verifying(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for a in self.assignments:
            counts[a.verifier] = counts.get(a.verifier, 0) + a.replicas
        return counts

    @property
    def drafts(self) -> bool:
        """Whether any replica drafts (a drafting kind whose every replica fell back does not)."""
        return any(a.step.k > 0 for a in self.assignments)

    def label(self) -> str:
        return "none" if self.drafter_kind == "none" else f"{self.drafter_kind} k={self.k}"


@dataclass(frozen=True, slots=True)
class _Replica:
    worker: WorkerSpec
    options: tuple[tuple[StepPrediction, DraftSource], ...]  # best first
    fallback: tuple[StepPrediction, DraftSource] | None  # plain decoding


class PlacementPricer:
    """Prices placements of one cluster; caches each (verifier, source, k)'s best batch."""

    def __init__(self, spec: ClusterSpec, costs: Mapping[tuple[str, str], WorkerCost],
                 acceptance: Mapping[str, float], context: int, overhead_ms: float,
                 latency_target_ms: float | None, max_batch: int | None, plain_where_better: bool = False,
                 by_latency: bool = False):
        """plain_where_better: a replica decodes plainly where drafting would make it slower (by
        tokens a second, or `by_latency` by its latency) than plain decoding does (the planner
        choosing the drafter; a kind the file fixes drafts wherever it can)."""
        self.spec, self.costs, self.acceptance = spec, costs, acceptance
        self.context, self.overhead_ms = context, overhead_ms
        self.latency_target_ms, self.max_batch = latency_target_ms, max_batch
        self.plain_where_better, self.by_latency = plain_where_better, by_latency
        self._best: dict[tuple, StepPrediction | None] = {}

    def price(self, kind: DrafterSpec, k: int, verify: Mapping[str, int], draft: Mapping[str, int]) -> Placement:
        capacity = {name: float(n) for name, n in draft.items() if n > 0}
        used = dict.fromkeys(capacity, 0.0)
        replicas = [r for name, n in verify.items() if n > 0
                    for r in [self._replica(self.spec.worker(name), kind, k, capacity)] * n]
        replicas.sort(key=_gain, reverse=True)
        chosen, idle = [], []
        for replica in replicas:
            pick = self._pick(replica, capacity, used) or replica.fallback
            if pick is None:
                idle.append((replica.worker.name, 1, "cannot meet the latency target"))
            else:
                chosen.append((replica.worker, pick))
        idle += _unused(draft, used, kind) + self._unplaced(verify, draft)
        return Placement(kind.name, k if kind.drafts else 0, self._group(chosen), _drafting(used),
                         tuple(_merge(idle)))

    def _replica(self, worker: WorkerSpec, kind: DrafterSpec, k: int, capacity: Mapping[str, float]) -> _Replica:
        none = DraftSource(DRAFTERS["none"], 0.0, "none")
        sources = [self._source(kind, worker, where) for where in self._wheres(worker, kind, capacity)]
        options = [(step, s) for s in sources if (step := self.best_step(worker, s, k)) is not None]
        plain = self.best_step(worker, none, 0)
        if plain is not None and self.plain_where_better:  # it drafts only where that beats decoding plainly
            options = [(step, s) for step, s in options if (step.latency_ms < plain.latency_ms if self.by_latency
                                                            else step.tokens_per_s > plain.tokens_per_s)]
        options.sort(key=lambda pair: pair[0].tokens_per_s, reverse=True)
        return _Replica(worker, tuple(options), None if plain is None else (plain, none))

    def _wheres(self, worker: WorkerSpec, kind: DrafterSpec, capacity: Mapping[str, float]) -> list[str]:
        if not kind.drafts:
            return ["none"]
        if not kind.uses_model:
            return [IN_REPLICA]
        wheres = ["colocated"] if worker.role == "both" else []
        return wheres + list(capacity)

    def _source(self, kind: DrafterSpec, verifier: WorkerSpec, where: str) -> DraftSource:
        acceptance = self.acceptance.get(kind.name, 0.0)
        if where in ("none", IN_REPLICA):
            return DraftSource(kind, acceptance, where)
        if where == "colocated":
            return DraftSource(kind, acceptance, where, self.costs[(verifier.name, verifier.draft_model)])
        drafter = self.spec.worker(where)
        rtt = self.spec.network.rtt_ms(verifier.group, drafter.group)
        return DraftSource(kind, acceptance, where, self.costs[(drafter.name, drafter.drafting_model)], rtt)

    def best_step(self, verifier: WorkerSpec, source: DraftSource, k: int) -> StepPrediction | None:
        """The batch with the most tokens/s within the latency target (None: no batch meets it)."""
        key = (verifier.name, source.kind.name, source.where, k)
        if key not in self._best:
            cost = self.costs[(verifier.name, verifier.model)]
            steps = [predict_step(cost, source, k, batch, self.context, self.overhead_ms)
                     for batch in cost.profile.batches if self.max_batch is None or batch <= self.max_batch]
            fits = [s for s in steps if self.latency_target_ms is None or s.latency_ms <= self.latency_target_ms]
            self._best[key] = max(fits, key=lambda s: (s.tokens_per_s, -s.batch), default=None)
        return self._best[key]

    def _pick(self, replica: _Replica, capacity: Mapping[str, float], used: dict[str, float]):
        for step, source in replica.options:
            if source.remote:
                if used[source.where] + step.drafter_share > capacity[source.where] + EPSILON:
                    continue
                used[source.where] += step.drafter_share
            return step, source
        return None

    def _group(self, chosen: list[tuple[WorkerSpec, tuple[StepPrediction, DraftSource]]]) -> tuple[Assignment, ...]:
        """Replicas of one worker with the same source share one (cached) prediction: group them."""
        counts: dict[tuple[str, str], int] = {}
        picks: dict[tuple[str, str], tuple[StepPrediction, DraftSource]] = {}
        for worker, (step, source) in chosen:
            key = (worker.name, source.where)
            counts[key] = counts.get(key, 0) + 1
            picks[key] = (step, source)
        groups = []
        for (name, where), n in counts.items():
            step, source = picks[(name, where)]
            cost = self.costs[(name, self.spec.worker(name).model)]
            batch1 = predict_step(cost, source, step.k, 1, self.context, self.overhead_ms)
            groups.append(Assignment(name, n, where, step, batch1))
        return tuple(sorted(groups, key=lambda a: -a.tokens_per_s))

    def _unplaced(self, verify: Mapping[str, int], draft: Mapping[str, int]) -> list[tuple[str, int, str]]:
        spare = [(w.name, w.replicas - verify.get(w.name, 0) - draft.get(w.name, 0)) for w in self.spec.workers]
        return [(name, n, "not placed") for name, n in spare if n > 0]


def _gain(replica: _Replica) -> float:
    best = replica.options[0][0].tokens_per_s if replica.options else 0.0
    return best - (replica.fallback[0].tokens_per_s if replica.fallback else 0.0)


def _drafting(used: Mapping[str, float]) -> tuple[tuple[str, int, float], ...]:
    busy = [(name, math.ceil(share - EPSILON), share) for name, share in used.items() if share > EPSILON]
    return tuple((name, n, share / n) for name, n, share in busy)


def _unused(draft: Mapping[str, int], used: Mapping[str, float], kind: DrafterSpec) -> list[tuple[str, int, str]]:
    why = "spare: the verifiers have drafters enough" if kind.uses_model else f"drafter {kind.name} uses no draft model"
    spare = [(name, n - math.ceil(used.get(name, 0.0) - EPSILON)) for name, n in draft.items()]
    return [(name, n, why) for name, n in spare if n > 0]


def _merge(idle: list[tuple[str, int, str]]) -> list[tuple[str, int, str]]:
    merged: dict[tuple[str, str], int] = {}
    for name, n, why in idle:
        merged[(name, why)] = merged.get((name, why), 0) + n
    return [(name, n, why) for (name, why), n in merged.items()]
