"""The drafter interface, for a batch of sequences.

A drafter proposes draft tokens for the target to verify; it never sees text. An engine step
asks every running sequence's drafter for an `offer` (what it could draft: a copied
continuation, or the draft model, priced as a `DraftCandidate`), lets the load-aware planner
choose every k at once, then asks each drafter to `propose_batch` for its sequences with the
chosen ks. An offer may carry a `fallback` (hybrid: the draft model, when the planner gives its
copy k = 0). `q_draft` holds the draft's processed probabilities for each proposed token (None:
a deterministic proposal, i.e. a one-hot q), so the acceptance rule stays exact.
"""

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Protocol

import numpy as np

from tandem.speculation.batch_depth import DraftCandidate

if TYPE_CHECKING:
    from tandem.engine.sequence import Sequence

NO_CANDIDATE = DraftCandidate("none", 0, False, fixed_k=0)


@dataclass(slots=True)
class SequenceDraft:
    """A proposal for one sequence: token ids, and q_draft [k, vocab] when sampled by a model."""

    source: str  # "none", "model", "ngram3", "shared5", ...
    token_ids: list[int]
    q_draft: np.ndarray | None = None
    rivals: "tuple[Rival, ...]" = ()  # the copies offered beside it and not chosen (engine/stages.py)


@dataclass(frozen=True, slots=True)
class Rival:
    """A copy offered for a round but not drafted: what it would have proposed. Its source learns
    from the tokens the round emits as if it had drafted them."""

    source: str
    copy: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class DraftOffer:
    candidate: DraftCandidate
    copy: tuple[int, ...] = ()  # the copied continuation (copy sources); empty for the model
    fallback: "DraftOffer | None" = None  # used when the planner gives `candidate` k = 0
    alternatives: tuple["DraftOffer", ...] = ()  # other copies of this step; the planner keeps the best

    @property
    def uses_model(self) -> bool:
        return self.candidate.uses_model


NO_OFFER = DraftOffer(NO_CANDIDATE)


@dataclass(frozen=True, slots=True)
class DraftJob:
    seq: "Sequence"
    offer: DraftOffer  # the offer the planner chose (the fallback, where it was used)
    k: int
    # prompt tokens the draft model may catch up on this step beyond the one it always feeds
    # (None: all it has not seen); one with more left feeds that many and drafts nothing yet
    catch_up: int | None = None
    rivals: tuple[Rival, ...] = ()  # the copies offered beside `offer` and not chosen


# (sequence, draft confidences so far) -> draft one more token? (auto depth, model drafts)
KeepDrafting = Callable[["Sequence", list[float]], bool]


class Drafter(Protocol):
    name: str  # "none" | "ngram" | "model" | "hybrid"
    uses_model: bool  # needs a draft model

    def offer(self, seq: "Sequence", limit: int) -> DraftOffer:
        """What seq could draft this step, at most `limit` tokens."""
        ...

    def propose_batch(self, jobs: list[DraftJob], keep_drafting: KeepDrafting | None = None) -> list[SequenceDraft]:
        """One draft per job, in order, of at most job.k tokens (model drafts of auto-depth
        sequences may go deeper while `keep_drafting` says so)."""
        ...


def copy_drafts(jobs: list[DraftJob]) -> list[SequenceDraft]:
    """Drafts that copy their offer's continuation: free to propose."""
    return [SequenceDraft(job.offer.candidate.source, list(job.offer.copy[: job.k])) for job in jobs]
