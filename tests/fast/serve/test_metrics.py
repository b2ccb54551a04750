"""ServingMetrics: synthetic engine steps and finished requests in, Prometheus text and the
dashboard snapshot out. A fake clock keeps the rolling windows deterministic."""

import dataclasses
import json
import math
import threading

import pytest
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from tandem.engine.events import RoundReport, StepReport
from tandem.serve.observability.acceptance_window import AcceptanceWindow
from tandem.serve.observability.metrics import ServingMetrics

MODEL = "tiny"
T0 = 1_700_000_000.0


class FakeClock:
    def __init__(self, now: float = T0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def step(started_at, rounds=(), *, running=1, waiting=0, prefill=0.0, draft=0.01, verify=0.02, prefilled=()):
    return StepReport(started_at=started_at, step_seconds=prefill + draft + verify, prefill_seconds=prefill,
                      draft_seconds=draft, verify_seconds=verify, running=running, waiting=waiting,
                      batch_tokens=sum(r.k + 1 for r in rounds), rounds=tuple(rounds), prefilled=tuple(prefilled))


def finished(metrics: ServingMetrics, status, prompt_tokens, completion_tokens, ttft, e2e, inter_token):
    """A request's whole life as the stream reports it: its prompt, its tokens, its end."""
    metrics.prompt_processed(prompt_tokens)
    metrics.tokens_generated(completion_tokens)
    metrics.request_finished(status, ttft, e2e, inter_token)


def samples(metrics: ServingMetrics) -> dict:
    """{(sample name, frozenset of labels without model_name): value}."""
    body, content_type = metrics.render()
    assert content_type.startswith("text/plain")
    out = {}
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            assert sample.labels.get("model_name") == MODEL
            labels = frozenset((k, v) for k, v in sample.labels.items() if k != "model_name")
            out[(sample.name, labels)] = sample.value
    return out


def value(metrics, name, **labels):
    return samples(metrics).get((name, frozenset(labels.items())), 0.0)


def test_speculation_counters_and_acceptance_by_position():
    metrics = ServingMetrics(MODEL, clock=FakeClock())
    metrics.observe_step(step(T0, [RoundReport("a", "model", 4, 2), RoundReport("b", "ngram3", 3, 3)]))
    metrics.observe_step(step(T0 + 0.1, [RoundReport("a", "model", 4, 0), RoundReport("b", "none", 0, 0)]))
    s = samples(metrics)
    assert s[("tandem:spec_decode_num_drafts_total", frozenset())] == 3  # the k = 0 round drafted nothing
    assert s[("tandem:spec_decode_num_draft_tokens_total", frozenset())] == 11
    assert s[("tandem:spec_decode_num_accepted_tokens_total", frozenset())] == 5
    accepted = {p: s.get(("tandem:spec_decode_num_accepted_tokens_per_pos_total", frozenset({("position", p)})), 0)
                for p in "1234"}
    rejected = {p: s.get(("tandem:spec_decode_num_rejected_tokens_per_pos_total", frozenset({("position", p)})), 0)
                for p in "1234"}
    assert accepted == {"1": 2, "2": 2, "3": 1, "4": 0}  # 2 of 4; 3 of 3; 0 of 4
    assert rejected == {"1": 1, "2": 0, "3": 1, "4": 0}  # position a + 1, when a < k
    assert s[("tandem:spec_decode_chosen_k_count", frozenset())] == 4
    assert s[("tandem:spec_decode_chosen_k_bucket", frozenset({("le", "0.0")}))] == 1
    assert s[("tandem:spec_decode_rounds_total", frozenset({("source", "model")}))] == 2
    by_source = {(name.split(":")[1], dict(labels)["source"]): v for (name, labels), v in s.items()
                 if "by_source" in name and name.endswith("_total")}
    assert by_source == {("spec_decode_draft_tokens_by_source_total", "model"): 8,
                         ("spec_decode_accepted_tokens_by_source_total", "model"): 2,
                         ("spec_decode_draft_tokens_by_source_total", "ngram3"): 3,
                         ("spec_decode_accepted_tokens_by_source_total", "ngram3"): 3}  # "none" drafted nothing
    assert s[("tandem:num_requests_running", frozenset())] == 1
    assert s[("tandem:verify_step_seconds_count", frozenset())] == 2
    chunk_only = dataclasses.replace(step(T0 + 0.2, verify=0.25, prefilled=("c",)), prefill_tokens=64)
    metrics.observe_step(chunk_only)  # a step that only scored a prompt chunk still ran the target's forward
    s = samples(metrics)
    assert s[("tandem:verify_step_seconds_count", frozenset())] == 3
    assert s[("tandem:verify_step_seconds_sum", frozenset())] == pytest.approx(0.02 + 0.02 + 0.25)
    by_position = metrics.snapshot()["acceptance_by_position"]
    assert [(p["position"], p["accepted"], p["rejected"]) for p in by_position] == [(1, 2, 1), (2, 2, 0), (3, 1, 1)]
    assert by_position[0]["rate"] == pytest.approx(2 / 3, abs=1e-4)


def test_finished_and_rejected_requests():
    metrics = ServingMetrics(MODEL, clock=FakeClock())
    finished(metrics, "stop", 12, 30, 0.2, 1.5, [0.01, 0.03, 0.05])
    finished(metrics, "length", 8, 16, None, 0.9, [])
    metrics.request_rejected(429)
    metrics.request_rejected(429)
    metrics.request_rejected(400)
    metrics.cache_lookup(hit=True)
    metrics.cache_lookup(hit=False)
    metrics.cache_lookup(hit=False)
    s = samples(metrics)
    assert s[("tandem:request_success_total", frozenset({("finished_reason", "stop")}))] == 1
    assert s[("tandem:request_success_total", frozenset({("finished_reason", "length")}))] == 1
    assert s[("tandem:request_rejected_total", frozenset({("http_status", "429")}))] == 2
    assert s[("tandem:request_rejected_total", frozenset({("http_status", "400")}))] == 1
    assert s[("tandem:prompt_tokens_total", frozenset())] == 20
    assert s[("tandem:generation_tokens_total", frozenset())] == 46
    assert s[("tandem:time_to_first_token_seconds_count", frozenset())] == 1
    assert s[("tandem:time_to_first_token_seconds_sum", frozenset())] == pytest.approx(0.2)
    assert s[("tandem:inter_token_latency_seconds_count", frozenset())] == 3
    assert s[("tandem:inter_token_latency_seconds_bucket", frozenset({("le", "0.01")}))] == 1
    assert s[("tandem:e2e_request_latency_seconds_count", frozenset())] == 2
    assert s[("tandem:response_cache_hits_total", frozenset())] == 1
    assert s[("tandem:response_cache_misses_total", frozenset())] == 2
    totals = metrics.snapshot()["totals"]
    assert (totals["requests"], totals["rejected"], totals["cache_misses"]) == (2, 3, 2)


def test_an_answer_from_the_response_cache_is_a_request_served_but_no_engine_tokens():
    """A dashboard's "requests done" and a request-rate panel count every answer; token counters
    count the engine's work, which a replayed answer did not do (hits were not counted at all)."""
    metrics = ServingMetrics(MODEL, clock=FakeClock())
    finished(metrics, "stop", 12, 30, 0.2, 1.5, [])
    metrics.request_replayed("stop", 0.004)
    s = samples(metrics)
    assert s[("tandem:request_success_total", frozenset({("finished_reason", "stop")}))] == 2
    assert s[("tandem:e2e_request_latency_seconds_count", frozenset())] == 2
    assert s[("tandem:prompt_tokens_total", frozenset())] == 12
    assert s[("tandem:generation_tokens_total", frozenset())] == 30
    assert s[("tandem:time_to_first_token_seconds_count", frozenset())] == 1
    assert metrics.snapshot()["totals"]["requests"] == 2


def test_alert_needs_evidence_fires_below_threshold_and_clears():
    clock = FakeClock()
    metrics = ServingMetrics(MODEL, alert_threshold=0.6, alert_window_tokens=100, alert_min_tokens=40, clock=clock)
    assert value(metrics, "tandem:acceptance_alert") == 0
    assert value(metrics, "tandem:acceptance_alert_threshold") == 0.6
    assert math.isnan(value(metrics, "tandem:acceptance_rate_rolling"))  # nothing drafted yet
    for i in range(9):  # 36 draft tokens, all rejected: not enough evidence yet
        metrics.observe_step(step(T0 + i * 0.1, [RoundReport("a", "model", 4, 0)]))
    assert value(metrics, "tandem:acceptance_rate_rolling") == 0.0
    assert value(metrics, "tandem:acceptance_alert") == 0
    metrics.observe_step(step(T0 + 1, [RoundReport("a", "model", 4, 0)]))  # 40 tokens
    assert value(metrics, "tandem:acceptance_alert") == 1
    assert metrics.alert_firing and metrics.snapshot()["alert"]["firing"]
    for i in range(15):  # 60 accepted: 60 of 100 = 0.6, at the threshold, not below
        metrics.observe_step(step(T0 + 2 + i * 0.1, [RoundReport("a", "model", 4, 4)]))
    assert value(metrics, "tandem:acceptance_rate_rolling") == pytest.approx(0.6)
    assert value(metrics, "tandem:acceptance_alert") == 0
    assert not metrics.snapshot()["alert"]["firing"]


def test_rolling_window_forgets_old_draft_tokens():
    metrics = ServingMetrics(MODEL, alert_window_tokens=200, clock=FakeClock())
    for i in range(100):  # 400 rejected tokens
        metrics.observe_step(step(T0 + i * 0.01, [RoundReport("a", "model", 4, 0)]))
    assert value(metrics, "tandem:acceptance_alert") == 1
    for i in range(50):  # 200 accepted tokens push every rejected one out of the window
        metrics.observe_step(step(T0 + 1 + i * 0.01, [RoundReport("a", "model", 4, 4)]))
    assert value(metrics, "tandem:acceptance_rate_rolling") == 1.0
    assert value(metrics, "tandem:acceptance_alert") == 0
    alert = metrics.snapshot()["alert"]
    assert (alert["window_tokens"], alert["window_size"], alert["rate"]) == (200, 200, 1.0)
    assert value(metrics, "tandem:spec_decode_num_draft_tokens_total") == 600  # counters do not forget


def test_acceptance_window_counts_a_round_as_accepted_then_rejected_tokens():
    window = AcceptanceWindow(threshold=0.5, size=5, min_tokens=5)
    window.add_round(k=4, accepted=1)
    assert (window.tokens, window.rate, window.firing) == (4, 0.25, False)
    window.add_round(k=3, accepted=3)  # oldest two (one accepted, one rejected) fall out
    assert (window.tokens, window.rate, window.firing) == (5, 0.6, False)
    with pytest.raises(ValueError, match="threshold"):
        AcceptanceWindow(threshold=1.5)
    with pytest.raises(ValueError, match="minimum evidence"):
        AcceptanceWindow(threshold=0.5, size=10, min_tokens=11)


def test_device_utilization_and_memory():
    clock = FakeClock()
    metrics = ServingMetrics(MODEL, utilization_window_seconds=10, clock=clock)
    for i in range(10):  # one step a second: 0.3 s target (0.1 prefill + 0.2 verify), 0.1 s draft
        metrics.observe_step(step(T0 + i, [RoundReport("a", "model", 2, 1)], prefill=0.1, draft=0.1, verify=0.2))
    clock.now = T0 + 10
    assert value(metrics, "tandem:device_utilization", role="target") == pytest.approx(0.3, abs=1e-6)
    assert value(metrics, "tandem:device_utilization", role="draft") == pytest.approx(0.1, abs=1e-6)
    clock.now = T0 + 100  # idle since: nothing in the window
    assert value(metrics, "tandem:device_utilization", role="target") == 0
    assert value(metrics, "tandem:device_memory_bytes", device="cpu") > 1_000_000
    assert metrics.snapshot()["memory_bytes"]["cpu"] > 1_000_000


def test_snapshot_series_per_second_with_idle_seconds_filled():
    clock = FakeClock(T0 + 5.5)
    metrics = ServingMetrics(MODEL, series_seconds=30, clock=clock)
    for i in range(4):  # second 0: 4 rounds k=4, 3 accepted -> 16 tokens, rate 0.75
        metrics.observe_step(step(T0 + 0.1 * i, [RoundReport("a", "model", 4, 3)], running=2, waiting=1))
    metrics.observe_step(step(T0 + 2.2, [RoundReport("a", "model", 2, 0)], running=3, waiting=0))
    clock.now = T0 + 2.5
    finished(metrics, "stop", 5, 10, 0.1, 2.0, [0.01, 0.02, 0.03])
    clock.now = T0 + 5.5
    snapshot = metrics.snapshot()
    json.dumps(snapshot, allow_nan=False)
    series = snapshot["series"]
    assert series["t"] == [T0 + s for s in range(5)]  # complete seconds only
    assert series["tokens_per_s"] == [16, 0, 1, 0, 0]
    assert series["acceptance_rate"] == [0.75, None, 0.0, None, None]
    assert series["mean_k"] == [4.0, None, 2.0, None, None]
    assert series["running"] == [2, 2, 3, 3, 3]  # carried over idle seconds
    assert series["utilization_draft"][0] == pytest.approx(0.04)
    assert series["itl_p50"] == [None, None, 0.02, 0.02, 0.02]
    assert snapshot["latency"]["itl"] == {"p50": 0.02, "p90": 0.028, "p99": 0.0298, "count": 3}
    assert snapshot["latency"]["ttft"]["count"] == 1
    assert snapshot["alert"]["threshold"] == 0.3  # the default


def test_snapshot_memory_is_bounded():
    clock = FakeClock()
    metrics = ServingMetrics(MODEL, series_seconds=5, recent_seconds=3, clock=clock)
    for i in range(50):
        clock.now = T0 + i
        metrics.observe_step(step(clock.now, [RoundReport("a", "model", 3, 1)]))
        finished(metrics, "stop", 1, 1, float(i), float(i), [])
    snapshot = metrics.snapshot()
    assert len(snapshot["series"]["t"]) == 5
    assert snapshot["latency"]["ttft"]["count"] == 3  # the last 3 seconds only
    assert snapshot["acceptance_by_position"][0]["accepted"] == 3  # the last 3 seconds only


def test_own_registry_and_thread_safety():
    before = {name for name in REGISTRY._names_to_collectors}
    first, second = ServingMetrics(MODEL), ServingMetrics(MODEL)  # same names, separate registries
    assert {name for name in REGISTRY._names_to_collectors} == before
    assert first.registry is not second.registry

    def engine():
        for i in range(2000):
            first.observe_step(step(T0 + i * 0.001, [RoundReport("a", "model", 2, 1)]))

    thread = threading.Thread(target=engine)
    thread.start()
    while thread.is_alive():
        first.render()
        first.snapshot()
    thread.join()
    assert value(first, "tandem:spec_decode_num_draft_tokens_total") == 4000
    assert first.snapshot()["totals"]["drafted"] == 4000


def test_a_cancel_between_steps_updates_the_queue_gauges_and_the_dashboard():
    """An idle engine takes no step after a cancel: the worker tells the counts directly, else
    /metrics and the dashboard kept the last step's running 1 for as long as the server idled."""
    clock = FakeClock()
    metrics = ServingMetrics(MODEL, clock=clock)
    metrics.observe_step(step(T0, running=1, waiting=1))
    clock.now = T0 + 2.5
    metrics.observe_queue(0, 0)
    assert value(metrics, "tandem:num_requests_running") == 0 and value(metrics, "tandem:num_requests_waiting") == 0
    clock.now = T0 + 5
    series = metrics.snapshot()["series"]
    assert series["running"][:3] == [1, 1, 0] and series["running"][-1] == 0 and series["waiting"][-1] == 0


def test_the_queue_gauges_read_what_they_watch_on_each_scrape():
    """Requests submitted or admitted during a long step were in no count until it ended: the
    gauges kept the step's report (running 1 while /health said 8), where /health counted them
    (the server watches the engine's running and EngineWorker.num_waiting)."""
    metrics = ServingMetrics(MODEL)
    running, queued = [8], [4]
    metrics.watch_queue(lambda: running[0], lambda: queued[0])
    metrics.observe_step(step(T0, running=1, waiting=0))
    metrics.observe_queue(1, 0)
    assert value(metrics, "tandem:num_requests_running") == 8 and value(metrics, "tandem:num_requests_waiting") == 4
    running[0], queued[0] = 0, 0
    assert value(metrics, "tandem:num_requests_running") == 0 and value(metrics, "tandem:num_requests_waiting") == 0


def test_a_client_gone_before_its_body_is_a_cancelled_request_not_a_rejection():
    metrics = ServingMetrics(MODEL)
    metrics.request_abandoned()
    assert value(metrics, "tandem:request_success_total", finished_reason="cancelled") == 1
    assert metrics.snapshot()["totals"]["requests"] == 1  # the dashboard's count agrees
    assert not [key for key in samples(metrics) if key[0] == "tandem:request_rejected_total"]


def test_a_prompt_scored_in_the_verify_call_adds_no_zero_to_the_prefill_histogram():
    metrics = ServingMetrics(MODEL)
    metrics.observe_step(step(T0, prefill=0.0, prefilled=("seq-0",)))  # llama.cpp: the prompt rode in verify
    metrics.observe_step(step(T0 + 1, prefill=0.5, prefilled=("seq-1",)))  # a call of its own
    assert value(metrics, "tandem:prefill_step_seconds_count") == 1  # it counted a 0 s prefill too
    assert value(metrics, "tandem:prefill_step_seconds_sum") == 0.5


def test_no_created_series_are_exported():
    """prometheus_client adds a `_created` series to every counter and histogram by default (typed
    a gauge); vLLM, whose names these follow, turns them off."""
    metrics = ServingMetrics(MODEL)
    finished(metrics, "stop", 3, 2, 0.1, 0.2, [0.1])
    text = metrics.render()[0].decode()
    assert "tandem:prompt_tokens_total" in text and "_created" not in text


def test_placements_and_restarts_are_counters_brought_up_to_the_routers_totals():
    """They were gauges that only rose (a trial's Prometheus `rate()` needs counters); both the
    engine thread and the health monitor report the same running totals."""
    from prometheus_client.parser import text_string_to_metric_families

    metrics = ServingMetrics(MODEL, clock=FakeClock())

    def report(prefix, cost, restarts):
        metrics.observe_workers([{"name": "v0", "role": "verify", "alive": True, "sequences": 1,
                                  "restarts": restarts, "routed": {"prefix": prefix, "cost": cost}}])

    report(2, 5, 0)
    report(2, 5, 0)  # the health monitor's copy of the same totals
    report(3, 7, 1)
    report(2, 6, 0)  # a step's stale copy, then the fresh totals again: nothing counted twice
    report(3, 7, 1)
    assert value(metrics, "tandem:cluster_routed_requests_total", worker="v0", reason="prefix") == 3
    assert value(metrics, "tandem:cluster_routed_requests_total", worker="v0", reason="cost") == 7
    assert value(metrics, "tandem:worker_restarts_total", worker="v0") == 1
    kinds = {f.name: f.type for f in text_string_to_metric_families(metrics.render()[0].decode())}
    assert kinds["tandem:cluster_routed_requests"] == kinds["tandem:worker_restarts"] == "counter"


def test_steps_that_only_planned_or_copied_keep_the_draft_device_idle():
    clock = FakeClock()
    metrics = ServingMetrics(MODEL, utilization_window_seconds=10, clock=clock)
    for i in range(10):  # 0.1 s of planning and n-gram copies a step, no draft-model forward
        metrics.observe_step(step(T0 + i, [RoundReport("a", "ngram3", 4, 2), RoundReport("b", "model", 0, 0)],
                                  draft=0.1, verify=0.2))
    clock.now = T0 + 10
    assert value(metrics, "tandem:device_utilization", role="draft") == 0
    assert metrics.snapshot()["series"]["utilization_draft"][-2] == 0
    metrics.observe_step(dataclasses.replace(step(T0 + 10, [RoundReport("a", "model", 0, 0)], draft=1.0),
                                             draft_forwards=1))  # a catch-up forward: the draft model ran
    clock.now = T0 + 11
    assert value(metrics, "tandem:device_utilization", role="draft") == pytest.approx(0.1, abs=1e-6)


def test_an_idle_seconds_latency_is_its_own_window_so_old_requests_leave_the_chart():
    """Idle seconds carried the last busy second's percentiles for as long as the server idled:
    a minute later the chart still drew a TTFT the tiles (and /metrics' window) had dropped."""
    clock = FakeClock(T0 + 0.5)
    metrics = ServingMetrics(MODEL, series_seconds=300, clock=clock)
    metrics.observe_step(step(T0 + 0.1, [RoundReport("a", "model", 2, 1)]))
    finished(metrics, "stop", 5, 10, 0.3, 2.0, [0.02])
    clock.now = T0 + 20.5
    finished(metrics, "stop", 5, 10, 0.5, 2.0, [0.04])
    clock.now = T0 + 120.5
    snapshot = metrics.snapshot()
    ttft = dict(zip(snapshot["series"]["t"], snapshot["series"]["ttft_p50"]))
    assert ttft[T0 + 10] == 0.3 and ttft[T0 + 30] == pytest.approx(0.4)  # both requests in the last 60 s
    assert ttft[T0 + 59] == pytest.approx(0.4) and ttft[T0 + 60] == 0.5  # the first left at 60 s
    assert ttft[T0 + 80] is None and ttft[T0 + 119] is None  # both gone, as the tiles say
    assert snapshot["latency"]["ttft"]["count"] == 0


def test_preemptions_and_kv_usage_are_exported():
    """Preemption was invisible outside the engine (a trial forced two: no counter, no gauge, no
    log); vLLM exports both under these names."""
    metrics = ServingMetrics(MODEL, clock=FakeClock())
    metrics.observe_step(dataclasses.replace(step(T0), preempted=1, kv_cells_used=300, kv_pool_cells=1200))
    metrics.observe_step(dataclasses.replace(step(T0 + 1), preempted=2, kv_cells_used=600, kv_pool_cells=1200))
    metrics.observe_step(step(T0 + 2))  # a report without a pool (a cluster's router): the gauge stays
    s = samples(metrics)
    assert s[("tandem:num_preemptions_total", frozenset())] == 3
    assert s[("tandem:kv_cache_usage_perc", frozenset())] == 0.5
    metrics.observe_queue(0, 0)  # the last sequence cancelled between steps: no step says the pool emptied
    assert samples(metrics)[("tandem:kv_cache_usage_perc", frozenset())] == 0
