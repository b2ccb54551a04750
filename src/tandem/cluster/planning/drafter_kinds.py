"""Drafter kinds as the planner prices them, and its acceptance assumptions.

The planner does not run drafters; it needs, per kind, whether drafting costs draft-model
steps (and what share of draft tokens does) and a per-token acceptance `a`, from which a step
drafting k tokens is expected to emit E(k) = 1 + a + ... + a^k = (1 - a^(k+1)) / (1 - a) tokens
per sequence. The kinds are the engine's (speculation/drafters/registry.py):

- none:   no drafts, k = 0: plain batched decoding.
- ngram:  copies continuations from the context; free to propose, needs no draft model.
- suffix: copies what most often followed the context's suffix, in the request or recent outputs; free.
- model:  the draft model proposes every token.
- hybrid: n-gram copies where the context repeats, the draft model elsewhere.

Default acceptance (override in the cluster file's `acceptance:` or with `--acceptance`):
model 0.6 is the engine's own prior for a draft model (speculation/depth.py); ngram 0.4 sits near the
engine's prior for a 2-token match (0.42), since on fresh text most matches are short (suffix the
same, until measured); hybrid
0.65 assumes copies where they exist beat the model a little, with HYBRID_MODEL_SHARE of its
tokens from the model. Measure acceptance on your workload (`tandem bench`) and pass it in.
"""

from dataclasses import dataclass
from types import MappingProxyType
from typing import Mapping

from tandem.errors import TandemError
from tandem.speculation.depth import PRIOR_ACCEPTANCE

HYBRID_MODEL_SHARE = 0.7  # share of a hybrid drafter's tokens proposed by the draft model


@dataclass(frozen=True, slots=True)
class DrafterKind:
    name: str
    drafts: bool  # False: k is 0
    model_share: float  # share of draft tokens that cost a draft-model step (0: needs no model)

    def __post_init__(self):
        if not 0.0 <= self.model_share <= 1.0:
            raise TandemError(f"drafter kind {self.name}: model_share must be in [0, 1]")

    @property
    def uses_model(self) -> bool:
        return self.model_share > 0


DRAFTER_KINDS: Mapping[str, DrafterKind] = MappingProxyType({k.name: k for k in (
    DrafterKind("none", drafts=False, model_share=0.0),
    DrafterKind("ngram", drafts=True, model_share=0.0),
    DrafterKind("suffix", drafts=True, model_share=0.0),
    DrafterKind("model", drafts=True, model_share=1.0),
    DrafterKind("hybrid", drafts=True, model_share=HYBRID_MODEL_SHARE),
)})

DEFAULT_ACCEPTANCE: Mapping[str, float] = MappingProxyType(
    {"model": PRIOR_ACCEPTANCE, "ngram": 0.4, "suffix": 0.4, "hybrid": 0.65})


def drafter_kind(name: str) -> DrafterKind:
    try:
        return DRAFTER_KINDS[name]
    except KeyError:
        raise TandemError(f"unknown drafter kind {name!r}; choose one of {', '.join(DRAFTER_KINDS)}") from None


def expected_tokens(acceptance: float, k: int) -> float:
    """E(k) = 1 + a + ... + a^k: tokens a sequence gains from one step drafting k tokens."""
    if k <= 0:
        return 1.0
    return (1 - acceptance ** (k + 1)) / (1 - acceptance)
