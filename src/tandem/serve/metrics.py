"""Prometheus metrics for serving (interface; the observability work fills it in)."""

from tandem.engine.events import StepReport


class ServingMetrics:
    def __init__(self, model_name: str, alert_threshold: float = 0.6, registry=None):
        self.model_name = model_name
        self.alert_threshold = alert_threshold

    def request_finished(self, status: str, prompt_tokens: int, completion_tokens: int,
                         ttft_seconds: float | None, e2e_seconds: float,
                         inter_token_seconds: list[float]) -> None:
        """status: the finish reason ("stop", "length", "cancelled", "error")."""

    def request_rejected(self, http_status: int) -> None:
        """A request refused before it reached the engine (4xx, 429, 503)."""

    def cache_lookup(self, hit: bool) -> None:
        """A response-cache lookup for a deterministic request."""

    def observe_step(self, report: StepReport) -> None:
        """Called on the engine thread after every engine step."""

    def render(self) -> tuple[bytes, str]:
        """The Prometheus text exposition and its content type."""
        return b"", "text/plain; version=0.0.4; charset=utf-8"

    def snapshot(self) -> dict:
        """Rolling series for the dashboard (JSON-ready)."""
        return {}
