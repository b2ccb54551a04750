"""One serving benchmark from settings to files: check the input, plan the requests of every
concurrency level, run the sweep, write the outputs.

Everything the user could get wrong (config names, concurrency list, models, prompts file, output
folder) is checked before any server starts. Outputs under `out_dir`: results.json, report.md,
throughput.png, ttft.png, itl.png, and logs/<config>.log (each server's stdout and stderr).
"""

import json
import os
import sys
from pathlib import Path

from tandem.bench.machine import machine_info
from tandem.bench.serve.plots import write_plots
from tandem.bench.serve.report import render_report
from tandem.bench.serve.requests import level_requests, repeats
from tandem.bench.serve.results import build_results
from tandem.bench.serve.server_kinds import DRAFTLESS_CONFIGS, SERVER_KINDS, ServerLaunch
from tandem.bench.serve.settings import ServeBenchSettings
from tandem.bench.serve.sweep import LevelPlan, SweepOutcome, run_sweep
from tandem.bench.out_dir import prepare_out_dir
from tandem.bench.workload import load_prompts, recorded_prompts_file
from tandem.errors import InterruptSaid
from tandem.models.backends import RunnerSpec
from tandem.models.resolve import gguf_path, tokenizer_path
from tandem.text.tokenizer import TextTokenizer, check_same_vocabulary

LOG_FOLDER = "logs"


def plan_levels(settings: ServeBenchSettings, prompts: list) -> list[LevelPlan]:
    """Each level takes the next requests of the interleaved workload (see `requests`)."""
    plans, offset = [], 0
    for concurrency in settings.concurrency:
        count = settings.requests_at(concurrency)
        plans.append(LevelPlan(concurrency, tuple(level_requests(prompts, count, offset, settings.max_tokens_spread))))
        offset += count
    for plan in plans:
        if repeats(plan.requests):
            print(f"note: at C={plan.concurrency}, {repeats(plan.requests)} of {len(plan.requests)} requests take "
                  f"a prompt again (the workload has {len(prompts)}, the sweep takes {offset}). Each is marked, "
                  "so no cache answers it, but its greedy answer is the earlier one, which Tandem's shared "
                  "n-gram store and suffix index draft from: for figures without that, take fewer requests "
                  "(--num-prompts, fewer levels) or a larger workload", file=sys.stderr)
    return plans


def server_launch(settings: ServeBenchSettings, kinds: list) -> ServerLaunch:
    """Resolve the models (pulling catalog ones if needed); raises TandemError if one is missing."""
    target_gguf = gguf_path(settings.target)
    drafting = [kind.label for kind in kinds if kind.needs_draft]
    draft_gguf = gguf_path(settings.draft) if drafting else None
    if drafting:  # a draft given as a file is checked too, before any server starts (it failed to start on it)
        check_same_vocabulary(TextTokenizer(str(tokenizer_path(settings.target))),
                              TextTokenizer(str(tokenizer_path(settings.draft))),
                              f"leave {', '.join(drafting)} out of --configs: {DRAFTLESS_CONFIGS} draft without one")
    return ServerLaunch(
        target=settings.target,
        draft=settings.draft,
        target_gguf=str(target_gguf),
        draft_gguf=None if draft_gguf is None else str(draft_gguf),
        threads=settings.threads or os.cpu_count() or 1,
        max_running=max(settings.concurrency),
        context_length=RunnerSpec(settings.target).context_length,  # Tandem's default context
        backend=settings.backend,
        dtype=settings.dtype,
        draft_backend=settings.draft_backend,
    )


def run_serve_bench(settings: ServeBenchSettings, progress: bool = True) -> dict:
    kinds = [SERVER_KINDS[name]() for name in settings.configs]
    prompts = load_prompts(settings.prompts_file)
    launch = server_launch(settings, kinds)
    for kind in kinds:  # a peer binary never built is an error now, not after the servers before it ran
        kind.command(launch, 0)
    prepare_out_dir(settings.out_dir)
    plans = plan_levels(settings, prompts)
    outcome = SweepOutcome()
    try:
        run_sweep(kinds, launch, plans, settings.max_tokens, settings.out_dir / LOG_FOLDER, progress, outcome=outcome)
    except KeyboardInterrupt:
        if outcome.results:  # the levels every server finished are kept (an interrupt lost the whole sweep)
            write_outputs(build_results(outcome, header(settings, launch, plans)) | {"interrupted": True},
                          settings.out_dir)
            print(f"\ninterrupted: wrote the finished levels (C={', '.join(map(str, sorted(outcome.results)))}) "
                  f"to {settings.out_dir}", file=sys.stderr)
        else:
            print(f"\ninterrupted before any level finished: no results written (the servers' logs are in "
                  f"{settings.out_dir / LOG_FOLDER})", file=sys.stderr)
        raise InterruptSaid() from None
    results = build_results(outcome, header(settings, launch, plans))
    write_outputs(results, settings.out_dir)
    return results


def header(settings: ServeBenchSettings, launch: ServerLaunch, plans: list[LevelPlan]) -> dict:
    return {
        "command": settings.command,
        "settings": {
            "target": settings.target,
            "draft": settings.draft,
            "target_gguf": launch.target_gguf,
            "configs": list(settings.configs),
            "concurrency": list(settings.concurrency),
            "prompts_file": recorded_prompts_file(settings.prompts_file),
            "requests_per_level": {str(plan.concurrency): len(plan.requests) for plan in plans},
            "repeats_per_level": {str(plan.concurrency): repeats(plan.requests) for plan in plans},
            "max_tokens": settings.max_tokens,
            "max_tokens_spread": settings.max_tokens_spread,
            "threads": launch.threads,
            "context_length": launch.context_length,
            "backend": launch.backend,
            "dtype": launch.dtype,
            "draft_backend": launch.draft_backend or launch.backend,
        },
        "machine": machine_info(),
    }


def write_outputs(results: dict, out_dir: Path) -> None:
    (out_dir / "results.json").write_text(json.dumps(results, indent=1))
    (out_dir / "report.md").write_text(render_report(results))
    write_plots(results, out_dir)
