"""The API under fuzzing (tests/api_fuzz.py), in process over a scripted engine: schemathesis over
/openapi.json and hypothesis raw bodies; no 5xx, every 4xx an OpenAI error, still healthy after."""

import schemathesis
from api_doubles import MODEL, ScriptedEngine, TestServer, reply_script
from api_fuzz import FuzzTally, fuzz_raw, fuzz_schema
from fastapi.testclient import TestClient

SCHEMA_EXAMPLES = 150  # per POST operation and mode
RAW_EXAMPLES = 400


def test_schema_fuzzing_finds_no_server_error():
    with TestServer(ScriptedEngine(reply_script(), max_running=4), max_tokens_limit=8) as server:
        schema = schemathesis.openapi.from_asgi("/openapi.json", server.app)
        tally = FuzzTally()
        fuzz_schema(schema, MODEL, SCHEMA_EXAMPLES, lambda case: case.call(), tally)
        assert not tally.problems, "\n".join(tally.problems)
        assert tally.statuses[200] > 25 and tally.statuses[400] > 50, tally.statuses  # both sides were reached
        assert TestClient(server.app).get("/health").status_code == 200
        print(f"schemathesis: {tally.cases} cases, statuses {dict(tally.statuses)}")


def test_raw_hostile_bodies_find_no_server_error():
    with TestServer(ScriptedEngine(reply_script(), max_running=4), max_tokens_limit=8) as server:
        client = TestClient(server.app)
        tally = FuzzTally()
        fuzz_raw(MODEL, RAW_EXAMPLES, lambda path, data: client.post(
            path, content=data, headers={"content-type": "application/json"}), tally)
        assert not tally.problems, "\n".join(tally.problems)
        assert tally.statuses[200] > 10, tally.statuses
        assert client.get("/health").status_code == 200
        print(f"raw bodies: {tally.cases} cases, statuses {dict(tally.statuses)}")


def test_the_schema_describes_the_bodies():
    with TestServer() as server:
        document = TestClient(server.app).get("/openapi.json").json()
        body = document["paths"]["/v1/chat/completions"]["post"]["requestBody"]["content"]["application/json"]
        assert body["schema"]["$ref"] == "#/components/schemas/ChatCompletionRequest"
        chat = document["components"]["schemas"]["ChatCompletionRequest"]
        assert {"model", "messages", "stop", "tandem", "max_tokens"} <= set(chat["properties"])
        assert "messages" in chat["required"]
