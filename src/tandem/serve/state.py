"""Everything a request handler needs, built once by server.py (or a test) and passed to create_app."""

import asyncio
import time
from dataclasses import dataclass, field
from typing import Protocol

from tandem.engine.events import SpeculationOptions
from tandem.engine.worker import EngineWorker
from tandem.serve.api.stream_limit import StreamLimit
from tandem.serve.observability.metrics import ServingMetrics
from tandem.serve.observability.tracing import RequestTracer
from tandem.serve.response_cache.store import ResponseStore
from tandem.serve.settings import ServeSettings
from tandem.speculation.drafters.registry import DRAFTER_NAMES



class Tokenizer(Protocol):
    """The text edge: what the API needs from tandem.text.tokenizer.TextTokenizer."""

    stop_token_ids: frozenset[int]
    size: int  # token ids 0 to size - 1 (a prompt of token ids is checked against it)

    def encode(self, text: str) -> list[int]: ...

    def decode(self, token_ids: list[int]) -> str: ...

    def chat_prompt_ids(self, messages: list[dict]) -> list[int]: ...


@dataclass(slots=True)
class ServerState:
    worker: EngineWorker
    tokenizer: Tokenizer
    model_name: str  # the name clients must send as "model"
    context_length: int  # the target's: prompt + new tokens must fit
    settings: ServeSettings
    metrics: ServingMetrics
    tracer: RequestTracer
    cache: ResponseStore
    drafters: tuple[str, ...] = DRAFTER_NAMES  # drafters a request may ask for (no draft model: ngram, none)
    speculation_defaults: SpeculationOptions = field(default_factory=SpeculationOptions)  # the engine's drafter, k
    created: int = field(default_factory=lambda: int(time.time()))
    draining: bool = False  # set on SIGINT/SIGTERM: new requests are refused with 503
    drain_started: asyncio.Event | None = None  # set with it, in the server's loop: bodies still arriving get 503
    streams: StreamLimit | None = None  # open streams per client; from settings when not given
    ignored_fields_said: dict[str, None] = field(default_factory=dict)  # unknown request fields logged lately (body.py)

    def __post_init__(self):
        if self.streams is None:
            self.streams = StreamLimit(self.settings.max_streams_per_client)
