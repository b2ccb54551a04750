"""OpenTelemetry spans request -> draft -> verify (interface; the observability work fills it in)."""

from tandem.engine.events import StepReport


class RequestTracer:
    def __init__(self, otlp_endpoint: str | None = None, service_name: str = "tandem"):
        self.otlp_endpoint = otlp_endpoint

    def start_request(self, seq_id: str, attributes: dict) -> None: ...

    def observe_step(self, report: StepReport) -> None:
        """Called on the engine thread: draft and verify child spans for each sequence stepped."""

    def end_request(self, seq_id: str, attributes: dict) -> None: ...

    def shutdown(self) -> None: ...
