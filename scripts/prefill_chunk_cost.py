"""What one prompt costs fed in chunks of n tokens, alone or beside D decoding streams, on the
llama.cpp batch runner (no engine): each step scores one chunk (logits for its last token only
at the end) and one token per stream, as the engine's steps beside streams do. Prints, per chunk
size, the prompt's total time, its cost a prompt token and a step's time; the best of two passes.

    python scripts/prefill_chunk_cost.py --model qwen2.5-coder-1.5b-instruct --threads 2 \
        --prompt-tokens 192 --streams 3 --chunks 16,32,64,128,192

Beside D streams a step also commits D stream tokens: subtract D streams' decode step (the
`--chunks 1` row is one prompt token plus the streams) times the steps to read the prompt's own
cost.

`--prompt-tokens 182 --splits 125+57,91+91,182` times given pieces instead (each list summing
to the prompt's tokens): the floor's full chunk and its tail, equal shares, the whole prompt.
"""

import argparse
import time

from tandem.models.batch_runner import BatchItem
from tandem.models.llamacpp_batch_runner import LlamaCppBatchRunner
from tandem.models.resolve import gguf_path

STREAM_CONTEXT = 200  # cached tokens of each decoding stream before the prompt joins


def prompt_time_ms(runner: LlamaCppBatchRunner, prompt: tuple[int, ...], chunk: int | list[int],
                   streams: int) -> tuple[float, int]:
    """(ms to score prompt in chunks beside `streams` one-token rounds, steps taken). `chunk`: a
    size for every step, or each step's size."""
    pieces = chunk if isinstance(chunk, list) else [chunk] * -(-len(prompt) // chunk)
    runner.rollback(0, 0)
    for slot in range(1, streams + 1):
        runner.rollback(slot, 0)
        runner.forward_batch([BatchItem(slot, prompt[:STREAM_CONTEXT], 1)])
    start, steps = time.perf_counter(), 0
    offset = 0
    for size in pieces:
        last = offset + size >= len(prompt)
        items = [BatchItem(0, prompt[offset:offset + size], 1 if last else 0)]
        offset += size
        items += [BatchItem(slot, (500,), 1) for slot in range(1, streams + 1)]
        runner.forward_batch(items)
        steps += 1
    return (time.perf_counter() - start) * 1000, steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prompt-tokens", type=int, default=192)
    parser.add_argument("--streams", type=int, default=0, help="decoding streams beside the prompt")
    parser.add_argument("--chunks", default="1,16,32,48,64,96,128,192,256")
    parser.add_argument("--splits", default=None,
                        help="comma-separated lists of '+'-joined chunk sizes, each summing to --prompt-tokens")
    args = parser.parse_args()
    splits = [[int(size) for size in text.split("+")] for text in args.splits.split(",")] if args.splits else []
    if any(sum(split) != args.prompt_tokens or min(split) < 1 for split in splits):
        parser.error("each of --splits must be positive sizes summing to --prompt-tokens")
    runner = LlamaCppBatchRunner(str(gguf_path(args.model)), max_slots=args.streams + 1, threads=args.threads)
    prompt = tuple((j * 104729 + 13) % 30000 + 1000 for j in range(max(args.prompt_tokens, STREAM_CONTEXT)))
    prompt_only = prompt[:args.prompt_tokens]
    for chunk in splits or [int(text) for text in args.chunks.split(",")]:
        runs = [prompt_time_ms(runner, prompt_only, chunk, args.streams) for _ in range(2)]
        total_ms, steps = min(runs)
        shape = "+".join(map(str, chunk)) if isinstance(chunk, list) else f"of {chunk:4d}"
        print(f"{args.model} {args.prompt_tokens} prompt tokens beside {args.streams} streams, chunks {shape}: "
              f"{total_ms:7.0f} ms, {total_ms / args.prompt_tokens:5.2f} ms a prompt token, {steps:3d} steps of "
              f"{total_ms / steps:6.0f} ms", flush=True)


if __name__ == "__main__":
    main()
