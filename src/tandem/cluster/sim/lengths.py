"""Prompt and output lengths in tokens: fixed, drawn from observed lengths, or recorded (the
lengths a measured run sent, request by request, so a simulation can replay that run).

`workload_prompt_lengths` estimates the prompt lengths of a benchmark workload (JSONL, see
bench/workload.py) without a tokenizer, at CHARS_PER_TOKEN characters per token plus a chat
template's framing; an estimate, named as such wherever it is used.
"""

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

CHARS_PER_TOKEN = 4.0  # English text under a BPE tokenizer, roughly
TEMPLATE_TOKENS = 10  # role markers of a chat template, per message


class LengthModel(Protocol):
    def draw(self, rng: np.random.Generator, index: int) -> int:
        """The length for the index-th request (models that sample use rng, in request order)."""
        ...


def _check_lengths(values: tuple[int, ...], kind: str) -> None:
    if not values:
        raise ValueError(f"{kind} lengths need at least one value")
    if min(values) < 1:
        raise ValueError(f"lengths must be >= 1 token, got {min(values)}")


@dataclass(frozen=True, slots=True)
class FixedLength:
    tokens: int

    def __post_init__(self):
        if self.tokens < 1:
            raise ValueError(f"a length must be >= 1 token, got {self.tokens}")

    def draw(self, rng: np.random.Generator, index: int) -> int:
        return self.tokens


@dataclass(frozen=True, slots=True)
class EmpiricalLengths:
    values: tuple[int, ...]

    def __post_init__(self):
        _check_lengths(self.values, "empirical")

    def draw(self, rng: np.random.Generator, index: int) -> int:
        return self.values[int(rng.integers(len(self.values)))]


@dataclass(frozen=True, slots=True)
class RecordedLengths:
    """The i-th request gets values[i] (cycling past the end): no randomness."""

    values: tuple[int, ...]

    def __post_init__(self):
        _check_lengths(self.values, "recorded")

    def draw(self, rng: np.random.Generator, index: int) -> int:
        return self.values[index % len(self.values)]


def workload_prompt_lengths(path: str | Path) -> EmpiricalLengths:
    """Estimated prompt lengths of a JSONL workload (`messages` or `prompt` per line)."""
    lengths = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        record = json.loads(line)
        messages = record.get("messages") or [{"content": record.get("prompt", "")}]
        chars = sum(len(m.get("content", "")) for m in messages)
        lengths.append(max(1, round(chars / CHARS_PER_TOKEN) + TEMPLATE_TOKENS * len(messages)))
    return EmpiricalLengths(tuple(lengths))
