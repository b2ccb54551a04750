"""What `tandem serve` is told at start-up, checked once so the server never starts half-configured.

Limits are named here: a request body over `max_body_bytes` is refused (413); past `max_running`
sequences in the batch plus `max_waiting` queued, new requests are refused (429). After SIGINT or
SIGTERM in-flight requests get `grace_seconds` to finish before they are cancelled.
"""

from dataclasses import dataclass

from tandem.errors import TandemError

DEFAULT_MAX_BODY_BYTES = 1024 * 1024  # 1 MiB
DEFAULT_CACHE_TTL_SECONDS = 3600.0
CACHE_SCHEMES = ("redis://", "rediss://")
CACHE_OFF = "off"  # no response cache (the n-gram store then stays in memory)


@dataclass(frozen=True, slots=True)
class ServeSettings:
    host: str = "127.0.0.1"
    port: int = 8000  # 0 = any free port (the chosen one is printed)
    api_key: str | None = None  # when set, /v1/* needs "Authorization: Bearer <key>"
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_running: int = 8  # sequences decoded together in one batch
    max_waiting: int = 64  # requests queued behind the batch
    cache_url: str | None = None  # None or "memory": in-process; "redis://HOST:PORT": shared; "off"
    cache_ttl_seconds: float = DEFAULT_CACHE_TTL_SECONDS
    otlp_endpoint: str | None = None  # OTLP/HTTP collector, e.g. http://localhost:4318
    alert_threshold: float = 0.6  # acceptance rate under which the dashboard raises an alert
    served_model_name: str | None = None  # None: the target's catalog name
    grace_seconds: float = 10.0  # how long shutdown waits for in-flight requests

    def __post_init__(self):
        if not self.host:
            raise TandemError("the host must not be empty (e.g. 127.0.0.1 or 0.0.0.0)")
        _check_int("port", self.port, 0, 65535)
        if self.api_key is not None and not self.api_key.strip():
            raise TandemError("the API key must not be empty: leave --api-key out to serve without one")
        _check_int("max body bytes", self.max_body_bytes, 1024, 1 << 30)
        _check_int("max running", self.max_running, 1, 4096)
        _check_int("max waiting", self.max_waiting, 0, 1 << 20)
        if self.cache_url not in (None, "memory", CACHE_OFF) and not self.cache_url.startswith(CACHE_SCHEMES):
            raise TandemError(f"the cache must be 'memory', 'off' or a redis://HOST:PORT URL, got {self.cache_url!r}")
        _check_number("cache TTL seconds", self.cache_ttl_seconds, low=1e-3)
        if self.otlp_endpoint is not None and not self.otlp_endpoint.startswith(("http://", "https://")):
            raise TandemError(f"the OTLP endpoint must be an http(s) URL, got {self.otlp_endpoint!r}")
        _check_number("alert threshold", self.alert_threshold, low=0.0, high=1.0)
        if self.served_model_name is not None and not self.served_model_name.strip():
            raise TandemError("the served model name must not be empty")
        _check_number("grace seconds", self.grace_seconds, low=0.0)


def _check_int(name: str, value, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise TandemError(f"{name} must be an integer from {low} to {high}, got {value!r}")


def _check_number(name: str, value, low: float, high: float = float("inf")) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        bound = f"from {low} to {high}" if high != float("inf") else f"of at least {low}"
        raise TandemError(f"{name} must be a number {bound}, got {value!r}")
