"""Load-aware depth: choose k for every running sequence of a batch at once.

One engine step verifies the drafts of all running sequences in one target call and drafts
with the draft model in lock-step (depth j of every sequence still drafting in one call). With
k_i draft tokens for sequence i, the step is expected to emit

    E = sum_i (1 + a_i + a_i^2 + ... + a_i^k_i)           tokens (a_i: acceptance of i's source)

and to take

    T = target(k_1 + 1, ..., k_B + 1) + sum_j draft(n_j) + setup + overhead

where target(...) and draft(...) read the runners' measured cost curves (fused runners: the cost
of the total token count; serial runners: the sum of per-item costs), n_j is the number of
sequences drafting a j-th token with the model, and setup is a draft model's one-time catch-up
on a prompt it has not seen, spread over the rounds the request has left (remaining tokens /
(1 + a)): it pays for itself only if drafting keeps paying for the rest of the request. (Charged
whole to one step, a long prompt would keep drafting off for good; not charged at all, every new
request would stall the batch on a multi-second draft prefill for a small gain.) The planner
maximises E / T. Since the gain of the j-th draft
token of sequence i is a_i^j and falls with j, taking draft tokens in order of falling gain gives
the best E for every total; the planner walks that order and keeps the prefix with the highest
E / T. All k = 0 (plain batched decoding) is one of the candidates and is kept unless drafting
beats it by MIN_GAIN: as concurrency grows and verification stops being cheap, k falls to 0,
so speculation on is not slower than off. A request with a fixed k keeps it.

Acceptance is estimated per source across sequences (speculation/depth.py's AcceptanceEstimate). A
source seen for the first time starts from what its family has shown so far (all n-gram
lengths, all shared-store lengths), not from a fixed prior: a shared store full of other
requests' text gives a dozen match lengths, and each must not pay to learn the same lesson. A
source that gets k = 0 is probed with one token now and then, within PROBE_BUDGET of decoding
time shared by all sources, unless it could not pay even at near-perfect acceptance.
"""

from dataclasses import dataclass, field, replace

from tandem.models.cost import CostView
from tandem.speculation.depth import (AUTO_K_MAX, BEST_ACCEPTANCE, COPY_K_MAX, PROBE_BUDGET, AcceptanceEstimate,
                                      source_family)

MIN_GAIN = 0.10  # drafting must be predicted to beat plain decoding by this share (estimates are noisy)
STEP_OVERHEAD_MS = 1.0  # engine bookkeeping per step, refined from observation


@dataclass(frozen=True, slots=True)
class DraftCandidate:
    """What one sequence could draft this step."""

    source: str  # acceptance source: "model", "ngram3", "shared5", ...
    cap: int  # most draft tokens it can propose (remaining tokens, context, continuation)
    uses_model: bool  # drafted by the draft model (costs draft steps) or copied (free)
    setup_ms: float = 0.0  # draft model catch-up before the first token
    fixed_k: int | None = None  # the request asked for this k
    remaining_tokens: int = 256  # what the request may still produce: spreads setup_ms
    prefill_tokens: int = 0  # prompt tokens scored in the same target call (a new sequence)

    def setup_share_ms(self, alpha: float) -> float:
        """This step's share of the catch-up: setup over the rounds the request has left."""
        rounds = max(1.0, self.remaining_tokens / (1.0 + alpha))
        return self.setup_ms / rounds


@dataclass
class _Walk:
    """Running totals while draft tokens are added in order of falling gain."""

    tokens: float
    target_counts: list[int]
    target_total: int
    target_ms: float
    draft_levels: list[int]  # n_j: sequences drafting a j-th token with the model
    draft_ms: float
    setup_ms: float = 0.0


@dataclass
class BatchDepthPlanner:
    target: CostView  # anything with .cost and .fused: a batch runner, or a view of a remote one
    draft: CostView | None = None
    k_max: int = AUTO_K_MAX  # deepest auto k of a draft model
    copy_k_max: int = COPY_K_MAX  # and of a copy
    overhead_ms: float = STEP_OVERHEAD_MS
    learns_overhead: bool = True  # False: overhead_ms stays as set (a replay priced, not timed)
    draft_call_ms: float = 0.0  # a step's model drafts pay this once (a remote drafter's round trip)
    estimates: dict[str, AcceptanceEstimate] = field(default_factory=dict)
    families: dict[str, AcceptanceEstimate] = field(default_factory=dict)  # pooled over match lengths
    probe_credit_ms: float = 0.0  # decoding time x PROBE_BUDGET not yet spent on probes
    last_drafted: dict[str, int] = field(default_factory=dict)  # source -> step it last drafted
    steps: int = 0
    # cached tokens per sequence, on average, in the step being planned: costs are read there
    # (models/cost.py; None: the profile's base). Set by plan; keep_drafting reads the same step's.
    context: float | None = None

    def acceptance(self, source: str) -> float:
        if source not in self.estimates:
            family = self.families.get(source_family(source))
            self.estimates[source] = (AcceptanceEstimate.for_source(source) if family is None
                                      else AcceptanceEstimate.with_prior(family.rate))
        return self.estimates[source].rate

    def record(self, source: str, drafted: int, accepted: int) -> None:
        if drafted:
            self.acceptance(source)
            self.estimates[source].update(drafted, accepted)
            family = source_family(source)
            if family not in self.families:
                self.families[family] = AcceptanceEstimate.for_source(source)
            self.families[family].update(drafted, accepted)

    def expected_accepted(self, candidate: DraftCandidate) -> float:
        """Draft tokens a round of this candidate is expected to have accepted at its deepest:
        a + a^2 + ... + a^n, a its source's acceptance, n its cap (at most its depth limit)."""
        alpha = self.acceptance(candidate.source)
        return sum(alpha**j for j in range(1, self.depth_limit(candidate) + 1))

    def depth_limit(self, candidate: DraftCandidate) -> int:
        """The deepest auto k for a candidate: its cap, within k_max for a draft model and
        copy_k_max for a copy."""
        return min(candidate.cap, self.k_max if candidate.uses_model else self.copy_k_max)

    def observe_overhead(self, overhead_ms: float) -> None:
        if self.learns_overhead:
            self.overhead_ms += 0.1 * (overhead_ms - self.overhead_ms)

    def plan(self, candidates: list[DraftCandidate], fallbacks: list[DraftCandidate | None] | None = None,
             context: float | None = None) -> tuple[list[int], list[bool]]:
        """k per candidate, in order, and whether each sequence's fallback was used instead. A
        candidate whose k is 0 in the best plan is replaced by its fallback (hybrid: the draft
        model where the copy does not pay) and the batch planned again. A draft model is only
        started on a sequence whose drafting would pay in the steady state (alone, caught up):
        its catch-up is an investment that only later rounds repay, so a step that looks cheap
        for other reasons (a big batch, a prefill) must not start it. `context`: the sequences'
        cached tokens on average, where the cost curves are read."""
        self.context = context
        fallbacks = fallbacks or [None] * len(candidates)
        steady_pays: dict[tuple[str, int], bool] = {}  # this step's answers of _steady, shared by its sequences
        ks = self._plan_steady(candidates, steady_pays)
        used = [f is not None and k == 0 and c.fixed_k is None for c, f, k in zip(candidates, fallbacks, ks)]
        if any(used):
            candidates = [f if u else c for c, f, u in zip(candidates, fallbacks, used)]
            ks = self._plan_steady(candidates, steady_pays)
        self._probe(candidates, ks)  # idle sources, including a draft model not worth starting
        return ks, used

    def _plan_steady(self, candidates: list[DraftCandidate], steady_pays: dict[tuple[str, int], bool]) -> list[int]:
        alphas = [self.acceptance(c.source) for c in candidates]
        return self._best_plan([self._steady(c, a, steady_pays) for c, a in zip(candidates, alphas)], alphas)

    def keep_drafting(self, source: str, confidences: list[float], others_tokens: int = 0,
                      batch_size: int = 1) -> bool:
        """Whether a model draft that pays should go one token deeper: the draft's own
        P(all drafted so far accepted) times the source's acceptance, per millisecond the token
        adds (a draft step, one more token in the target call), must beat the step's tokens per
        millisecond so far. A fused call also scores `others_tokens` of the other sequences;
        the step's tokens are taken as this sequence's times `batch_size`. For one sequence
        this is the round's own rate."""
        drafted = len(confidences)
        if drafted >= self.k_max:
            return False
        survive, tokens = 1.0, 1.0
        for confidence in confidences:
            survive *= confidence
            tokens += survive
        draft_step = self.draft.cost.cost_ms(1, self.context) if self.draft is not None else 0.0
        target = self.target.cost
        if self.target.fused:
            total = others_tokens + drafted + 1
            target_ms = target.cost_ms(total, self.context)
            extra_target = target.cost_ms(total + 1, self.context) - target_ms
        else:
            target_ms = target.cost_ms(drafted + 1, self.context)
            extra_target = target.cost_ms(drafted + 2, self.context) - target_ms
        elapsed = drafted * draft_step + target_ms + self.overhead_ms
        gain = survive * self.acceptance(source)
        step_tokens = tokens * batch_size if self.target.fused else tokens  # serial: this item's own pass
        return gain / max(draft_step + extra_target, 1e-6) > step_tokens / max(elapsed, 1e-6)

    def _steady(self, candidate: DraftCandidate, alpha: float,
                steady_pays: dict[tuple[str, int], bool]) -> DraftCandidate:
        """The candidate, or, where its draft model would not pay even caught up and alone, the
        same with nothing to draft. The answer depends on the source and cap alone (alpha is the
        source's; caught up, nothing else of the candidate is priced), so a step asks it once."""
        if not candidate.uses_model or candidate.fixed_k is not None or candidate.cap == 0 or candidate.setup_ms <= 0:
            return candidate
        key = (candidate.source, candidate.cap)
        if key not in steady_pays:
            caught_up = DraftCandidate(candidate.source, candidate.cap, True)
            steady_pays[key] = any(self._best_plan([caught_up], [alpha]))
        if steady_pays[key]:
            return candidate
        return DraftCandidate(candidate.source, 0, True, candidate.setup_ms, remaining_tokens=candidate.remaining_tokens)

    def _best_plan(self, candidates: list[DraftCandidate], alphas: list[float]) -> list[int]:
        """A step that also scores prompts (prefill) has a large fixed cost; judged by its own E / T,
        any draft token cheaper than that step's poor average would look worth it. Its drafts
        must instead beat the batch's steady rate (the best E / T without the prefill): the time
        they add could have been spent decoding at that rate. Without prefill both criteria pick
        the same plan (the best E / T is the plan whose extra tokens beat its own rate)."""
        if not any(c.prefill_tokens for c in candidates):
            return self._walk(candidates, alphas)[0]
        steady = [replace(c, prefill_tokens=0) for c in candidates]
        return self._walk(candidates, alphas, self._walk(steady, alphas)[1])[0]

    def _walk(self, candidates: list[DraftCandidate], alphas: list[float],
              reference_rate: float | None = None) -> tuple[list[int], float]:
        """Add draft tokens in order of falling gain and keep the best prefix: by E / T, or, given
        a reference rate r, by E - r (1 + MIN_GAIN) T. Returns the ks and the E / T they give."""
        ks = [min(c.fixed_k, c.cap) if c.fixed_k is not None else 0 for c in candidates]
        walk = self._start(candidates, alphas, ks)
        base_rate = self._rate(walk)
        if reference_rate is None:
            score, bar = self._rate, base_rate * (1 + MIN_GAIN)
        else:
            price = reference_rate * (1 + MIN_GAIN)
            score = lambda w: w.tokens - price * self._elapsed(w)  # noqa: E731
            bar = score(walk)
        gains = sorted(
            (-(alphas[i] ** j), j, i)
            for i, c in enumerate(candidates) if c.fixed_k is None
            for j in range(1, self.depth_limit(c) + 1)
        )
        best_score, best_rate, best_taken, taken = score(walk), base_rate, 0, []
        for negative_gain, j, i in gains:
            self._add(walk, candidates[i], -negative_gain, i, j, alphas[i])
            taken.append(i)
            if score(walk) > best_score:
                best_score, best_rate, best_taken = score(walk), self._rate(walk), len(taken)
        if best_score <= bar:
            return ks, base_rate
        for i in taken[:best_taken]:
            ks[i] += 1
        return ks, best_rate

    def _start(self, candidates: list[DraftCandidate], alphas: list[float], ks: list[int]) -> _Walk:
        counts = [k + 1 + c.prefill_tokens for c, k in zip(candidates, ks)]
        walk = _Walk(0.0, counts, sum(counts), self.target_ms(counts), [], 0.0)
        for c, a, k in zip(candidates, alphas, ks):
            walk.tokens += sum(a**j for j in range(k + 1))
            if c.uses_model and k:
                walk.setup_ms += c.setup_share_ms(a)
                for j in range(1, k + 1):
                    self._add_draft_level(walk, j)
        return walk

    def target_ms(self, counts: list[int]) -> float:
        """The target call scoring counts[i] tokens for each sequence i, on its measured curve."""
        if self.target.fused:
            return self.target.cost.cost_ms(sum(counts), self.context)
        return sum(self.target.cost.cost_ms(n, self.context) for n in counts)

    def _add(self, walk: _Walk, candidate: DraftCandidate, gain: float, i: int, j: int, alpha: float) -> None:
        walk.tokens += gain
        before = walk.target_counts[i]
        walk.target_counts[i] += 1
        walk.target_total += 1
        if self.target.fused:
            walk.target_ms = self.target.cost.cost_ms(walk.target_total, self.context)
        else:
            cost = self.target.cost
            walk.target_ms += cost.cost_ms(before + 1, self.context) - cost.cost_ms(before, self.context)
        if candidate.uses_model:
            if j == 1:
                walk.setup_ms += candidate.setup_share_ms(alpha)
            self._add_draft_level(walk, j)

    def _add_draft_level(self, walk: _Walk, j: int) -> None:
        if self.draft is None:
            return
        while len(walk.draft_levels) < j:
            walk.draft_levels.append(0)
        n = walk.draft_levels[j - 1]
        walk.draft_levels[j - 1] = n + 1
        if j == 1 and n == 0:
            walk.draft_ms += self.draft_call_ms
        cost = self.draft.cost
        walk.draft_ms += ((cost.cost_ms(n + 1, self.context) - cost.cost_ms(n, self.context)) if self.draft.fused
                          else cost.cost_ms(1, self.context))

    def _elapsed(self, walk: _Walk) -> float:
        return walk.target_ms + walk.draft_ms + walk.setup_ms + self.overhead_ms

    def _rate(self, walk: _Walk) -> float:
        return walk.tokens / max(self._elapsed(walk), 1e-6)

    def _probe(self, candidates: list[DraftCandidate], ks: list[int]) -> None:
        """Probe one idle source with a one-token draft when the shared probe credit pays for it.

        The credit grows by PROBE_BUDGET of every step's time, for all sources together (a
        budget per source would let a dozen n-gram lengths each spend it); the source idle the
        longest goes first, and one that could not pay even at near-perfect acceptance never."""
        self.probe_credit_ms += self.target_ms([k + 1 for k in ks]) * PROBE_BUDGET
        idle: dict[str, int] = {}
        for i, c in enumerate(candidates):
            if c.fixed_k is None and c.cap >= 1 and c.source not in idle:
                idle[c.source] = i
        for i, k in enumerate(ks):
            if k:
                self.last_drafted[candidates[i].source] = self.steps
                idle.pop(candidates[i].source, None)
        self.steps += 1
        for source in sorted(idle, key=lambda s: self.last_drafted.get(s, -1)):
            i = idle[source]
            extra = self._probe_cost(candidates, ks, i)
            if self.probe_credit_ms >= extra and self._could_pay(candidates, ks, i):
                ks[i] = 1
                self.probe_credit_ms -= extra
                self.last_drafted[source] = self.steps
            return  # only the stalest source may probe; the others wait their turn

    def _probe_cost(self, candidates: list[DraftCandidate], ks: list[int], i: int) -> float:
        counts = [k + 1 for k in ks]
        before = self.target_ms(counts)
        counts[i] += 1
        extra = self.target_ms(counts) - before
        if candidates[i].uses_model and self.draft is not None:
            extra += self.draft.cost.cost_ms(1, self.context) + candidates[i].setup_ms
        return extra

    def _could_pay(self, candidates: list[DraftCandidate], ks: list[int], i: int) -> bool:
        """Would candidate i's source beat plain decoding in this batch (the others keeping their
        ks, nobody prefilling, the draft model caught up) even at near-perfect acceptance? Asked
        of the source alone, a source that pays only in small batches (a draft model on a CPU)
        would be probed in every batch, each probe also paying its catch-up on a whole prompt."""
        trial = [replace(c, fixed_k=k, prefill_tokens=0) for c, k in zip(candidates, ks)]
        trial[i] = DraftCandidate(candidates[i].source, candidates[i].cap, candidates[i].uses_model)
        alphas = [self.acceptance(c.source) for c in candidates]
        alphas[i] = BEST_ACCEPTANCE
        return self._best_plan(trial, alphas)[i] > 0
