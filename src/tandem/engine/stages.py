"""The stages of an engine step (engine/batch_engine.py), kept apart from its scheduling: the
same step runs in `tandem generate`, `serve` and every cluster replica (cluster/runtime/replica.py).
- plan: each sequence's drafter offers what it could draft (a copy, the draft model, nothing);
  the load-aware planner chooses every k at once (speculation/batch_depth.py),
- draft: each drafter proposes for all its sequences in one batch call,
- commit: a verified round's tokens pass the stops into the sequence; the planner learns the
  source's acceptance, and that of each copy offered beside it and not chosen (its rivals), from
  the tokens the round emitted: a copy's proposal is fixed, so whether it would have been
  accepted is known without verifying it (greedy: the emitted token is the target's; sampled:
  the emitted token follows the target's distribution, so it equals a one-hot draft with the
  probability that draft is accepted). A copy following its source that loses its turn early
  (a fresh alignment beside a short suffix match) thus learns how well it would have done, and
  wins the rounds it would do better in; the update and the round report come out.
"""

from dataclasses import replace

from tandem.engine.events import RoundReport, SequenceUpdate
from tandem.engine.sequence import Sequence
from tandem.engine.stops import StopConditionError
from tandem.speculation.batch_depth import BatchDepthPlanner
from tandem.speculation.drafters.base import NO_OFFER, Drafter, DraftJob, DraftOffer, Rival, SequenceDraft
from tandem.speculation.depth import source_family
from tandem.token_ids import common_prefix

# Rivals learn only where their source would otherwise starve: a copy that follows its source
# (drafters/ngram.py), whose buckets are reached only by holding, which a fresh alignment never
# shows while a short suffix match wins its rounds. A rival's evidence ends with the round,
# so it speaks mostly for a copy's first tokens, which hold more often than later ones; credited
# to every copy (suffix and shared matches too), it raised their estimates on short answers
# until they drafted long copies that failed (suffix9: 411 drafts at 27% in 20 answers, C=1).
RIVAL_FAMILIES = ("follow",)


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
    offered = [offer_for(seq, drafters[seq.drafter], context_length) for seq in seqs]
    offers = [best_alternative(offer, planner) for offer in offered]
    candidates = [replace(o.candidate, prefill_tokens=len(seq.unprefilled)) if seq.unprefilled else o.candidate
                  for o, seq in zip(offers, seqs)]
    fallbacks = [o.fallback.candidate if o.fallback is not None else None for o in offers]
    context = sum(seq.cached_length for seq in seqs) / max(len(seqs), 1)  # where the step's costs are read
    ks, used = planner.plan(candidates, fallbacks, context)
    jobs = []
    for seq, whole, o, k, fell_back in zip(seqs, offered, offers, ks, used):
        chosen = o.fallback if fell_back else o
        jobs.append(DraftJob(seq, chosen, k, rivals=rivals_of(whole, chosen if k else None)))
    return jobs


def rivals_of(offer: DraftOffer, drafted: DraftOffer | None) -> tuple[Rival, ...]:
    """The alignment copies (RIVAL_FAMILIES) among an offer and its alternatives other than the
    one drafted (all of them where none is)."""
    drafted_copy = None if drafted is None else (drafted.candidate.source, drafted.copy)
    return tuple(Rival(o.candidate.source, o.copy) for o in (offer, *offer.alternatives)
                 if o.copy and source_family(o.candidate.source) in RIVAL_FAMILIES
                 and (o.candidate.source, o.copy) != drafted_copy)


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
    for draft, job in zip(drafts, jobs):
        draft.rivals = job.rivals
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
    for rival in draft.rivals:
        agreed = common_prefix(rival.copy, emitted)
        planner.record(rival.source, agreed + (agreed < min(len(rival.copy), len(emitted))), agreed)
    try:
        tokens, reason = seq.commit(list(emitted), context_length)
    except StopConditionError as error:  # the request's own stop condition failed: it alone ends, nothing committed
        return (SequenceUpdate(seq.seq_id, (), k, 0, True, "error", str(error), seq.cached_tokens or 0),
                RoundReport(seq.seq_id, draft.source, k, accepted), "error")
    kept = min(accepted, len(tokens))  # accepted drafts past a stop are not part of the answer
    update = SequenceUpdate(seq.seq_id, tuple(tokens), k, kept, reason is not None, reason,
                            cached_tokens=seq.cached_tokens or 0)
    return update, RoundReport(seq.seq_id, draft.source, k, accepted), reason
