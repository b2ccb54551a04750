"""What the coordinator and the cluster workers send each other: deltas, never whole histories.

The coordinator owns every sequence's token ids (the source of truth). A worker keeps its own
copy, built from the prompt it was opened with plus the deltas it was sent or produced; each
message names the length the coordinator has committed, so a worker that is ahead (it produced
tokens a stop then cut) or behind (it restarted) finds out at once. The only full history ever
sent is on `open`: a new sequence, or a re-prefill after a worker died.
"""

from dataclasses import dataclass

import numpy as np

from tandem.speculation.sampling import SamplingParams


@dataclass(frozen=True, slots=True)
class VerifyItem:
    seq_id: str
    committed_length: int  # the coordinator's token count; the verifier truncates to it
    draft_tokens: tuple[int, ...]
    sampling: SamplingParams
    q_draft: np.ndarray | None = None  # [k, vocab] for a sampled model draft; None: one-hot


@dataclass(frozen=True, slots=True)
class VerifyResult:
    seq_id: str
    emitted: tuple[int, ...]  # accepted drafts + one target token (before stops)
    accepted: int
    step_ms: float = 0.0  # the whole batched verify call on the worker (slowdown included)
    batch_tokens: int = 0  # tokens that call scored, over all its sequences


@dataclass(frozen=True, slots=True)
class DraftItem:
    seq_id: str
    base_length: int  # tokens the drafter already holds for this sequence before `delta`
    delta: tuple[int, ...]  # committed tokens it has not seen
    k: int
    sampling: SamplingParams
    seed: int  # per-round rng seed for sampled drafts


@dataclass(frozen=True, slots=True)
class DraftReply:
    seq_id: str
    token_ids: tuple[int, ...]
    q_draft: np.ndarray | None = None  # [k, vocab] when sampled
    needs_sync: bool = False  # the drafter lost this sequence: resend it whole (base_length 0)
