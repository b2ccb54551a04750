"""Reading a request body: at most `limit` bytes, whatever Content-Length claims; then JSON; then
the pydantic model. Each failure is an APIError with the status OpenAI would use (413, 400)."""

import asyncio
import json
import logging
import sys
from typing import TypeVar

from fastapi import Request
from pydantic import BaseModel, ValidationError
from starlette.requests import ClientDisconnect

from tandem.serve.api.errors import APIError, invalid_body, shutting_down
from tandem.serve.api.protocol import FIELDS_WITHOUT_EFFECT, STREAM_OPTIONS_WITHOUT_EFFECT, StreamOptions

log = logging.getLogger(__name__)
MAX_IGNORED_NAMES_REMEMBERED = 64  # unknown field names remembered as said (the least recently sent forgotten first)
MAX_IGNORED_NAMES_A_REQUEST = 4  # named in the log from one request (a client may send thousands)
JSON_TYPE_NAMES = {type(None): "null", bool: "a boolean", int: "a number", float: "a number", str: "a string",
                   list: "an array"}

M = TypeVar("M", bound=BaseModel)
MAX_JSON_DEPTH = 32  # nested arrays and objects; a request needs 4 (messages, a message, its content parts, a part)


async def read_limited(request: Request, limit: int, timeout_s: float | None = None,
                       stop: asyncio.Event | None = None) -> bytes:
    """The body, at most `limit` bytes, arrived within timeout_s (None: no limit; a client that
    stops mid-body held its connection for ever, the request's time limit starting after it).
    `stop` set (the server drains) while it still arrives: a 503 (uvicorn cancelled the read at its
    close timeout, which answered a plain-text 500 and logged a traceback)."""
    encoding = request.headers.get("content-encoding", "identity").strip().lower()
    if encoding not in ("", "identity"):  # a gzipped body read as text was "not valid JSON"
        raise APIError(415, f"Content-Encoding {encoding!r} is not supported: send the body uncompressed",
                       code="unsupported_content_encoding")
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise _too_large(int(declared), limit)
    chunks, size = [], 0
    try:
        async with asyncio.timeout(timeout_s):
            arriving = request.stream().__aiter__()
            while True:
                try:
                    chunk = await _unless_stopped(arriving.__anext__(), stop)
                except StopAsyncIteration:
                    break
                size += len(chunk)
                if size > limit:
                    raise _too_large(size, limit)
                chunks.append(chunk)
    except ClientDisconnect:  # nobody reads the answer; it is counted, not logged as our failure
        raise APIError(400, "the client closed the connection before its request body arrived",
                       code="client_disconnected") from None
    except TimeoutError:
        raise APIError(408, f"the request body did not arrive within {timeout_s:g} s (--request-timeout)",
                       code="request_timeout") from None
    return b"".join(chunks)


async def _unless_stopped(step, stop: asyncio.Event | None):
    """`await step`, unless `stop` is set first: then a 503 shutting_down."""
    if stop is None:
        return await step
    step, halt = asyncio.ensure_future(step), asyncio.ensure_future(stop.wait())
    try:
        done, _ = await asyncio.wait((step, halt), return_when=asyncio.FIRST_COMPLETED)
    finally:
        halt.cancel()
        if not step.done():  # stopped, timed out or cancelled: the read goes too
            step.cancel()
    if step in done:
        return step.result()
    raise shutting_down("the server is shutting down; the request's body was still arriving")


def parse_json_object(body: bytes) -> dict:
    try:
        value = json.loads(body, parse_constant=_refuse_constant)
    except RecursionError:  # nested far past the limit: the parser's own stack ran out first
        raise _too_deep() from None
    except ValueError as error:  # UnicodeDecodeError is a ValueError
        if "integer string conversion" in str(error):  # Python's own limit, with advice for the server's code
            raise APIError(400, f"the request body holds an integer of more than {sys.get_int_max_str_digits():,} "
                           "digits", code="invalid_json") from None
        raise APIError(400, f"the request body is not valid JSON: {error}", code="invalid_json") from None
    if not isinstance(value, dict):
        raise APIError(400, f"the request body must be a JSON object, got {JSON_TYPE_NAMES.get(type(value), 'something else')}",
                       code="invalid_json")
    if _depth(value) > MAX_JSON_DEPTH:  # before anything walks it recursively (a RecursionError was a 500)
        raise _too_deep()
    _check_unicode(value)
    return value


def _too_deep() -> APIError:
    return APIError(400, f"the request body's JSON nests arrays and objects deeper than {MAX_JSON_DEPTH} levels",
                    code="invalid_json")


def _depth(value) -> int:
    """How deeply arrays and objects nest in a parsed JSON value (a scalar: 0), without recursion."""
    deepest, pending = 0, [(value, 1)]
    while pending:
        item, level = pending.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        deepest = max(deepest, level)
        if level <= MAX_JSON_DEPTH:  # no need to look past the limit
            pending.extend((child, level + 1) for child in children)
    return deepest


def _check_unicode(value: dict) -> None:
    """JSON may escape a lone UTF-16 surrogate ("\\ud83d"), which is no Unicode text: no
    tokenizer can take it, so it is the client's mistake (400), found before anything reads it."""
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as error:
        bad = error.object[error.start:error.end]
        raise APIError(400, f"the request body holds a lone UTF-16 surrogate ({ascii(bad)}), which is not valid "
                       "Unicode text; send whole surrogate pairs or the characters themselves",
                       code="invalid_value") from None


async def read_request(request: Request, model: type[M], limit: int, timeout_s: float | None = None,
                       stop: asyncio.Event | None = None, ignored_said: dict[str, None] | None = None) -> M:
    """The body as `model`, validated; it must arrive within timeout_s, and before `stop` is set.
    Unknown fields not remembered in `ignored_said` are logged and remembered there."""
    body = parse_json_object(await read_limited(request, limit, timeout_s, stop))
    try:
        parsed = model.model_validate(body)
    except ValidationError as error:
        raise invalid_body(error) from None
    if ignored_said is not None:
        _say_ignored(body, model, ignored_said)
    return parsed


def _say_ignored(body: dict, model: type[BaseModel], said: dict[str, None]) -> None:
    """Unknown top-level fields are ignored (another server's options, a misspelt one: `max_token`):
    the server's log names each once, so an operator can see what clients send that does nothing.
    `said` holds the names logged (their first 64 characters, as logged), in the order last sent:
    the most recent MAX_IGNORED_NAMES_REMEMBERED. One request names at most
    MAX_IGNORED_NAMES_A_REQUEST new ones (the rest are named by later requests that send them), so
    that no client can fill the log, nor silence it for names sent later."""
    unknown = [name for name in body if name not in model.model_fields and name not in FIELDS_WITHOUT_EFFECT]
    stream_options = body.get("stream_options")
    if isinstance(stream_options, dict):  # a misspelt `include_usage` there went unsaid too
        unknown += [f"stream_options.{name}" for name in stream_options
                    if name not in StreamOptions.model_fields and name not in STREAM_OPTIONS_WITHOUT_EFFECT]
    unknown = list(dict.fromkeys(name[:64] for name in unknown))
    new = [name for name in unknown if name not in said]
    for name in unknown:
        if name in said:
            said[name] = said.pop(name)  # sent again: the most recent
    for name in new[:MAX_IGNORED_NAMES_A_REQUEST]:
        said[name] = None
        log.warning("ignored an unknown request field %r on %s (said once per field name)", name, model.__name__)
    while len(said) > MAX_IGNORED_NAMES_REMEMBERED:
        del said[next(iter(said))]
    unsaid = len(new) - MAX_IGNORED_NAMES_A_REQUEST
    if unsaid > 0:
        log.warning("ignored %d more unknown field%s on %s in the same request", unsaid, "" if unsaid == 1 else "s",
                    model.__name__)


def _too_large(size: int, limit: int) -> APIError:
    return APIError(413, f"the request body is over the server's limit of {limit} bytes ({size}+ bytes)",
                    code="request_too_large")


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")
