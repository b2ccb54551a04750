"""OpenTelemetry spans request -> draft -> verify.

One "request" span per sequence, from `start_request` to `end_request`. After every engine step
(`observe_step`, on the engine thread) each sequence that took part and has an open request span
gets child spans with explicit times derived from the `StepReport`: "prefill" if the step scored
its prompt (or a chunk of it): [started_at, +prefill_seconds] where the prompt went through a call
of its own, else the verify call's interval, where it rode beside the rounds (llama.cpp's batch
runner: `prefill_seconds` is 0 then); then "draft" [+draft_seconds] if it drafted (k > 0), then
"verify" [+verify_seconds]. Draft and verify are batched, so every sequence of a step shares the
same intervals. Attributes: k, accepted, source, batch_tokens; a prefill span's the step's
prompt tokens (`prefill_tokens`, every prompt of the step) and whether it rode in the verify call. `end_request`
marks the request span failed when its attributes give the finish reason "error" or "unavailable".

With `otlp_endpoint` (e.g. http://localhost:4318; "/v1/traces" is added when the URL has no path)
spans go through a `BatchSpanProcessor` to an OTLP/HTTP exporter, on this tracer's own
`TracerProvider` (never the global one). A `span_exporter` (tests: `InMemorySpanExporter`) is fed
synchronously through a `SimpleSpanProcessor`. With neither, the tracer is a no-op: it imports and
builds no OpenTelemetry objects, and every method returns at once.
"""

import threading
from urllib.parse import urlparse

from tandem.engine.events import StepReport

OTLP_TRACES_PATH = "/v1/traces"
MAX_OPEN_SPANS = 10_000  # request spans never ended (a caller's bug) are closed past this many
NANOS_PER_SECOND = 1_000_000_000
FINISH_REASON_KEYS = ("finish_reason", "gen_ai.response.finish_reason")  # FAILED ones mark the span failed
# the engine failed on the request; nothing was left to run it; the server's time limit ended it (a
# 504, a server error, as OpenTelemetry's HTTP conventions mark 5xx); "cancelled" is the client's doing
FAILED = {"error": "the engine failed", "unavailable": "no engine was left to run it",
          "timeout": "the request ran past --request-timeout"}


class RequestTracer:
    def __init__(self, otlp_endpoint: str | None = None, service_name: str = "tandem", span_exporter=None):
        self.otlp_endpoint = otlp_endpoint
        self.enabled = otlp_endpoint is not None or span_exporter is not None
        self._lock = threading.Lock()
        self._spans: dict = {}  # seq_id -> open "request" span
        self._provider = _build_provider(service_name, otlp_endpoint, span_exporter) if self.enabled else None
        self._tracer = self._provider.get_tracer("tandem.serve") if self.enabled else None

    def start_request(self, seq_id: str, attributes: dict) -> None:
        if self._tracer is None:
            return
        span = self._tracer.start_span("request", attributes={"seq_id": seq_id} | _clean(attributes))
        with self._lock:
            self._spans[seq_id] = span
            stale = self._spans.pop(next(iter(self._spans))) if len(self._spans) > MAX_OPEN_SPANS else None
        if stale is not None:
            stale.end()

    def observe_step(self, report: StepReport) -> None:
        """Called on the engine thread: draft and verify child spans for each sequence stepped."""
        if self._tracer is None or not (report.rounds or report.prefilled):
            return
        with self._lock:
            parents = {seq_id: self._spans.get(seq_id)
                       for seq_id in (*report.prefilled, *(round_.seq_id for round_ in report.rounds))}
        prefill_end = report.started_at + report.prefill_seconds
        draft_end = prefill_end + report.draft_seconds
        verify_end = draft_end + report.verify_seconds
        in_verify_call = report.prefill_seconds == 0  # the prompt rode in the verify call
        prefill_span = (draft_end, verify_end) if in_verify_call else (report.started_at, prefill_end)
        for seq_id in report.prefilled:
            if parents[seq_id] is not None:
                self._child(parents[seq_id], "prefill", *prefill_span,
                            {"prefill_tokens": report.prefill_tokens, "in_verify_call": in_verify_call,
                             "batch_tokens": report.batch_tokens})
        for round_ in report.rounds:
            parent = parents[round_.seq_id]
            if parent is None:
                continue
            attributes = {"k": round_.k, "accepted": round_.accepted, "source": round_.source,
                          "batch_tokens": report.batch_tokens}
            if round_.k > 0:
                self._child(parent, "draft", prefill_end, draft_end, attributes)
            self._child(parent, "verify", draft_end, verify_end, attributes)

    def _child(self, parent, name: str, start: float, end: float, attributes: dict) -> None:
        from opentelemetry import trace

        span = self._tracer.start_span(name, context=trace.set_span_in_context(parent),
                                       start_time=_nanos(start), attributes=attributes)
        span.end(end_time=_nanos(end))

    def end_request(self, seq_id: str, attributes: dict) -> None:
        if self._tracer is None:
            return
        with self._lock:
            span = self._spans.pop(seq_id, None)
        if span is None:
            return
        span.set_attributes(_clean(attributes))
        reason = next((attributes[key] for key in FINISH_REASON_KEYS if attributes.get(key) in FAILED), None)
        if reason is not None:
            from opentelemetry.trace import Status, StatusCode

            span.set_status(Status(StatusCode.ERROR, str(attributes.get("error", FAILED[reason]))))
        span.end()

    @property
    def open_requests(self) -> int:
        with self._lock:
            return len(self._spans)

    def force_flush(self) -> None:
        if self._provider is not None:
            self._provider.force_flush()

    def shutdown(self) -> None:
        """End the request spans still open, export what is pending, stop the provider."""
        if self._provider is None:
            return
        with self._lock:
            spans, self._spans = list(self._spans.values()), {}
        for span in spans:
            span.end()
        self._provider.shutdown()


def _build_provider(service_name: str, otlp_endpoint: str | None, span_exporter):
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
    if otlp_endpoint is not None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=traces_url(otlp_endpoint))))
    if span_exporter is not None:
        provider.add_span_processor(SimpleSpanProcessor(span_exporter))
    return provider


def traces_url(otlp_endpoint: str) -> str:
    """The OTLP/HTTP traces URL: the endpoint as given, or with /v1/traces if it has no path."""
    if urlparse(otlp_endpoint).path in ("", "/"):
        return otlp_endpoint.rstrip("/") + OTLP_TRACES_PATH
    return otlp_endpoint


def _clean(attributes: dict) -> dict:
    """OpenTelemetry takes str, bool, int, float (and sequences of them); None is dropped."""
    return {key: value if isinstance(value, (str, bool, int, float)) else str(value)
            for key, value in attributes.items() if value is not None}


def _nanos(seconds: float) -> int:
    return int(seconds * NANOS_PER_SECOND)
