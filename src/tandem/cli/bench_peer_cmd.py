"""`tandem bench-peer PEER`: an in-process serving peer under bench-serve's closed-loop load."""

import argparse
import shlex
import sys
from pathlib import Path

from tandem.bench.serve.report import level_table, throughput_table
from tandem.bench.serve.settings import DEFAULT_CONCURRENCY, MIN_REQUESTS, REQUESTS_PER_CLIENT, parse_concurrency
from tandem.bench.workload import DEFAULT_WORKLOAD
from tandem.cli.int_list import thread_count
from tandem.models.catalog import DEFAULT_TARGET


def _transformers_cb(args: argparse.Namespace, command: str) -> dict:
    from tandem.bench.peers.transformers_cb import CbPeerSettings, run_peer_sweep

    settings = CbPeerSettings(
        model=args.model, concurrency=parse_concurrency(args.concurrency), prompts_file=Path(args.prompts),
        out_dir=Path(args.out), dtype=args.dtype, device=args.device, num_prompts=args.num_prompts,
        max_tokens=args.max_tokens, threads=args.threads, attn_implementation=args.attn,
        max_batch_tokens=args.max_batch_tokens, page_size=args.page_size, command=command,
    )
    return run_peer_sweep(settings)


PEERS = {"transformers-cb": _transformers_cb}  # name -> run(args, command) -> results dict


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "bench-peer", help="benchmark an in-process peer engine under closed-loop load",
        description="Runs bench-serve's closed loop (C requests in flight, the same requests per level) "
        "against an engine in this process: transformers-cb is transformers' own continuous batching "
        "(ContinuousBatchingManager) on Tandem's torch model folder. Writes results.json (bench-serve's "
        "shape) and report.md to --out.",
    )
    parser.add_argument("peer", choices=sorted(PEERS), help="which peer")
    parser.add_argument("--model", default=DEFAULT_TARGET,
                        help="catalog name, .gguf file or HF folder (default %(default)s)")
    parser.add_argument("--dtype", default="fp32", help="fp32 | bf16 | fp16 (default fp32)")
    parser.add_argument("--device", default="auto", help="torch device: cpu, cuda:0 ... (default: GPU if any)")
    parser.add_argument("--concurrency", default=DEFAULT_CONCURRENCY,
                        help=f"comma-separated in-flight request counts (default {DEFAULT_CONCURRENCY})")
    parser.add_argument("--prompts", default=str(DEFAULT_WORKLOAD),
                        help="JSONL workload: a file, or default (the 100 prompts) | long (long answers) | edits (whole-file edits)")
    parser.add_argument("--num-prompts", "--limit", dest="num_prompts", type=int, default=None,
                        help=f"requests per concurrency level (default max({MIN_REQUESTS}, "
                        f"{REQUESTS_PER_CLIENT} x C), as bench-serve)")
    parser.add_argument("--max-tokens", type=int, default=50, help="max new tokens per request (default 50)")
    parser.add_argument("--threads", type=thread_count, default=None, help="torch CPU threads (default: torch's, the machine's cores)")
    parser.add_argument("--attn", default="sdpa",
                        help="transformers' attn_implementation: sdpa, paged|eager or flash_attention_2 (default sdpa)")
    parser.add_argument("--max-batch-tokens", type=int, default=None,
                        help="tokens per forward step (default: transformers' 8192)")
    parser.add_argument("--page-size", type=int, default=256, help="tokens per KV cache page (default 256)")
    parser.add_argument("--out", default="bench-peer-results", help="output folder (default bench-peer-results)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    results = PEERS[args.peer](args, shlex.join(["tandem"] + sys.argv[1:]))
    lines = throughput_table(results)
    for level in results["levels"]:
        lines += [""] + level_table(results, level)
    print("\n".join(lines))
    print(f"\nwrote results.json and report.md to {args.out}", file=sys.stderr)
    return 0
