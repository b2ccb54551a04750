"""Drafting for a batch: what each sequence could draft, and the draft model run in lock-step.

`candidate_for` looks at one sequence and says where its draft would come from this step: a copy
from its own context (prompt lookup), a copy from the shared n-gram store (what earlier requests
produced), the draft model, or nothing; the planner then picks k for everyone. `draft_with_model`
runs the draft model for all sequences that draft with it: one batched forward per depth, each
sequence's draft slot synced lazily (rolled back to what is still valid, then fed the tokens it
has not seen).
"""

import time
from dataclasses import dataclass

import numpy as np

from tandem.engine.sequence import Sequence
from tandem.models.batch_runner import BatchItem, BatchRunner
from tandem.spec.batch_depth import DraftCandidate
from tandem.spec.drafters.ngram import find_ngram_match
from tandem.spec.sampling import probs_from_logits, sample

# (min, max) n-gram lengths: the plain n-gram drafter accepts short matches; hybrid only trusts
# long ones (the draft model is the fallback).
NGRAM_LENGTHS = {"ngram": (2, 4), "hybrid": (3, 8)}
SHARED_MIN_NGRAM = 3


@dataclass(slots=True)
class SequenceDraft:
    """A proposal for one sequence: token ids, and q_draft [k, vocab] when sampled by a model."""

    source: str
    token_ids: list[int]
    q_draft: np.ndarray | None = None


def draft_limit(seq: Sequence, context_length: int, k_max: int) -> int:
    """A round always adds one target token: drafts fit in what is left besides it."""
    return max(0, min(seq.room - 1, context_length - len(seq.tokens) - 1, k_max))


def candidate_for(seq: Sequence, limit: int, ngram_store, draft: BatchRunner | None) -> tuple[DraftCandidate, list[int]]:
    """Where seq's draft would come from, and the copied continuation (empty for the model)."""
    if seq.drafter == "none" or limit == 0 or (seq.unprefilled and seq.fixed_k is None):
        # the first round scores the prompt: a draft there is a guess at how the answer opens
        return DraftCandidate("none", 0, False, fixed_k=0), []
    if seq.drafter in NGRAM_LENGTHS:
        low, high = NGRAM_LENGTHS[seq.drafter]
        match = find_ngram_match(seq.tokens, limit, low, high)
        if match is not None and match.continuation:
            source = f"ngram{match.ngram_len}"
            return DraftCandidate(source, len(match.continuation), False, fixed_k=seq.fixed_k), match.continuation
        if ngram_store is not None:
            length, continuation = ngram_store.continuation(seq.tokens, limit)
            if length >= SHARED_MIN_NGRAM and continuation:
                source = f"shared{length}"
                return DraftCandidate(source, len(continuation), False, fixed_k=seq.fixed_k), continuation
    if seq.drafter in ("model", "hybrid") and draft is not None:
        setup = _catch_up_ms(seq, draft)
        return DraftCandidate("model", limit, True, setup, seq.fixed_k, seq.room), []
    return DraftCandidate("none", 0, False, fixed_k=0), []


def _reusable(seq: Sequence) -> int:
    """Draft-cache tokens still valid; the last token is always fed again for fresh logits."""
    cached, tokens = seq.draft_cached, seq.tokens
    limit = min(len(cached), len(tokens) - 1)
    i = 0
    while i < limit and cached[i] == tokens[i]:
        i += 1
    return i


def _catch_up_ms(seq: Sequence, draft: BatchRunner) -> float:
    unseen = len(seq.tokens) - _reusable(seq)
    return max(0.0, draft.cost.cost_ms(unseen) - draft.cost.cost_ms(1))


def draft_with_model(draft: BatchRunner, jobs: list[tuple[Sequence, int]]) -> tuple[dict[str, SequenceDraft], int]:
    """Draft k tokens for each (sequence, k); return the drafts by seq id and the forwards run."""
    drafts = {seq.seq_id: SequenceDraft("model", []) for seq, _ in jobs}
    q_rows: dict[str, list[np.ndarray]] = {seq.seq_id: [] for seq, _ in jobs}
    items = []
    for seq, _ in jobs:  # 1. sync every draft slot and draft the first token
        reusable = _reusable(seq)
        draft.rollback(seq.slot, reusable)
        items.append(BatchItem(seq.slot, tuple(seq.tokens[reusable:]), 1))
        seq.draft_cached = list(seq.tokens)
    active = list(jobs)
    forwards = 0
    while active:
        start = time.perf_counter()
        logits = draft.forward_batch(items)  # per item [1, vocab]
        _observe(draft, items, start)
        forwards += 1
        still, items = [], []
        for (seq, k), row in zip(active, logits):
            token, q_row = _pick(row[0], seq)
            drafts[seq.seq_id].token_ids.append(token)
            q_rows[seq.seq_id].append(q_row)
            if len(drafts[seq.seq_id].token_ids) < k and token not in seq.request.stop_token_ids:
                still.append((seq, k))  # 2. the next depth feeds the token just drafted
                items.append(BatchItem(seq.slot, (token,), 1))
                seq.draft_cached.append(token)
        active = still
    for seq, _ in jobs:
        if not seq.request.sampling.greedy:
            drafts[seq.seq_id].q_draft = np.stack(q_rows[seq.seq_id])  # [k, vocab]
    return drafts, forwards


def _observe(runner: BatchRunner, items: list[BatchItem], start: float) -> None:
    if runner.fused:
        tokens = sum(len(item.token_ids) for item in items)
        runner.cost.observe(tokens, (time.perf_counter() - start) * 1000)


def _pick(logits: np.ndarray, seq: Sequence) -> tuple[int, np.ndarray | None]:
    sampling = seq.request.sampling
    if sampling.greedy:
        return int(np.argmax(logits)), None
    q_row = probs_from_logits(logits[None, :], sampling)[0]  # [vocab]
    return sample(q_row, seq.rng), q_row
