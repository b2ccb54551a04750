"""What a run measured, and the result it reports.

Definitions, as `tandem bench-serve` measures a real server (bench/serve/client.py):
- latency: a request's finish minus its arrival; TTFT: its first emitted token minus arrival.
- inter-token latency (ITL): the gap between consecutive emissions of a request; a round that
  emits several tokens is one emission (the server streams a round's tokens together).
- throughput: output tokens / (last finish - first arrival), in tokens per second, as
  `tandem bench-serve` counts it (the tail, where clients run out of requests, included).
- steady throughput: tokens emitted from the first arrival to the last request's arrival, per
  second of that span: the rate under full load, without the tail (None when every request
  arrived at once).
- utilisation: the share of the run a device spent computing (queued, discarded drafts included
  while the run lasted).
- mean k: draft tokens per round; acceptance: accepted / drafted tokens.
- moves: streams the router moved from one replica to another (moves.py); placements: requests
  placed by the router's rules, by reason (cost, prefix: routing.py).
- TTFT p50 by turn: with conversations, the median TTFT of each turn number.
- scored tokens: what the replicas' verify calls scored (rounds' last tokens and drafts, prompt
  tokens); reused tokens: prompt tokens found in a replica's prompt cache instead (step.py).
"""

from collections import Counter
from dataclasses import asdict, dataclass, field

import numpy as np

from tandem.cluster.sim.state import SimSequence


@dataclass(slots=True)
class Recorder:
    first_arrival_ms: float | None = None
    last_arrival_ms: float = 0.0
    tokens_at_last_arrival: int = 0
    last_finish_ms: float = 0.0
    output_tokens: int = 0
    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    finished: int = 0
    moves: int = 0
    scored_tokens: int = 0
    reused_tokens: int = 0
    latency_ms: list[float] = field(default_factory=list)
    ttft_ms: list[float] = field(default_factory=list)
    itl_ms: list[float] = field(default_factory=list)
    ttft_by_turn: dict[int, list[float]] = field(default_factory=dict)  # conversations' turns only
    placements: Counter[str] = field(default_factory=Counter)  # reason -> requests

    def arrival(self, now: float) -> None:
        if self.first_arrival_ms is None:
            self.first_arrival_ms = now
        self.last_arrival_ms, self.tokens_at_last_arrival = now, self.output_tokens

    def round(self, seq: SimSequence, now: float, k: int, accepted: int, emitted: int) -> None:
        self.rounds += 1
        self.drafted += k
        self.accepted += accepted
        self.output_tokens += emitted
        if seq.first_token_ms is None:
            seq.first_token_ms = now
            self.ttft_ms.append(now - seq.arrival_ms)
            if seq.conversation is not None:
                self.ttft_by_turn.setdefault(seq.turn, []).append(now - seq.arrival_ms)
        else:
            self.itl_ms.append(now - seq.last_token_ms)
        seq.last_token_ms = now

    def finish(self, seq: SimSequence, now: float) -> None:
        self.finished += 1
        self.latency_ms.append(now - seq.arrival_ms)
        self.last_finish_ms = max(self.last_finish_ms, now)

    def _steady_tok_s(self) -> float | None:
        span_ms = self.last_arrival_ms - (self.first_arrival_ms or 0.0)
        if span_ms <= 0 or self.tokens_at_last_arrival == 0:
            return None
        return round(1000.0 * self.tokens_at_last_arrival / span_ms, 2)

    @property
    def duration_ms(self) -> float:
        return self.last_finish_ms - (self.first_arrival_ms or 0.0)

    def result(self, utilisation: dict[str, float], events: int) -> "SimResult":
        seconds = max(self.duration_ms, 1e-9) / 1000
        return SimResult(
            requests=self.finished,
            output_tokens=self.output_tokens,
            duration_s=round(seconds, 4),
            throughput_tok_s=round(self.output_tokens / seconds, 2),
            steady_tok_s=self._steady_tok_s(),
            requests_per_s=round(self.finished / seconds, 3),
            latency_ms=percentiles(self.latency_ms, (50, 90, 99)),
            ttft_ms=percentiles(self.ttft_ms, (50, 99)),
            itl_ms=percentiles(self.itl_ms, (50, 99)),
            utilisation={name: round(u, 4) for name, u in utilisation.items()},
            mean_k=round(self.drafted / self.rounds, 3) if self.rounds else 0.0,
            acceptance=round(self.accepted / self.drafted, 4) if self.drafted else 0.0,
            events=events,
            moves=self.moves,
            scored_tokens=self.scored_tokens,
            reused_tokens=self.reused_tokens,
            placements=dict(sorted(self.placements.items())),
            ttft_ms_p50_by_turn={str(turn): round(float(np.median(values)), 3)
                                 for turn, values in sorted(self.ttft_by_turn.items())},
        )


def percentiles(values: list[float], points: tuple[int, ...]) -> dict[str, float]:
    if not values:
        return {f"p{p}": 0.0 for p in points}
    return {f"p{p}": round(float(np.percentile(values, p)), 3) for p in points}


@dataclass(frozen=True, slots=True)
class SimResult:
    requests: int
    output_tokens: int
    duration_s: float
    throughput_tok_s: float
    steady_tok_s: float | None
    requests_per_s: float
    latency_ms: dict[str, float]  # p50, p90, p99
    ttft_ms: dict[str, float]  # p50, p99
    itl_ms: dict[str, float]  # p50, p99
    utilisation: dict[str, float]  # device name -> busy share of the run, in [0, 1]
    mean_k: float
    acceptance: float
    events: int
    moves: int = 0  # streams the router moved to another replica
    scored_tokens: int = 0  # tokens the replicas' verify calls scored
    reused_tokens: int = 0  # prompt tokens found in a replica's prompt cache instead
    placements: dict[str, int] = field(default_factory=dict)  # requests placed, by the router's reason
    ttft_ms_p50_by_turn: dict[str, float] = field(default_factory=dict)  # conversations: turn -> TTFT p50

    def to_json(self) -> dict:
        return asdict(self)
