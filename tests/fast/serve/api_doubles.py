"""Fast doubles for the HTTP API tests: a byte tokenizer, a scripted batching engine, recording
metrics and tracer, and a server built around them (the real app, worker thread and cache).

`ByteTokenizer`: one token per UTF-8 byte (ids 0-255) plus EOS (256), so a multi-byte character
spans several tokens and a stream cut between them shows "\\ufffd" until it completes.
`ScriptedEngine`: the real `SequencePool` (queue, submit checks, cancel, retire) and the real
`Sequence.commit` (EOS, stop conditions, max tokens, context, counts); only the model is
scripted. Each round of a running sequence proposes the next script ids (cycling) as the target
would: `accepted` draft tokens plus the token the target adds; `gate` pauses it, `fail_with`
makes its steps raise as a device failure would.
"""

import asyncio
import functools
import json
import threading
import time

import httpx

from tandem.engine.events import SequenceUpdate, SpeculationOptions, StepReport
from tandem.engine.request import GenerationRequest
from tandem.engine.sequence import Sequence
from tandem.engine.sequence_pool import SequencePool
from tandem.engine.worker import EngineWorker
from tandem.serve.api.app import create_app
from tandem.serve.response_cache.cache import InProcessResponseCache, response_cache_key
from tandem.serve.response_cache.store import ResponseStore
from tandem.serve.settings import ServeSettings
from tandem.serve.state import ServerState
from tandem.speculation.depth import Auto
from tandem.speculation.drafters.registry import DRAFTER_NAMES, build_drafters

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
    size = 257  # bytes and the EOS

    def encode(self, text: str) -> list[int]:
        return list(text.encode())

    def decode(self, token_ids) -> str:
        assert all(t < 256 for t in token_ids), "an EOS id reached the text"
        return bytes(token_ids).decode("utf-8", errors="replace")

    def chat_prompt_ids(self, messages: list[dict]) -> list[int]:  # roles given to the template as TextTokenizer's
        from tandem.text.chat_roles import template_role

        return self.encode("".join(f"<{template_role(m['role'])}>{m['content']}\n" for m in messages) + "<assistant>")


class UnusedDraftModel:
    """Lets the registry build the drafters that need a model; the script drafts instead."""

    def cost_view(self, seq):
        return None

    def catch_up_ms(self, seq) -> float:
        return 0.0

    def draft(self, jobs, keep_drafting):
        raise AssertionError("ScriptedEngine never drafts")


class ScriptedEngine(SequencePool):
    """A round drafts k = tokens_per_step + 1 tokens (fewer where the sequence's depth or room
    says so), accepts tokens_per_step - 1 of them, and the target adds one: tokens_per_step
    script ids per step, cut by the real stops."""

    def __init__(self, script: list[int], max_running: int = 2, context_length: int = 512,
                 tokens_per_step: int = 3, step_seconds: float = 0.0, draft_model: bool = True):
        super().__init__(build_drafters(UnusedDraftModel() if draft_model else None))
        self.default_drafter = "hybrid" if draft_model else "ngram"
        self.default_depth = Auto()
        self.script = script
        self.max_running = max_running
        self.context_length = context_length
        self.tokens_per_step = tokens_per_step
        self.step_seconds = step_seconds
        self.added: list[tuple[str, GenerationRequest, SpeculationOptions]] = []
        self.cancelled: list[str] = []
        self.gate = threading.Event()
        self.gate.set()
        self.fail_with: str | None = None  # steps raise this (the worker fails every sequence)
        self.unavailable: str | None = None  # steps finish every sequence "unavailable" with this (a cluster's last verifier gone)
        self.cached_prefix = 0  # prompt tokens each sequence reports its prompt cache held

    def add(self, seq_id: str, request: GenerationRequest, options: SpeculationOptions = SpeculationOptions()) -> None:
        super().add(seq_id, request, options)
        self.added.append((seq_id, request, options))

    def cancel(self, seq_id: str) -> SequenceUpdate | None:
        self.cancelled.append(seq_id)
        return super().cancel(seq_id)

    def _finish(self, seq: Sequence) -> None:
        self.retire(seq)  # no slot or cache to free

    def step(self) -> tuple[list[SequenceUpdate], StepReport]:
        if not self.gate.is_set():
            time.sleep(PAUSED_STEP_SECONDS)
            return [], self._report(0)
        time.sleep(self.step_seconds)
        if self.fail_with is not None:
            raise RuntimeError(self.fail_with)
        if self.unavailable is not None:
            gone = [*self.running.values(), *self.waiting]
            self.running.clear()
            self.waiting.clear()
            return [SequenceUpdate(seq.seq_id, (), finished=True, finish_reason="unavailable", error=self.unavailable)
                    for seq in gone], self._report(0)
        while self.waiting and len(self.running) < self.max_running:
            seq = self.waiting.popleft()
            self.running[seq.seq_id] = seq
        rounds = [self._round(seq) for seq in list(self.running.values())]
        return [update for update, _ in rounds], self._report(sum(k + 1 for _, k in rounds))

    def _round(self, seq: Sequence) -> tuple[SequenceUpdate, int]:
        k = seq.fixed_k if seq.fixed_k is not None else self.tokens_per_step + 1
        k = min(k, seq.draft_limit(self.context_length))
        accepted = min(self.tokens_per_step - 1, k)
        start = len(seq.output)
        proposed = [self.script[(start + i) % len(self.script)] for i in range(accepted + 1)]
        emitted, reason = seq.commit(proposed, self.context_length)
        if reason is not None:
            self._finish(seq)
        update = SequenceUpdate(seq.seq_id, tuple(emitted), k, accepted, reason is not None, reason,
                                cached_tokens=min(self.cached_prefix, len(seq.request.prompt_ids)))
        return update, k

    def _report(self, batch_tokens: int) -> StepReport:
        return StepReport(time.time(), 0.0, 0.0, 0.0, 0.0, len(self.running), len(self.waiting), batch_tokens)


class RecordingMetrics:
    def __init__(self):
        self.finished: list[tuple] = []
        self.cached_tokens: list[int] = []
        self.rejected: list[int] = []
        self.lookups: list[bool] = []
        self.replayed: list[str] = []  # finish reasons of answers from the response cache
        self.generated: list[int] = []  # tokens_generated's counts, as they came
        self._prompt = (0, 0)  # the current request's (prompt tokens, cached), told at its first token

    def prompt_processed(self, prompt_tokens, cached_tokens=0) -> None:
        self._prompt = (prompt_tokens, cached_tokens)

    def tokens_generated(self, count) -> None:
        self.generated.append(count)

    def request_finished(self, status, ttft_seconds, e2e_seconds, inter_token_seconds) -> None:
        """One request at a time: (status, prompt, completion, ttft, e2e, gaps), its counts those
        told since the last one finished."""
        (prompt_tokens, cached_tokens), completion_tokens = self._prompt, sum(self.generated)
        self.finished.append((status, prompt_tokens, completion_tokens - sum(f[2] for f in self.finished),
                              ttft_seconds, e2e_seconds, list(inter_token_seconds)))
        self.cached_tokens.append(cached_tokens)
        self._prompt = (0, 0)

    def request_rejected(self, http_status: int) -> None:
        self.rejected.append(http_status)

    def cache_lookup(self, hit: bool) -> None:
        self.lookups.append(hit)

    def request_replayed(self, status, e2e_seconds) -> None:
        self.replayed.append(status)

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

    def __init__(self, engine: ScriptedEngine | None = None, drafters: tuple[str, ...] | None = None, **settings):
        self.engine = engine or ScriptedEngine(reply_script())
        if drafters is None:  # what the server offers: what its engine can run
            drafters = tuple(name for name in DRAFTER_NAMES if name in self.engine.drafters)
        # starlette's TestClient and schemathesis address the app as "testserver"
        self.settings = ServeSettings(**{"served_model_name": MODEL, "allowed_hosts": ("testserver",), **settings})
        self.worker = EngineWorker(self.engine, self.settings.max_waiting).start()
        self.metrics, self.tracer = RecordingMetrics(), RecordingTracer()
        self.state = ServerState(self.worker, ByteTokenizer(), MODEL, self.engine.context_length, self.settings,
                                 self.metrics, self.tracer,
                                 ResponseStore(InProcessResponseCache(), response_cache_key), drafters=drafters)
        self.app = create_app(self.state)

    def client(self, **headers) -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=httpx.ASGITransport(app=self.app), base_url="http://localhost",
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
