"""The stages of an engine step (engine/batch_engine.py), kept apart from its scheduling: the
same step runs in `tandem generate`, `serve` and every cluster replica (cluster/runtime/replica.py).
- plan: each sequence's drafter offers what it could draft (a copy, the draft model, nothing);
  the load-aware planner chooses every k at once (speculation/batch_depth.py),
- draft: each drafter proposes for all its sequences in one batch call,
- commit: a verified round's tokens pass the stops into the sequence; the planner learns the
  source's acceptance; the update and the round report come out.
"""

from dataclasses import replace

from tandem.engine.events import RoundReport, SequenceUpdate
from tandem.engine.sequence import Sequence
from tandem.speculation.batch_depth import BatchDepthPlanner
from tandem.speculation.drafters.base import NO_OFFER, Drafter, DraftJob, DraftOffer, SequenceDraft


def offer_for(seq: Sequence, drafter: Drafter, context_length: int) -> DraftOffer:
    """What seq could draft this step. Nothing in its prefill round unless k is fixed: a draft
    there is a guess at how the answer opens."""
    limit = seq.draft_limit(context_length)
    if limit == 0 or (seq.unprefilled and seq.fixed_k is None):
        return NO_OFFER
    return drafter.offer(seq, limit)


def plan_drafts(seqs: list[Sequence], drafters: dict[str, Drafter], planner: BatchDepthPlanner,
                context_length: int) -> list[DraftJob]:
    """One job per sequence, in order: the offer the planner chose and its k (0: no draft)."""
    offers = [best_alternative(offer_for(seq, drafters[seq.drafter], context_length), planner) for seq in seqs]
    candidates = [replace(o.candidate, prefill_tokens=len(seq.unprefilled)) if seq.unprefilled else o.candidate
                  for o, seq in zip(offers, seqs)]
    fallbacks = [o.fallback.candidate if o.fallback is not None else None for o in offers]
    ks, used = planner.plan(candidates, fallbacks)
    return [DraftJob(seq, o.fallback if fell_back else o, k) for seq, o, k, fell_back in zip(seqs, offers, ks, used)]


def best_alternative(offer: DraftOffer, planner: BatchDepthPlanner) -> DraftOffer:
    """Of an offer and its alternatives, the one whose drafts are expected to be accepted most
    (by each source's acceptance so far: a source that keeps failing loses its turn, one never
    tried is judged by its prior); it keeps the offer's fallback."""
    if not offer.alternatives:
        return offer
    best = max((offer, *offer.alternatives), key=lambda o: planner.expected_accepted(o.candidate))
    return replace(best, fallback=offer.fallback, alternatives=())


def draft_all(jobs: list[DraftJob], drafters: dict[str, Drafter],
              planner: BatchDepthPlanner | None = None) -> list[SequenceDraft]:
    """Each drafter proposes for its jobs with k > 0 in one call; the rest draft nothing. With a
    planner, auto-depth model drafts go as deep as the draft's confidence pays for."""
    drafts = [SequenceDraft(job.offer.candidate.source, []) for job in jobs]
    keep = _keep_drafting(jobs, planner) if planner is not None else None
    by_drafter: dict[str, list[int]] = {}
    for index, job in enumerate(jobs):
        if job.k > 0:
            by_drafter.setdefault(job.seq.drafter, []).append(index)
    for name, indices in by_drafter.items():
        proposed = drafters[name].propose_batch([jobs[i] for i in indices], keep)
        for index, draft in zip(indices, proposed):
            drafts[index] = draft
    return drafts


def _keep_drafting(jobs: list[DraftJob], planner: BatchDepthPlanner):
    planned = {job.seq.seq_id: job for job in jobs}
    total = sum(job.k + 1 + len(job.seq.unprefilled) for job in jobs)

    def keep(seq: Sequence, confidences: list[float]) -> bool:
        job = planned[seq.seq_id]
        others = total - job.k - 1
        return planner.keep_drafting(job.offer.candidate.source, confidences, others, len(jobs))

    return keep


def commit_round(seq: Sequence, draft: SequenceDraft, emitted: list[int], accepted: int,
                 planner: BatchDepthPlanner, context_length: int) -> tuple[SequenceUpdate, RoundReport, str | None]:
    """Commit a verified round (accepted drafts + the target's token) up to the first stop."""
    k = len(draft.token_ids)
    planner.record(draft.source, k, accepted)
    tokens, reason = seq.commit(list(emitted), k, accepted, context_length)
    update = SequenceUpdate(seq.seq_id, tuple(tokens), k, accepted, reason is not None, reason,
                            cached_tokens=seq.cached_tokens or 0)
    return update, RoundReport(seq.seq_id, draft.source, k, accepted), reason
