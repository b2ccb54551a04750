"""OpenAI-style error responses: `{"error": {"message", "type", "param", "code"}}`.

Status codes, following OpenAI (which answers 400 for every invalid request, not FastAPI's 422):
  400 invalid_request_error  malformed JSON, wrong types, out-of-range values, n != 1, a prompt or
                             max_tokens that does not fit the context or the server's limits (the
                             numbers are named), logit_bias (not supported)
  401 authentication_error   missing or wrong Bearer key when the server has --api-key
  403 invalid_request_error  a browser request from a web origin not in --allowed-origins (origin_guard.py),
                             or to a loopback-bound server under another host name (host_guard.py)
  404 invalid_request_error  unknown model (code model_not_found), unknown route
  405 invalid_request_error  wrong method on a known route
  413 invalid_request_error  body larger than --max-body-bytes
  415 invalid_request_error  a compressed body (Content-Encoding other than identity)
  429 rate_limit_error       the engine queue is full; Retry-After says when to try again
  500 server_error           the engine failed (our fault, not the client's); no traceback is sent
  429 rate_limit_error       also: this client already holds --max-streams-per-client open streams
  503 service_unavailable    the server is shutting down (code shutting_down), or nothing can run a request
                             now, a cluster with no verifier left (code unavailable); Retry-After
  504 timeout_error          the request ran past --request-timeout (queueing included) and was cancelled
Every refused request (4xx, 429, 503) is counted by `metrics.request_rejected`, but for the
dashboard's, the metrics' and the schema's own fetches (UNCOUNTED_PATHS, and the dashboard's
assets) and paths no route
serves (a browser's favicon, a load balancer's probe, a scanner: no API request was refused).
"""

import json
import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException

UNCOUNTED_PATHS = frozenset({"/metrics", "/dashboard/data", "/openapi.json"})
UNCOUNTED_PREFIX = "/dashboard/static/"  # a page's asset not found is no API request refused

log = logging.getLogger(__name__)
RETRY_AFTER_SHUTDOWN_SECONDS = 5
MAX_INPUT_ECHO = 40  # characters of a bad value quoted back in an error message


class APIError(Exception):
    """An error the client sees as an OpenAI error body with this status."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None, headers: dict | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict:
        return error_body(self.message, self.type, self.param, self.code)

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def error_body(message: str, type: str, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


async def send_refusal(send, status: int, message: str, code: str) -> None:
    """An error body sent straight through ASGI `send`, by middleware that answers before the app."""
    body = json.dumps(error_body(message, "invalid_request_error", code=code)).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


def queue_full(retry_after_seconds: int, message: str) -> APIError:
    return APIError(429, message, "rate_limit_error", code="queue_full",
                    headers={"Retry-After": str(retry_after_seconds)})


def shutting_down(message: str = "the server is shutting down and accepts no new requests") -> APIError:
    return APIError(503, message, "service_unavailable", code="shutting_down",
                    headers={"Retry-After": str(RETRY_AFTER_SHUTDOWN_SECONDS)})


def unavailable_message(reason: str) -> str:
    """Why a request cannot run now (a cluster with no verifier left), arriving or already queued."""
    return f"the server cannot run this request now: {reason}"


def unavailable(reason: str) -> APIError:
    """Nothing can run a request now: a 503 the client may retry later."""
    return APIError(503, unavailable_message(reason), "service_unavailable", code="unavailable",
                    headers={"Retry-After": str(RETRY_AFTER_SHUTDOWN_SECONDS)})


def request_timed_out() -> APIError:
    return APIError(504, "the request ran past the server's time limit (--request-timeout) and was cancelled; "
                    "ask for fewer max_tokens or retry later", "timeout_error", code="request_timeout")


def invalid_body(error: ValidationError | RequestValidationError) -> APIError:
    """The first problem pydantic found, named the way OpenAI names parameters (`messages[0].role`)."""
    first = error.errors()[0]
    param = _param_name(first.get("loc", ()))
    kind = first.get("type", "")
    if kind == "missing":
        return APIError(400, f"Missing required parameter: '{param}'.", param=param,
                        code="missing_required_parameter")
    if kind == "extra_forbidden":
        return APIError(400, f"Unrecognized parameter: '{param}'.", param=param, code="unknown_parameter")
    code = "invalid_type" if kind.endswith("_type") else kind if kind == "unsupported_value" else "invalid_value"
    shown = _as_json(first.get("input"))
    shown = shown if len(shown) <= MAX_INPUT_ECHO else shown[:MAX_INPUT_ECHO] + "..."
    message = f"Invalid value for '{param}' ({shown}): {first.get('msg', 'invalid')}."
    return APIError(400, message, param=param, code=code)


def _as_json(value) -> str:
    """The value as the client wrote it (true, null, "5"), not as Python shows it (True, None, '5')."""
    try:
        return json.dumps(value, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError):
        return repr(value)


def _param_name(loc) -> str:
    name = ""
    for part in loc:
        if part == "body":  # FastAPI's own validation prefixes the body
            continue
        name += f"[{part}]" if isinstance(part, int) else (f".{part}" if name else str(part))
    return name or "body"


def _counted(path: str) -> bool:
    return path not in UNCOUNTED_PATHS and not path.startswith(UNCOUNTED_PREFIX)


def install_error_handlers(app: FastAPI, metrics) -> None:
    """Every error leaves as an OpenAI error body; refusals are counted; tracebacks stay in the log."""

    def refused(error: APIError, request: Request) -> JSONResponse:
        # the API's refusals; not a dashboard's or a scraper's polls refused without the key, which
        # counted one a second and showed requests rejected where none were
        if error.code == "client_disconnected":  # nobody refused it: the client left (nginx's 499)
            metrics.request_abandoned()
        elif (error.status < 500 or error.status == 503) and _counted(request.url.path):
            metrics.request_rejected(error.status)
        return error.response()

    @app.exception_handler(APIError)
    async def on_api_error(request: Request, error: APIError):
        return refused(error, request)

    @app.exception_handler(RequestValidationError)
    async def on_validation_error(request: Request, error: RequestValidationError):
        return refused(invalid_body(error), request)

    @app.exception_handler(HTTPException)
    async def on_http_exception(request: Request, error: HTTPException):
        kind = "server_error" if error.status_code >= 500 else "invalid_request_error"
        message = error.detail if isinstance(error.detail, str) else "request failed"
        code = None
        if error.status_code == 404 and message == "Not Found":  # the router's own: no such route
            return APIError(404, f"no route {request.method} {request.url.path}", kind, code="not_found").response()
        headers = dict(error.headers or {})
        if error.status_code == 405 and message == "Method Not Allowed":  # the router's own, with its Allow
            allowed = headers.get("Allow", "")
            if allowed == "HEAD":  # the HEAD twin of a GET route (routes_info.py): the router named the first it met
                allowed = headers["Allow"] = "GET, HEAD"
            message = f"{request.method} is not allowed on {request.url.path}" + (f"; use {allowed}" if allowed else "")
            code = "method_not_allowed"
        return refused(APIError(error.status_code, message, kind, code=code, headers=headers), request)

    @app.exception_handler(Exception)
    async def on_unexpected(request: Request, error: Exception):
        log.exception("unhandled error serving %s %s", request.method, request.url.path)
        return APIError(500, "internal server error", "server_error").response()
