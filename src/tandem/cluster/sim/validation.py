"""Holding a prediction against a measured run: relative errors for throughput and p50 latency.

A measured run is a JSON object. Either Tandem's own form:

    {"throughput_tok_s": 41.2,        # completion tokens / wall time of the run   (required)
     "latency_ms_p50": 3120.0,        # request latency, send to last token, p50   (required)
     "ttft_ms_p50": 410.0,            # optional
     "itl_ms_p50": 95.0,              # optional
     "call_seconds": 126.4,           # optional: the workers' calls' wall time, summed
     "prompt_tokens": [212, 98, ...], # optional: each request's prompt length, in the order sent
     "prompt_prefixes": [[0, 24], null, ...],  # optional: per request, [group, tokens] of the
                                      # opening it shares with other prompts, or null
     "scored_tokens": 7127,           # optional: tokens the replicas' verify calls scored
     "concurrency": 4, "requests": 32, "max_tokens": 128,   # optional: what was run
     "completion_tokens": 4096,       # optional: tokens answered in all
     "note": "2 verifiers + 1 drafter, Ray on one machine"}  # optional

or one concurrency level's figures from `tandem bench-serve` results.json (the same keys,
except that request latency is `e2e_s_p50` in seconds, which is converted). The run's setup
(cluster file, concurrency, requests, max tokens, acceptance) should be simulated as it ran:
`tandem simulate --measured` takes the requests, concurrency and answer length the run records
(`MeasuredRun.answer_tokens` for the length) where it is not told them, and says where it is told otherwise;
`compare_with_measurement` then says whether the prediction is within TOLERANCE.

A profile is measured at another time than the run, and a VM's speed drifts between the two
(the 2-core VMs here: 10-20% over minutes). Where the run gives `call_seconds` (`tandem
bench-cluster` writes it), `run_speed` says how much longer its workers' calls took than the
simulation had them take; simulated again with every device that much slower, what is left of
the error is the simulator's model of the step, the router and the network, not the drift.
"""

import json
from dataclasses import dataclass
from pathlib import Path

from tandem.cluster.sim.metrics import SimResult
from tandem.errors import TandemError

TOLERANCE = 0.15  # the bar: prediction within 15% of the measurement


@dataclass(frozen=True, slots=True)
class MeasuredRun:
    throughput_tok_s: float
    latency_ms_p50: float
    ttft_ms_p50: float | None = None
    itl_ms_p50: float | None = None
    prompt_tokens: tuple[int, ...] = ()  # each request's prompt length in the order sent (bench-cluster)
    call_seconds: float | None = None  # the workers' calls' wall time, summed over the run (bench-cluster)
    prompt_prefixes: tuple[tuple[int, int] | None, ...] = ()  # per request: (group, tokens) it shares (bench-cluster)
    scored_tokens: int | None = None  # tokens the replicas' verify calls scored (bench-cluster)
    requests: int | None = None  # what was run, where the file says
    concurrency: int | None = None
    max_tokens: int | None = None
    completion_tokens: int | None = None

    def __post_init__(self):
        if self.throughput_tok_s <= 0 or self.latency_ms_p50 <= 0:
            raise TandemError("a measured run needs a positive throughput_tok_s and latency_ms_p50")
        if self.call_seconds is not None and self.call_seconds <= 0:
            raise TandemError("a measured run's call_seconds must be positive")
        if self.scored_tokens is not None and self.scored_tokens < 0:
            raise TandemError("a measured run's scored_tokens must be >= 0")
        for name in ("requests", "concurrency", "max_tokens"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise TandemError(f"a measured run's {name} must be at least 1")
        if self.completion_tokens is not None and self.completion_tokens < 0:
            raise TandemError("a measured run's completion_tokens must be >= 0")
        if any(p is not None and p[1] < 0 for p in self.prompt_prefixes):
            raise TandemError("a measured run's prompt_prefixes must not be negative")
        if self.prompt_prefixes and len(self.prompt_prefixes) != len(self.prompt_tokens):
            raise TandemError("a measured run's prompt_prefixes must give one entry per prompt_tokens entry")

    @classmethod
    def from_json(cls, data: dict) -> "MeasuredRun":
        if not isinstance(data, dict):
            raise TandemError(f"a measured run is a JSON object, got {type(data).__name__}")
        try:
            return cls._from_object(data)
        except (TypeError, ValueError):
            raise TandemError("a measured run's figures must be numbers") from None

    @classmethod
    def _from_object(cls, data: dict) -> "MeasuredRun":
        latency = data.get("latency_ms_p50")
        if latency is None and data.get("e2e_s_p50") is not None:
            latency = 1000.0 * float(data["e2e_s_p50"])
        if data.get("throughput_tok_s") is None or latency is None:
            raise TandemError("a measured run needs throughput_tok_s and latency_ms_p50 (or e2e_s_p50)")
        optional = {key: float(data[key]) for key in ("ttft_ms_p50", "itl_ms_p50", "call_seconds")
                    if data.get(key) is not None}
        try:
            prompts = tuple(int(n) for n in data.get("prompt_tokens") or ())
            prefixes = tuple(_prefix(p) for p in data.get("prompt_prefixes") or ())
        except (TypeError, ValueError, IndexError, KeyError):
            raise TandemError("a measured run's prompt_tokens must be a list of token counts, its prompt_prefixes "
                              "of [group, tokens] pairs or null") from None
        counts = {key: int(data[key]) for key in ("scored_tokens", "requests", "concurrency", "max_tokens",
                                                  "completion_tokens") if data.get(key) is not None}
        return cls(float(data["throughput_tok_s"]), float(latency), **optional, prompt_tokens=prompts,
                   prompt_prefixes=prefixes, **counts)

    def answer_tokens(self) -> int | None:
        """Tokens a request answered: the mean answer (completion tokens over requests, at
        least 1; answers may stop before max_tokens), else max_tokens, else None."""
        if self.completion_tokens is not None and self.requests:
            return max(1, round(self.completion_tokens / self.requests))
        return self.max_tokens

    @classmethod
    def load(cls, path: str | Path) -> "MeasuredRun":
        try:
            return cls.from_json(json.loads(Path(path).read_text()))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
            said = error.strerror if isinstance(error, OSError) and error.strerror else error
            raise TandemError(f"cannot read the measured run {path}: {said}") from None


def _prefix(entry) -> tuple[int, int] | None:
    if entry is None:
        return None
    if len(entry) != 2:
        raise ValueError("a prompt prefix is [group, tokens]")
    return int(entry[0]), int(entry[1])


def run_speed(predicted: SimResult, call_seconds: float) -> float:
    """How many times the simulated devices' computing time the run's calls took: the factor that
    makes every device of a second simulation run at the run's speed."""
    computing_s = sum(u * predicted.duration_s for u in predicted.utilisation.values())
    if computing_s <= 0:
        raise TandemError("the simulation computed nothing: there is no device speed to compare")
    return call_seconds / computing_s


def compare_with_measurement(predicted: SimResult, measured: MeasuredRun | dict) -> dict:
    """Relative error (predicted - measured) / measured per figure, and whether throughput and
    p50 latency are both within TOLERANCE."""
    if isinstance(measured, dict):
        measured = MeasuredRun.from_json(measured)
    pairs = {
        "throughput_tok_s": (predicted.throughput_tok_s, measured.throughput_tok_s),
        "latency_ms_p50": (predicted.latency_ms["p50"], measured.latency_ms_p50),
        "ttft_ms_p50": (predicted.ttft_ms["p50"], measured.ttft_ms_p50),
        "itl_ms_p50": (predicted.itl_ms["p50"], measured.itl_ms_p50),
    }
    if measured.scored_tokens:  # the work done: tells a wrong speed from a wrong amount of work
        pairs["scored_tokens"] = (predicted.scored_tokens, measured.scored_tokens)
    figures = {name: {"predicted": p, "measured": m, "relative_error": round((p - m) / m, 4)}
               for name, (p, m) in pairs.items() if m is not None}
    checked = ("throughput_tok_s", "latency_ms_p50")
    return {"figures": figures, "tolerance": TOLERANCE,
            "within_tolerance": all(abs(figures[name]["relative_error"]) <= TOLERANCE for name in checked)}
