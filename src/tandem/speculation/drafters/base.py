"""The drafter interface.

A drafter looks at a sequence's committed token ids and proposes draft tokens for the target to
verify; how many (k) it asks the depth policy, naming its source so acceptance is tracked per
source. It never sees text. `q_draft` holds the draft's processed probabilities for
each proposed token (None means a deterministic proposal: a one-hot q), so the acceptance rule
can stay exact.
"""

from dataclasses import dataclass, field
from typing import Protocol, Sequence

import numpy as np

from tandem.spec.depth import DepthPolicy
from tandem.spec.sampling import SamplingParams



@dataclass(frozen=True, slots=True)
class DraftRequest:
    sampling: SamplingParams
    rng: np.random.Generator
    depth: DepthPolicy  # chooses k for the source the drafter picks, and may stop it early
    limit: int  # hard cap on k (remaining max tokens, context room)


@dataclass(slots=True)
class Draft:
    token_ids: list[int]
    q_draft: np.ndarray | None = None  # [len(token_ids), draft_vocab] or None (one-hot)
    source: str = "none"  # which drafter produced it: "model", "ngram", "none"
    draft_forwards: int = 0
    confidences: list[float] = field(default_factory=list)

    @property
    def k(self) -> int:
        return len(self.token_ids)


EMPTY_DRAFT = Draft([])


class Drafter(Protocol):
    name: str

    def propose(self, token_ids: Sequence[int], request: DraftRequest) -> Draft: ...

    def cost_ms(self, num_tokens: int) -> float:
        """Expected time to propose `num_tokens` draft tokens."""
        ...
