"""Suffix drafting: propose what most often followed the context's longest earlier suffix, in the
request's own prompt and output or in recent requests' outputs (speculation/suffix_index.py).

Model-free and variable-length: the proposal runs while each next token is the clear favourite of
what followed, so a long repeated span (a file being edited, an agent turn repeating an earlier
one) is proposed whole and a branching point ends it. The source is "suffix<c>", c the first
token's share of what followed the match in tenths (0-9), so the planner learns one acceptance
per confidence level and prices each like any other copy. A finished sequence's output (with
the prompt tail that leads into it) joins the shared index; its own index is dropped.
"""

from tandem.speculation.batch_depth import DraftCandidate
from tandem.speculation.drafters.base import NO_OFFER, DraftJob, DraftOffer, SequenceDraft, copy_drafts
from tandem.speculation.suffix_index import DEFAULT_DEPTH, GrowingSuffixIndex, SuffixIndex, SuffixProposal


def suffix_source(confidence: float) -> str:
    return f"suffix{min(9, int(confidence * 10))}"


def suffix_offer(found: SuffixProposal, seq) -> DraftOffer:
    candidate = DraftCandidate(suffix_source(found.confidence), len(found.tokens), False, fixed_k=seq.fixed_k)
    return DraftOffer(candidate, found.tokens)


class SuffixDrafter:
    name = "suffix"
    uses_model = False

    def __init__(self, shared: SuffixIndex | None = None, depth: int = DEFAULT_DEPTH):
        self.shared = shared if shared is not None else SuffixIndex(depth=depth)
        self.depth = depth
        self.own: dict[str, GrowingSuffixIndex] = {}  # seq_id -> its prompt and output so far

    def proposal(self, seq, limit: int) -> SuffixProposal | None:
        """The better of the request's own and the shared continuation: the longer match, then
        the more confident."""
        own = self.own.get(seq.seq_id)
        if own is None:
            own = self.own[seq.seq_id] = GrowingSuffixIndex(self.depth)
        own.extend(seq.tokens[own.length:])
        shared = self.shared.lookup(seq.tokens, limit) if seq.request.cache_salt is None else None  # salted: its own
        found = [p for p in (own.lookup(seq.tokens, limit), shared) if p is not None]
        return max(found, key=lambda p: (p.match_len, p.confidence), default=None)

    def offer(self, seq, limit: int) -> DraftOffer:
        found = self.proposal(seq, limit) if limit > 0 else None
        return NO_OFFER if found is None else suffix_offer(found, seq)

    def propose_batch(self, jobs: list[DraftJob], keep_drafting=None) -> list[SequenceDraft]:
        return copy_drafts(jobs)

    @property
    def answers_bytes(self) -> int:
        """Bytes charged by the shared index of earlier outputs (what forget_answers frees)."""
        return self.shared.charged_bytes

    def forget_answers(self) -> None:
        """Earlier requests' outputs leave the shared index (a benchmark's next run starts cold)."""
        self.shared.clear()

    def forget(self, seq) -> None:
        """seq left the batch: its output (led in by its prompt's tail) joins the shared index."""
        self.own.pop(seq.seq_id, None)
        prompt_len = len(seq.request.prompt_ids)
        start = max(0, prompt_len - (self.depth - 1))
        if len(seq.tokens) > prompt_len and seq.request.cache_salt is None:  # a salted answer stays its own
            self.shared.add(seq.tokens[start:])
