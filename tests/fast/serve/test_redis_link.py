"""The Redis link's degrade-never-raise rules, without a server: failures become the fallback,
a backoff skips the network, warnings are rate-limited, and a success resets everything."""

import logging

import pytest
import redis

from tandem.errors import TandemError
from tandem.redis_link import RedisLink, check_redis_url, redact

URL = "redis://127.0.0.1:6379/0"


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class FlakyOp:
    """Fails while `down`, counting the calls that reached it."""

    def __init__(self):
        self.down = True
        self.calls = 0

    def __call__(self, client) -> str:
        self.calls += 1
        if self.down:
            raise redis.ConnectionError("Connection refused")
        return "ok"


def test_failures_become_the_fallback_and_back_off():
    clock, op = FakeClock(), FlakyOp()
    link = RedisLink(URL, backoff_min_s=1.0, backoff_max_s=4.0, clock=clock)
    assert link.run(op, "fallback") == "fallback" and op.calls == 1
    assert link.run(op, "fallback") == "fallback" and op.calls == 1  # skipped while down
    clock.now = 1.0
    assert link.run(op, "fallback") == "fallback" and op.calls == 2  # retried, failed: 2 s backoff
    clock.now = 2.9
    assert link.run(op, "fallback") == "fallback" and op.calls == 2
    clock.now = 3.0
    op.down = False
    assert link.run(op, "fallback") == "ok" and op.calls == 3
    assert link.errors == 4  # every degraded call counts, skipped or failed
    op.down = True
    link.run(op, None)  # the backoff starts over from its minimum
    clock.now = 4.0
    link.run(op, None)
    assert op.calls == 5


def test_a_full_redis_drops_the_write_but_is_not_down(caplog):
    """At its maxmemory under noeviction Redis refuses writes (OOM) but answers reads: a refused
    write is dropped with a warning naming the fix, and the next call still reaches Redis (a
    full Redis used to be taken for a dead one, and reads were skipped through the backoff)."""
    clock, calls = FakeClock(), []

    def write(client):
        calls.append("write")
        raise redis.exceptions.OutOfMemoryError("command not allowed when used memory > 'maxmemory'.")

    link = RedisLink(URL, backoff_min_s=1.0, backoff_max_s=4.0, clock=clock)
    with caplog.at_level(logging.WARNING, logger="tandem.redis_link"):
        assert link.run(write, "dropped") == "dropped"
    assert "full" in caplog.text and "maxmemory-policy" in caplog.text
    assert link.run(lambda client: calls.append("read") or "hit", None) == "hit"  # not skipped
    assert calls == ["write", "read"] and link.errors == 1


def test_a_key_of_another_type_is_a_miss_and_redis_stays_up(caplog):
    """WRONGTYPE (another app's list under a Tandem key) took the whole link down: every
    request's cache was skipped for the backoff, as if Redis were dead. Now that one call is a
    miss, and the log line holds no raw bytes of the key."""
    calls = []

    def get(client):
        calls.append("get")
        raise redis.exceptions.ResponseError("WRONGTYPE Operation against a key holding the wrong kind of value\n"
                                             "tandem:ngram:\x00\xff")

    link = RedisLink(URL, backoff_min_s=1.0, backoff_max_s=4.0, clock=FakeClock())
    with caplog.at_level(logging.WARNING, logger="tandem.redis_link"):
        assert link.run(get, "miss") == "miss"
    assert link.run(lambda client: calls.append("next") or "hit", None) == "hit"  # not skipped: not down
    assert calls == ["get", "next"] and link.errors == 1
    assert "refused an operation (WRONGTYPE" in caplog.text and "\xff" not in caplog.text


def test_recovery_is_said_as_loudly_as_the_outage(caplog):
    clock, op = FakeClock(), FlakyOp()
    link = RedisLink(URL, backoff_min_s=1.0, backoff_max_s=4.0, clock=clock)
    with caplog.at_level(logging.WARNING, logger="tandem.redis_link"):
        link.run(op, None)
        clock.now, op.down = 1.0, False
        link.run(op, None)
    assert "unavailable" in caplog.text and "reachable again" in caplog.text


def test_backoff_is_capped():
    clock, op = FakeClock(), FlakyOp()
    link = RedisLink(URL, backoff_min_s=1.0, backoff_max_s=2.0, clock=clock)
    for _ in range(6):
        link.run(op, None)
        clock.now += 2.0  # always past the capped backoff
    assert op.calls == 6


def test_warnings_are_rate_limited(caplog):
    clock, op = FakeClock(), FlakyOp()
    link = RedisLink(URL, backoff_min_s=0.1, backoff_max_s=0.1, clock=clock)
    with caplog.at_level(logging.WARNING, logger="tandem.redis_link"):
        for _ in range(50):
            link.run(op, None)
            clock.now += 0.2
    assert len(caplog.records) == 1  # 10 s of failures, one warning
    assert "127.0.0.1:6379" in caplog.text


def test_other_errors_are_bugs_and_propagate():
    link = RedisLink(URL)
    with pytest.raises(KeyError):
        link.run(lambda client: {}["missing"], None)


@pytest.mark.parametrize("url", ["redis://h", "redis://h:6379", "redis://h:6379/3", "rediss://u:p@h:1/"])
def test_good_urls(url):
    check_redis_url(url)


def test_bad_backoff_is_a_clear_error():
    with pytest.raises(TandemError, match="backoff"):
        RedisLink(URL, backoff_min_s=2.0, backoff_max_s=1.0)


def test_redact_hides_passwords_only():
    assert redact("redis://user:pw@host:1/0") == "redis://user:***@host:1/0"
    assert redact("redis://host:1/0") == "redis://host:1/0"
