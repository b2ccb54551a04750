"""A client's request as the router follows it across placements (cluster/runtime/router.py).

Each placement on a replica has its own id (`seq@attempt`), so the updates of one that moved
or died are told apart from the next one's. A placement runs the prompt with the output so far
appended (its output offset: a seeded request's later tokens keep their positions) and the rest
of the token budget; stop strings stay with the router.
"""

import hashlib
from dataclasses import dataclass, field, replace

from tandem.cluster.runtime.endpoints import Pending
from tandem.cluster.runtime.pool import Worker
from tandem.engine.events import SequenceUpdate, SpeculationOptions, StepReport
from tandem.engine.request import GenerationRequest
from tandem.engine.stops import StopConditionError, tokens_to_keep


@dataclass(slots=True, eq=False)
class Routed:
    seq_id: str
    request: GenerationRequest
    options: SpeculationOptions
    output: list[int] = field(default_factory=list)  # relayed to the client
    replica: Worker | None = None
    placement: str | None = None  # the current placement's id on its replica
    base: int = 0  # output tokens the current placement was given in its prompt
    attempts: int = 0
    cached_tokens: int = 0  # the prompt's cache hit, by the placement that ran it before any output
    reason: str = "cost"  # why it is next placed: cost | failover | move
    moving: tuple[Worker, str, Pending] | None = None  # a detach in flight: to where, which placement

    @property
    def tokens(self) -> tuple[int, ...]:
        return (*self.request.prompt_ids, *self.output)

    @property
    def affinity_tokens(self) -> tuple[int, ...]:
        """What the router's prefix memory knows the stream by: its tokens, behind a mark of its
        cache salt where it has one (a salted stream finds only its own salt's prefixes, as the
        replicas' caches do, and tells nothing of others' prompts through the routing counts)."""
        salt = self.request.cache_salt
        return self.tokens if salt is None else (salt_mark(salt), *self.tokens)

    @property
    def num_affinity_marks(self) -> int:
        """Tokens of affinity_tokens that are no prompt's (the salt's mark)."""
        return 0 if self.request.cache_salt is None else 1

    @property
    def num_tokens(self) -> int:
        """len(tokens), without building them: the context the stream holds where it runs."""
        return len(self.request.prompt_ids) + len(self.output)

    @property
    def room(self) -> int:
        return self.request.max_tokens - len(self.output)

    @property
    def slot_hold(self) -> str:
        """What holds a slot on a move's target until the stream arrives."""
        return f"{self.seq_id}@moving"

    def next_placement(self, replica: Worker) -> str:
        self.attempts += 1
        self.placement = f"{self.seq_id}@{self.attempts}"
        self.replica, self.base, self.reason = replica, len(self.output), "cost"
        return self.placement

    def placement_request(self) -> GenerationRequest:
        return replace(self.request, prompt_ids=self.tokens, max_tokens=self.room, stop_condition=None,
                       output_offset=self.request.output_offset + len(self.output))

    def take(self, update: SequenceUpdate) -> SequenceUpdate:
        """A placement's update, for the client: cut at a stop string (finishing it there),
        its tokens added to the output."""
        tokens, finished, reason, error = list(update.token_ids), update.finished, update.finish_reason, update.error
        stop = self.request.stop_condition
        if stop is not None and tokens:
            try:
                keep = tokens_to_keep(stop, self.output + tokens)
            except StopConditionError as failure:
                keep, tokens, finished, reason, error = None, [], True, "error", str(failure)
            if keep is not None:
                tokens, finished, reason, error = tokens[: max(0, keep - len(self.output))], True, "stop", None
        if not self.output:  # a placement of the client's prompt alone (a first, or one moved before any token)
            self.cached_tokens = max(self.cached_tokens, min(update.cached_tokens, len(self.request.prompt_ids)))
        self.output += tokens
        return SequenceUpdate(self.seq_id, tuple(tokens), update.drafted, min(update.accepted, len(tokens)),
                              finished, reason, error,
                              self.cached_tokens)


def salt_mark(salt: str) -> int:
    """A token id no model has (negative), one per salt."""
    return -1 - int.from_bytes(hashlib.sha256(salt.encode()).digest()[:7], "big")


def client_id(placement: str) -> str:
    return placement.rsplit("@", 1)[0]


def client_report(report: StepReport, running: int, waiting: int, workers: tuple[dict, ...]) -> StepReport:
    """A replica's step, in the clients' sequence ids, with the cluster's counts and workers."""
    rounds = tuple(replace(r, seq_id=client_id(r.seq_id)) for r in report.rounds)
    return replace(report, rounds=rounds, prefilled=tuple(client_id(s) for s in report.prefilled),
                   running=running, waiting=waiting, workers=workers)
