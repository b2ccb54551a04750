"""Fast doubles for the HTTP API tests: a byte tokenizer, a scripted batching engine, recording
metrics and tracer, and a server built around them (the real app, worker thread and cache).

`ByteTokenizer`: one token per UTF-8 byte (ids 0-255) plus EOS (256), so a multi-byte character
spans several tokens and a stream cut between them shows "\\ufffd" until it completes.
`ScriptedEngine`: every running sequence emits the next `tokens_per_step` ids of `script` per
step (cycling), honouring max_tokens, stop token ids, stop conditions and cancel; `gate` pauses it.
"""

import asyncio
import functools
import json
import threading
import time
from collections import deque
from dataclasses import dataclass, field

import httpx

from tandem.engine.events import SequenceUpdate, SpeculationOptions, StepReport
from tandem.engine.request import GenerationRequest
from tandem.engine.worker import EngineWorker
from tandem.serve.app import create_app
from tandem.serve.cache import InProcessResponseCache, response_cache_key
from tandem.serve.response_store import ResponseStore
from tandem.serve.settings import ServeSettings
from tandem.serve.state import ServerState

EOS = 256
MODEL = "tiny-test"
REPLY = "Héllo, wörld! 🙂 ok"
PAUSED_STEP_SECONDS = 0.005


def async_test(test):
    """Run an async test function on a fresh event loop."""

    @functools.wraps(test)
    def run(*args, **kwargs):
        return asyncio.run(test(*args, **kwargs))

    return run


class ByteTokenizer:
    stop_token_ids = frozenset({EOS})

    def encode(self, text: str) -> list[int]:
        return list(text.encode())

    def decode(self, token_ids) -> str:
        return bytes(t for t in token_ids if t < 256).decode("utf-8", errors="replace")

    def chat_prompt_ids(self, messages: list[dict]) -> list[int]:
        return self.encode("".join(f"<{m['role']}>{m['content']}\n" for m in messages) + "<assistant>")


@dataclass
class Running:
    request: GenerationRequest
    output: list[int] = field(default_factory=list)


class ScriptedEngine:
    def __init__(self, script: list[int], max_running: int = 2, context_length: int = 512,
                 tokens_per_step: int = 3, step_seconds: float = 0.0):
        self.script = script
        self.max_running = max_running
        self.context_length = context_length
        self.tokens_per_step = tokens_per_step
        self.step_seconds = step_seconds
        self.waiting: deque[tuple[str, GenerationRequest]] = deque()
        self.running: dict[str, Running] = {}
        self.added: list[tuple[str, GenerationRequest, SpeculationOptions]] = []
        self.cancelled: list[str] = []
        self.gate = threading.Event()
        self.gate.set()
        self.fail_with: str | None = None  # the next step fails every running sequence with this

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    def validate(self, request, options) -> None:
        pass

    def add(self, seq_id, request, options) -> None:
        self.added.append((seq_id, request, options))
        self.waiting.append((seq_id, request))

    def cancel(self, seq_id):
        self.cancelled.append(seq_id)
        for item in self.waiting:
            if item[0] == seq_id:
                self.waiting.remove(item)
                return SequenceUpdate(seq_id, (), finished=True, finish_reason="cancelled")
        if self.running.pop(seq_id, None) is None:
            return None
        return SequenceUpdate(seq_id, (), finished=True, finish_reason="cancelled")

    def step(self):
        if not self.gate.is_set():
            time.sleep(PAUSED_STEP_SECONDS)
            return [], self._report()
        time.sleep(self.step_seconds)
        while self.waiting and len(self.running) < self.max_running:
            seq_id, request = self.waiting.popleft()
            self.running[seq_id] = Running(request)
        updates = [self._advance(seq_id, seq) for seq_id, seq in list(self.running.items())]
        for update in updates:
            if update.finished:
                del self.running[update.seq_id]
        return updates, self._report()

    def _advance(self, seq_id: str, seq: Running) -> SequenceUpdate:
        if self.fail_with is not None:
            return SequenceUpdate(seq_id, (), finished=True, finish_reason="error", error=self.fail_with)
        start, new = len(seq.output), []
        reason = None
        for i in range(self.tokens_per_step):
            token = self.script[(start + i) % len(self.script)]
            new.append(token)
            seq.output.append(token)
            reason = self._finish_reason(seq)
            if reason is not None:
                break
        if reason == "stop" and seq.request.stop_condition is not None:
            keep = seq.request.stop_condition.tokens_to_keep(seq.output)
            if keep is not None:
                new = new[: max(0, keep - start)]
        return SequenceUpdate(seq_id, tuple(new), drafted=len(new) + 1, accepted=len(new) - 1 if new else 0,
                              finished=reason is not None, finish_reason=reason)

    def _finish_reason(self, seq: Running) -> str | None:
        if seq.output[-1] in seq.request.stop_token_ids:
            return "stop"
        if seq.request.stop_condition is not None and seq.request.stop_condition.tokens_to_keep(seq.output):
            return "stop"
        if len(seq.output) >= seq.request.max_tokens:
            return "length"
        return None

    def _report(self) -> StepReport:
        return StepReport(time.time(), 0.0, 0.0, 0.0, 0.0, len(self.running), len(self.waiting), 0)


class RecordingMetrics:
    def __init__(self):
        self.finished: list[tuple] = []
        self.rejected: list[int] = []
        self.lookups: list[bool] = []

    def request_finished(self, status, prompt_tokens, completion_tokens, ttft_seconds, e2e_seconds,
                         inter_token_seconds) -> None:
        self.finished.append((status, prompt_tokens, completion_tokens, ttft_seconds, e2e_seconds,
                              list(inter_token_seconds)))

    def request_rejected(self, http_status: int) -> None:
        self.rejected.append(http_status)

    def cache_lookup(self, hit: bool) -> None:
        self.lookups.append(hit)

    def observe_step(self, report) -> None:
        pass

    def render(self):
        return b"# TYPE tandem_test counter\ntandem_test_total 1\n", "text/plain; version=0.0.4; charset=utf-8"

    def snapshot(self) -> dict:
        return {"series": []}


class RecordingTracer:
    def __init__(self):
        self.started: dict[str, dict] = {}
        self.ended: dict[str, dict] = {}

    def start_request(self, seq_id, attributes) -> None:
        self.started[seq_id] = attributes

    def observe_step(self, report) -> None:
        pass

    def end_request(self, seq_id, attributes) -> None:
        self.ended[seq_id] = attributes

    def shutdown(self) -> None:
        pass


def reply_script(text: str = REPLY, eos: bool = True) -> list[int]:
    return list(text.encode()) + ([EOS] if eos else [])


class TestServer:
    """The real app over a worker thread and a ScriptedEngine; `client()` talks to it in-process."""

    __test__ = False  # not a pytest class

    def __init__(self, engine: ScriptedEngine | None = None, drafters=("hybrid", "model", "ngram", "none"),
                 **settings):
        self.engine = engine or ScriptedEngine(reply_script())
        self.settings = ServeSettings(**{"served_model_name": MODEL, **settings})
        self.worker = EngineWorker(self.engine, self.settings.max_waiting).start()
        self.metrics, self.tracer = RecordingMetrics(), RecordingTracer()
        self.state = ServerState(self.worker, ByteTokenizer(), MODEL, self.engine.context_length, self.settings,
                                 self.metrics, self.tracer,
                                 ResponseStore(InProcessResponseCache(), response_cache_key), drafters=drafters)
        self.app = create_app(self.state)

    def client(self, **headers) -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=httpx.ASGITransport(app=self.app), base_url="http://test",
                                 headers=headers, timeout=10)

    async def wait_until(self, condition, timeout: float = 5.0) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            assert time.monotonic() < deadline, "timed out waiting for the engine"
            await asyncio.sleep(0.005)

    def close(self) -> None:
        self.engine.gate.set()
        self.worker.shutdown(0)
        self.state.cache.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def sse_events(text: str) -> list:
    """Parse an SSE body into its data payloads (JSON objects, or the string "[DONE]")."""
    assert text.endswith("\n\n"), text[-50:]
    events = []
    for block in text.split("\n\n")[:-1]:
        assert block.startswith("data: "), block
        payload = block[len("data: "):]
        events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


def completion_body(**fields) -> dict:
    return {"model": MODEL, "prompt": "Say hi", "temperature": 0, **fields}


def chat_body(**fields) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": "Say hi"}], "temperature": 0, **fields}
