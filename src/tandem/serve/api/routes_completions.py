"""POST /v1/completions and POST /v1/chat/completions, streaming (SSE) and not.

A request goes: key check -> body (size, JSON, shape) -> prompt tokens and limits -> the
client's open-stream count (streams only) -> response cache (deterministic requests only) ->
engine -> text. A non-streaming request whose client goes away is cancelled too, so an abandoned
request never keeps a slot in the batch. A request still running `--request-timeout` seconds after
it arrived is cancelled: 504, or on a stream an error event and [DONE].
"""

import asyncio
import dataclasses
import time
from contextlib import aclosing

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse

from tandem.serve.api.auth import require_api_key
from tandem.serve.api.body import read_request
from tandem.serve.api.engine_stream import EngineFailure, GenerationRun, start_generation, usage_body
from tandem.serve.api.errors import request_timed_out, shutting_down
from tandem.serve.api.prepare import PreparedRequest, prepare_chat, prepare_completion
from tandem.serve.api.protocol import ChatCompletionRequest, CompletionRequest
from tandem.serve.api.responses import ResponseShape
from tandem.serve.api.streaming import ClosingStreamingResponse, generation_events, replay_events, replayed_text
from tandem.serve.state import ServerState

CACHEABLE_FINISH_REASONS = ("stop", "length")
CACHED_FIELDS = ("text", "token_ids", "finish_reason", "usage")  # what GenerationRun.cache_value() stores


def completions_router(state: ServerState) -> APIRouter:
    router = APIRouter(dependencies=[Depends(require_api_key(state.settings.api_key))])
    limit = state.settings.max_body_bytes
    timeout_s = state.settings.request_timeout_seconds  # the body's arrival counts against it too

    @router.post("/v1/completions")
    async def completions(request: Request):
        received_at = time.perf_counter()
        _refuse_if_draining(state)
        body = await read_request(request, CompletionRequest, limit, timeout_s, state.drain_started,
                                  state.ignored_fields_said)
        return await _respond(state, request, await prepare_completion(state, body), "text", received_at)

    @router.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        received_at = time.perf_counter()
        _refuse_if_draining(state)
        body = await read_request(request, ChatCompletionRequest, limit, timeout_s, state.drain_started,
                                  state.ignored_fields_said)
        return await _respond(state, request, await prepare_chat(state, body), "chat", received_at)

    return router


def _refuse_if_draining(state: ServerState) -> None:
    if state.draining:
        raise shutting_down()


async def _respond(state: ServerState, request: Request, prepared: PreparedRequest, kind: str, received_at: float):
    deadline = received_at + state.settings.request_timeout_seconds  # time.perf_counter() seconds
    release = state.streams.open(_client_address(request)) if prepared.stream else _nothing
    try:
        return await _answer(state, request, prepared, kind, received_at, deadline, release)
    except BaseException:
        release()
        raise


async def _answer(state: ServerState, request: Request, prepared: PreparedRequest, kind: str, received_at: float,
                  deadline: float, release):
    shape = ResponseShape(kind, state.model_name, include_usage=prepared.stream and prepared.include_usage)
    key = state.cache.key(state.model_name, prepared.generation.prompt_ids, prepared.cache_params)
    if key is not None:
        cached = _usable(await state.cache.get(key), state, prepared.stop_strings)
        state.metrics.cache_lookup(cached is not None)
        if cached is not None:
            state.metrics.request_replayed(cached["finish_reason"], time.perf_counter() - received_at)
            return _cached_response(state, prepared, dataclasses.replace(shape, cached=True), cached, deadline,
                                    release)
    run = start_generation(state, prepared, kind, received_at, shape.id)

    async def remember(finished: GenerationRun) -> None:
        if key is not None and finished.finish_reason in CACHEABLE_FINISH_REASONS:
            await state.cache.put(key, finished.cache_value())

    if prepared.stream:
        return ClosingStreamingResponse(generation_events(run, shape, remember, deadline),
                                        on_close=(run.close, release), deadline=deadline)
    await _collect(run, request, deadline)
    await remember(run)
    return JSONResponse(shape.full(run.text, run.finish_reason, run.usage()))


def _client_address(request: Request) -> str:
    return request.client.host if request.client else "unknown"


def _nothing() -> None:
    pass


async def _collect(run: GenerationRun, request: Request, deadline: float) -> None:
    """Run the generation to its end; cancel it if the client disconnects or the deadline passes."""
    collecting = asyncio.ensure_future(_run_to_end(run))
    watcher = asyncio.ensure_future(_wait_for_disconnect(request))
    try:
        await asyncio.wait({collecting, watcher}, timeout=max(0.0, deadline - time.perf_counter()),
                           return_when=asyncio.FIRST_COMPLETED)
        if not collecting.done() and not watcher.done():
            raise request_timed_out()
    finally:
        watcher.cancel()
        if not collecting.done():  # the client went away: cancel the sequence in the engine
            collecting.cancel()
            await asyncio.wait({collecting})
        run.close()  # a no-op once the run ended; cancels it if it never started
    if collecting.cancelled():
        return
    try:
        collecting.result()
    except EngineFailure as failure:
        raise failure.api_error() from None


async def _run_to_end(run: GenerationRun) -> None:
    async with aclosing(run.deltas()) as deltas:
        async for _ in deltas:
            pass


async def _wait_for_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _cached_response(state: ServerState, prepared: PreparedRequest, shape: ResponseShape, cached: dict,
                     deadline: float, release):
    """The stored answer, its usage as this request spent it: every prompt token found cached,
    nothing drafted (the original run's counts were its own)."""
    usage = cached["usage"]
    cached = cached | {"usage": usage_body(usage["prompt_tokens"], usage["completion_tokens"], 0, 0,
                                           cached_tokens=usage["prompt_tokens"])}
    if prepared.stream:
        return ClosingStreamingResponse(replay_events(cached, shape, state.tokenizer.decode, prepared.stop_strings),
                                        on_close=(release,), deadline=deadline)
    return JSONResponse(shape.full(cached["text"], cached["finish_reason"], cached["usage"]))


def _usable(cached, state: ServerState, stop_strings: tuple[str, ...]) -> dict | None:
    """A cached value this version wrote, whole; anything else is a miss, answered and written
    anew. A shared Redis holds what any writer put there: a value of the wrong types failed the
    request with a 500, and one whose text was not its tokens' was served as it was (the stream
    replayed the tokens, so the two disagreed)."""
    if not isinstance(cached, dict) or not all(field in cached for field in CACHED_FIELDS):
        return None
    ids, usage = cached["token_ids"], cached["usage"]
    if not (isinstance(cached["text"], str) and cached["finish_reason"] in CACHEABLE_FINISH_REASONS
            and isinstance(ids, list) and all(type(i) is int and 0 <= i < state.tokenizer.size for i in ids)
            and isinstance(usage, dict)
            and all(type(usage.get(n)) is int and usage[n] >= 0 for n in ("prompt_tokens", "completion_tokens"))):
        return None
    return cached if replayed_text(ids, state.tokenizer.decode, stop_strings) == cached["text"] else None
