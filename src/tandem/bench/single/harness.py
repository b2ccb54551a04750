"""The benchmark loop: every configuration on every prompt, side by side in one process.

The configuration order alternates per prompt (forward on even prompts, reversed on odd ones) so
that drift (thermal throttling, a neighbour's load, cache warmth) falls on every configuration
alike. Warm-up prompts run first, untimed and unrecorded.
"""

import sys
import time
from dataclasses import dataclass, field
from typing import Sequence

from tandem.bench.single.config_base import BenchConfig
from tandem.bench.single.memory import PeakMemory
from tandem.bench.workload import BenchPrompt
from tandem.progress import ProgressBar


@dataclass(frozen=True, slots=True)
class FormattedPrompt:
    prompt: BenchPrompt
    token_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class RunRecord:
    """One configuration on one prompt."""

    prompt_id: str
    category: str
    token_ids: tuple[int, ...]
    seconds: float  # from the request to the last token, prompt processing included
    stats: dict = field(default_factory=dict)

    @property
    def new_tokens(self) -> int:
        return len(self.token_ids)


def config_order(items: Sequence, prompt_index: int) -> list:
    """Forward on even prompt indices, reversed on odd ones."""
    return list(items) if prompt_index % 2 == 0 else list(reversed(items))


def timed_run(config: BenchConfig, item: FormattedPrompt, max_tokens: int) -> RunRecord:
    start = time.perf_counter()
    token_ids, stats = config.run(item.token_ids, max_tokens)
    seconds = time.perf_counter() - start
    return RunRecord(item.prompt.id, item.prompt.category, tuple(token_ids), seconds, stats)


def warm_up(configs: Sequence[BenchConfig], items: Sequence[FormattedPrompt], max_tokens: int) -> None:
    with ProgressBar(items, desc="warm-up", unit="prompt", file=sys.stderr, disable=not items) as progress:
        for item in progress:
            for config in configs:
                config.run(item.token_ids, max_tokens)


def run_benchmark(configs: Sequence[BenchConfig], items: Sequence[FormattedPrompt], max_tokens: int,
                  memory: PeakMemory) -> tuple[dict[str, list[RunRecord]], bool]:
    """Records per configuration label, in prompt order, and whether a Ctrl-C cut the run short:
    then the prompts every configuration finished are kept (a long run's finished part is not
    lost); before any, the interrupt goes on."""
    records: dict[str, list[RunRecord]] = {config.label: [] for config in configs}
    try:  # outside the bar, so that its end line says it stopped
        with ProgressBar(items, desc="bench", unit="prompt", file=sys.stderr) as progress:
            for index, item in enumerate(progress):
                for config in config_order(configs, index):
                    progress.set_postfix_str(f"{item.prompt.id} / {config.label}", refresh=True)
                    with memory.track(config.label):
                        records[config.label].append(timed_run(config, item, max_tokens))
    except KeyboardInterrupt:
        done = min(len(runs) for runs in records.values())
        if done == 0:
            raise
        print(f"\ninterrupted: keeping the {done} prompts every configuration finished", file=sys.stderr)
        return {label: runs[:done] for label, runs in records.items()}, True
    return records, False
