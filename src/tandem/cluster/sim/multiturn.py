"""A measured multi-turn run, replayed: its conversations as a simulation's workload, and the
simulated TTFT by turn and placements held against the measured ones.

The run is the JSON that `scripts/measure_cluster_multiturn.py --out DIR` writes per scenario:

    {"concurrency": 10,                         # conversations open at once
     "max_running": 8,                          # the server's cap on requests in flight (optional)
     "max_tokens": 48,                          # each request's cap (optional; answers may stop before it)
     "ttft_p50_ms_by_turn": {"1": 31230, ...},  # measured
     "placements": {"verify-verify-0 prefix": 22, ...},  # the router's, "worker reason" -> requests
     "call_seconds": 118.3,                     # the replicas' model calls, summed (optional)
     "conversations": [                         # in the order the clients opened them
       [{"turn": 1, "ok": true, "prompt_tokens": 731, "completion_tokens": 48, "ttft_ms": 30112.4,
         "cached_tokens": 0}, ...], ...]}

A turn's new tokens are its prompt less the turn before's prompt and answer (the chat template's
few tokens around the answer count as new); a conversation is replayed up to its first failed
turn.
"""

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from tandem.cluster.sim.config import Workload
from tandem.cluster.sim.lengths import FixedLength, RecordedLengths
from tandem.cluster.sim.metrics import SimResult
from tandem.errors import TandemError


@dataclass(frozen=True, slots=True)
class MultiTurnRun:
    concurrency: int
    new_tokens: tuple[tuple[int, ...], ...]  # per conversation, per turn
    completion_tokens: tuple[int, ...]  # per turn, conversation by conversation
    ttft_p50_ms_by_turn: dict[str, float]
    placements: dict[str, int]  # reason -> requests, over the replicas
    max_running: int | None = None  # the server's cap on requests in flight, where recorded
    call_seconds: float | None = None  # the replicas' model calls during the run, summed, where recorded
    max_tokens: int | None = None  # each request's cap, where recorded (the router sees it, not the answer's end)

    @classmethod
    def load(cls, path: str | Path) -> "MultiTurnRun":
        try:
            data = json.loads(Path(path).read_text())
            return cls.from_json(data)
        except OSError as error:
            raise TandemError(f"cannot read the multi-turn run {path}: {error.strerror or error}") from None
        except KeyError as error:
            raise TandemError(f"{path} is not a multi-turn run (scripts/measure_cluster_multiturn.py --out): "
                              f"it has no {error.args[0]!r} field") from None
        except (ValueError, TypeError) as error:
            raise TandemError(f"{path} is not a multi-turn run (scripts/measure_cluster_multiturn.py --out): "
                              f"{error}") from None

    @classmethod
    def from_json(cls, data: dict) -> "MultiTurnRun":
        new_tokens, completions = [], []
        for turns in data["conversations"]:
            conversation, history = [], 0
            for turn in turns:
                if not turn["ok"]:
                    break
                prompt, answer = int(turn["prompt_tokens"]), int(turn["completion_tokens"])
                if prompt < 1 or answer < 1:
                    raise ValueError(f"a turn needs a positive prompt_tokens and completion_tokens, got {turn}")
                conversation.append(max(1, prompt - history))
                completions.append(answer)
                history = prompt + answer
            if conversation:
                new_tokens.append(tuple(conversation))
        if not new_tokens:
            raise ValueError("no conversation has a turn that succeeded")
        concurrency = int(data["concurrency"])
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency}")
        placements: Counter[str] = Counter()
        for key, count in data.get("placements", {}).items():
            placements[key.rsplit(" ", 1)[-1]] += int(count)  # "worker reason" -> reason
        max_running = data.get("max_running")
        if max_running is not None and int(max_running) < 1:
            raise ValueError(f"max_running must be >= 1, got {max_running}")
        call_seconds = data.get("call_seconds")
        if call_seconds is not None and float(call_seconds) <= 0:
            raise ValueError(f"call_seconds must be positive, got {call_seconds}")
        max_tokens = data.get("max_tokens")
        if max_tokens is not None and int(max_tokens) < max(completions):
            raise ValueError(f"max_tokens {max_tokens} is below an answer of {max(completions)} tokens")
        return cls(concurrency, tuple(new_tokens), tuple(completions),
                   {str(t): float(ms) for t, ms in data.get("ttft_p50_ms_by_turn", {}).items()}, dict(placements),
                   None if max_running is None else int(max_running),
                   None if call_seconds is None else float(call_seconds),
                   None if max_tokens is None else int(max_tokens))

    def workload(self, concurrency: int | None = None, prompt_prefixes: tuple = ()) -> Workload:
        """Every conversation as it ran: each turn's new tokens and answer length (and, where
        given, the opening every prompt shares: a system prompt)."""
        return Workload(len(self.completion_tokens), FixedLength(1), RecordedLengths(self.completion_tokens),
                        concurrency=concurrency or self.concurrency, prompt_prefixes=prompt_prefixes,
                        conversations=self.new_tokens, requested_tokens=self.max_tokens)


def compare_turns(result: SimResult, run: MultiTurnRun) -> dict:
    """TTFT p50 by turn, predicted against measured, and the placements by reason."""
    turns = {turn: {"predicted": result.ttft_ms_p50_by_turn[turn], "measured": measured,
                    "relative_error": round((result.ttft_ms_p50_by_turn[turn] - measured) / measured, 4)}
             for turn, measured in run.ttft_p50_ms_by_turn.items() if turn in result.ttft_ms_p50_by_turn and measured > 0}
    predicted = {**result.placements, **({"move": result.moves} if result.moves else {})}  # the router counts moves too
    return {"ttft_ms_p50_by_turn": turns, "placements": {"predicted": predicted, "measured": run.placements}}


def turn_lines(comparison: dict, heading: str = "against the multi-turn run:") -> list[str]:
    lines = [heading]
    for turn, figure in comparison["ttft_ms_p50_by_turn"].items():
        lines.append(f"  TTFT p50 turn {turn}  predicted {figure['predicted']:,.0f}  measured {figure['measured']:,.0f}"
                     f"  error {figure['relative_error']:+.1%}")
    placements = comparison["placements"]
    for side in ("predicted", "measured"):
        lines.append(f"  placements {side:9s} " + ", ".join(f"{r} {n}" for r, n in sorted(placements[side].items())))
    at_speed = comparison.get("at_run_speed")
    if at_speed:
        lines.extend(turn_lines(at_speed, f"at the run's device speed (its calls took {at_speed['device_speed']:.2f}x "
                                          "the time simulated above):"))
    return lines
