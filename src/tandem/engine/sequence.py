"""One request inside a batching engine: its token ids (the source of truth), its slot, and
how it drafts.

Invariant between steps: the target slot caches every committed token but the last, except
`unprefilled` ones (a newly admitted prompt's uncached part, scored in chunks, the rest with its first round);
the draft slot caches `draft_cached` (a prefix of the tokens, synced lazily before drafting).
"""

from dataclasses import dataclass, field

import numpy as np

from tandem.engine.events import SpeculationOptions
from tandem.engine.request import GenerationRequest
from tandem.engine.stops import apply_stops
from tandem.speculation.depth import K_LIMIT, Auto, Depth, Fixed


@dataclass(slots=True)
class Sequence:
    seq_id: str
    request: GenerationRequest
    drafter: str  # "hybrid" | "model" | "ngram" | "none"
    depth: Depth
    rng: np.random.Generator
    slot: int = -1
    tokens: list[int] = field(default_factory=list)  # prompt + committed output
    output: list[int] = field(default_factory=list)
    draft_cached: list[int] = field(default_factory=list)  # tokens in the draft slot's cache
    unprefilled: tuple[int, ...] = ()  # prompt tokens the target slot still lacks (until prefilled)
    cached_tokens: int | None = None  # prompt tokens found cached when first placed (None before)

    @classmethod
    def create(cls, seq_id: str, request: GenerationRequest, options: SpeculationOptions,
               default_drafter: str, default_depth: Depth = Auto()) -> "Sequence":
        drafter = options.drafter or default_drafter
        depth = Fixed(0) if drafter == "none" else (options.k if options.k is not None else default_depth)
        rng = np.random.default_rng(request.sampling.seed)
        return cls(seq_id, request, drafter, depth, rng, tokens=list(request.prompt_ids))

    @property
    def fixed_k(self) -> int | None:
        """The k the request fixed; None where the planner chooses."""
        return self.depth.k if isinstance(self.depth, Fixed) else None

    @property
    def cached_length(self) -> int:
        """Tokens the target slot holds before this step's call: all but the last token and the
        unprefilled ones."""
        return len(self.tokens) - 1 - len(self.unprefilled)

    def draft_limit(self, context_length: int) -> int:
        """A round always adds one target token: drafts fit in what is left besides it."""
        return max(0, min(self.room - 1, context_length - len(self.tokens) - 1, K_LIMIT))

    def commit(self, proposed: list[int], context_length: int) -> tuple[list[int], str | None]:
        """Append a verified round's tokens up to the first stop; return them and why the
        sequence ends (None, "stop" or "length"; see engine/stops.py)."""
        emitted, reason = apply_stops(proposed, self.output, self.request, context_length - len(self.tokens))
        self.tokens += emitted
        self.output += emitted
        return emitted, reason

    @property
    def output_position(self) -> int:
        """The output position of the next token: the request's own output so far, after any
        it resumed from (sampling.position_race)."""
        return self.request.output_offset + len(self.tokens) - len(self.request.prompt_ids)

    @property
    def room(self) -> int:
        """Tokens this sequence may still produce."""
        return self.request.max_tokens - len(self.output)
