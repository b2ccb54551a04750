"""The API's OpenAPI 3.1 schema (GET /openapi.json): FastAPI's description of the routes, plus
what it cannot see because the completion routes read their bodies themselves (serve/api/body.py):
the request bodies, from the pydantic models in protocol.py, and the error responses, every one
an OpenAI error object. Fuzzers (schemathesis) and client generators read it."""

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic.json_schema import models_json_schema

from tandem.serve.api.protocol import ChatCompletionRequest, CompletionRequest

BODIES = {"/v1/completions": CompletionRequest, "/v1/chat/completions": ChatCompletionRequest}
ERROR_STATUSES = {
    "400": "Invalid request: malformed JSON, a wrong type, an out-of-range value, a prompt that does not fit",
    "401": "Missing or wrong API key (with --api-key)",
    "404": "Unknown model",
    "413": "Body over --max-body-bytes",
    "429": "Queue full, or too many open streams from this client; see Retry-After",
    "500": "The engine failed on this request",
    "503": "Shutting down, or no worker can serve; see Retry-After",
    "504": "The request ran past --request-timeout",
}
ERROR_SCHEMA = {
    "type": "object", "required": ["error"],
    "properties": {"error": {
        "type": "object", "required": ["message", "type", "param", "code"],
        "properties": {"message": {"type": "string"}, "type": {"type": "string"},
                       "param": {"type": ["string", "null"]}, "code": {"type": ["string", "null"]}}}},
}
COMPLETION_SCHEMA = {"type": "object", "required": ["id", "object", "choices"]}  # or an SSE stream


def build_openapi(app: FastAPI) -> dict:
    schema = get_openapi(title=app.title, version="1", summary=app.summary, routes=app.routes)
    _, definitions = models_json_schema([(model, "validation") for model in BODIES.values()],
                                        ref_template="#/components/schemas/{model}")
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    components.update(definitions["$defs"])
    components["Error"] = ERROR_SCHEMA
    components.pop("HTTPValidationError", None)  # FastAPI's 422: Tandem answers 400 instead
    components.pop("ValidationError", None)
    error = {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
    for operations in schema["paths"].values():
        for operation in operations.values():
            operation["responses"].pop("422", None)
            operation["responses"]["4XX"] = {"description": "An OpenAI error object", **error}
    schema["paths"]["/metrics"]["get"]["responses"]["200"] = {
        "description": "Prometheus text exposition", "content": {"text/plain": {"schema": {"type": "string"}}}}
    for path, model in BODIES.items():
        operation = schema["paths"][path]["post"]
        operation["requestBody"] = {"required": True, "content": {"application/json": {
            "schema": {"$ref": f"#/components/schemas/{model.__name__}"}}}}
        operation["responses"] = {
            "200": {"description": "The completion, or with `stream: true` a text/event-stream of chunks",
                    "content": {"application/json": {"schema": COMPLETION_SCHEMA},
                                "text/event-stream": {"schema": {"type": "string"}}}},
            **{status: {"description": text, **error} for status, text in ERROR_STATUSES.items()},
        }
    return schema
