"""Per-second series of the recent past, for the dashboard. Bounded memory, no Prometheus.

Engine steps and finished requests land in one-second buckets (by wall-clock second, `time.time()`
as in `StepReport.started_at`); the newest `seconds` buckets are kept. A round with k draft tokens
and `accepted` accepted commits `accepted + 1` tokens (the accepted drafts plus the bonus or
correction token), which is what tokens/s counts. Seconds without events read as zero work, with
queue sizes carried forward and latencies as of their end (requests that finished more than
`recent_seconds` before leave them). Only complete seconds appear in `series`.

Two summaries cover the last `recent_seconds`: latency percentiles (TTFT, inter-token,
end-to-end) of the requests that finished in it, and acceptance by draft position (1-based):
positions 1..accepted count as accepted, position accepted + 1 (if <= k) as rejected; later
positions were never judged. Each bucket also records the latency percentiles as of its own end,
for the latency series. Not thread-safe: the owner holds a lock.
"""

from collections import deque
from dataclasses import dataclass, field

from tandem.engine.events import StepReport

DEFAULT_SERIES_SECONDS = 300
DEFAULT_RECENT_SECONDS = 60.0
MAX_LATENCY_SAMPLES = 4096  # per kind; the oldest go first
LATENCY_KINDS = ("ttft", "itl", "e2e")
PERCENTILES = (50, 90, 99)


@dataclass(slots=True)
class SecondBucket:
    t: int  # the wall-clock second (unix time, floored)
    drafted: int = 0
    accepted: int = 0
    rounds: int = 0
    k_sum: int = 0
    tokens: int = 0
    running: int = 0
    waiting: int = 0
    target_busy: float = 0.0  # prefill + verify seconds of steps that ended in this second
    draft_busy: float = 0.0
    rolling_rate: float | None = None  # the acceptance window's rate after this second's last step
    latency: dict | None = None  # {"ttft_p50": s, ...}, filled when the second is over
    finished: int = 0  # requests that finished in this second (their latencies leave the window together)
    by_position: list = field(default_factory=list)  # [position - 1] -> [accepted, rejected]


class RollingSeries:
    def __init__(self, seconds: int = DEFAULT_SERIES_SECONDS,
                 recent_seconds: float = DEFAULT_RECENT_SECONDS):
        if seconds < 1 or recent_seconds <= 0:
            raise ValueError(f"the dashboard windows must be positive, got {seconds} s and {recent_seconds} s")
        self.seconds = seconds
        self.recent_seconds = recent_seconds
        self._buckets: deque[SecondBucket] = deque(maxlen=seconds + 1)  # + the second under way
        self._samples = {kind: deque(maxlen=MAX_LATENCY_SAMPLES) for kind in LATENCY_KINDS}  # (when, s)

    # -- recording ------------------------------------------------------------------------------

    def add_step(self, report: StepReport, when: float, rolling_rate: float | None) -> None:
        bucket = self._bucket(when)
        bucket.running, bucket.waiting = report.running, report.waiting
        bucket.target_busy += report.prefill_seconds + report.verify_seconds
        bucket.draft_busy += report.draft_model_seconds
        bucket.rolling_rate = rolling_rate
        for round_ in report.rounds:
            bucket.rounds += 1
            bucket.k_sum += round_.k
            bucket.drafted += round_.k
            bucket.accepted += round_.accepted
            bucket.tokens += round_.accepted + 1
            _count_positions(bucket.by_position, round_.k, round_.accepted)

    def note_queue(self, when: float, running: int, waiting: int) -> None:
        """The queue's counts changed without a step (a cancel on an idle engine)."""
        bucket = self._bucket(when)
        bucket.running, bucket.waiting = running, waiting

    def add_request(self, when: float, ttft: float | None, e2e: float, inter_token: list[float]) -> None:
        self._bucket(when).finished += 1  # closes the previous second first, so these samples count from now on
        if ttft is not None:
            self._samples["ttft"].append((when, ttft))
        self._samples["e2e"].append((when, e2e))
        self._samples["itl"].extend((when, seconds) for seconds in inter_token)

    def _bucket(self, when: float) -> SecondBucket:
        self.close_until(when)
        second = int(when)
        if self._buckets and self._buckets[-1].t >= second:  # same second, or a late report
            return self._buckets[-1]
        last = self._buckets[-1] if self._buckets else SecondBucket(second)
        self._buckets.append(SecondBucket(second, running=last.running, waiting=last.waiting,
                                          rolling_rate=last.rolling_rate))
        return self._buckets[-1]

    def close_until(self, now: float) -> None:
        """Record the latency percentiles of the newest bucket if its second is over."""
        if self._buckets and self._buckets[-1].t < int(now) and self._buckets[-1].latency is None:
            last = self._buckets[-1]
            last.latency = self._latency_fields(last.t + 1)

    # -- reading --------------------------------------------------------------------------------

    def latency_summary(self, now: float) -> dict:
        """{"ttft": {"p50": s, "p90": s, "p99": s, "count": n}, "itl": ..., "e2e": ...}."""
        summary = {}
        for kind in LATENCY_KINDS:
            values = self._recent(kind, now)
            summary[kind] = {f"p{q}": _percentile(values, q) for q in PERCENTILES} | {"count": len(values)}
        return summary

    def acceptance_by_position(self, now: float) -> list[dict]:
        """Per draft position over the recent window: accepted, rejected, and their rate."""
        totals: list[list[int]] = []
        for bucket in self._buckets:
            if bucket.t > now - self.recent_seconds:
                _grow(totals, len(bucket.by_position))
                for position, (accepted, rejected) in enumerate(bucket.by_position):
                    totals[position][0] += accepted
                    totals[position][1] += rejected
        return [
            {"position": i + 1, "accepted": a, "rejected": r, "rate": round(a / (a + r), 4) if a + r else None}
            for i, (a, r) in enumerate(totals)
        ]

    def series(self, now: float) -> dict[str, list]:
        """Column-wise per-second series over the complete seconds of the window."""
        self.close_until(now)
        end = int(now) - 1
        by_second = {bucket.t: bucket for bucket in self._buckets}
        columns: dict[str, list] = {name: [] for name in _COLUMNS}
        if not by_second:
            return columns
        start = max(min(by_second), end - self.seconds + 1)
        previous = next((b for b in reversed(self._buckets) if b.t < start), SecondBucket(start))
        for second in range(start, end + 1):
            bucket = by_second.get(second)
            if bucket is None:  # an idle second: no work, the last known queue; latency as of its end
                latency = previous.latency
                if latency is not None and self._window_dropped(by_second, second):
                    latency = self._latency_fields(second + 1)
                bucket = SecondBucket(second, running=previous.running, waiting=previous.waiting,
                                      rolling_rate=previous.rolling_rate, latency=latency)
            _append_row(columns, bucket)
            previous = bucket
        return columns

    def _window_dropped(self, by_second: dict[int, SecondBucket], second: int) -> bool:
        """Whether requests that finished leave the latency window during `second`: an idle
        second's percentiles are the second before's unless some did (carried on regardless, a
        minute-old TTFT stayed on the chart for as long as the server idled)."""
        end = second + 1
        oldest, newest = int(end - 1 - self.recent_seconds), int(end - self.recent_seconds)
        return any(by_second[t].finished for t in range(oldest, newest + 1) if t in by_second)

    def _recent(self, kind: str, now: float) -> list[float]:
        since = now - self.recent_seconds
        return sorted(seconds for when, seconds in self._samples[kind] if since < when <= now)

    def _latency_fields(self, now: float) -> dict:
        fields = {}
        for kind in LATENCY_KINDS:
            values = self._recent(kind, now)
            for q in PERCENTILES:
                fields[f"{kind}_p{q}"] = _percentile(values, q)
        return fields


_LATENCY_COLUMNS = tuple(f"{kind}_p{q}" for kind in LATENCY_KINDS for q in PERCENTILES)
_COLUMNS = ("t", "acceptance_rate", "rolling_acceptance_rate", "tokens_per_s", "mean_k", "running",
            "waiting", "utilization_target", "utilization_draft") + _LATENCY_COLUMNS


def _append_row(columns: dict[str, list], bucket: SecondBucket) -> None:
    columns["t"].append(bucket.t)
    columns["acceptance_rate"].append(round(bucket.accepted / bucket.drafted, 4) if bucket.drafted else None)
    columns["rolling_acceptance_rate"].append(
        None if bucket.rolling_rate is None else round(bucket.rolling_rate, 4))
    columns["tokens_per_s"].append(bucket.tokens)
    columns["mean_k"].append(round(bucket.k_sum / bucket.rounds, 3) if bucket.rounds else None)
    columns["running"].append(bucket.running)
    columns["waiting"].append(bucket.waiting)
    columns["utilization_target"].append(round(min(1.0, bucket.target_busy), 4))
    columns["utilization_draft"].append(round(min(1.0, bucket.draft_busy), 4))
    for name in _LATENCY_COLUMNS:
        columns[name].append((bucket.latency or {}).get(name))


def _count_positions(by_position: list, k: int, accepted: int) -> None:
    judged = min(k, accepted + 1)  # positions 1..accepted accepted, accepted + 1 rejected
    _grow(by_position, judged)
    for position in range(judged):
        by_position[position][0 if position < accepted else 1] += 1


def _grow(counts: list, size: int) -> None:
    counts.extend([0, 0] for _ in range(size - len(counts)))


def _percentile(sorted_values: list[float], q: float) -> float | None:
    """Linear interpolation between closest ranks; None for no values."""
    if not sorted_values:
        return None
    rank = (len(sorted_values) - 1) * q / 100
    low = int(rank)
    high = min(low + 1, len(sorted_values) - 1)
    value = sorted_values[low] + (sorted_values[high] - sorted_values[low]) * (rank - low)
    return round(value, 6)
