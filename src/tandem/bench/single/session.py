"""One benchmark run from settings to files: load prompts, format them once with the target's
chat template, load every configuration's models once, warm up, run, write the results.

Outputs under `out_dir`: results.json, report.md, speedup.png, acceptance_by_position.png,
latency.png.
"""

import json
import sys
from dataclasses import dataclass
from pathlib import Path

from tandem.bench.single.harness import FormattedPrompt, run_benchmark, warm_up
from tandem.bench.machine import machine_info
from tandem.bench.out_dir import prepare_out_dir
from tandem.bench.single.memory import PeakMemory
from tandem.bench.single.models import BenchModels, ModelChoice
from tandem.bench.single.plots import write_plots
from tandem.bench.single.registry import build_configs, parse_config_names, setup_all
from tandem.bench.single.report import render_report
from tandem.bench.single.results import build_results
from tandem.bench.workload import (WARMUP_PROMPTS, BenchPrompt, format_prompt, load_prompts, recorded_prompts_file,
                                   select_prompts)
from tandem.errors import TandemError


@dataclass(frozen=True, slots=True)
class BenchSettings:
    models: ModelChoice
    configs: str  # the --configs text: "none,hybrid:k=4,llamacpp-plain"
    prompts_file: Path
    out_dir: Path
    max_tokens: int = 50
    limit: int | None = None
    per_category: int | None = None
    warmup: int = 1
    command: str = "tandem bench"

    def __post_init__(self):
        if self.max_tokens < 1:
            raise TandemError(f"--max-tokens must be a positive integer, got {self.max_tokens}")
        if self.warmup < 0:
            raise TandemError(f"--warmup must be 0 or more, got {self.warmup}")


def run_session(settings: BenchSettings) -> dict:
    specs = parse_config_names(settings.configs)
    prompts = select_prompts(load_prompts(settings.prompts_file), settings.limit, settings.per_category)
    models = BenchModels(settings.models)
    configs = build_configs(specs, models)
    if any(config.uses_draft_model for config in configs):
        models.check_draft_vocabulary()  # transformers' assisted generation would die on it mid-run
    items = [FormattedPrompt(p, format_prompt(models.tokenizer, p)) for p in prompts]
    _check_lengths(items, settings.models.target.context_length, settings.prompts_file)
    prepare_out_dir(settings.out_dir)  # fail before the long part, not after
    warmups = [FormattedPrompt(p, format_prompt(models.tokenizer, p)) for p in warmup_prompts(settings.warmup)]
    print(f"loading models for {len(configs)} configs...", file=sys.stderr)
    setup_all(configs)
    with PeakMemory() as memory:
        warm_up(configs, warmups, settings.max_tokens)
        records, interrupted = run_benchmark(configs, items, settings.max_tokens, memory)
    uses_draft = any(config.uses_draft_model for config in configs)
    header = {**_header(settings, len(items), uses_draft), "cost_curves_ms": models.cost_curves()}
    if interrupted:
        header["interrupted_after_prompts"] = min(len(runs) for runs in records.values())
    results = build_results(configs, records, memory, header)
    write_outputs(results, settings.out_dir)
    return results


def _check_lengths(items: list[FormattedPrompt], context_length: int, prompts_file) -> None:
    """Every prompt leaves room for an answer in the target's context, checked before the models load
    (the engine refused it only after loading and profiling them)."""
    for item in items:
        if len(item.token_ids) >= context_length:
            raise TandemError(f"prompt {item.prompt.id!r} of {prompts_file} has {len(item.token_ids)} tokens but "
                              f"the target's context holds {context_length}: shorten it or leave it out")


def warmup_prompts(count: int) -> list[BenchPrompt]:
    """`count` warm-up prompts, none of them in a workload (WARMUP_PROMPTS in turn)."""
    return [BenchPrompt(f"warm-up-{i}", "warm-up", prompt=WARMUP_PROMPTS[i % len(WARMUP_PROMPTS)])
            for i in range(count)]


def _header(settings: BenchSettings, prompt_count: int, uses_draft: bool) -> dict:
    """uses_draft: some config drafts with the draft model (else the report names none)."""
    choice = settings.models
    return {
        "command": settings.command,
        "settings": {
            "prompts_file": recorded_prompts_file(settings.prompts_file),
            "prompts": prompt_count,
            "max_tokens": settings.max_tokens,
            "warmup": settings.warmup,
            "configs": settings.configs,
            "target": choice.target.resolved().describe(),
            "draft": choice.draft.resolved().describe() if uses_draft else None,
            "default_k": str(choice.k),
            "threads": choice.cpu_threads,
        },
        "machine": machine_info(),
    }


def write_outputs(results: dict, out_dir: Path) -> None:
    (out_dir / "results.json").write_text(json.dumps(results, indent=1))
    (out_dir / "report.md").write_text(render_report(results))
    write_plots(results, out_dir)
