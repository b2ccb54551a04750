"""One request inside the engine, seen from the event loop: submit, read updates, turn tokens to text.

`start_generation` submits (429 when the queue is full, 503 when shutting down) and opens the
request's trace span. `GenerationRun.deltas()` yields text that is safe to show (complete UTF-8,
never a stop string) and then the final flush; afterwards the run holds the totals. Leaving
`deltas()` early (a client went away, the task was cancelled), or calling `close()` before it ever
ran, cancels the sequence, so the engine frees it at its next step. The metrics and the trace span
are closed exactly once either way; with --log-requests the prompt and completion text are logged
then (never otherwise, and never the key).

Inter-token times (one per token after the first): an update may carry several tokens (accepted
drafts); each gets the wait for its update divided by the tokens in it; the tokens that came with
the very first token get 0.
"""

import logging
import time
from collections.abc import AsyncIterator

from tandem.engine.worker import EngineStoppedError, EngineUnavailableError, QueueFullError, RequestHandle
from tandem.errors import TandemError
from tandem.serve.api.errors import (RETRY_AFTER_SHUTDOWN_SECONDS, APIError, queue_full, shutting_down, unavailable,
                                     unavailable_message)
from tandem.serve.api.prepare import PreparedRequest
from tandem.serve.state import ServerState
from tandem.text.stream import TextStream

log = logging.getLogger(__name__)
request_log = logging.getLogger("tandem.requests")  # prompt and completion text: only with --log-requests


class EngineFailure(Exception):
    """The engine could not finish the request (an engine error, or cancelled by shutdown)."""

    def __init__(self, message: str, finish_reason: str):
        super().__init__(message)
        self.finish_reason = finish_reason

    def api_error(self) -> APIError:
        """What the client gets, whole or as a stream's error event: the engine's own failure is a
        500; a request cancelled by the shutdown, or with no worker left, a 503 to retry later."""
        if self.finish_reason == "error":
            return APIError(500, str(self), "server_error", code=self.finish_reason)
        return APIError(503, str(self), "service_unavailable", code=self.finish_reason,
                        headers={"Retry-After": str(RETRY_AFTER_SHUTDOWN_SECONDS)})  # as every 503


class GenerationRun:
    def __init__(self, state: ServerState, handle: RequestHandle, prepared: PreparedRequest, received_at: float,
                 response_id: str = ""):
        self.state = state
        self.handle = handle
        self.prepared = prepared
        self.response_id = response_id  # the id the client gets (chatcmpl-...), in the log line and the span
        self.received_at = received_at  # time.perf_counter() when the request arrived
        self.token_ids: list[int] = []
        self.text = ""
        self.drafted = 0
        self.accepted = 0
        self.cached_tokens = 0  # prompt tokens the engine's prompt cache held
        self.finish_reason: str | None = None
        self.error: str | None = None
        self._first_token_at: float | None = None
        self._last_update_at = received_at
        self._inter_token: list[float] = []
        self._prompt_told = False  # its prompt counted on /metrics (once it is in)
        self._closed = False

    @property
    def seq_id(self) -> str:
        return self.handle.seq_id

    async def deltas(self) -> AsyncIterator[str]:
        """Text deltas until the sequence finishes; raises EngineFailure if it ends in error."""
        stream = TextStream(self.state.tokenizer.decode, list(self.prepared.stop_strings))
        try:
            while True:
                update = await self.handle.next_update()
                self.cached_tokens = max(self.cached_tokens, update.cached_tokens)
                self._record(update.token_ids, update.drafted, update.accepted)
                if not self._prompt_told and (update.token_ids or update.finish_reason in ("stop", "length")):
                    self._prompt_told = True  # its prompt is in: a first token, or an answer that ended at once
                    _safely(self.state.metrics.prompt_processed, self.prepared.prompt_tokens, self.cached_tokens)
                delta = stream.push(list(update.token_ids)) if update.token_ids else ""
                if update.finished:
                    self.finish_reason, self.error = update.finish_reason, update.error
                    delta += stream.finish()
                    if stream.stopped and self.finish_reason == "length":  # the cap fell inside the stop string
                        self.finish_reason = "stop"
                if delta:
                    self.text += delta
                    yield delta
                if update.finished:
                    break
            self._raise_if_failed()
        finally:
            self.close()

    def usage(self) -> dict:
        return usage_body(self.prepared.prompt_tokens, len(self.token_ids), self.drafted, self.accepted,
                          self.cached_tokens)

    def cache_value(self) -> dict:
        return {"text": self.text, "token_ids": list(self.token_ids), "finish_reason": self.finish_reason,
                "usage": self.usage()}

    def _record(self, token_ids: tuple[int, ...], drafted: int, accepted: int) -> None:
        self.drafted += drafted
        self.accepted += accepted
        if not token_ids:
            return
        now = time.perf_counter()
        if self._first_token_at is None:  # the rest of the first update arrived with the first token
            self._first_token_at = now
            self._inter_token += [0.0] * (len(token_ids) - 1)
        else:
            self._inter_token += [(now - self._last_update_at) / len(token_ids)] * len(token_ids)
        self._last_update_at = now
        self.token_ids += token_ids
        _safely(self.state.metrics.tokens_generated, len(token_ids))

    def _raise_if_failed(self) -> None:
        if self.finish_reason == "error":
            raise EngineFailure(f"the engine failed on this request: {self.error or 'unknown error'}", "error")
        if self.finish_reason == "cancelled":
            raise EngineFailure("the request was cancelled by the server (shutting down)", "cancelled")
        if self.finish_reason == "unavailable":  # a 503 the client may retry, not the engine's fault
            raise EngineFailure(unavailable_message(self.error or "unavailable"), "unavailable")

    def close(self) -> None:
        """Cancel the sequence if it is still running; report metrics and end the span (once)."""
        if self._closed:
            return
        self._closed = True
        now = time.perf_counter()
        if not self.handle.finished:  # left early: the client went away, or the time limit passed
            self.handle.cancel()
            timed_out = now - self.received_at >= self.state.settings.request_timeout_seconds
            self.finish_reason = "timeout" if timed_out else "cancelled"  # the metrics tell them apart
        ttft = None if self._first_token_at is None else self._first_token_at - self.received_at
        _safely(self.state.metrics.request_finished, self.finish_reason, ttft, now - self.received_at,
                self._inter_token)
        if self.state.settings.log_requests:
            _safely(self._log_texts)
        _safely(self.state.tracer.end_request, self.seq_id, {
            "gen_ai.response.finish_reason": self.finish_reason, "gen_ai.usage.output_tokens": len(self.token_ids),
            "tandem.drafted_tokens": self.drafted, "tandem.accepted_tokens": self.accepted})


    def _log_texts(self) -> None:
        prompt = self.state.tokenizer.decode(list(self.prepared.generation.prompt_ids))
        request_log.info("%s %s (%s): prompt %r -> completion %r", self.response_id or "-", self.seq_id,
                         self.finish_reason, prompt, self.text)


def start_generation(state: ServerState, prepared: PreparedRequest, endpoint: str, received_at: float,
                     response_id: str = "") -> GenerationRun:
    """Hand the request to the engine thread; 429 when full, 503 when shutting down. `response_id`
    (the answer's `id`) goes into the span and the request log, so either finds the client's answer."""
    if state.draining:
        raise shutting_down()
    options = prepared.options
    attributes = {"tandem.endpoint": endpoint, "gen_ai.request.model": state.model_name,
                  "gen_ai.response.id": response_id or None,
                  "gen_ai.usage.input_tokens": prepared.prompt_tokens,
                  "gen_ai.request.max_tokens": prepared.generation.max_tokens,
                  "gen_ai.request.temperature": prepared.generation.sampling.temperature,
                  "tandem.stream": prepared.stream, "tandem.drafter": options.drafter,
                  "tandem.k": None if options.k is None else str(options.k)}
    span_attributes = {k: v for k, v in attributes.items() if v is not None}
    try:  # the span opens before the engine thread can step the sequence
        handle = state.worker.submit(prepared.generation, options,
                                     lambda seq_id: _safely(state.tracer.start_request, seq_id, span_attributes))
    except QueueFullError as error:
        raise queue_full(error.retry_after_seconds, str(error)) from None
    except EngineUnavailableError as error:  # before its base class: not a shutdown
        raise unavailable(str(error)) from None
    except EngineStoppedError as error:
        raise shutting_down(str(error)) from None
    except TandemError as error:  # a request this engine can never run: the client's mistake
        raise APIError(400, str(error), code="invalid_value") from None
    return GenerationRun(state, handle, prepared, received_at, response_id)


def usage_body(prompt_tokens: int, completion_tokens: int, drafted: int, accepted: int,
               cached_tokens: int = 0) -> dict:
    """OpenAI's usage object; `prompt_tokens_details.cached_tokens`: prompt tokens whose KV the
    engine found cached (in a slot or its host tier) instead of computing them."""
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens},
            "speculative": {"drafted_tokens": drafted, "accepted_tokens": accepted}}


def _safely(call, *args) -> None:
    """Observability must never break a response."""
    try:
        call(*args)
    except Exception:
        log.exception("%s failed", getattr(call, "__qualname__", call))
