"""What `tandem serve` is told at start-up, checked once so the server never starts half-configured.

Limits are named here: a request body over `max_body_bytes` is refused (413); past `max_running`
sequences in the batch plus `max_waiting` queued, new requests are refused (429), and so is a
client's stream past `max_streams_per_client` open ones; a prompt over `max_prompt_tokens` or a
max_tokens over `max_tokens_limit` is refused (400); a request still running after
`request_timeout_seconds` is cancelled (504, or an error event on a stream). After SIGINT or
SIGTERM in-flight requests get `grace_seconds` to finish before they are cancelled.

Security: the server binds loopback unless told otherwise (server.py warns when it binds beyond
loopback without `api_key`); no prompt, completion or key text reaches the log unless
`log_requests` (and the key never); no CORS headers unless `allowed_origins`; /metrics, the
dashboard's data and /openapi.json are open, as vLLM's are, unless `protect_metrics`.
"""

import os
import re
from dataclasses import dataclass
from pathlib import Path

from tandem.engine.disk_cache import disk_room
from tandem.engine.folder_lock import check_folder_free
from tandem.engine.host_cache import physical_memory_bytes
from tandem.errors import TandemError
from tandem.memory_size import human_size
from tandem.numbers import is_int, is_number

DEFAULT_MAX_BODY_BYTES = 1024 * 1024  # 1 MiB
DEFAULT_CACHE_TTL_SECONDS = 3600.0
CACHE_SCHEMES = ("redis://", "rediss://")
API_KEY_ENV = "TANDEM_API_KEY"  # the key from the environment keeps it out of the process list
DEFAULT_REQUEST_TIMEOUT_SECONDS = 600.0
LOG_LEVELS = ("debug", "info", "warning", "error")  # --log-level
DEFAULT_MAX_STREAMS_PER_CLIENT = 64  # behind a proxy every client shares its address: raise it there
ORIGIN = re.compile(r"^https?://[^/\s]+$")
MAX_GRACE_SECONDS = 86_400.0  # a day: longer ones overflowed the drain's join and hung the shutdown
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
    alert_threshold: float = 0.3  # acceptance rate under which the dashboard raises an alert (normal chat: 0.5-0.6)
    served_model_name: str | None = None  # None: the target's catalog name
    grace_seconds: float = 10.0  # how long shutdown waits for in-flight requests
    max_tokens_limit: int | None = None  # the most new tokens a request may ask for (None: the context)
    max_prompt_tokens: int | None = None  # the longest prompt accepted (None: the context)
    request_timeout_seconds: float = DEFAULT_REQUEST_TIMEOUT_SECONDS  # a whole request, queueing included
    max_streams_per_client: int = DEFAULT_MAX_STREAMS_PER_CLIENT  # open streams per client address
    allowed_origins: tuple[str, ...] = ()  # browser origins allowed by CORS; () = no CORS headers
    allowed_hosts: tuple[str, ...] = ()  # Host names a loopback-bound server answers besides loopback ones
    protect_metrics: bool = False  # /metrics, /dashboard/data and /openapi.json need the key too
    log_requests: bool = False  # log each request's prompt and completion text (never the key)
    log_level: str = "warning"  # one of LOG_LEVELS: the root logger's and uvicorn's
    cache_ram_bytes: int | None = None  # host tier of the prompt cache (None: 8 GiB or RAM/4; 0: off)
    cache_dir: str | None = None  # disk tier of the prompt cache (None: off)
    cache_disk_bytes: int | None = None  # its budget (None: 16 GiB or a quarter of the free space)

    def __post_init__(self):
        if not self.host:
            raise TandemError("--host must not be empty (e.g. 127.0.0.1 or 0.0.0.0)")
        _check_int("--port", self.port, 0, 65535)
        if self.log_level not in LOG_LEVELS:
            raise TandemError(f"--log-level {self.log_level!r}: use one of {', '.join(LOG_LEVELS)}")
        if self.api_key is not None and not self.api_key.strip():
            raise TandemError("--api-key must not be empty: leave it out to serve without a key")
        if self.api_key is not None:
            check_sendable_key(self.api_key, "--api-key")
        _check_int("--max-body-bytes", self.max_body_bytes, 1024, 1 << 30)
        _check_int("--max-running", self.max_running, 1, 4096)
        _check_int("--max-waiting", self.max_waiting, 0, 1 << 20)
        if self.cache_url not in (None, "memory", CACHE_OFF) and not self.cache_url.startswith(CACHE_SCHEMES):
            raise TandemError(f"--cache must be 'memory', 'off' or a redis://HOST:PORT URL, got {self.cache_url!r}")
        _check_number("--cache-ttl (seconds)", self.cache_ttl_seconds, low=1e-3)
        if self.otlp_endpoint is not None and not self.otlp_endpoint.startswith(("http://", "https://")):
            raise TandemError(f"--otlp-endpoint must be an http(s) URL, got {self.otlp_endpoint!r}")
        _check_number("--alert-threshold", self.alert_threshold, low=0.0, high=1.0)
        if self.served_model_name is not None and not self.served_model_name.strip():
            raise TandemError("--served-model-name must not be empty")
        _check_number("--grace-seconds", self.grace_seconds, low=0.0, high=MAX_GRACE_SECONDS)
        if self.cache_ram_bytes is not None:
            _check_int("--cache-ram (bytes)", self.cache_ram_bytes, 0, 1 << 50)
        if self.cache_disk_bytes is not None and self.cache_dir is None:
            raise TandemError("--cache-disk sizes the disk tier: give it a folder with --cache-dir")
        if self.cache_disk_bytes == 0:
            raise TandemError("--cache-disk 0 leaves the disk tier no room: leave out --cache-dir for none")
        if self.cache_disk_bytes is not None:
            _check_int("--cache-disk (bytes)", self.cache_disk_bytes, 1, 1 << 60)
        if self.cache_dir is not None:
            _check_folder("--cache-dir", self.cache_dir)
            check_folder_free(Path(self.cache_dir).expanduser(), "--cache-dir")  # before the models load
        if self.max_tokens_limit is not None:
            _check_int("--max-tokens-limit", self.max_tokens_limit, 1, 1 << 24)
        if self.max_prompt_tokens is not None:
            _check_int("--max-prompt-tokens", self.max_prompt_tokens, 1, 1 << 24)
        _check_number("--request-timeout (seconds)", self.request_timeout_seconds, low=1e-3)
        _check_int("--max-streams-per-client", self.max_streams_per_client, 1, 1 << 20)
        for origin in self.allowed_origins:
            if origin != "*" and not ORIGIN.match(origin):
                raise TandemError(f"--allowed-origins: an origin must be '*' or scheme://host[:port], got {origin!r}")
        for name in self.allowed_hosts:
            if not name or any(c in name for c in "/ :") and not name.startswith("["):
                raise TandemError(f"--allowed-hosts: a host is a name without scheme or port (or '*'), got {name!r}")
        if self.protect_metrics and self.api_key is None:
            raise TandemError("--protect-metrics puts /metrics and the dashboard behind the API key: give --api-key")


def _check_int(name: str, value, low: int, high: int) -> None:
    if not is_int(value) or not low <= value <= high:
        raise TandemError(f"{name} must be an integer from {low} to {high}, got {value!r}")


def cache_budget_warnings(settings: ServeSettings) -> list[str]:
    """The prompt cache's budgets given larger than this machine holds (the server still starts:
    the host tier would fill the memory before its bound, the disk tier the disk)."""
    warnings = []
    ram = physical_memory_bytes()
    if settings.cache_ram_bytes and ram is not None and settings.cache_ram_bytes > ram:
        warnings.append(f"--cache-ram {human_size(settings.cache_ram_bytes)} is more than this machine's memory "
                        f"({human_size(ram)}): the host tier can fill it before reaching its bound")
    if settings.cache_disk_bytes and settings.cache_dir is not None:
        room = disk_room(settings.cache_dir)
        if settings.cache_disk_bytes > room:
            warnings.append(f"--cache-disk {human_size(settings.cache_disk_bytes)} is more than the disk has for "
                            f"the cache ({human_size(room)} free or its own): the tier will evict at a full disk")
    return warnings


def _check_folder(option: str, folder: str) -> None:
    """A folder the server will write: there (or creatable) and writable, known before the models load."""
    path = Path(folder).expanduser()
    if path.exists() and not path.is_dir():
        raise TandemError(f"{option} {folder} is a file, not a folder")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise TandemError(f"{option} {folder}: cannot create the folder ({error.strerror})") from None
    if not os.access(path, os.W_OK):
        raise TandemError(f"{option} {folder}: the folder is not writable")


def check_sendable_key(key: str, source: str) -> None:
    """A key every HTTP client can send: printable ASCII (the OpenAI SDK cannot send 'é' at all,
    and curl's UTF-8 bytes did not match it)."""
    unsendable = sorted({c for c in key if not " " <= c <= "~"})
    if unsendable:
        raise TandemError(f"{source} holds {', '.join(repr(c) for c in unsendable)}: an API key must be printable "
                          "ASCII (letters, digits, punctuation), which every HTTP client can send")


def _check_number(name: str, value, low: float, high: float = float("inf")) -> None:
    if not is_number(value) or not low <= value <= high:
        bound = f"from {low} to {high}" if high != float("inf") else f"of at least {low}"
        raise TandemError(f"{name} must be a number {bound}, got {value!r}")
