"""A Redis client for the serving caches that never raises to its caller.

Contract: `run(op, fallback)` returns `op(client)`, or `fallback` when Redis is unreachable or
fails mid-call; a failure counts an error and logs a warning at most once per
WARNING_INTERVAL_SECONDS. After a failure the link is *down* for a backoff that doubles from
`backoff_min_s` to `backoff_max_s`; while down, `run` returns `fallback` at once without
touching the network, so a dead Redis costs a request only its cache. The first call after the
backoff tries again (redis-py reconnects its pooled connections by itself), and a success resets
the backoff. Socket timeouts are short and redis-py's own retries are off, so no call waits on
a dead or hung server for longer than one socket timeout.

Only a malformed URL is the user's error (`TandemError`, at construction); an unreachable
server never is.
"""

import logging
import math
import threading
import time
from typing import Callable, TypeVar
from urllib.parse import urlsplit

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from tandem.errors import TandemError

log = logging.getLogger(__name__)
T = TypeVar("T")

REDIS_SCHEMES = ("redis", "rediss")
SOCKET_TIMEOUT_SECONDS = 0.2  # connect and read; a cache that slow is no cache
RECONNECT_BACKOFF_MIN_SECONDS = 0.5
RECONNECT_BACKOFF_MAX_SECONDS = 10.0
WARNING_INTERVAL_SECONDS = 30.0  # at most one "Redis is down" warning per interval
BACKEND_ERRORS = (redis.RedisError, OSError)


_WARNED_UNBOUNDED: set[str] = set()  # servers already warned about (redacted URLs)
_WARNED_LOCK = threading.Lock()


def memory_bound_problem(maxmemory: int, policy: str) -> str | None:
    """What keeps a Redis from bounding the caches' entries by bytes, or None."""
    if maxmemory == 0:
        return "has no memory limit (maxmemory 0): the cache's entries there are bounded only by their TTL"
    if policy == "noeviction":
        return "evicts nothing at its limit (maxmemory-policy noeviction): new entries are dropped once it is full"
    return None


def is_redis_url(url: str) -> bool:
    """Whether `url` asks for Redis (it may still be malformed: see check_redis_url)."""
    return url.startswith(tuple(f"{scheme}://" for scheme in REDIS_SCHEMES))


def check_redis_url(url: str) -> None:
    """Raise TandemError unless `url` reads redis[s]://[user:password@]host[:port][/db]."""
    expected = "expected redis://host:port[/db]"
    try:
        parts = urlsplit(url)
    except ValueError:
        raise TandemError(f"cannot parse the Redis URL {redact(url)!r}: {expected}") from None
    if parts.scheme not in REDIS_SCHEMES:
        raise TandemError(f"unsupported Redis URL {redact(url)!r}: {expected}")
    if not parts.hostname:
        raise TandemError(f"the Redis URL {redact(url)!r} names no host: {expected}")
    try:
        _ = parts.port  # parsed lazily: a bad port raises only here
    except ValueError:
        raise TandemError(f"the Redis URL {redact(url)!r} has a bad port: {expected}") from None
    db = parts.path.strip("/")
    if db and not db.isdigit():
        raise TandemError(f"the Redis URL {redact(url)!r} has a bad database number {db!r}: {expected}")


def redact(url: str) -> str:
    """The URL with any password replaced, fit for logs and error messages."""
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:
        return "<unparseable URL>"
    if password is None:
        return url
    netloc = parts.netloc.replace(f":{password}@", ":***@", 1)
    return parts._replace(netloc=netloc).geturl()


class RedisLink:
    def __init__(
        self,
        url: str,
        socket_timeout_s: float = SOCKET_TIMEOUT_SECONDS,
        backoff_min_s: float = RECONNECT_BACKOFF_MIN_SECONDS,
        backoff_max_s: float = RECONNECT_BACKOFF_MAX_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ):
        check_redis_url(url)
        if not 0 < backoff_min_s <= backoff_max_s:
            raise TandemError(f"Redis reconnect backoff needs 0 < min <= max, got {backoff_min_s}, {backoff_max_s}")
        self.url = redact(url)
        try:
            self.client = redis.Redis.from_url(
                url, socket_timeout=socket_timeout_s, socket_connect_timeout=socket_timeout_s,
                retry=Retry(NoBackoff(), 0), retry_on_timeout=False,
            )
        except ValueError as error:
            raise TandemError(f"cannot use the Redis URL {self.url!r}: {error}") from None
        self._clock = clock
        self._backoff_min_s = backoff_min_s
        self._backoff_max_s = backoff_max_s
        self._lock = threading.Lock()
        self._errors = 0
        self._errors_unreported = 0
        self._backoff_s = backoff_min_s
        self._down_until = -math.inf
        self._last_warning = -math.inf

    @property
    def errors(self) -> int:
        """Operations not served: failed calls and calls skipped while down."""
        with self._lock:
            return self._errors

    def run(self, op: Callable[[redis.Redis], T], fallback: T) -> T:
        """`op(client)`, or `fallback` if Redis is down or the call fails. Never raises a
        Redis or socket error."""
        if self._skip():
            return fallback
        try:
            result = op(self.client)
        except redis.exceptions.OutOfMemoryError as error:
            self._full(error)  # it answers: reads go on, this write is dropped
            return fallback
        except redis.exceptions.ResponseError as error:  # it answers: this key or command is refused
            self._refused(error)  # (WRONGTYPE: another app's key of another type under the name)
            return fallback
        except BACKEND_ERRORS as error:
            self._failed(error)
            return fallback
        self._succeeded()
        return result

    def ping(self) -> bool:
        return self.run(lambda client: bool(client.ping()), False)

    def warn_if_unbounded(self) -> None:
        """Log once per server and process where Redis itself does not bound Tandem's entries by
        bytes (a shared Redis is bounded by its own maxmemory; Tandem's entries carry TTLs, so
        allkeys-lru or volatile-lru evicts them). A server that is down or refuses CONFIG (a
        managed one) says nothing here."""
        try:
            config = self.client.config_get("maxmemory*")
        except BACKEND_ERRORS:
            return
        problem = memory_bound_problem(int(config.get("maxmemory", 0) or 0), config.get("maxmemory-policy", ""))
        with _WARNED_LOCK:
            if problem is None or self.url in _WARNED_UNBOUNDED:
                return
            _WARNED_UNBOUNDED.add(self.url)
        log.warning("Redis at %s %s: set maxmemory and maxmemory-policy allkeys-lru to bound Tandem's "
                    "entries by bytes", self.url, problem)

    def close(self) -> None:
        try:
            self.client.close()
        except BACKEND_ERRORS:
            pass

    def _skip(self) -> bool:
        with self._lock:
            if self._clock() >= self._down_until:
                return False
            self._errors += 1
            self._errors_unreported += 1
            return True

    def _failed(self, error: Exception) -> None:
        with self._lock:
            self._down_until = self._clock() + self._backoff_s
            retry_in = self._backoff_s
            self._backoff_s = min(2 * self._backoff_s, self._backoff_max_s)
            count = self._count_error()
        if count is None:
            return
        log.warning("Redis at %s unavailable (%s: %s); serving uncached, %d operation(s) degraded "
                    "since the last warning; retrying in %.1f s",
                    self.url, type(error).__name__, said(error), count, retry_in)

    def _full(self, error: Exception) -> None:
        """Redis refused a write at its `maxmemory` under the `noeviction` policy (its default
        policy; its default maxmemory is no limit): the write is lost, Redis is not down."""
        with self._lock:
            count = self._count_error()
        if count is None:
            return
        log.warning("Redis at %s is full (%s); %d write(s) dropped since the last warning. Set its "
                    "maxmemory-policy to allkeys-lru (or volatile-lru: every Tandem key expires) so that "
                    "it evicts", self.url, said(error), count)

    def _refused(self, error: Exception) -> None:
        """Redis answered with an error for this operation alone (a key of another type under a
        Tandem name): a miss, or a write dropped; Redis is not down, so the link stays up (it was
        taken down, and every request's cache skipped for the backoff)."""
        with self._lock:
            count = self._count_error()
        if count is None:
            return
        log.warning("Redis at %s refused an operation (%s); %d operation(s) served uncached since the last "
                    "warning (a key of another type under a Tandem name? see `redis-cli --scan --pattern 'tandem:*'`)",
                    self.url, said(error), count)

    def _count_error(self) -> int | None:
        """Count a degraded operation (the lock held); the operations to report since the last
        warning where one is due (at most one per WARNING_INTERVAL_SECONDS), else None."""
        self._errors += 1
        self._errors_unreported += 1
        now = self._clock()
        if now - self._last_warning < WARNING_INTERVAL_SECONDS:
            return None
        self._last_warning = now
        count, self._errors_unreported = self._errors_unreported, 0
        return count

    def _succeeded(self) -> None:
        with self._lock:
            recovered = self._down_until > -math.inf
            self._down_until = -math.inf
            self._backoff_s = self._backoff_min_s
        if recovered:  # as loud as the outage was: an operator who saw it down sees it back
            log.warning("Redis at %s reachable again; caching resumed", self.url)


def said(error: Exception, limit: int = 200) -> str:
    """An error's first line, fit for a log: printable ASCII (a refused write's message quotes
    the command, whose key holds packed token ids: the log read as a binary file), at most
    `limit` characters."""
    line = str(error).splitlines()[0] if str(error) else type(error).__name__
    printable = "".join(c if c.isprintable() and c.isascii() else "?" for c in line)
    return printable if len(printable) <= limit else printable[:limit - 3] + "..."
