"""What the cluster planner assumes of the drafters (the table itself is
speculation/drafters/registry.py's `DRAFTERS`: whether a drafter needs a draft model, what
share of its tokens the model proposes, and its acceptance until measured).

The planner does not run drafters; per drafter it needs whether drafting costs draft-model
steps (and what share of draft tokens does) and a per-token acceptance `a`, from which a step
drafting k tokens is expected to emit E(k) = 1 + a + ... + a^k = (1 - a^(k+1)) / (1 - a) tokens
per sequence. Override the acceptance in the cluster file's `acceptance:` or with
`--acceptance`; measure it on your workload (`tandem bench`) and pass it in.
"""

from types import MappingProxyType
from typing import Mapping

from tandem.speculation.drafters.registry import DRAFTERS

DEFAULT_ACCEPTANCE: Mapping[str, float] = MappingProxyType(
    {name: spec.prior_acceptance for name, spec in DRAFTERS.items() if spec.drafts})


def expected_tokens(acceptance: float, k: int) -> float:
    """E(k) = 1 + a + ... + a^k: tokens a sequence gains from one step drafting k tokens."""
    if k <= 0:
        return 1.0
    return (1 - acceptance ** (k + 1)) / (1 - acceptance)
