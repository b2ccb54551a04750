"""`tandem bench`: run configurations side by side on the same prompts and write a report."""

import argparse
import shlex
import sys
from pathlib import Path

from tandem.bench.single.models import ModelChoice
from tandem.bench.single.registry import CONFIGS, parse_config_names
from tandem.bench.machine import machine_line
from tandem.bench.single.report import main_table
from tandem.bench.single.session import BenchSettings, run_session
from tandem.bench.workload import DEFAULT_WORKLOAD
from tandem.cli.options import (add_model_options, check_default_draft_fits, check_max_tokens_fit,
                                check_model_names, draft_spec, engine_prefill_floor, target_spec)
from tandem.engine.step_budget import THROUGHPUT_PREFILL_FLOOR

DEFAULT_CONFIGS = "none,ngram,model,hybrid,llamacpp-plain"


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "bench", help="benchmark drafters and peer engines side by side",
        description="Greedy decoding of every prompt by every config in one process, config order "
        "alternating per prompt. Writes results.json, report.md and PNG plots to --out. --drafter "
        "is ignored here: configs name their drafters.",
    )
    add_model_options(parser)
    parser.add_argument("--prompts", default=str(DEFAULT_WORKLOAD),
                        help="JSONL workload: a file, or default (the 100 prompts) | long (long answers) | edits (whole-file edits)")
    parser.add_argument("--configs", default=DEFAULT_CONFIGS,
                        help=f"comma-separated, with optional :k=N|auto suffix; known: {', '.join(CONFIGS)} "
                        f"(default {DEFAULT_CONFIGS})")
    parser.add_argument("--max-tokens", type=int, default=50, help="new tokens per prompt (default 50)")
    parser.add_argument("--limit", type=int, default=None, help="only the first N prompts")
    parser.add_argument("--per-category", type=int, default=None, help="only the first N of each category")
    parser.add_argument("--warmup", type=int, default=1, help="untimed warm-up prompts (default 1)")
    parser.add_argument("--out", default="bench-results", help="output folder (default bench-results)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    check_max_tokens_fit(args)
    check_models(args)
    settings = BenchSettings(
        models=model_choice(args),
        configs=args.configs,
        prompts_file=Path(args.prompts),
        out_dir=Path(args.out),
        max_tokens=args.max_tokens,
        limit=args.limit,
        per_category=args.per_category,
        warmup=args.warmup,
        command=shlex.join(["tandem"] + sys.argv[1:]),
    )
    results = run_session(settings)
    print(machine_line(results["machine"]))
    print("\n".join(main_table(results)))
    print(f"\nwrote results.json, report.md and plots to {settings.out_dir}", file=sys.stderr)
    return 130 if "interrupted_after_prompts" in results else 0  # a Ctrl-C's finished part, written


def check_models(args: argparse.Namespace) -> None:
    """The models, checked before any is pulled: both names, and the default draft where a config
    drafts with it (the target and the ~470 MiB draft were pulled before its tokenizer was refused)."""
    check_model_names(args)
    with_model = [spec.label for spec in parse_config_names(args.configs) if CONFIGS[spec.kind].uses_draft_model]
    if with_model:
        who = f"{', '.join(with_model)} in --configs draft{'s' if len(with_model) == 1 else ''}"
        check_default_draft_fits(args, who, "leave them out of --configs (none, ngram and suffix draft without a model)")


def model_choice(args: argparse.Namespace) -> ModelChoice:
    return ModelChoice(target_spec(args), draft_spec(args), args.k, args.threads, args.step_tokens,
                       engine_prefill_floor(args.prefill_floor, THROUGHPUT_PREFILL_FLOOR), args.prefill_waves)
