"""`tandem serve` on the small model under fuzzing (tests/api_fuzz.py), a fixed budget of cases:
schemathesis over the server's own /openapi.json, then hypothesis raw hostile bodies. No 5xx, every
4xx an OpenAI error object, every stream ended by [DONE], the server alive and idle afterwards
(no sequence or KV slot left behind)."""

import sys

import httpx
import pytest
import schemathesis
from api_fuzz import FuzzTally, fuzz_raw, fuzz_schema
from serve_support import start_server

SMALL = "smollm2-135m-instruct"
SCHEMA_EXAMPLES = 60  # per POST operation and generation mode (GETs a quarter)
RAW_EXAMPLES = 250


@pytest.fixture(scope="module")
def server():
    command = [sys.executable, "-m", "tandem.cli.main", "serve", "--target", SMALL, "--draft", SMALL,
               "--backend", "llamacpp", "--draft-backend", "llamacpp", "--threads", "2", "--port", "0",
               "--max-running", "4", "--max-tokens-limit", "8", "--cache", "off"]
    served = start_server(command)
    yield served
    served.stop()


def assert_idle_and_alive(server) -> None:
    health = server.health()
    assert health["status"] == "ok" and health["running"] == 0 and health["in_flight"] == 0, health
    metrics = httpx.get(f"{server.url}/metrics", timeout=10).text
    assert 'tandem:kv_slots_in_use{model_name="smollm2-135m-instruct"} 0.0' in metrics
    assert server.process.poll() is None


def test_schema_fuzzing_finds_no_server_error(server):
    schema = schemathesis.openapi.from_url(f"{server.url}/openapi.json")
    tally = FuzzTally()
    fuzz_schema(schema, SMALL, SCHEMA_EXAMPLES, lambda case: case.call(base_url=server.url, timeout=120), tally)
    print(f"\nschemathesis on the real server: {tally.cases} cases, statuses {dict(tally.statuses)}")
    assert not tally.problems, "\n".join(tally.problems)
    assert tally.statuses[200] > 10 and tally.statuses[400] > 50, tally.statuses
    assert_idle_and_alive(server)


def test_raw_hostile_bodies_find_no_server_error(server):
    tally = FuzzTally()
    with httpx.Client(base_url=server.url, timeout=120, headers={"content-type": "application/json"}) as http:
        fuzz_raw(SMALL, RAW_EXAMPLES, lambda path, data: http.post(path, content=data), tally)
    print(f"\nraw bodies on the real server: {tally.cases} cases, statuses {dict(tally.statuses)}")
    assert not tally.problems, "\n".join(tally.problems)
    assert tally.statuses[200] > 20, tally.statuses
    assert_idle_and_alive(server)
