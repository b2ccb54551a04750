"""`tandem bench-serve`: concurrent streaming clients against OpenAI-compatible servers, side by side."""

import argparse
import shlex
import sys
from pathlib import Path

from tandem.bench.machine import machine_line
from tandem.bench.serve.report import throughput_table
from tandem.bench.serve.results import failed_runs
from tandem.bench.serve.server_kinds import DRAFTLESS_CONFIGS, SERVER_KINDS
from tandem.bench.serve.settings import (DEFAULT_CONCURRENCY, DEFAULT_CONFIGS, MIN_REQUESTS, REQUESTS_PER_CLIENT,
                                         ServeBenchSettings, parse_concurrency, parse_configs)
from tandem.bench.workload import DEFAULT_WORKLOAD
from tandem.cli.int_list import thread_count
from tandem.errors import TandemError
from tandem.models.catalog import CATALOG, DEFAULT_DRAFT, DEFAULT_TARGET, SHIPPED_DRAFT, default_draft

MULTITURN = "multiturn"  # not a JSONL file: bench/serve/conversations.py's scenarios


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "bench-serve", help="benchmark servers under concurrent streaming load",
        description="Starts each server once (the same target and threads), then at "
        "every concurrency level runs a closed loop of C streaming clients over the workload against each "
        "server in alternating order. Writes results.json, report.md, PNG plots and server logs to --out.",
    )
    parser.add_argument("--target", default=DEFAULT_TARGET, help="catalog name or .gguf file")
    parser.add_argument("--draft", default=None,
                        help=f"draft model for tandem-spec and llama-server-draft (default: as `tandem serve` picks by "
                        f"Tandem's draft backend: {DEFAULT_DRAFT} on llama.cpp, {SHIPPED_DRAFT} on torch)")
    parser.add_argument("--configs", default=DEFAULT_CONFIGS,
                        help=f"comma-separated; known: {', '.join(SERVER_KINDS)} (default {DEFAULT_CONFIGS})")
    parser.add_argument("--concurrency", default=None,  # None: not given (multiturn refuses any value)
                        help=f"comma-separated client counts (default {DEFAULT_CONCURRENCY})")
    parser.add_argument("--prompts", default=str(DEFAULT_WORKLOAD),
                        help="JSONL workload: a file, or default (the 100 prompts) | long (long answers) | edits (whole-file "
                        "edits: one small change, the rest copied) | "
                        "multiturn (conversations resending their history: chat, agent loops, a shared system "
                        "prompt; --concurrency and --num-prompts do not apply)")
    parser.add_argument("--num-prompts", type=int, default=None,
                        help=f"requests per concurrency level (default max({MIN_REQUESTS}, "
                        f"{REQUESTS_PER_CLIENT} x C))")
    parser.add_argument("--max-tokens", type=int, default=50, help="max new tokens per request (default 50)")
    parser.add_argument("--max-tokens-spread", type=int, default=0,
                        help="vary the cap per request: request i gets --max-tokens plus a fixed offset in [-N, N], "
                        "so answers in a closed loop do not all end in the same step (default 0)")
    parser.add_argument("--threads", type=thread_count, default=None, help="CPU threads per server and model (default: all)")
    parser.add_argument("--backend", default="llamacpp", choices=("llamacpp", "torch"),
                        help="Tandem's backend for target and draft (default llamacpp)")
    parser.add_argument("--draft-backend", default=None, choices=("llamacpp", "torch"),
                        help="Tandem's draft backend (default: as --backend)")
    parser.add_argument("--dtype", default="fp32", help="Tandem's torch dtype: fp32 | bf16 | fp16 (default fp32)")
    parser.add_argument("--out", default="bench-serve-results", help="output folder (default bench-serve-results)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from tandem.bench.serve.session import run_serve_bench

    if args.prompts == MULTITURN:
        given = [option for option, value in (("--num-prompts", args.num_prompts is not None),
                                               ("--concurrency", args.concurrency is not None)) if value]
        if given:
            raise TandemError(f"{' and '.join(given)} {'does' if len(given) == 1 else 'do'} not apply to --prompts multiturn: its scenarios set their "
                              "own users and turns")
        args.concurrency = "1"  # the levels' checks do not apply either

    draft = args.draft or default_draft(args.draft_backend or args.backend)
    configs = parse_configs(args.configs)
    drafting = [name for name in configs if SERVER_KINDS[name].needs_draft]
    if (drafting and args.draft is None and args.target in CATALOG
            and CATALOG[args.target].family != CATALOG[draft].family):  # its servers failed to start on it
        raise TandemError(f"{', '.join(drafting)} {'drafts' if len(drafting) == 1 else 'draft'} with the default draft {draft}, a {CATALOG[draft].family} "
                          f"model with another tokenizer than {args.target}'s: name a draft that shares it with "
                          f"--draft, or compare configs that draft without one ({DRAFTLESS_CONFIGS})")
    settings = ServeBenchSettings(
        target=args.target,
        draft=draft,
        configs=configs,
        concurrency=parse_concurrency(DEFAULT_CONCURRENCY if args.concurrency is None else args.concurrency),
        prompts_file=Path(args.prompts),
        out_dir=Path(args.out),
        num_prompts=args.num_prompts,
        max_tokens=args.max_tokens,
        max_tokens_spread=args.max_tokens_spread,
        threads=args.threads,
        command=shlex.join(["tandem"] + sys.argv[1:]),
        backend=args.backend,
        dtype=args.dtype,
        draft_backend=args.draft_backend,
    )
    if args.prompts == MULTITURN:
        from tandem.bench.serve.multiturn import multiturn_table, run_multiturn_bench

        results = run_multiturn_bench(settings)
        print(machine_line(results["machine"]))
        print("\n".join(multiturn_table(results)))
    else:
        results = run_serve_bench(settings)
        print(machine_line(results["machine"]))
        print("\n".join(throughput_table(results)))
    written = "results.json, report.md and server logs" if args.prompts == MULTITURN else \
        "results.json, report.md, plots and server logs"
    print(f"\nwrote {written} to {settings.out_dir}", file=sys.stderr)
    failed = failed_runs(results) if args.prompts != MULTITURN else []
    if failed:  # a table of zeros is no measurement: said, and the exit status says it too
        print(f"error: every request failed for {', '.join(failed)}: report.md quotes their errors", file=sys.stderr)
        return 1
    return 0
