"""`bench-serve --prompts multiturn`: conversations that resend their whole history every turn, as
chat clients and agents do, so what a server keeps of earlier turns' KV decides its latency.

Three scenarios from bench/workloads/multiturn.json, each run against every server in turn (the
order alternating from one scenario to the next), servers started once:
- `chat`: 10 users at once, 3 turns each; each first message a different ~700-token source file,
  the later turns short follow-ups; every turn resends the history with the answers received.
- `agent`: 4 agent loops at once, 4 turns each, every turn appending tool output (a listing, a
  file, a test run) to the history.
- `shared_system`: 16 users, 4 at a time, each asking one question after the same ~1,900-token
  system prompt: once it is cached, a user's first token costs only its own tokens.
A user sends its next turn as soon as the previous answer ends. Every request is greedy and
streamed; the figures: wall time per scenario, TTFT p50 by turn, and the prompt tokens the
server reported cached (`usage.prompt_tokens_details.cached_tokens`, where it sends it).
"""

import asyncio
import json
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import httpx

from tandem.bench.serve.client import RequestRecord, stream_chat
from tandem.bench.serve.loadgen import CONNECT_TIMEOUT_S, READ_TIMEOUT_S
from tandem.bench.serve.requests import BenchRequest, chat_payload
from tandem.errors import TandemError

MULTITURN_WORKLOAD = Path(__file__).parents[1] / "workloads" / "multiturn.json"
SCENARIOS = ("chat", "agent", "shared_system")
CONCURRENCY = {"chat": 10, "agent": 4, "shared_system": 4}  # conversations open at once


@dataclass(frozen=True, slots=True)
class Conversation:
    conversation_id: str
    system: str | None
    turns: tuple[str, ...]  # the user's message of each turn


@dataclass(frozen=True, slots=True)
class Turn:
    conversation_id: str
    turn: int  # 1-based
    record: RequestRecord


@dataclass(frozen=True, slots=True)
class ScenarioRun:
    scenario: str
    concurrency: int
    turns: tuple[Turn, ...]
    wall_s: float


def load_scenarios(path: Path = MULTITURN_WORKLOAD) -> dict[str, list[Conversation]]:
    try:
        data = json.loads(path.read_text())
        chat = [Conversation(c["id"], None, tuple(c["turns"])) for c in data["chat"]]
        agent = [Conversation(c["id"], None, tuple(c["turns"])) for c in data["agent"]]
        shared = data["shared_system"]
        users = [Conversation(f"user-{i + 1:02d}", shared["system"], (question,))
                 for i, question in enumerate(shared["questions"])]
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise TandemError(f"cannot read the multi-turn workload {path}: {error}") from None
    return {"chat": chat, "agent": agent, "shared_system": users}


async def _converse(client: httpx.AsyncClient, url: str, conversation: Conversation, model: str, max_tokens: int,
                    extras: dict, scenario: str) -> list[Turn]:
    messages = [{"role": "system", "content": conversation.system}] if conversation.system else []
    turns = []
    for number, text in enumerate(conversation.turns, start=1):
        messages.append({"role": "user", "content": text})
        request = BenchRequest(f"{conversation.conversation_id}/{number}", scenario, tuple(messages))
        record = await stream_chat(client, url, chat_payload(request, model, max_tokens, extras),
                                   request.prompt_id, scenario)
        turns.append(Turn(conversation.conversation_id, number, record))
        if not record.ok:
            break  # the history would be wrong from here on
        messages.append({"role": "assistant", "content": record.text})
    return turns


async def run_scenario_async(url: str, scenario: str, conversations: Sequence[Conversation], model: str,
                             max_tokens: int, extras: dict, concurrency: int) -> ScenarioRun:
    """Every conversation, at most `concurrency` at once (a client takes the next when one ends)."""
    pending = iter(conversations)
    done: list[Turn] = []
    timeout = httpx.Timeout(READ_TIMEOUT_S, connect=CONNECT_TIMEOUT_S)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=timeout, limits=limits) as client:

        async def user_loop() -> None:
            for conversation in pending:
                done.extend(await _converse(client, url, conversation, model, max_tokens, extras, scenario))

        start = time.perf_counter()
        await asyncio.gather(*(user_loop() for _ in range(concurrency)))
        wall = time.perf_counter() - start
    return ScenarioRun(scenario, concurrency, tuple(done), wall)


def run_scenario(url: str, scenario: str, conversations: Sequence[Conversation], model: str, max_tokens: int,
                 extras: dict, concurrency: int) -> ScenarioRun:
    return asyncio.run(run_scenario_async(url, scenario, conversations, model, max_tokens, extras, concurrency))


def summarize_scenario(run: ScenarioRun) -> dict:
    """Wall time, TTFT p50 (ms) by turn, cached prompt share where reported, errors."""
    by_turn: dict[int, list[float]] = {}
    for turn in run.turns:
        if turn.record.ok and turn.record.ttft_s is not None:
            by_turn.setdefault(turn.turn, []).append(turn.record.ttft_s)
    records = [t.record for t in run.turns]
    reported = [r for r in records if r.ok and r.cached_tokens is not None and r.prompt_tokens]
    return {
        "scenario": run.scenario,
        "concurrency": run.concurrency,
        "requests": len(records),
        "errors": sum(not r.ok for r in records),
        "wall_s": round(run.wall_s, 3),
        "ttft_p50_ms_by_turn": {str(turn): round(1000 * statistics.median(values), 1)
                                for turn, values in sorted(by_turn.items())},
        "ttft_p50_ms": round(1000 * statistics.median([v for vs in by_turn.values() for v in vs]), 1) if by_turn else None,
        "completion_tokens": sum(r.completion_tokens for r in records),
        "prompt_tokens": sum(r.prompt_tokens or 0 for r in reported) or None,
        "cached_share": (round(sum(r.cached_tokens for r in reported) / sum(r.prompt_tokens for r in reported), 3)
                         if reported else None),
    }
