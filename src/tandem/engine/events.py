"""What the batching engine reports, one engine step at a time. Token ids only; no text.

`SequenceUpdate`: what one step did for one sequence (the tokens it committed, whether it
finished and why). `StepReport`: what the whole step cost and chose, for metrics, traces and the
dashboard. Both are plain frozen records, safe to hand from the engine thread to the event loop.
"""

from dataclasses import dataclass, field

from tandem.errors import TandemError
from tandem.speculation.depth import Depth, parse_depth

FINISH_REASONS = ("stop", "length", "cancelled", "error", "unavailable")  # unavailable: nothing left to run it (a cluster
# without a live verifier), the client may retry; error: the engine failed on it


@dataclass(frozen=True, slots=True)
class SpeculationOptions:
    """Per-request knobs (the API's `"tandem": {...}` object); None means the server default."""

    drafter: str | None = None  # a name of speculation/drafters/registry.py's table (checked by the engine)
    k: Depth | None = None  # Auto() or Fixed(k); "auto" or an int are parsed on creation

    def __post_init__(self):
        if self.drafter is not None and not (isinstance(self.drafter, str) and self.drafter):
            raise TandemError(f"a drafter is a name such as 'hybrid' or 'ngram' (None: the engine's), got {self.drafter!r}")
        if self.k is not None:
            object.__setattr__(self, "k", parse_depth(self.k))


def checked_options(options: "SpeculationOptions | None") -> "SpeculationOptions":
    """A request's options as the engine's entry points take them: None is the engine's own."""
    if options is None:
        return SpeculationOptions()
    if not isinstance(options, SpeculationOptions):
        raise TandemError(f"options must be a SpeculationOptions (or None), got {type(options).__name__}")
    return options


@dataclass(frozen=True, slots=True)
class SequenceUpdate:
    seq_id: str
    token_ids: tuple[int, ...]  # committed this step (may be empty)
    drafted: int = 0  # draft tokens proposed for this sequence this step
    accepted: int = 0  # of which the target accepted
    finished: bool = False
    finish_reason: str | None = None  # one of FINISH_REASONS once finished
    error: str | None = None  # set with finish_reason "error" or "unavailable"
    cached_tokens: int = 0  # prompt tokens the prompt cache held when the sequence was placed


@dataclass(frozen=True, slots=True)
class RoundReport:
    """One sequence's speculation round inside a step."""

    seq_id: str
    source: str  # "model", "ngram3", ..., "none"
    k: int  # draft tokens verified
    accepted: int  # how many of them the target accepted (the bonus token is not counted)


@dataclass(frozen=True, slots=True)
class StepReport:
    started_at: float  # time.time() when the step began (for spans and charts)
    step_seconds: float  # wall time of the whole step
    prefill_seconds: float  # separate prompt processing (0 where prefill rides in the verify call)
    draft_seconds: float  # planning and drafting (draft-model forwards; n-gram copies are free)
    verify_seconds: float  # the batched target forward
    running: int  # sequences in the batch after the step
    waiting: int  # requests queued, not yet admitted
    batch_tokens: int  # round tokens the verify forward scored: per round its last token + drafts
    rounds: tuple[RoundReport, ...] = field(default_factory=tuple)
    prefilled: tuple[str, ...] = field(default_factory=tuple)  # seq ids whose prompt (or a chunk) this step scored
    workers: tuple[dict, ...] = field(default_factory=tuple)  # cluster workers' health (see cluster/runtime/pool.py)
    draft_forwards: int = 0  # draft-model forwards of the step
    prefill_tokens: int = 0  # prompt tokens the verify forward scored besides batch_tokens (chunked prefill)
    preempted: int = 0  # sequences put back in the queue for KV room in this step (recomputed when placed again)
    kv_cells_used: int = 0  # target KV cells the running sequences hold after the step (a shared prefix each time)
    kv_pool_cells: int = 0  # the target's KV pool (0: a runner without one, a cluster's router)

    @property
    def draft_model_seconds(self) -> float:
        """The draft stage's seconds where a draft model ran in it (a local one's forwards, or a
        round a remote one drafted), else 0: a step that only planned, or drafted copies, kept
        no draft device busy."""
        ran = self.draft_forwards or any(round_.k and round_.source == "model" for round_ in self.rounds)
        return self.draft_seconds if ran else 0.0
