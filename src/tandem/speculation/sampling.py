"""Sampling parameters and the one place logits become probabilities.

`probs_from_logits` applies temperature, top-k and top-p in that order. The target's logits
(giving `p_target`) and the draft's logits (giving `q_draft`) always pass through this same
function with the same `SamplingParams`, which is what keeps speculative sampling exact for the
processed distribution. Temperature 0 means greedy decoding.

A seeded request's token at each output position is the winner of an exponential race drawn
from the seed and the position alone (`position_race`, `race_winner`), not from a stream whose
use depends on how rounds fall: its tokens are then the same whatever was drafted (acceptance.py,
`accept_positional`). The race, not the inverse CDF at a uniform: inverting the CDF in token-id
order, a change of the logits in their last bits (another batch shape of llama.cpp's Q4
kernels) moves every boundary after it, so a token could turn into its neighbour by id, one ten
times less likely (seen by a user: p 0.20 to 0.024); a race's winner changes only where two
tokens' scores nearly tie.
"""

from dataclasses import dataclass

import numpy as np

from tandem.errors import TandemError
from tandem.numbers import is_int, is_number


MAX_TEMPERATURE = 2.0  # OpenAI's bound; the server and the command line share it


@dataclass(frozen=True, slots=True)
class SamplingParams:
    temperature: float = 0.0
    top_k: int = 0  # 0 = no top-k filter
    top_p: float = 1.0
    seed: int | None = None

    def __post_init__(self):
        if not (is_number(self.temperature) and 0.0 <= self.temperature <= MAX_TEMPERATURE):
            raise TandemError(f"temperature must be a number in [0, {MAX_TEMPERATURE:g}], got {self.temperature!r}")
        if not (is_number(self.top_p) and 0.0 <= self.top_p <= 1.0):
            raise TandemError(f"top-p must be in [0, 1], got {self.top_p!r}")
        if not (is_int(self.top_k) and self.top_k >= 0):
            raise TandemError(f"top-k must be a non-negative integer, got {self.top_k!r}")
        if self.seed is not None and not (is_int(self.seed) and 0 <= self.seed < 2**63):
            raise TandemError(f"seed must be an integer from 0 to 2**63 - 1, got {self.seed!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def probs_from_logits(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """Processed probabilities for sampling.  logits: [n, vocab] -> [n, vocab] float64."""
    shifted = logits.astype(np.float64)  # [n, vocab]
    shifted -= shifted.max(axis=-1, keepdims=True)  # before dividing: a tiny temperature sends the rest to -inf, not inf - inf
    with np.errstate(over="ignore"):
        scaled = shifted / params.temperature  # [n, vocab], every row's largest 0
    if params.top_k and params.top_k < scaled.shape[-1]:
        kth = np.partition(scaled, -params.top_k, axis=-1)[:, -params.top_k, None]  # [n, 1]
        scaled = np.where(scaled < kth, -np.inf, scaled)
    probs = np.exp(scaled)
    probs /= probs.sum(axis=-1, keepdims=True)
    if params.top_p < 1.0:
        probs = _top_p_filter(probs, params.top_p)
    return probs


def _top_p_filter(probs: np.ndarray, top_p: float) -> np.ndarray:
    """Keep the smallest set of most likely tokens whose mass reaches top_p.  [n, vocab]."""
    order = np.argsort(-probs, axis=-1, kind="stable")  # [n, vocab]
    sorted_probs = np.take_along_axis(probs, order, axis=-1)
    mass_before = np.cumsum(sorted_probs, axis=-1) - sorted_probs
    keep_sorted = mass_before < top_p
    keep_sorted[:, 0] = True  # the most likely token always stays (top_p 0 keeps it alone)
    keep = np.empty_like(keep_sorted)
    np.put_along_axis(keep, order, keep_sorted, axis=-1)
    filtered = np.where(keep, probs, 0.0)
    return filtered / filtered.sum(axis=-1, keepdims=True)


def sample(probs: np.ndarray, rng: np.random.Generator) -> int:
    """One token from a probability vector.  probs: [vocab]."""
    return sample_at(probs, rng.random())


def sample_at(probs: np.ndarray, uniform: float) -> int:
    """The token whose share of the CDF holds `uniform` in [0, 1): a sample of probs when
    uniform is.  probs: [vocab]."""
    cdf = np.cumsum(probs)
    index = int(np.searchsorted(cdf, uniform * cdf[-1], side="right"))
    return min(index, probs.shape[-1] - 1)


def position_race(seed: int, position: int, vocab: int) -> np.ndarray:
    """The race of a seeded request's output position: one Exp(1) time per token id, a function
    of the seed and the position alone (ids below any vocab size get the same times, so a draft
    model of a narrower vocabulary runs the same race).  -> [vocab] float32 (a device gets them
    in half the bytes; divided by float64 probabilities, each side computes the same times).
    Drawn in float64, then rounded: numpy's float32 draw is exactly 0 once in ~8 million (2^-23,
    its ziggurat's first layer), a time of 0 that any token of probability above 0 wins with, about
    one output position in 55 over a 150k vocabulary; a float64 draw rounds to 0 never in practice."""
    return np.random.default_rng([seed, position]).standard_exponential(vocab).astype(np.float32)


def race_winner(probs: np.ndarray, race: np.ndarray) -> int:
    """The token whose time race / probs comes first (the exponential race, i.e. Gumbel-max:
    token i wins with probability probs[i]); tokens of probability 0 never run.
    probs: [vocab]; race: [vocab] or longer (its first ids taken)."""
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        times = np.where(probs > 0, race[: probs.shape[-1]] / probs, np.inf)  # [vocab]; a time of 0 over 0 is no NaN
    return int(np.argmin(times))
