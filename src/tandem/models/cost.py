"""Measured cost of scoring n new tokens in one forward pass.

On a CPU a forward over n tokens is far from free (llama.cpp 1.5B: 1 token 27 ms, 5 tokens
111 ms); on a GPU it nearly is. The depth controller therefore reads a measured curve, never an
assumption. The curve is a profile taken at load time, corrected by the step times observed
during generation, so a device that slows down is noticed.

The correction is a ratio (observed / profiled), not a replacement of single points. A profile
is taken on one short sequence; serving sixteen long ones can make every token half again as
dear. Were only the observed size moved (say 16 tokens, the plain batch), the unobserved sizes
just above it (the same batch with a few drafts) would keep their profiled values, below the
observed one: drafts would look free (an earlier version did this). An observation at
n therefore moves the ratio at n and, by part of the same factor (less and less), the ratios
already learned within two octaves of n, and reads interpolate the ratio between learned sizes,
so the curve keeps the profile's shape around where it is used. Part of the factor, not part of
the way toward n's value: a size seen rarely keeps what its own observations showed. (Pulled
toward each plain step's ratio, the 3-token rounds of short answers on AMD EPYC Zen 5, 15%
dearer than their profile and seen once in twenty steps, were priced 3% over it, and the
planner drafted copies there that lost.)

Cost also depends on how many tokens are cached before the call (attention reads them all),
and not evenly across sizes: llama.cpp's CPU flash attention scores 64 query positions as one
tile and fewer position by position, so on a 1.5B Q4 target (AMD EPYC, 2 threads, one profile)
48 tokens cost 620 ms on 64 cached tokens and 875 ms on 1,024, while 64 tokens cost 842 and 879.
A curve taken on the short cache alone made 48-token rounds look 26% cheaper than 64-token ones
where long answers run, and the planner cut long copies to 47-draft rounds that cost as much as
63-draft ones (whole-file edits decoded 1.12x faster once it read the deep curve). So a batch
runner is also profiled on a deep cache (`deep_ms`, at `deep_context` cached tokens), and
`cost_ms(n, context)` reads the two curves interpolated linearly in the context (extrapolated
past the deep one). The learned ratio corrects what the context does not explain.
"""

import bisect
import math
import time
from dataclasses import dataclass, field
from typing import Callable

PROFILE_SIZES = (1, 2, 3, 4, 6, 8, 12, 16)
OBSERVATION_WEIGHT = 0.1  # weight of one new observation in the moving average at its size
NEIGHBOUR_OCTAVES = 2.0  # an observation at n also corrects learned ratios within this many octaves


@dataclass
class CostModel:
    """latency_ms[n] (the profile) for measured n; linear interpolation between, linear
    extrapolation past; times ratio(n), learned from observations. The measured points are read
    as measured, even where a larger n costs less than a smaller one: that is how the kernels
    behave (re-profiled, reproducibly: llama.cpp 1.5B Q4 batch 12 tokens 273 ms, 16 tokens
    257 ms; torch fp32 135M 3 tokens 120 ms, 4 tokens 84 ms), so a planner may rightly draft up
    to the cheaper size. (Capping them with a running maximum told it 4 tokens cost 120 ms.)
    Reads are on the hot path (the depth planner asks a hundred times a step, mostly at the same
    sizes and one context), so the sorted curves are cached and so are the last context's reads
    (`_reads`, cleared whenever what they read changes: an observation)."""

    latency_ms: dict[int, float] = field(default_factory=dict)  # on base_context cached tokens
    ratio: dict[int, float] = field(default_factory=dict)  # observed / profiled, by observed size
    deep_ms: dict[int, float] = field(default_factory=dict)  # the same sizes on deep_context cached tokens
    base_context: int = 0
    deep_context: int = 0
    _curve: tuple[list[int], list[float]] | None = field(default=None, repr=False, compare=False)
    _ratio_curve: tuple[list[int], list[float]] | None = field(default=None, repr=False, compare=False)
    _deep_curve: tuple[list[int], list[float]] | None = field(default=None, repr=False, compare=False)
    profiled: bool = field(init=False, default=False)  # False: observations themselves are the curve
    _reads: dict[int, float] = field(default_factory=dict, init=False, repr=False, compare=False)  # at _reads_context
    _reads_context: float | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.profiled = bool(self.latency_ms)

    def cost_ms(self, num_tokens: int, context: float | None = None) -> float:
        """Scoring num_tokens in one call on `context` cached tokens (None: the profile's base)."""
        if num_tokens <= 0:
            return 0.0
        if context != self._reads_context:
            self._reads, self._reads_context = {}, context
        found = self._reads.get(num_tokens)
        if found is None:
            found = self._reads[num_tokens] = self.profiled_ms(num_tokens, context) * self.ratio_at(num_tokens)
        return found

    def profiled_ms(self, num_tokens: int, context: float | None = None) -> float:
        if not self.latency_ms:
            return float(num_tokens)  # unmeasured: proportional, the pessimistic CPU assumption
        base = _read_curve(*self._profile_curve(), num_tokens)
        fraction = self.depth_weight(context)
        if fraction == 0.0:
            return base
        if self._deep_curve is None:
            self._deep_curve = _sorted_points(self.deep_ms)
        deep = _read_curve(*self._deep_curve, num_tokens)
        return base + fraction * (deep - base)

    def depth_weight(self, context: float | None) -> float:
        """The deep curve's weight in a read at `context`: linear from 0 at the base context to 1 at
        the deep one, and on past it; 0 at or under the base, or without a deep curve."""
        if context is None or context <= self.base_context or not self.deep_ms or self.deep_context <= self.base_context:
            return 0.0
        return (context - self.base_context) / (self.deep_context - self.base_context)

    def ratio_at(self, num_tokens: int) -> float:
        """Learned correction at num_tokens: 1 before any observation, constant past the ends."""
        if not self.ratio:
            return 1.0
        if self._ratio_curve is None:
            self._ratio_curve = _sorted_points(self.ratio)
        sizes, values = self._ratio_curve
        if num_tokens <= sizes[0]:
            return values[0]
        if num_tokens >= sizes[-1]:
            return values[-1]
        return _interpolate(sizes, values, num_tokens)

    def _profile_curve(self) -> tuple[list[int], list[float]]:
        if self._curve is None:
            self._curve = _sorted_points(self.latency_ms)
        return self._curve

    def observe(self, num_tokens: int, elapsed_ms: float, context: float | None = None) -> None:
        """A step that scored num_tokens on `context` cached tokens took elapsed_ms: move the
        ratio at num_tokens toward what it showed (against the profile read at that context),
        and the learned ratios near it by part of the same factor. Without a profile there is
        nothing to correct: the observed sizes become the curve's points."""
        if num_tokens <= 0:
            return
        if not self.profiled:  # no profile to correct: observed sizes become the curve's points
            old = self.latency_ms.get(num_tokens)
            if old is None:
                old = self.profiled_ms(num_tokens) if self.latency_ms else elapsed_ms
            self.latency_ms[num_tokens] = old + OBSERVATION_WEIGHT * (elapsed_ms - old)
            self._curve, self._reads = None, {}
            return
        shown = elapsed_ms / self.profiled_ms(num_tokens, context)
        key = _bucket(num_tokens)
        old = self.ratio.get(key, self.ratio_at(key))
        self.ratio[key] = old + OBSERVATION_WEIGHT * (shown - old)
        drift = self.ratio[key] / old
        for size in self.ratio:
            if size != key:
                self.ratio[size] *= drift ** _closeness(size, key)
        self._ratio_curve, self._reads = None, {}

    def to_json(self) -> dict[str, float]:
        """The profile as corrected so far, at its measured and observed sizes."""
        sizes = sorted(set(self.latency_ms) | set(self.ratio))
        return {str(n): round(self.latency_ms.get(n, self.profiled_ms(n)) * self.ratio_at(n), 3) for n in sizes}

    @classmethod
    def from_json(cls, data: dict[str, float]) -> "CostModel":
        return cls({int(n): float(ms) for n, ms in data.items()})

    def to_wire(self) -> dict:
        """Both curves as corrected so far, for another process to plan or place on: the short
        one (to_json) and the deep one with its context, so a long context is read as here."""
        deep = {str(n): round(self.cost_ms(n, self.deep_context), 3) for n in sorted(self.deep_ms)}
        return {"ms": self.to_json(), "deep_ms": deep, "base_context": self.base_context,
                "deep_context": self.deep_context}

    @classmethod
    def from_wire(cls, data: dict) -> "CostModel":
        """to_wire's dict (a flat to_json dict reads as a short curve alone)."""
        if "ms" not in data:
            return cls.from_json(data)
        return cls({int(n): float(ms) for n, ms in data["ms"].items()},
                   deep_ms={int(n): float(ms) for n, ms in data.get("deep_ms", {}).items()},
                   base_context=int(data.get("base_context", 0)), deep_context=int(data.get("deep_context", 0)))

    def scaled(self, factor: float) -> "CostModel":
        """The same model on a device `factor` times slower: both curves scaled, what was learned
        kept (its ratios are relative)."""
        return CostModel({n: ms * factor for n, ms in self.latency_ms.items()}, dict(self.ratio),
                         {n: ms * factor for n, ms in self.deep_ms.items()}, self.base_context, self.deep_context)


@dataclass(frozen=True, slots=True)
class CostView:
    """What the depth planner reads of a runner (local, remote or simulated): its cost curve, and
    whether a batch is one fused forward (cost of the total tokens) or one pass per item."""

    cost: CostModel
    fused: bool = True


def catch_up_ms(cost: CostModel, unseen: int) -> float:
    """Extra cost of a draft model's first forward when it has not seen `unseen` tokens (a whole
    prompt, the first time), beyond a normal one-token draft step: in one call, or a token at a
    time where that is cheaper (`fed_singly`)."""
    one = cost.cost_ms(1)
    return max(0.0, min(cost.cost_ms(unseen), unseen * one) - one)


def fed_singly(cost: CostModel, tokens: int, context: float | None = None) -> bool:
    """Whether one sequence's `tokens` cost less fed one per call than in one call. On CPUs whose
    multi-row kernels work on tiles of rows, a call of 2-4 rows can cost 2-4 single rows' worth
    each (the 0.5B on one Zen 5 thread at 300 cached tokens: 1 token 20.8 ms, 2 tokens 73.1, 4
    tokens 95.6)."""
    return tokens > 1 and tokens * cost.cost_ms(1, context) < cost.cost_ms(tokens, context)


def _sorted_points(points: dict[int, float]) -> tuple[list[int], list[float]]:
    """A curve's sizes in order and their values (cached by the CostModel: reads are hot)."""
    sizes = sorted(points)
    return sizes, [points[n] for n in sizes]


def _read_curve(sizes: list[int], values: list[float], n: int) -> float:
    """A measured curve at n: interpolated between its sizes, extrapolated past the last."""
    if n >= sizes[-1]:
        if len(sizes) == 1:
            return values[0] * n / sizes[0]
        slope = (values[-1] - values[-2]) / (sizes[-1] - sizes[-2])
        if slope < 0:  # a last segment that falls says nothing about larger calls
            return values[-1] * n / sizes[-1]
        return values[-1] + slope * (n - sizes[-1])
    return _interpolate(sizes, values, n)


def _interpolate(sizes: list[int], values: list[float], n: int) -> float:
    i = bisect.bisect_left(sizes, n)
    if sizes[i] == n or i == 0:
        return values[i]
    fraction = (n - sizes[i - 1]) / (sizes[i] - sizes[i - 1])
    return values[i - 1] + fraction * (values[i] - values[i - 1])


def _bucket(n: int) -> int:
    """Where an observation of n tokens is learned: n itself up to 16, then 8 places per octave
    (prefill steps score every total up to thousands; each needs no ratio of its own)."""
    if n <= 16:
        return n
    step = 1 << (n.bit_length() - 4)
    return n - n % step


def _closeness(a: int, b: int) -> float:
    """1 at the same size, falling linearly to 0 at NEIGHBOUR_OCTAVES octaves apart."""
    return max(0.0, 1.0 - abs(math.log2(a / b)) / NEIGHBOUR_OCTAVES)


def measure_cost(
    forward: Callable[[list[int]], object],
    rollback: Callable[[int], None],
    base_length: int,
    sizes: tuple[int, ...] = PROFILE_SIZES,
    repeats: int = 5,
    after_each: Callable[[], object] = lambda: None,
    statistic: Callable[[list[float]], float] = min,
) -> CostModel:
    """Time forward passes of n tokens on top of a cache of `base_length`; by default the fastest
    of the repeats, since interference from other work only ever adds time (a planner compares
    sizes; `statistic=median` prices what a call typically costs). Each repeat sweeps every
    size, so a burst of interference costs each size one sample, not one size all of its samples.
    `after_each` is called after every forward, outside its timing (a progress bar)."""
    filler = [1] * max(sizes)
    forward(filler[:1])  # warm-up
    rollback(base_length)
    after_each()
    samples: dict[int, list[float]] = {n: [] for n in sizes}
    for _ in range(repeats):
        for n in sizes:
            start = time.perf_counter()
            forward(filler[:n])
            samples[n].append((time.perf_counter() - start) * 1000)
            rollback(base_length)
            after_each()
    return CostModel({n: float(statistic(times)) for n, times in samples.items()})
