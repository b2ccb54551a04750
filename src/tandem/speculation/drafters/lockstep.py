"""A draft model in this process, drafting for many sequences in lock-step.

One batched forward per depth: the first feeds every sequence the committed tokens its draft
slot has not seen (its slot rolled back to what is still valid: synced lazily) and drafts the
first token; each later forward drafts one more token for the sequences still drafting. A
sequence stops at a stop token, at its k, or, for an auto-depth sequence (once the planner
decided its drafting pays), where the planner's `keep_drafting` says one more token is not worth
it given the draft's own confidence in what it drafted. A job whose `catch_up` allows fewer
tokens than its slot has not seen (a new prompt, while other streams decode) feeds a chunk of
them in the first forward and drafts nothing this step.
The drafter worker of the cluster runs the same code (cluster/runtime/drafter_worker.py).
"""

import time

import numpy as np

from tandem.models.batch_runner import BatchItem, BatchRunner, cached_context
from tandem.models.cost import CostView, catch_up_ms, fed_singly
from tandem.speculation.drafters.base import DraftJob, KeepDrafting, SequenceDraft
from tandem.speculation.sampling import position_race, probs_from_logits, race_winner, sample
from tandem.token_ids import common_prefix


def reusable(seq) -> int:
    """Draft-cache tokens still valid; the last token is always fed again for fresh logits."""
    return min(common_prefix(seq.draft_cached, seq.tokens), len(seq.tokens) - 1)


class LocalDraftModel:
    def __init__(self, runner: BatchRunner):
        self.runner = runner
        self.forwards = 0  # lock-step forwards run so far (for stats)

    def cost_view(self, seq) -> CostView:
        return CostView(self.runner.cost, self.runner.fused)

    def catch_up_ms(self, seq) -> float:
        return catch_up_ms(self.runner.cost, len(seq.tokens) - reusable(seq))

    def draft(self, jobs: list[DraftJob], keep_drafting: KeepDrafting | None = None) -> list[SequenceDraft]:
        drafts = [SequenceDraft("model", []) for _ in jobs]
        q_rows: list[list[np.ndarray]] = [[] for _ in jobs]
        confidences: list[list[float]] = [[] for _ in jobs]
        synced = [(index, self._sync(job)) for index, job in enumerate(jobs)]  # 1. sync every draft slot
        items = self._catch_up_singly([item for _, item in synced if item is not None])
        owners = [index if item.num_logits else None for index, item in synced if item is not None]
        while items:
            context = cached_context(self.runner, items) if self.runner.fused else None
            start = time.perf_counter()
            logits = self.runner.forward_batch(items, views=True)  # per item [1, vocab] ([0, vocab]: catch-up only), read here
            self._observe(items, start, context)
            still, items = [], []
            for index, rows in zip(owners, logits):
                if index is None:
                    continue  # a chunk of catch-up: this sequence drafts in a later step
                job = jobs[index]
                token, q_row, confidence = _pick(rows[0], job.seq, len(drafts[index].token_ids))
                drafts[index].token_ids.append(token)
                q_rows[index].append(q_row)
                confidences[index].append(confidence)
                if self._goes_on(job, drafts[index].token_ids, confidences[index], keep_drafting):
                    still.append(index)  # 2. the next depth feeds the token just drafted
                    items.append(BatchItem(job.seq.slot, (token,), 1))
                    job.seq.draft_cached.append(token)
            owners = still
        for job, draft, rows in zip(jobs, drafts, q_rows):
            if rows and not job.seq.request.sampling.greedy:
                draft.q_draft = np.stack(rows)  # [k, vocab]
        return drafts

    def _sync(self, job: DraftJob) -> BatchItem | None:
        """The first forward's item for job: what its draft slot has not seen, ending in the
        last committed token, whose logits give the first draft token. Where job.catch_up
        allows fewer, a chunk of the unseen tokens without logits (None: nothing to feed)."""
        seq = job.seq
        keep = reusable(seq)
        self.runner.rollback(seq.slot, keep)
        unseen = seq.tokens[keep:]
        if job.catch_up is not None and len(unseen) - 1 > job.catch_up:
            seq.draft_cached = list(seq.tokens[: keep + job.catch_up])
            return BatchItem(seq.slot, tuple(unseen[: job.catch_up]), 0) if job.catch_up else None
        seq.draft_cached = list(seq.tokens)
        return BatchItem(seq.slot, tuple(unseen), 1)

    def _catch_up_singly(self, items: list[BatchItem]) -> list[BatchItem]:
        """The first forward's items, or, where one sequence syncs several tokens that its curve
        prices lower one per call (models/cost.py `fed_singly`: the catch-up on a round's
        accepted tokens, on a CPU's tiled kernels), its last token alone after the others fed one
        at a time. The draft's cache ends the same; only its proposals' rounding may differ."""
        if len(items) != 1 or items[0].num_logits != 1:
            return items
        (item,) = items
        context = cached_context(self.runner, items) if self.runner.fused else None
        if not fed_singly(self.runner.cost, len(item.token_ids), context):
            return items
        for token in item.token_ids[:-1]:
            single = [BatchItem(item.slot, (token,), 0)]
            start, context = time.perf_counter(), (cached_context(self.runner, single) if self.runner.fused else None)
            self.runner.forward_batch(single)
            self._observe(single, start, context)
        return [BatchItem(item.slot, item.token_ids[-1:], 1)]

    def _observe(self, items: list[BatchItem], start: float, context: float | None) -> None:
        self.forwards += 1
        if self.runner.fused:
            tokens = sum(len(item.token_ids) for item in items)
            self.runner.cost.observe(tokens, (time.perf_counter() - start) * 1000, context)

    @staticmethod
    def _goes_on(job: DraftJob, tokens: list[int], confidences: list[float], keep_drafting) -> bool:
        if tokens[-1] in job.seq.request.stop_token_ids or len(tokens) >= job.offer.candidate.cap:
            return False
        if job.seq.fixed_k is None and keep_drafting is not None:
            return keep_drafting(job.seq, confidences)  # confidence decides how deep
        return len(tokens) < job.k


def _pick(logits: np.ndarray, seq, depth: int) -> tuple[int, np.ndarray | None, float]:
    """The draft token from next-token logits [vocab], its q row (sampling), its confidence;
    `depth`: drafts before it this round. A seeded request drafts by the race of the token's
    output position, the one the target's positional rule will run (acceptance.py), so draft and
    target pick the same token wherever q is near p. A device runner's tensor is
    read on the host (free on a CPU; one row per token on a GPU)."""
    if not isinstance(logits, np.ndarray):
        logits = logits.float().cpu().numpy()
    sampling = seq.request.sampling
    if sampling.greedy:
        token = int(np.argmax(logits))
        shifted = np.exp(logits - logits[token])
        return token, None, float(1.0 / shifted.sum())
    q_row = probs_from_logits(logits[None, :], sampling)[0]  # [vocab]
    if sampling.seed is None:
        token = sample(q_row, seq.rng)
    else:
        token = race_winner(q_row, position_race(sampling.seed, seq.output_position + depth, len(q_row)))
    return token, q_row, float(q_row[token])
