"""`tandem serve --cluster` on a real local Ray cluster (smollm2 on llama.cpp: one drafter and
two verifier replicas), as a user runs it: kill -9 of a worker that has no work is seen within
one health period on /metrics and the dashboard's data, the worker is restarted in the
background and comes back with a new pid, and requests are served throughout."""

import re
import sys
import time

import pytest
from serve_support import start_server

SMALL = "smollm2-135m-instruct"
PERIOD_S = 1.0
CLUSTER = f"""
workers:
  - name: draft
    role: draft
    model: {SMALL}
    backend: llamacpp
    threads: 1
    resources: {{CPU: 0.5}}
  - name: verify
    role: verify
    model: {SMALL}
    backend: llamacpp
    threads: 1
    replicas: 2
    resources: {{CPU: 0.5}}
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    pytest.importorskip("ray")
    path = tmp_path_factory.mktemp("cluster") / "cluster.yaml"
    path.write_text(CLUSTER)
    command = [sys.executable, "-m", "tandem.cli.main", "serve", "--cluster", str(path), "--port", "0",
               "--health-period", str(PERIOD_S), "--cache", "off"]
    served = start_server(command)
    yield served
    served.stop()


def worker_up(server, name: str) -> int | None:
    text = server.http().get("/metrics").text
    match = re.search(r'tandem:worker_up\{[^}]*worker="' + re.escape(name) + r'"[^}]*\} (\S+)', text)
    return None if match is None else int(float(match.group(1)))


def workers(server) -> dict[str, dict]:
    return {w["name"]: w for w in server.http().get("/dashboard/data").json()["workers"]}


def wait_for(condition, seconds: float) -> float:
    """Seconds until condition() held; fails after `seconds`."""
    start = time.monotonic()
    while not condition():
        assert time.monotonic() - start < seconds, "timed out"
        time.sleep(0.05)
    return time.monotonic() - start


def ask(server) -> str:
    reply = server.client().chat.completions.create(
        model=SMALL, messages=[{"role": "user", "content": "Say hello in Spanish."}], max_tokens=8)
    return reply.choices[0].message.content


@pytest.mark.parametrize("name", ["draft-draft-0", "verify-verify-1"])
def test_an_idle_worker_killed_is_seen_down_within_a_period_and_comes_back(server, name):
    import os
    import signal

    assert ask(server)
    wait_for(lambda: worker_up(server, name) == 1, 10)
    before = workers(server)[name]
    os.kill(before["pid"], signal.SIGKILL)  # nothing is running: no call would notice
    seconds = wait_for(lambda: worker_up(server, name) == 0, 10)
    assert seconds <= PERIOD_S + 0.5  # one period, plus the check's wait for answers
    health = server.health()  # the other verifier still serves: degraded, naming the one restarting
    assert health["status"] == "degraded", health
    assert {"name": name, "role": before["role"], "state": "restarting"} in health["workers_not_up"]
    wait_for(lambda: worker_up(server, name) == 1, 120)  # restarted in the background
    after = workers(server)[name]
    assert after["pid"] != before["pid"] and after["restarts"] == before["restarts"] + 1
    wait_for(lambda: f"{name} is up again" in "".join(server.output), 5)  # at the default log level
    assert f"{name} is down; restarting it" in "".join(server.output) and ask(server)
    assert server.health()["status"] == "ok"
