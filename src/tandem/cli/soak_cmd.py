"""`tandem soak`: a closed loop of C streaming clients for a fixed time against one server,
sampling its memory, file descriptors, threads and KV slots; exits 1 when a check fails."""

import argparse
import asyncio
import os
import re
import shlex
import sys
import time
from pathlib import Path

from tandem.bench.workload import DEFAULT_WORKLOAD
from tandem.cli.int_list import whole_number
from tandem.errors import InterruptSaid, TandemError
from tandem.models.catalog import DEFAULT_DRAFT, DEFAULT_TARGET, SHIPPED_DRAFT

DURATION = re.compile(r"^(\d+(?:\.\d+)?)\s*([smh]?)$")
UNIT_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600}


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "soak", help="hold a server under load for a long time and check it for leaks",
        description="Runs C streaming clients in a closed loop for --duration against `tandem serve` (started "
        "here with the model options below, or the server at --url), samples its /metrics every "
        "--sample-every (resident memory, open file descriptors, threads, KV slots held), then checks: no "
        "failed request, memory growth after warm-up under 5%, no KV slot held once idle, no descriptor "
        "or thread growth. Writes results.json, report.md and soak.png to --out; exits 1 if a check fails.")
    parser.add_argument("--url", default=None, help="soak this running server (its /v1 URL) instead of starting one")
    parser.add_argument("--api-key", type=lambda key: key.strip(),  # as serve takes it: a key file's newline dropped
                        default=(os.environ.get("TANDEM_API_KEY") or "").strip() or None,
                        help="the server's API key (default: $TANDEM_API_KEY)")
    parser.add_argument("--target", default=None, help=f"target model (default {DEFAULT_TARGET}; not with --url)")
    parser.add_argument("--draft", default=None,
                        help=f"draft model (default: `tandem serve`'s, by its draft backend: {DEFAULT_DRAFT} on "
                        f"llama.cpp, {SHIPPED_DRAFT} on torch; not with --url)")
    parser.add_argument("--serve-args", default="", help="more `tandem serve` options, one string; write it with = where it starts with a dash: "
                        "--serve-args='--protect-metrics --api-key K' (not with --url)")
    parser.add_argument("--concurrency", type=whole_number(1), default=8, help="clients (default 8)")
    parser.add_argument("--duration", default="30m", help="how long the load runs: 90s, 30m, 1h (default 30m)")
    parser.add_argument("--sample-every", default="60s", help="sampling period (default 60s)")
    parser.add_argument("--warmup", default=None,
                        help="memory growth is measured from the first sample after this (default: a tenth "
                        "of --duration, at least one sample period)")
    parser.add_argument("--max-tokens", type=whole_number(1), default=64, help="max new tokens per request (default 64)")
    parser.add_argument("--abandon-every", type=whole_number(0), default=10,
                        help="every n-th request hangs up after its first token; 0: none (default 10)")
    parser.add_argument("--prompts", default=str(DEFAULT_WORKLOAD),
                        help="JSONL workload: a file, or default (the 100 prompts) | long (long answers) | edits (whole-file edits)")
    parser.add_argument("--out", default="soak-out", help="output folder (default soak-out)")
    parser.set_defaults(func=run)


def parse_duration(option: str, text: str) -> float:
    match = DURATION.match(text.strip().lower())
    if not match or float(match.group(1)) <= 0:
        raise TandemError(f"{option} must be a positive duration such as 90s, 30m or 1h, got {text!r}")
    return float(match.group(1)) * UNIT_SECONDS[match.group(2)]


def run(args: argparse.Namespace) -> int:
    from tandem.bench.soak.report import results_json, write_outputs
    from tandem.bench.soak.run import SoakResult, SoakSettings, SoakTally, soak
    from tandem.bench.soak.server import started_server
    from tandem.bench.out_dir import prepare_out_dir
    from tandem.bench.soak.verdict import judge
    from tandem.bench.workload import load_prompts

    duration = parse_duration("--duration", args.duration)
    period = parse_duration("--sample-every", args.sample_every)
    warmup = parse_duration("--warmup", args.warmup) if args.warmup is not None else max(period, duration / 10)
    if period >= duration:
        raise TandemError(f"--sample-every {args.sample_every} leaves no second sample in --duration {args.duration}")
    if warmup >= duration:
        raise TandemError(f"--warmup {args.warmup} leaves nothing of --duration {args.duration} to measure")
    starting_options = [name for name, value in (("--target", args.target), ("--draft", args.draft),
                                                 ("--serve-args", args.serve_args)) if value]
    if args.url is not None and starting_options:
        verb = "start" if len(starting_options) > 1 else "starts"
        raise TandemError(f"{' and '.join(starting_options)} {verb} a server here, but --url soaks the server already "
                          f"there as it was started: give one or the other")
    args.target = args.target or DEFAULT_TARGET
    try:
        shlex.split(args.serve_args)
    except ValueError as error:
        raise TandemError(f"--serve-args cannot be split into options: {error}") from None
    prompts = tuple(load_prompts(args.prompts))
    out = Path(args.out)
    prepare_out_dir(out)  # before the soak, not after it
    command = shlex.join(["tandem"] + sys.argv[1:])
    tally, seen = SoakTally(), []
    with started_server(args, out) as (base_url, model, exit_note):
        settings = SoakSettings(base_url, model, prompts, args.concurrency, duration, period, args.max_tokens,
                                args.abandon_every, args.api_key)
        started = time.monotonic()
        try:
            result = asyncio.run(soak(settings, lambda sample: (seen.append(sample), _show(sample)), tally))
        except KeyboardInterrupt:
            if seen:  # a long soak's samples so far are kept, judged as what they are (no idle phase: not passed)
                part = SoakResult(settings, tuple(seen), tally, time.monotonic() - started)
                write_outputs(results_json(part, judge(seen, warmup), command) | {"interrupted": True}, out)
                print(f"\ninterrupted: wrote the {len(seen)} samples so far to {out}", file=sys.stderr)
                raise InterruptSaid() from None
            raise
        if tally.server_lost is not None:
            tally.server_lost = "; ".join(filter(None, [exit_note(), tally.server_lost]))
    checks = judge(list(result.samples), warmup, server_lost=tally.server_lost)
    results = results_json(result, checks, command)
    write_outputs(results, out)
    for check in checks:
        print(f"{'ok  ' if check.passed else 'FAIL'} {check.name}: {check.figure}")
    for message in result.tally.error_messages:
        print(f"  error: {message}", file=sys.stderr)
    print(f"wrote results.json, report.md and soak.png to {out}", file=sys.stderr)
    return 0 if results["passed"] else 1


def _show(sample) -> None:
    rss = "-" if sample.rss_bytes is None else f"{sample.rss_bytes / 2**20:.0f} MiB"
    print(f"[{sample.elapsed_s / 60:5.1f} min] {sample.phase}: {sample.requests_done} requests, {sample.errors} "
          f"errors, RSS {rss} (caches {_mib(sample.prompt_cache_bytes)} + {_mib(sample.drafting_memory_bytes)}), "
          f"fds {_n(sample.open_fds)}, threads {_n(sample.threads)}, KV slots {_n(sample.kv_slots_in_use)}",
          file=sys.stderr, flush=True)


def _mib(value) -> str:
    return "-" if value is None else f"{value / 2**20:.0f}"


def _n(value) -> str:
    return "-" if value is None else f"{value:.0f}"
