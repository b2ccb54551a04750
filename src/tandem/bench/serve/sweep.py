"""The sweep: every server started once and warmed up, then every concurrency level, each server
in turn, in alternating order (as listed at the first level, reversed at the next, and so on), so
neither order nor drift favours one server. At C=1 the servers take turns request by request
instead (the order rotating each request): one client sends one request at a time either way,
and a VM whose speed drifts over minutes then slows every server alike. All servers stay up for
the whole sweep (idle ones cost memory, not CPU) and are stopped at the end, on failure too.
"""

import sys
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Sequence

import httpx

from tandem.bench.serve.client import answer_tokens_only
from tandem.bench.serve.draft_sources import parse_sources, read_metrics, source_delta
from tandem.bench.serve.engine_steps import parse_steps, step_delta
from tandem.bench.serve.launcher import READY_TIMEOUT_S, ServerProcess
from tandem.bench.serve.loadgen import LoadResult, run_load
from tandem.bench.serve.requests import BenchRequest, load_items, warmup_request
from tandem.bench.serve.server_kinds import ServerKind, ServerLaunch
from tandem.errors import TandemError
from tandem.progress import ProgressBar

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
    sources: dict[int, dict[str, dict]] = field(default_factory=dict)  # concurrency -> label -> draft sources
    steps: dict[int, dict[str, dict]] = field(default_factory=dict)  # concurrency -> label -> engine steps


@dataclass(frozen=True, slots=True)
class Endpoint:
    """A ready server as the clients see it."""

    kind: ServerKind
    chat_url: str
    model: str  # the name it serves, sent in every request
    metrics_url: str | None = None  # Tandem's /metrics (draft sources), None for other servers
    pid: int | None = None  # the server process (its CPU time can be read while it runs)


def config_order(kinds: Sequence[ServerKind], level_index: int) -> list[ServerKind]:
    return list(kinds) if level_index % 2 == 0 else list(reversed(kinds))


def start_servers(servers: ExitStack, kinds: Sequence[ServerKind], launch: ServerLaunch, max_tokens: int,
                  log_dir: Path, ready_timeout_s: float = READY_TIMEOUT_S) -> tuple[dict[str, Endpoint], dict[str, dict]]:
    """Start and warm up every server (stopped when `servers` closes): endpoints and descriptions
    by label."""
    endpoints, described = {}, {}
    for kind in kinds:
        print(f"starting {kind.label} (log: {log_dir / (kind.label + '.log')})...", file=sys.stderr)
        server = servers.enter_context(ServerProcess(kind, launch, log_dir / f"{kind.label}.log", ready_timeout_s))
        metrics_url = None if kind.metrics_path is None else server.base_url.removesuffix("/v1") + kind.metrics_path
        endpoint = Endpoint(kind, server.base_url + CHAT_PATH, served_model(server.base_url, kind), metrics_url,
                            server.pid)
        described[kind.label] = {"command": server.command, "notes": kind.notes, "base_url": server.base_url,
                                 "model": endpoint.model}
        warm_up(endpoint, max_tokens)
        endpoints[kind.label] = endpoint
    return endpoints, described


def run_sweep(kinds: Sequence[ServerKind], launch: ServerLaunch, plans: Sequence[LevelPlan], max_tokens: int,
              log_dir: Path, progress: bool = True, ready_timeout_s: float = READY_TIMEOUT_S,
              outcome: SweepOutcome | None = None) -> SweepOutcome:
    """`outcome`: filled level by level (a level enters it whole), so that a caller holding it
    keeps the finished levels of an interrupted sweep."""
    outcome = outcome if outcome is not None else SweepOutcome()
    with ExitStack() as servers:
        endpoints, described = start_servers(servers, kinds, launch, max_tokens, log_dir, ready_timeout_s)
        outcome.servers.update(described)
        for index, plan in enumerate(plans):
            order = config_order(kinds, index)
            outcome.orders[plan.concurrency] = [kind.label for kind in order]
            in_order = [endpoints[kind.label] for kind in order]
            before = {e.kind.label: read_metrics(e.metrics_url) for e in in_order}
            if plan.concurrency == 1:
                outcome.results[1] = run_turns(in_order, plan, max_tokens, progress)
            else:
                outcome.results[plan.concurrency] = {e.kind.label: run_level(e, plan, max_tokens, progress)
                                                     for e in in_order}
            after = {e.kind.label: read_metrics(e.metrics_url) for e in in_order}  # moved by its own requests only
            read = [label for label in before if before[label] is not None and after[label] is not None]
            outcome.sources[plan.concurrency] = {
                label: source_delta(parse_sources(before[label]), parse_sources(after[label])) for label in read}
            outcome.steps[plan.concurrency] = {
                label: step_delta(parse_steps(before[label]), parse_steps(after[label])) for label in read}
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


def run_turns(endpoints: Sequence[Endpoint], plan: LevelPlan, max_tokens: int, progress: bool) -> dict[str, LoadResult]:
    """C=1 with the servers taking turns: request i goes to every server, in the level's order
    rotated by i. Each server's wall time is the sum of its requests' own runs."""
    items = {e.kind.label: load_items(plan.requests, e.model, max_tokens, dict(e.kind.request_extras))
             for e in endpoints}
    records: dict[str, list] = {e.kind.label: [] for e in endpoints}
    wall = dict.fromkeys(records, 0.0)
    with ProgressBar(total=len(plan.requests) * len(endpoints), desc="C=1 (servers take turns)", unit="req",
              file=sys.stderr, disable=not progress, leave=False) as bar:
        for i in range(len(plan.requests)):
            shift = i % len(endpoints)
            for endpoint in [*endpoints[shift:], *endpoints[:shift]]:
                label = endpoint.kind.label
                one = as_answers(run_load(endpoint.chat_url, [items[label][i]], 1), endpoint.kind)
                records[label] += one.records
                wall[label] += one.wall_s
                bar.update()
    results = {label: LoadResult(1, tuple(records[label]), wall[label], 1) for label in records}
    for label, result in results.items():
        errors = sum(not r.ok for r in result.records)
        print(f"C=1 {label}: {len(result.records)} requests in {result.wall_s:.1f} s"
              + (f", {errors} errors" if errors else ""), file=sys.stderr)
    return results


def run_level(endpoint: Endpoint, plan: LevelPlan, max_tokens: int, progress: bool) -> LoadResult:
    kind, url = endpoint.kind, endpoint.chat_url
    items = load_items(plan.requests, endpoint.model, max_tokens, dict(kind.request_extras))
    with ProgressBar(total=len(items), desc=f"C={plan.concurrency} {kind.label}", unit="req", file=sys.stderr,
              disable=not progress, leave=False) as bar:
        result = as_answers(run_load(url, items, plan.concurrency, on_done=lambda _record: bar.update()), kind)
    errors = sum(not r.ok for r in result.records)
    print(f"C={plan.concurrency} {kind.label}: {len(items)} requests in {result.wall_s:.1f} s"
          + (f", {errors} errors" if errors else ""), file=sys.stderr)
    return result


def as_answers(result: LoadResult, kind: ServerKind) -> LoadResult:
    """Every server's completion tokens counted alike, as the answer's tokens (`answer_tokens_only`)."""
    if not kind.usage_counts_end_token:
        return result
    return replace(result, records=tuple(answer_tokens_only(record) for record in result.records))
