"""What a benchmark configuration is: one way of producing a greedy continuation of token ids.

`setup()` loads what the configuration needs (through the shared `BenchModels`, so models are
loaded once per run); `run(prompt_ids, max_tokens)` returns the new token ids, stopped at the
target tokenizer's stop ids (not included), and a stats dict. Tandem configurations fill the stats
with draft/verify seconds and acceptance counts; peers may leave it empty. The harness times
`run` from the call to its return, so prompt processing is included and model loading is not.
"""

from dataclasses import dataclass
from typing import Protocol, Sequence

from tandem.bench.single.models import BenchModels


@dataclass(frozen=True, slots=True)
class ConfigSpec:
    """A parsed `--configs` entry: `hybrid:k=4` -> kind "hybrid", options {"k": "4"}."""

    kind: str
    options: tuple[tuple[str, str], ...] = ()

    @property
    def label(self) -> str:
        return ":".join([self.kind] + [f"{key}={value}" for key, value in self.options])

    def option(self, key: str, default: str | None = None) -> str | None:
        return dict(self.options).get(key, default)


class BenchConfig(Protocol):
    label: str
    is_peer: bool  # another engine (llama.cpp, transformers), not Tandem
    setup_rank: int  # lower sets up first: Tandem runners load before peers that may reuse them
    uses_draft_model: bool  # drafts with the draft model, so needs the target's tokenizer

    def setup(self) -> None: ...

    def run(self, prompt_ids: Sequence[int], max_tokens: int) -> tuple[list[int], dict]: ...


class ConfigFactory(Protocol):
    OPTIONS: tuple[str, ...]  # the option keys the suffix may set

    def __call__(self, spec: ConfigSpec, models: BenchModels) -> BenchConfig: ...
