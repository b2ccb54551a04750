"""`tandem bench-step`: the fused torch runner's step cost by batch size, its overhead beyond the
model's forward, and one-token decode against the memory floor; or the llama.cpp batch runner's
step cost with and without its call layout (see bench/step.py)."""

import argparse
import json
import sys
from pathlib import Path

from tandem.bench.machine import machine_info, machine_line
from tandem.cli.given import StoreGiven, given_options
from tandem.cli.int_list import int_list, thread_count, whole_number
from tandem.errors import TandemError
from tandem.models.catalog import DEFAULT_TARGET
from tandem.models.llamacpp_batch_runner import MAX_SEQUENCES


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "bench-step", help="time batched steps by batch size (torch: overhead, memory floor; llama.cpp: call layout)",
        description="Time one runner's batched steps: for each batch size and tokens per slot, the fastest of "
                    "--repeats calls over slots holding --context cached tokens, split into the model's time and "
                    "the runner's overhead (torch also prints the memory floor of one decode). Prints a table "
                    "with the machine it ran on; --out keeps it as JSON.")
    parser.register("action", None, StoreGiven)  # --dtype given for llama.cpp is refused, not ignored
    parser.add_argument("--model", default=DEFAULT_TARGET, help="catalog name or HF folder (default %(default)s)")
    parser.add_argument("--backend", choices=["torch", "llamacpp"], default="torch",
                        help="torch: the fused runner (default); llamacpp: the llama.cpp batch runner")
    parser.add_argument("--device", default="cpu", help="torch device: cpu, cuda:0, ... (default cpu)")
    parser.add_argument("--dtype", default="bf16", help="fp32 | bf16 | fp16 (default bf16)")
    parser.add_argument("--batches", type=int_list(1, MAX_SEQUENCES), default="1,2,4,8,16",
                        help=f"slots per step, each at most {MAX_SEQUENCES} (default 1,2,4,8,16)")
    parser.add_argument("--tokens", type=int_list(), default="1,5",
                        help="new tokens per slot (default 1,5: decode, k=4 verify)")
    parser.add_argument("--context", type=whole_number(0), default=200, help="cached tokens per slot (default 200)")
    parser.add_argument("--repeats", type=whole_number(1), default=3, help="timed calls per point, the fastest kept (default 3)")
    parser.add_argument("--serial", action="store_true",
                        help="also time the serial runner (torch: transformers; llamacpp: all slots in one call)")
    parser.add_argument("--threads", type=thread_count, default=None, help="CPU threads (default: all)")
    parser.add_argument("--out", default=None, help="write the figures as JSON here")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from tandem.progress import ProgressBar

    from tandem.bench.out_dir import check_out_file
    from tandem.bench.step import (STEP_CONTEXT, fill_slots, load_llamacpp_runners, load_runners, memory_bandwidth,
                                   time_step)

    batches, tokens = args.batches, args.tokens
    if args.out:
        check_out_file(Path(args.out))  # before the timing, not after it
    if args.backend == "llamacpp" and args.device != "cpu":
        raise TandemError("--backend llamacpp runs on the CPU; --device is for the torch runner")
    if args.backend == "llamacpp" and "dtype" in given_options(args):
        raise TandemError(f"--dtype {args.dtype} is for the torch runner: llama.cpp reads the GGUF file's own precision")
    needed = args.context + max(tokens)
    context_length = max(STEP_CONTEXT, needed)
    if args.backend == "llamacpp":
        runners = load_llamacpp_runners(args.model, max(batches), args.threads, args.serial, context_length)
    else:
        runners = load_runners(args.model, args.device, args.dtype, max(batches), args.threads, args.serial,
                               context_length)
    limit = min(runner.context_length for runner in runners.values())
    if needed > limit:  # before the timing (llama.cpp failed deep into it, naming neither)
        raise TandemError(f"--context {args.context} plus {max(tokens)} tokens is beyond the {limit} tokens a "
                          f"sequence of this model may hold (what it was trained on)")
    for label, runner in runners.items():  # every slot holds --context plus the new tokens at once
        pool, block = getattr(runner, "pool_tokens", None), getattr(runner, "pool_block", 16)
        wanted = max(batches) * -(-needed // block) * block  # in whole pages (16 tokens in the paged pool)
        if pool is not None and wanted > pool:
            raise TandemError(f"{max(batches)} slots of --context {args.context} plus {max(tokens)} tokens need "
                              f"{wanted:,} KV cells; the {label} runner's pool holds {pool:,}: lower --batches "
                              "or --context")
    timings = []
    interrupted = False
    try:
        with ProgressBar(total=len(batches) * len(tokens) * len(runners), desc="steps", file=sys.stderr) as bar:
            for batch in batches:
                for runner in runners.values():
                    fill_slots(runner, batch, args.context)
                for count in tokens:
                    for label, runner in runners.items():
                        timings.append(time_step(runner, label, batch, count, args.repeats))
                        bar.update()
    except KeyboardInterrupt:  # Ctrl-C: the points timed so far are shown and written, then exit 130
        if not timings:
            raise
        interrupted = True
    machine = machine_info()  # a figure is read with the machine it came from
    figures: dict = {"command": sys.argv, "machine": machine, **({"interrupted": True} if interrupted else {})}
    print(machine_line(machine))
    if "fused" in runners:
        fused = runners["fused"]
        bandwidth = memory_bandwidth(fused.device)
        floor_ms = fused.decoder.decode_bytes / bandwidth * 1000
        print(f"weights read per decode: {fused.decoder.decode_bytes / 2**20:.0f} MiB; bandwidth {bandwidth / 1e9:.1f} GB/s;"
              f" memory floor of one decode: {floor_ms:.1f} ms")
        figures.update(bandwidth_bytes_s=bandwidth, decode_bytes=fused.decoder.decode_bytes, floor_ms=floor_ms)
    print(f"{'runner':8} {'B':>3} {'tok/slot':>8} {'step ms':>9} {'model ms':>9} {'overhead':>9} {'ms/token':>9}")
    for t in timings:
        model = f"{t.model_ms:9.1f}" if t.model_ms is not None else f"{'-':>9}"
        over = f"{t.overhead_ms:9.1f}" if t.overhead_ms is not None else f"{'-':>9}"
        print(f"{t.runner:8} {t.batch:3d} {t.tokens_per_slot:8d} {t.step_ms:9.1f} {model} {over} "
              f"{t.step_ms / (t.batch * t.tokens_per_slot):9.1f}")
    if args.out:
        Path(args.out).write_text(json.dumps({**figures, "timings": [t.as_dict() for t in timings]}, indent=1))
    if interrupted:
        print(f"interrupted: {len(timings)} points timed", file=sys.stderr)
        return 130
    return 0
