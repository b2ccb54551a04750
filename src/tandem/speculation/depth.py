"""Speculation depth: how many draft tokens (k) a round proposes, and what is known about how
well each draft source does.

`Depth` is parsed once at the edge (CLI, API, cluster file, bench) with `parse_depth`: `Auto()`
lets the load-aware planner (speculation/batch_depth.py) choose k every step, up to AUTO_K_MAX
for a draft model and COPY_K_MAX for a copy;
`Fixed(k)` always drafts k tokens (fewer only where the request or the context ends, or a copy
is shorter), up to K_LIMIT, the one limit for a requested k everywhere.

Acceptance is tracked per source ("model", "ngram3", "shared5", ...) as an `AcceptanceEstimate`
with a prior and decay, so it follows the text. A copy after a longer match starts from a
higher prior (a copy that already agrees on 8 tokens usually goes on agreeing).
"""

import re

from dataclasses import dataclass

from tandem.errors import TandemError
from tandem.numbers import is_int

K_LIMIT = 64  # the deepest k a request may fix
AUTO_K_MAX = 16  # the deepest k the planner chooses on its own for a draft model
# and for a copy (free to propose; a copy that holds may run for hundreds of tokens): 63, so that
# the deepest round scores 64 tokens, one tile of llama.cpp's CPU flash attention (65 cost 15% more)
COPY_K_MAX = 63
PRIOR_ACCEPTANCE = 0.6  # for a draft model before any round is seen
PRIOR_WEIGHT = 4.0  # pseudo-observations behind the prior
DECAY = 0.97  # per-round forgetting of old acceptance evidence
PROBE_BUDGET = 0.02  # share of decoding time that probes of idle sources may cost
BEST_ACCEPTANCE = 0.99  # a source that cannot pay even at this acceptance is never probed
# the most an acceptance estimate may say: a copy that holds breaks about once in 300-1,000 tokens
# (whole-file edits: ~0.997), and at 0.99 a 63-token round would be priced at 47 accepted tokens
# instead of ~58, so the planner cut such copies to rounds of ~32 where 64 pay more
MAX_ACCEPTANCE = 0.998


@dataclass(frozen=True, slots=True)
class Auto:
    """The planner chooses k every step."""

    def __str__(self) -> str:
        return "auto"


@dataclass(frozen=True, slots=True)
class Fixed:
    """Always draft k tokens (k = 0 is plain decoding)."""

    k: int

    def __post_init__(self):
        if not is_int(self.k) or not 0 <= self.k <= K_LIMIT:
            raise TandemError(f"k must be 'auto' or an integer from 0 to {K_LIMIT}, got {self.k!r}")

    def __str__(self) -> str:
        return str(self.k)


Depth = Auto | Fixed


def parse_depth(value: "str | int | Depth") -> Depth:
    """`auto`, an integer from 0 to K_LIMIT (or its text), or a Depth already parsed."""
    if isinstance(value, (Auto, Fixed)):
        return value
    if value == "auto":
        return Auto()
    if is_int(value):
        return Fixed(value)
    if isinstance(value, str) and re.fullmatch(r"[+-]?[0-9]+", value.strip()):
        return Fixed(int(value))  # -1 is refused by Fixed, in the same words as 65
    raise TandemError(f"k must be 'auto' or an integer from 0 to {K_LIMIT}, got {value!r}")


def source_family(source: str) -> str:
    """"ngram5" -> "ngram", "shared3" -> "shared", "model" -> "model"."""
    return source.rstrip("0123456789")


def prior_acceptance(source: str) -> float:
    """Before evidence: a draft model 0.6; a copy after a match of length n (from the context or
    the shared store), 0.3 + 0.06 n (<= 0.8); a suffix proposal whose first token followed its
    match c tenths of the time, 0.1 + 0.08 c (<= 0.82); a copy still following its source after
    bucket b of accepted tokens (drafters/ngram.py), 0.7 + 0.08 b (<= 0.94)."""
    family, length = source_family(source), source[len(source_family(source)):]
    if family == "follow" and length.isdigit():
        return min(0.7 + 0.08 * int(length), 0.94)
    if family in ("ngram", "shared") and length.isdigit():
        return min(0.3 + 0.06 * int(length), 0.8)
    if family == "suffix" and length.isdigit():
        return 0.1 + 0.08 * min(int(length), 9)
    return PRIOR_ACCEPTANCE


@dataclass
class AcceptanceEstimate:
    """Per-token acceptance probability with a prior; trials end at the first rejection."""

    accepted: float = PRIOR_ACCEPTANCE * PRIOR_WEIGHT
    trials: float = PRIOR_WEIGHT

    @classmethod
    def for_source(cls, source: str) -> "AcceptanceEstimate":
        return cls.with_prior(prior_acceptance(source))

    @classmethod
    def with_prior(cls, rate: float) -> "AcceptanceEstimate":
        return cls(rate * PRIOR_WEIGHT, PRIOR_WEIGHT)

    @property
    def rate(self) -> float:
        return min(self.accepted / self.trials, MAX_ACCEPTANCE)

    def update(self, drafted: int, accepted: int) -> None:
        self.accepted = self.accepted * DECAY + accepted
        self.trials = self.trials * DECAY + accepted + (1 if accepted < drafted else 0)
