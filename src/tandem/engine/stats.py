"""Counters for one generation, and the figures derived from them.

acceptance_rate = accepted / drafted draft tokens; mean_accepted_len = accepted draft tokens per
verification round that had at least one draft token. Time is split into prefill (the steps that
read the prompt, in chunks: the last one's verify call scores the first round too), draft (planning and drafting), verify
(the target's later forwards) and overhead (everything else in the step).
"""

from dataclasses import dataclass, field

from tandem.engine.events import StepReport


@dataclass
class GenerationStats:
    seq_id: str | None = None  # the request's id in the engine (engine/run_request.py)
    prompt_tokens: int = 0
    new_tokens: int = 0
    finish_reason: str | None = None  # as the API says it: "stop" (end of sequence or a stop string), "length",
    # "cancelled" (engine.cancel), "error"; None while running or where the caller stopped reading (a break).
    # One object per request: a second request's counts would add to the first's
    seconds: float = 0.0
    prefill_seconds: float = 0.0
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    target_forwards: int = 0
    draft_forwards: int = 0
    drafted: int = 0
    accepted: int = 0
    rounds_with_draft: int = 0
    accepted_by_position: list[int] = field(default_factory=list)  # [i]: rounds accepting draft i
    drafted_by_position: list[int] = field(default_factory=list)  # [i]: rounds drafting position i
    chosen_k: list[int] = field(default_factory=list)  # per round
    chosen_sources: list[str] = field(default_factory=list)  # per round: where its draft came from
    sources: dict[str, int] = field(default_factory=dict)  # rounds per draft source

    def record_step(self, report: StepReport, seq_id: str) -> None:
        """Add one engine step's share for seq_id (the whole step, when it runs alone)."""
        if seq_id in report.prefilled:
            self.prefill_seconds += report.verify_seconds
        else:
            self.verify_seconds += report.verify_seconds
        self.draft_seconds += report.draft_seconds
        self.draft_forwards += report.draft_forwards
        self.seconds += report.step_seconds
        for round_ in report.rounds:
            if round_.seq_id == seq_id:
                self.target_forwards += 1
                self.record_round(round_.source, round_.k, round_.accepted)

    def record_round(self, source: str, drafted: int, accepted: int) -> None:
        self.chosen_k.append(drafted)
        self.chosen_sources.append(source)
        if not drafted:
            return
        self.rounds_with_draft += 1
        self.drafted += drafted
        self.accepted += accepted
        self.sources[source] = self.sources.get(source, 0) + 1
        _grow(self.drafted_by_position, drafted)
        _grow(self.accepted_by_position, drafted)
        for i in range(drafted):
            self.drafted_by_position[i] += 1
        for i in range(accepted):
            self.accepted_by_position[i] += 1

    @property
    def overhead_seconds(self) -> float:
        return max(0.0, self.seconds - self.prefill_seconds - self.draft_seconds - self.verify_seconds)

    def summary(self) -> dict:
        return {
            "new_tokens": self.new_tokens,
            "finish_reason": self.finish_reason,
            "seconds": round(self.seconds, 4),
            "tokens_per_s": round(self.new_tokens / self.seconds, 3) if self.seconds else 0.0,
            "acceptance_rate": round(self.accepted / self.drafted, 4) if self.drafted else None,  # no drafts: none
            "mean_accepted_len": (
                round(self.accepted / self.rounds_with_draft, 4) if self.rounds_with_draft else None
            ),
            "target_forwards": self.target_forwards,
            "draft_forwards": self.draft_forwards,
            "drafted_tokens": self.drafted,
            "accepted_tokens": self.accepted,
            "prompt_tokens": self.prompt_tokens,
            "time_split_s": {
                "prefill": round(self.prefill_seconds, 4),
                "draft": round(self.draft_seconds, 4),
                "verify": round(self.verify_seconds, 4),
                "overhead": round(self.overhead_seconds, 4),
            },
            "acceptance_by_position": [
                round(a / d, 4) if d else 0.0
                for a, d in zip(self.accepted_by_position, self.drafted_by_position)
            ],
            "draft_sources": dict(self.sources),
            "chosen_k": list(self.chosen_k),
        }


def _grow(counts: list[int], size: int) -> None:
    counts.extend([0] * (size - len(counts)))
