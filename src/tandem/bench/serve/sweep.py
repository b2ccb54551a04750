"""The sweep: every server started once and warmed up, then every concurrency level, each server
in turn, in alternating order (as listed at the first level, reversed at the next, and so on), so
neither order nor drift favours one server. All servers stay up for the whole sweep (idle ones
cost memory, not CPU) and are stopped at the end, on failure too.
"""

import sys
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import httpx
from tqdm import tqdm

from tandem.bench.serve.launcher import READY_TIMEOUT_S, ServerProcess
from tandem.bench.serve.loadgen import LoadResult, run_load
from tandem.bench.serve.requests import BenchRequest, load_items, warmup_request
from tandem.bench.serve.server_kinds import ServerKind, ServerLaunch
from tandem.errors import TandemError

CHAT_PATH = "/chat/completions"
MODELS_TIMEOUT_S = 30.0


@dataclass(frozen=True, slots=True)
class LevelPlan:
    concurrency: int
    requests: tuple[BenchRequest, ...]


@dataclass(frozen=True, slots=True)
class SweepOutcome:
    results: dict[int, dict[str, LoadResult]] = field(default_factory=dict)  # concurrency -> label -> run
    orders: dict[int, list[str]] = field(default_factory=dict)  # concurrency -> labels in run order
    servers: dict[str, dict] = field(default_factory=dict)  # label -> command, notes, base URL, model


@dataclass(frozen=True, slots=True)
class Endpoint:
    """A ready server as the clients see it."""

    kind: ServerKind
    chat_url: str
    model: str  # the name it serves, sent in every request


def config_order(kinds: Sequence[ServerKind], level_index: int) -> list[ServerKind]:
    return list(kinds) if level_index % 2 == 0 else list(reversed(kinds))


def run_sweep(kinds: Sequence[ServerKind], launch: ServerLaunch, plans: Sequence[LevelPlan], max_tokens: int,
              log_dir: Path, progress: bool = True, ready_timeout_s: float = READY_TIMEOUT_S) -> SweepOutcome:
    outcome = SweepOutcome()
    with ExitStack() as servers:
        endpoints = {}
        for kind in kinds:
            print(f"starting {kind.label} (log: {log_dir / (kind.label + '.log')})...", file=sys.stderr)
            server = servers.enter_context(ServerProcess(kind, launch, log_dir / f"{kind.label}.log",
                                                         ready_timeout_s))
            endpoint = Endpoint(kind, server.base_url + CHAT_PATH, served_model(server.base_url, kind))
            outcome.servers[kind.label] = {"command": server.command, "notes": kind.notes,
                                           "base_url": server.base_url, "model": endpoint.model}
            warm_up(endpoint, max_tokens)
            endpoints[kind.label] = endpoint
        for index, plan in enumerate(plans):
            order = config_order(kinds, index)
            outcome.orders[plan.concurrency] = [kind.label for kind in order]
            outcome.results[plan.concurrency] = {
                kind.label: run_level(endpoints[kind.label], plan, max_tokens, progress) for kind in order
            }
    return outcome


def served_model(base_url: str, kind: ServerKind) -> str:
    """The first model id of GET /v1/models (servers may refuse any other name)."""
    try:
        response = httpx.get(base_url + "/models", timeout=MODELS_TIMEOUT_S)
        response.raise_for_status()
        return str(response.json()["data"][0]["id"])
    except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as error:
        raise TandemError(f"{kind.label}: cannot read the served model from {base_url}/models: {error}") from None


def warm_up(endpoint: Endpoint, max_tokens: int) -> None:
    """One untimed request; a failure here means the server cannot serve the benchmark at all."""
    items = load_items([warmup_request()], endpoint.model, max_tokens, dict(endpoint.kind.request_extras))
    record = run_load(endpoint.chat_url, items, 1).records[0]
    if not record.ok:
        raise TandemError(f"{endpoint.kind.label}: the warm-up request failed: {record.error}")


def run_level(endpoint: Endpoint, plan: LevelPlan, max_tokens: int, progress: bool) -> LoadResult:
    kind, url = endpoint.kind, endpoint.chat_url
    items = load_items(plan.requests, endpoint.model, max_tokens, dict(kind.request_extras))
    with tqdm(total=len(items), desc=f"C={plan.concurrency} {kind.label}", unit="req", file=sys.stderr,
              disable=not progress, leave=False) as bar:
        result = run_load(url, items, plan.concurrency, on_done=lambda _record: bar.update())
    errors = sum(not r.ok for r in result.records)
    print(f"C={plan.concurrency} {kind.label}: {len(items)} requests in {result.wall_s:.1f} s"
          + (f", {errors} errors" if errors else ""), file=sys.stderr)
    return result
