"""Prometheus metrics for serving, and the rolling series behind the dashboard.

Names follow vLLM's where one exists, with the prefix `tandem:` for `vllm:`; every metric carries
the label `model_name`. Terms: a round drafts k tokens of which `accepted` are accepted; by draft
position (1-based) positions 1..accepted count as accepted and position accepted + 1 (if <= k) as
rejected. `observe_step` runs on the engine thread, the rest on the event loop; everything here is
thread-safe (prometheus_client's instruments are, and one lock guards the rolling state). Metrics
live on their own `CollectorRegistry` unless one is given, never on the global one.
"""

import threading
import time
from collections import Counter as Tally
from collections.abc import Callable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from tandem.engine.events import StepReport
from tandem.serve.observability.acceptance_window import DEFAULT_MIN_TOKENS, DEFAULT_WINDOW_TOKENS, AcceptanceWindow
from tandem.serve.observability.device_usage import DEFAULT_UTILIZATION_WINDOW_SECONDS, BusyWindow, device_memory_bytes
from tandem.serve.observability.metric_instruments import Instruments
from tandem.serve.observability.rolling_series import DEFAULT_RECENT_SECONDS, DEFAULT_SERIES_SECONDS, RollingSeries

TOTALS = ("requests", "rejected", "prompt_tokens", "generation_tokens", "drafted", "accepted",
          "cache_hits", "cache_misses", "prefix_cache_queries", "prefix_cache_hits")  # totals since start


class ServingMetrics:
    def __init__(self, model_name: str, alert_threshold: float = 0.3, registry=None, *,
                 alert_window_tokens: int = DEFAULT_WINDOW_TOKENS,
                 alert_min_tokens: int = DEFAULT_MIN_TOKENS,
                 series_seconds: int = DEFAULT_SERIES_SECONDS,
                 recent_seconds: float = DEFAULT_RECENT_SECONDS,
                 utilization_window_seconds: float = DEFAULT_UTILIZATION_WINDOW_SECONDS,
                 clock: Callable[[], float] = time.time):
        """alert_threshold: `tandem:acceptance_alert` is 1 while the acceptance rate over the last
        `alert_window_tokens` draft tokens is below it (given at least `alert_min_tokens` of them).
        series_seconds: how much history the dashboard's per-second series keep.
        recent_seconds: the window of the dashboard's latency percentiles and acceptance by position.
        clock: wall time in seconds, as `StepReport.started_at` (tests pass a fake one)."""
        self.model_name = model_name
        self.alert_threshold = alert_threshold
        self.registry = registry if registry is not None else CollectorRegistry()
        self._clock = clock
        self._lock = threading.Lock()
        self._window = AcceptanceWindow(alert_threshold, alert_window_tokens, alert_min_tokens)
        self._series = RollingSeries(series_seconds, recent_seconds)
        self._busy = BusyWindow(utilization_window_seconds)
        self._totals: Tally[str] = Tally(dict.fromkeys(TOTALS, 0))
        self._m = Instruments(self.registry, model_name)
        self._m.acceptance_alert_threshold.set(alert_threshold)
        self._queue_watched = False  # running/waiting read from callables (watch_queue), not reports
        self._workers: list[dict] = []  # the latest cluster worker states (empty: one process)
        self._totals_counted: dict[tuple, int] = {}  # running totals the counters were brought up to
        self._host_cache_bytes: Callable[[], int] = lambda: 0
        self._disk_cache_bytes: Callable[[], int] = lambda: 0

    # -- the HTTP layer -------------------------------------------------------------------------

    def prompt_processed(self, prompt_tokens: int, cached_tokens: int = 0) -> None:
        """A request's prompt is in (its first token came, or its answer ended at once): its
        tokens, and the cached_tokens of them the prompt cache held (vLLM's prefix-cache queries
        and hits count tokens). A request gone before that counts none."""
        self._m.prompt_tokens.inc(prompt_tokens)
        self._m.prefix_cache_queries.inc(prompt_tokens)
        self._m.prefix_cache_hits.inc(cached_tokens)
        with self._lock:
            self._totals.update(prompt_tokens=prompt_tokens, prefix_cache_queries=prompt_tokens,
                                prefix_cache_hits=cached_tokens)

    def tokens_generated(self, count: int) -> None:
        """Completion tokens as they reach their request's stream (a long answer's count moves
        while it runs, as vLLM's does each step)."""
        self._m.generation_tokens.inc(count)
        with self._lock:
            self._totals["generation_tokens"] += count

    def request_finished(self, status: str, ttft_seconds: float | None, e2e_seconds: float,
                         inter_token_seconds: list[float]) -> None:
        """status: the finish reason (engine/events.py FINISH_REASONS), or "timeout" for a request the
        server cancelled at --request-timeout. Its tokens were counted as they came
        (`prompt_processed`, `tokens_generated`)."""
        m = self._m
        m.request_success.labels(self.model_name, status).inc()
        if ttft_seconds is not None:
            m.time_to_first_token.observe(ttft_seconds)
        m.e2e_request_latency.observe(e2e_seconds)
        for seconds in inter_token_seconds:
            m.inter_token_latency.observe(seconds)
        with self._lock:
            self._totals["requests"] += 1
            self._series.add_request(self._clock(), ttft_seconds, e2e_seconds, inter_token_seconds)

    def request_replayed(self, status: str, e2e_seconds: float) -> None:
        """A request answered from the response cache: a request served (by its finish reason,
        with its latency), but no tokens the engine processed."""
        self._m.request_success.labels(self.model_name, status).inc()
        self._m.e2e_request_latency.observe(e2e_seconds)
        with self._lock:
            self._totals["requests"] += 1
            self._series.add_request(self._clock(), None, e2e_seconds, [])

    def watch_prompt_cache(self, host_cache_bytes: Callable[[], int], disk_cache_bytes: Callable[[], int]) -> None:
        """Read the prompt cache's host- and disk-tier bytes from these callables (on scrapes and
        snapshots)."""
        self._host_cache_bytes = host_cache_bytes
        self._disk_cache_bytes = disk_cache_bytes
        self._m.prefix_cache_host_bytes.set_function(host_cache_bytes)
        self._m.prefix_cache_disk_bytes.set_function(disk_cache_bytes)

    def watch_queue(self, num_running: Callable[[], int], num_waiting: Callable[[], int]) -> None:
        """Read `num_requests_running` and `num_requests_waiting` from these callables on scrapes,
        as /health reads them: requests admitted or submitted during a long step count at once
        (the steps' reports hold the engine's counts at their ends, one step late)."""
        self._queue_watched = True
        self._m.num_requests_running.set_function(num_running)
        self._m.num_requests_waiting.set_function(num_waiting)

    def watch_drafting_memory(self, answers_bytes: Callable[[], int]) -> None:
        """Read the drafters' memory of earlier answers (bytes charged) from this callable on scrapes."""
        self._m.drafting_memory_bytes.set_function(answers_bytes)

    def request_abandoned(self) -> None:
        """A client that left before its request's body arrived: a cancelled request (as one that
        leaves mid-answer), not a refusal that a 4xx alert should see."""
        self._m.request_success.labels(self.model_name, "cancelled").inc()
        with self._lock:
            self._totals["requests"] += 1

    def request_rejected(self, http_status: int) -> None:
        """A request refused before it reached the engine (4xx, 429, 503)."""
        self._m.request_rejected.labels(self.model_name, str(http_status)).inc()
        with self._lock:
            self._totals["rejected"] += 1

    def cache_lookup(self, hit: bool) -> None:
        """A response-cache lookup for a deterministic request."""
        (self._m.cache_hits if hit else self._m.cache_misses).inc()
        with self._lock:
            self._totals["cache_hits" if hit else "cache_misses"] += 1

    # -- the engine thread ----------------------------------------------------------------------

    def observe_step(self, report: StepReport) -> None:
        """Called on the engine thread after every engine step."""
        self._observe_timings(report)
        self._observe_rounds(report)
        if report.workers:
            self.observe_workers(list(report.workers))
        ended_at = report.started_at + report.step_seconds
        with self._lock:
            for round_ in report.rounds:
                self._window.add_round(round_.k, round_.accepted)
            self._totals["drafted"] += sum(round_.k for round_ in report.rounds)
            self._totals["accepted"] += sum(round_.accepted for round_ in report.rounds)
            self._busy.add_step(report.started_at, ended_at, report.prefill_seconds + report.verify_seconds,
                                report.draft_model_seconds)
            self._series.add_step(report, ended_at, self._window.rate)
            self._refresh_rolling_gauges(ended_at)

    def observe_queue(self, running: int, waiting: int) -> None:
        """Called on the engine thread where a cancel or a new request changed the counts between
        steps (an idle engine takes no step to report them)."""
        self._set_queue(running, waiting)
        if running == 0:  # the last sequence cancelled between steps: no step will say the pool emptied
            self._m.kv_cache_usage.set(0)
        with self._lock:
            self._series.note_queue(self._clock(), running, waiting)

    def _set_queue(self, running: int, waiting: int) -> None:
        if not self._queue_watched:  # watched: read on scrapes
            self._m.num_requests_running.set(running)
            self._m.num_requests_waiting.set(waiting)

    def _observe_timings(self, report: StepReport) -> None:
        m = self._m
        self._set_queue(report.running, report.waiting)
        m.engine_step_seconds.observe(report.step_seconds)
        if report.preempted:
            m.num_preemptions.inc(report.preempted)
        if report.kv_pool_cells:  # a shared prefix counts in each sequence holding it: at most 1
            m.kv_cache_usage.set(min(1.0, report.kv_cells_used / report.kv_pool_cells))
        if report.prefilled or report.prefill_tokens:
            m.prompt_steps.inc()
        if report.prefill_seconds > 0:  # a call of its own (prompt chunks riding in the verify call are in verify's)
            m.prefill_step_seconds.observe(report.prefill_seconds)
        if report.draft_seconds > 0:
            m.draft_step_seconds.observe(report.draft_seconds)
        if report.rounds or report.prefill_tokens:  # the target's forward ran: rounds, prompt chunks or both
            m.verify_step_seconds.observe(report.verify_seconds)

    def observe_workers(self, workers: list[dict]) -> None:
        """Cluster workers' states: after every step, and from the health monitor's checks
        (cluster/runtime/health.py), so a worker that dies while idle shows as down."""
        m = self._m
        for worker in workers:
            m.worker_up.labels(self.model_name, worker["name"], worker["role"]).set(1 if worker["alive"] else 0)
            m.worker_sequences.labels(self.model_name, worker["name"]).set(worker["sequences"])
        with self._lock:  # counters, from the router's running totals (two threads report them)
            for worker in workers:
                self._count_up(m.worker_restarts.labels(self.model_name, worker["name"]),
                               ("restarts", worker["name"]), worker["restarts"])
                for reason, count in worker.get("routed", {}).items():
                    self._count_up(m.cluster_routed.labels(self.model_name, worker["name"], reason),
                                   ("routed", worker["name"], reason), count)
            self._workers = [dict(worker) for worker in workers]

    def _count_up(self, counter, key: tuple, total: int) -> None:
        """A counter brought up to a running total reported elsewhere (under self._lock)."""
        counted = self._totals_counted.get(key, 0)
        if total > counted:  # a stale report (a step's copy, older than the health monitor's) counts nothing
            counter.inc(total - counted)
            self._totals_counted[key] = total

    def _observe_rounds(self, report: StepReport) -> None:
        """Tallied per step first: one increment per label value, not per round."""
        m = self._m
        sources, accepted_at, rejected_at = Tally(), Tally(), Tally()
        drafted_by, accepted_by = Tally(), Tally()
        for round_ in report.rounds:
            m.chosen_k.observe(round_.k)
            sources[round_.source] += 1
            if round_.k > 0:
                drafted_by[round_.source] += round_.k
                accepted_by[round_.source] += round_.accepted
                accepted_at.update(range(1, round_.accepted + 1))
                if round_.accepted < round_.k:
                    rejected_at[round_.accepted + 1] += 1
        drafting = [round_ for round_ in report.rounds if round_.k > 0]
        if drafting:
            m.num_drafts.inc(len(drafting))
            m.num_draft_tokens.inc(sum(round_.k for round_ in drafting))
            m.num_accepted_tokens.inc(sum(round_.accepted for round_ in drafting))
        for source, rounds in sources.items():
            m.rounds_by_source.labels(self.model_name, source).inc(rounds)
        for source, drafted in drafted_by.items():
            m.draft_tokens_by_source.labels(self.model_name, source).inc(drafted)
            m.accepted_tokens_by_source.labels(self.model_name, source).inc(accepted_by[source])
        for position, count in accepted_at.items():
            m.accepted_per_pos.labels(self.model_name, str(position)).inc(count)
        for position, count in rejected_at.items():
            m.rejected_per_pos.labels(self.model_name, str(position)).inc(count)

    def _refresh_rolling_gauges(self, now: float) -> dict[str, float]:  # holds the lock
        rate = self._window.rate
        self._m.acceptance_rate_rolling.set(rate if rate is not None else float("nan"))
        self._m.acceptance_alert.set(1 if self._window.firing else 0)
        utilization = self._busy.utilization(now)
        for role, fraction in utilization.items():
            self._m.device_utilization.labels(self.model_name, role).set(fraction)
        return utilization

    # -- readers --------------------------------------------------------------------------------

    def render(self) -> tuple[bytes, str]:
        """The Prometheus text exposition and its content type."""
        with self._lock:
            self._refresh_rolling_gauges(self._clock())
        self._refresh_memory()
        return generate_latest(self.registry), CONTENT_TYPE_LATEST

    def _refresh_memory(self) -> dict[str, int]:
        memory = device_memory_bytes()
        for device, used in memory.items():
            self._m.device_memory.labels(self.model_name, device).set(used)
        return memory

    def _prompt_cache_state(self) -> dict:
        """The prompt cache's hit rate over the prompt tokens of finished requests, and its host
        and disk tiers' bytes (call with the lock held)."""
        queries = self._totals["prefix_cache_queries"]
        rate = self._totals["prefix_cache_hits"] / queries if queries else None
        return {"hit_rate": rate, "host_bytes": int(self._host_cache_bytes()),
                "disk_bytes": int(self._disk_cache_bytes())}

    @property
    def alert_firing(self) -> bool:
        with self._lock:
            return self._window.firing

    def snapshot(self) -> dict:
        """Rolling series for the dashboard (JSON-ready): see rolling_series.py for their meaning."""
        now = self._clock()
        memory = self._refresh_memory()
        with self._lock:
            utilization = self._refresh_rolling_gauges(now)
            return {
                "model_name": self.model_name,
                "now": now,
                "series_seconds": self._series.seconds,
                "recent_seconds": self._series.recent_seconds,
                "alert": self._window.state(),
                "series": self._series.series(now),
                "latency": self._series.latency_summary(now),
                "acceptance_by_position": self._series.acceptance_by_position(now),
                "utilization": {role: round(value, 4) for role, value in utilization.items()},
                "memory_bytes": memory,
                "totals": dict(self._totals),
                "prompt_cache": self._prompt_cache_state(),
                "workers": list(self._workers),
            }
