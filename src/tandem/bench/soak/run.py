"""The soak itself: C clients in a closed loop for a fixed time against one server, the server's
/metrics sampled at a fixed period, then, once the clients stop and the server has drained, one
idle sample.

Requests are the workload's chat prompts in turn, greedy and streamed, each marked on every pass
after the first (bench/serve/requests.py) so the response cache never answers one. Every
`abandon_every`-th request is dropped after its first token, as a client that goes away: the
server must free its sequence. A failed request (an HTTP error, an error event, a broken stream)
counts as an error; its first few messages are kept. After a failed request, or a sample that
cannot be read, the server's /health is asked: where nothing answers, the server is gone, the
clients stop (they would count every refused connection as a request) and the soak ends with the
samples so far and what was seen (`SoakTally.server_lost`).
"""

import asyncio
import contextlib
import itertools
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import httpx

from tandem.bench.serve.client import stream_chat
from tandem.bench.serve.requests import BenchRequest, chat_payload, level_requests
from tandem.bench.serve.sse import parse_chunk, sse_payloads
from tandem.bench.soak.samples import ServerSample, read_metrics
from tandem.bench.workload import BenchPrompt
from tandem.errors import TandemError

IDLE_WAIT_S = 60.0  # after the load, how long the server gets to finish what it holds
REQUEST_TIMEOUT_S = 600.0
HEALTH_TIMEOUT_S = 10.0
KEPT_ERRORS = 5


@dataclass(frozen=True, slots=True)
class SoakSettings:
    base_url: str  # the server's API root, ending in /v1
    model: str
    prompts: tuple[BenchPrompt, ...]
    concurrency: int = 8
    duration_s: float = 1800.0
    sample_every_s: float = 60.0
    max_tokens: int = 64
    abandon_every: int = 10  # every n-th request is dropped after its first token; 0: none
    api_key: str | None = None

    def __post_init__(self):
        if self.concurrency < 1 or self.duration_s <= 0 or self.sample_every_s <= 0 or self.max_tokens < 1:
            raise ValueError(f"concurrency, duration, sample period and max tokens must be positive: {self}")
        if self.abandon_every < 0:
            raise ValueError("abandon_every must be 0 (never) or a positive request count")


@dataclass(slots=True)
class SoakTally:
    started: int = 0
    done: int = 0
    errors: int = 0
    abandoned: int = 0
    completion_tokens: int = 0
    error_messages: list[str] = field(default_factory=list)
    server_lost: str | None = None  # what was seen when the server stopped answering; None: it never did

    def failed(self, message: str) -> None:
        self.errors += 1
        if len(self.error_messages) < KEPT_ERRORS:
            self.error_messages.append(message)


@dataclass(frozen=True, slots=True)
class SoakResult:
    settings: SoakSettings
    samples: tuple[ServerSample, ...]
    tally: SoakTally
    load_seconds: float


def request_cycle(prompts: tuple[BenchPrompt, ...]) -> Iterator[BenchRequest]:
    """The workload's prompts in turn, forever, each pass after the first marked."""
    for offset in itertools.count(0, len(prompts)):
        yield from level_requests(prompts, len(prompts), offset)


async def soak(settings: SoakSettings, on_sample: Callable[[ServerSample], None] = lambda s: None,
               tally: SoakTally | None = None) -> SoakResult:
    """`tally`: counts kept by the caller too, so that an interrupted soak's part can be written."""
    tally = tally if tally is not None else SoakTally()
    samples: list[ServerSample] = []
    requests = request_cycle(settings.prompts)
    root = settings.base_url.removesuffix("/").removesuffix("/v1")
    chat_url = root + "/v1/chat/completions"
    headers = {"Authorization": f"Bearer {settings.api_key}"} if settings.api_key else {}
    limits = httpx.Limits(max_connections=settings.concurrency + 1, max_keepalive_connections=settings.concurrency + 1)
    async with httpx.AsyncClient(timeout=httpx.Timeout(REQUEST_TIMEOUT_S, connect=10.0), limits=limits,
                                 headers=headers) as client:
        start = time.monotonic()
        deadline = start + settings.duration_s
        lost = asyncio.Event()  # set with tally.server_lost: the sampler stops waiting for its next sample

        def lose(seen: str) -> None:
            tally.server_lost = seen
            lost.set()

        async def take_sample(phase: str) -> None:
            try:
                response = await client.get(root + "/metrics")
                response.raise_for_status()
            except httpx.HTTPError as error:
                if not await _answers(client, root):
                    lose(f"{root}/metrics unread after {tally.done} requests: {error}")
                    return
                raise TandemError(f"cannot read {root}/metrics after {tally.done} requests: {error}") from None
            sample = ServerSample(round(time.monotonic() - start, 1), phase, tally.done, tally.errors,
                                  **read_metrics(response.text))
            samples.append(sample)
            on_sample(sample)

        def going() -> bool:
            return time.monotonic() < deadline and tally.server_lost is None

        async def one_client() -> None:
            while going():
                request = next(requests)
                payload = chat_payload(request, settings.model, settings.max_tokens, {})
                tally.started += 1
                if settings.abandon_every and tally.started % settings.abandon_every == 0:
                    error = await _abandon(client, chat_url, payload, tally)
                else:
                    record = await stream_chat(client, chat_url, payload, request.prompt_id, request.category)
                    error = record.error if not record.ok else None
                    if record.ok:
                        tally.completion_tokens += record.completion_tokens
                    else:
                        tally.failed(f"{request.prompt_id}: {record.error}")
                tally.done += 1
                if error is not None and tally.server_lost is None and not await _answers(client, root):
                    lose(f"nothing answers {root}/health after {tally.done} requests; the last: {error}")

        async def sampler() -> None:
            while going() and (left := deadline - time.monotonic()) > 0:
                await take_sample("load")
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(lost.wait(), min(settings.sample_every_s, left))

        await asyncio.gather(sampler(), *(one_client() for _ in range(settings.concurrency)))
        load_seconds = time.monotonic() - start
        if tally.server_lost is None:
            await _wait_idle(client, root)
            await take_sample("idle")
    return SoakResult(settings, tuple(samples), tally, load_seconds)


async def _abandon(client: httpx.AsyncClient, url: str, payload: dict, tally: SoakTally) -> str | None:
    """Send a streamed request and hang up after its first token (or its first error: returned)."""
    try:
        async with client.stream("POST", url, json=payload) as response:
            if response.status_code != 200:
                return _failed(tally, f"HTTP {response.status_code}: {(await response.aread())[:200]!r}")
            async for data in sse_payloads(response.aiter_lines()):
                chunk = parse_chunk(data) if data != "[DONE]" else None
                if chunk is not None and chunk.error:
                    return _failed(tally, chunk.error)
                if chunk is None or chunk.text:
                    break
        tally.abandoned += 1
        return None
    except httpx.HTTPError as error:
        return _failed(tally, f"{type(error).__name__}: {error}")


def _failed(tally: SoakTally, error: str) -> str:
    tally.failed(f"abandoned request: {error}")
    return error


async def _answers(client: httpx.AsyncClient, root: str) -> bool:
    """Whether anything answers the server's /health (a 503 while it drains is an answer)."""
    try:
        await client.get(root + "/health", timeout=HEALTH_TIMEOUT_S)
        return True
    except httpx.HTTPError:
        return False


async def _wait_idle(client: httpx.AsyncClient, root: str) -> None:
    """Until the engine runs and queues nothing (or IDLE_WAIT_S passed)."""
    deadline = time.monotonic() + IDLE_WAIT_S
    while time.monotonic() < deadline:
        values = read_metrics((await client.get(root + "/metrics")).text)
        if not values["running"] and not values["waiting"]:
            return
        await asyncio.sleep(0.5)
