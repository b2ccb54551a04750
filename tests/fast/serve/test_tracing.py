"""RequestTracer: spans request -> prefill/draft/verify from synthetic engine steps, captured by
an in-memory exporter; and a no-op tracer when no endpoint is configured."""

import subprocess
import sys

from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tandem.engine.events import RoundReport, StepReport
from tandem.serve.observability.tracing import RequestTracer, traces_url

T0 = 1_700_000_000.0


def step(started_at, rounds, prefilled=()):
    return StepReport(started_at=started_at, step_seconds=0.1, prefill_seconds=0.02, draft_seconds=0.03,
                      verify_seconds=0.04, running=len(rounds), waiting=0, batch_tokens=9,
                      rounds=tuple(rounds), prefilled=tuple(prefilled))


def ns(seconds):
    return int(seconds * 1_000_000_000)


def traced():
    exporter = InMemorySpanExporter()
    return RequestTracer(span_exporter=exporter, service_name="tandem-test"), exporter


def test_request_span_has_draft_and_verify_children_per_step():
    tracer, exporter = traced()
    tracer.start_request("seq-0", {"model": "tiny", "max_tokens": 16, "user": None})
    tracer.start_request("seq-1", {"model": "tiny"})
    tracer.observe_step(step(T0, [RoundReport("seq-0", "model", 4, 2), RoundReport("seq-1", "none", 0, 0)],
                             prefilled=["seq-0"]))
    tracer.observe_step(step(T0 + 1, [RoundReport("seq-0", "ngram3", 3, 3)]))
    tracer.end_request("seq-0", {"finish_reason": "stop", "completion_tokens": 7})
    tracer.end_request("seq-1", {"gen_ai.response.finish_reason": "error", "error": "boom"})
    spans = exporter.get_finished_spans()
    requests = {s.attributes["seq_id"]: s for s in spans if s.name == "request"}
    assert set(requests) == {"seq-0", "seq-1"}
    first, second = requests["seq-0"], requests["seq-1"]
    assert first.parent is None and first.resource.attributes["service.name"] == "tandem-test"
    assert "user" not in first.attributes and first.attributes["finish_reason"] == "stop"
    assert not second.status.is_ok

    def children(parent):
        return [s for s in spans if s.parent is not None and s.parent.span_id == parent.context.span_id]

    kids = children(first)
    assert [s.name for s in kids] == ["prefill", "draft", "verify", "draft", "verify"]
    assert all(s.context.trace_id == first.context.trace_id for s in kids)
    prefill, draft, verify = kids[:3]
    assert (prefill.start_time, prefill.end_time) == (ns(T0), ns(T0 + 0.02))
    assert (draft.start_time, draft.end_time) == (ns(T0 + 0.02), ns(T0 + 0.05))
    assert (verify.start_time, verify.end_time) == (ns(T0 + 0.05), ns(T0 + 0.09))
    assert dict(verify.attributes) == {"k": 4, "accepted": 2, "source": "model", "batch_tokens": 9}
    assert kids[3].attributes["source"] == "ngram3" and kids[4].attributes["accepted"] == 3
    assert [s.name for s in children(second)] == ["verify"]  # k = 0 drafted nothing
    tracer.shutdown()


def test_a_prompt_scored_in_the_verify_call_gets_that_calls_interval():
    """On llama.cpp a prompt chunk rides in the verify call (prefill_seconds 0): the prefill span
    lasted 0 ms and said batch_tokens 1, while the verify span held the prompt's whole second."""
    tracer, exporter = traced()
    tracer.start_request("seq-0", {"model": "tiny"})
    tracer.observe_step(StepReport(started_at=T0, step_seconds=1.1, prefill_seconds=0.0, draft_seconds=0.0,
                                   verify_seconds=1.08, running=1, waiting=0, batch_tokens=1,
                                   prefilled=("seq-0",), prefill_tokens=34))
    tracer.end_request("seq-0", {"finish_reason": "stop"})
    [prefill] = [s for s in exporter.get_finished_spans() if s.name == "prefill"]
    assert (prefill.start_time, prefill.end_time) == (ns(T0), ns(T0 + 1.08))
    assert prefill.attributes["prefill_tokens"] == 34 and prefill.attributes["in_verify_call"] is True
    tracer.shutdown()


def test_steps_for_sequences_without_open_spans_are_ignored():
    tracer, exporter = traced()
    tracer.observe_step(step(T0, [RoundReport("unknown", "model", 2, 1)]))
    tracer.start_request("seq-0", {})
    tracer.end_request("seq-0", {})
    tracer.observe_step(step(T0 + 1, [RoundReport("seq-0", "model", 2, 1)]))  # after it ended
    tracer.end_request("seq-0", {})  # twice: harmless
    assert [s.name for s in exporter.get_finished_spans()] == ["request"]
    assert tracer.open_requests == 0


def test_shutdown_ends_open_request_spans():
    tracer, exporter = traced()
    tracer.start_request("seq-0", {})
    assert tracer.open_requests == 1
    tracer.shutdown()
    assert [s.name for s in exporter.get_finished_spans()] == ["request"]


def test_no_endpoint_is_a_no_op():
    tracer = RequestTracer()
    assert not tracer.enabled and tracer._provider is None and tracer._tracer is None
    tracer.start_request("seq-0", {"model": "tiny"})
    tracer.observe_step(step(T0, [RoundReport("seq-0", "model", 4, 2)], prefilled=["seq-0"]))
    tracer.end_request("seq-0", {"finish_reason": "stop"})
    assert tracer.open_requests == 0
    tracer.force_flush()
    tracer.shutdown()


def test_no_op_tracer_imports_no_opentelemetry():
    code = ("import sys; from tandem.serve.observability.tracing import RequestTracer; t = RequestTracer(); "
            "t.start_request('s', {}); t.end_request('s', {}); t.shutdown(); "
            "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_otlp_endpoint_builds_batch_exporter_on_its_own_provider():
    from opentelemetry import trace

    global_provider = trace.get_tracer_provider()
    tracer = RequestTracer(otlp_endpoint="http://127.0.0.1:9")  # nothing listens; never exported
    assert tracer.enabled and tracer._provider is not global_provider
    assert trace.get_tracer_provider() is global_provider
    processors = tracer._provider._active_span_processor._span_processors
    assert [type(p).__name__ for p in processors] == ["BatchSpanProcessor"]
    assert "opentelemetry.exporter.otlp.proto.http.trace_exporter" in sys.modules
    tracer.shutdown()  # no spans: nothing to export


def test_traces_url():
    assert traces_url("http://collector:4318") == "http://collector:4318/v1/traces"
    assert traces_url("http://collector:4318/") == "http://collector:4318/v1/traces"
    assert traces_url("http://collector:4318/custom/path") == "http://collector:4318/custom/path"


def test_request_spans_never_ended_are_bounded(monkeypatch):
    """A caller that never ends its request spans cannot grow the tracer without bound: past
    MAX_OPEN_SPANS the oldest open one is ended (and exported) to make room."""
    from tandem.serve.observability import tracing

    monkeypatch.setattr(tracing, "MAX_OPEN_SPANS", 3)
    tracer, exporter = traced()
    for i in range(5):
        tracer.start_request(f"seq-{i}", {})
    assert len(tracer._spans) == 3 and set(tracer._spans) == {"seq-2", "seq-3", "seq-4"}
    assert [s.attributes["seq_id"] for s in exporter.get_finished_spans()] == ["seq-0", "seq-1"]


def test_a_request_the_time_limit_ended_is_a_failed_span_and_a_cancelled_one_is_not():
    tracer, exporter = traced()
    for seq_id, reason in (("seq-0", "timeout"), ("seq-1", "cancelled"), ("seq-2", "unavailable")):
        tracer.start_request(seq_id, {"model": "tiny"})
        tracer.end_request(seq_id, {"gen_ai.response.finish_reason": reason})
    status = {s.attributes["seq_id"]: s.status for s in exporter.get_finished_spans()}
    assert not status["seq-0"].is_ok and "--request-timeout" in status["seq-0"].description
    assert status["seq-1"].is_unset
    assert not status["seq-2"].is_ok and status["seq-2"].description == "no engine was left to run it"
    tracer.shutdown()
