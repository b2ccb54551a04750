"""What a replica and a drafter worker send each other: deltas, never whole histories.

The replica owns every sequence's token ids. The drafter keeps its own copy, built from the
deltas it was sent; each message names the length the drafter is assumed to hold, so a drafter
that lost the sequence (it restarted, or evicted it) says so and gets it whole next time.
"""

from dataclasses import dataclass

import numpy as np

from tandem.speculation.sampling import SamplingParams


@dataclass(frozen=True, slots=True)
class DraftItem:
    seq_id: str
    base_length: int  # tokens the drafter already holds for this sequence before `delta`
    delta: tuple[int, ...]  # committed tokens it has not seen
    k: int
    sampling: SamplingParams
    seed: int  # per-round rng seed for sampled drafts
    output_start: int  # where output position 0 sits in the tokens, >= 1 (seeded drafts' races follow positions)


@dataclass(frozen=True, slots=True)
class DraftReply:
    seq_id: str
    token_ids: tuple[int, ...]
    q_draft: np.ndarray | None = None  # [k, vocab] when sampled
    needs_sync: bool = False  # the drafter lost this sequence: resend it whole (base_length 0)
