"""In-process closed loops on the batching engine, drafter settings alternating, paired by repeat.

No HTTP, no detokenizer: C sequences run in one `BatchEngine`, and each finished one is replaced
by the next request of the serving benchmark's interleaved workload, as `tandem bench-serve`'s
clients would. Every run is a fresh subprocess (one engine, one OpenMP team), and repeat r gives
each drafter the same requests (offset r x requests), the order flipping every repeat, so this
VM's drift over minutes falls on both sides of a ratio.

    .venv/bin/python scripts/engine_ab.py --backend torch --dtype bf16 --draft-backend llamacpp \
        --drafters none,hybrid --concurrency 8 --requests 16 --repeats 3
"""

import argparse
import json
import subprocess
import sys
import time

import numpy as np

TARGET = "qwen2.5-coder-1.5b-instruct"
DRAFT = "qwen2.5-coder-0.5b-instruct"


def run_one(args) -> dict:
    """One closed loop in this process; returns throughput and inter-token gaps."""
    from tandem.bench.serve.requests import level_requests
    from tandem.bench.workload import DEFAULT_WORKLOAD, load_prompts
    from tandem.engine.build import EngineConfig, build_engine
    from tandem.engine.request import GenerationRequest
    from tandem.models.backends import RunnerSpec
    from tandem.models.resolve import tokenizer_path
    from tandem.text.tokenizer import TextTokenizer

    target = RunnerSpec(args.target, args.backend, dtype=args.dtype, threads=args.threads)
    draft = RunnerSpec(args.draft, args.draft_backend or args.backend, dtype=args.dtype, threads=args.threads)
    engine = build_engine(EngineConfig(target, draft, drafter=args.one), max_running=args.concurrency)
    tokenizer = TextTokenizer(str(tokenizer_path(args.target)))
    requests = level_requests(load_prompts(DEFAULT_WORKLOAD), args.requests, args.offset)
    prompts = [tokenizer.chat_prompt_ids(list(request.messages)) for request in requests]

    def admit(index: int) -> None:
        engine.add(str(index), GenerationRequest(tuple(prompts[index]), max_tokens=args.max_tokens,
                                                 stop_token_ids=tokenizer.stop_token_ids))

    admitted = min(args.concurrency, len(prompts))
    for index in range(admitted):
        admit(index)
    emitted, gaps, last_token_at = 0, [], {}
    started = time.perf_counter()
    while engine.has_work:
        updates, _report = engine.step()
        now = time.perf_counter()
        for update in updates:
            if update.token_ids:
                emitted += len(update.token_ids)
                if update.seq_id in last_token_at:
                    gaps.append(now - last_token_at[update.seq_id])
                last_token_at[update.seq_id] = now
            if update.finished and admitted < len(prompts):
                admit(admitted)
                admitted += 1
    wall = time.perf_counter() - started
    gaps_ms = np.array(gaps) * 1000
    return {"drafter": args.one, "wall_s": wall, "tokens": emitted, "tok_s": emitted / wall,
            "itl_p50_ms": float(np.percentile(gaps_ms, 50)), "itl_p99_ms": float(np.percentile(gaps_ms, 99))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default=TARGET)
    parser.add_argument("--draft", default=DRAFT)
    parser.add_argument("--backend", default="llamacpp")
    parser.add_argument("--draft-backend", default=None)
    parser.add_argument("--dtype", default="fp32")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--drafters", default="none,hybrid", help="comma-separated drafter settings")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--requests", type=int, default=16, help="requests per run")
    parser.add_argument("--max-tokens", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--offset", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--one", help=argparse.SUPPRESS)  # internal: run one loop, print JSON
    args = parser.parse_args()
    if args.one:
        print(json.dumps(run_one(args)))
        return

    drafters = args.drafters.split(",")
    runs = []
    for repeat in range(args.repeats):
        order = drafters if repeat % 2 == 0 else drafters[::-1]
        for drafter in order:
            command = [sys.executable, __file__, *sys.argv[1:], "--one", drafter, "--offset", str(repeat * args.requests)]
            finished = subprocess.run(command, capture_output=True, text=True)
            if finished.returncode != 0:
                sys.exit(f"the {drafter} run failed:\n{finished.stderr[-2000:]}")
            run = json.loads(finished.stdout.strip().splitlines()[-1]) | {"repeat": repeat}
            runs.append(run)
            print(f"repeat {repeat} {drafter:8s} {run['tok_s']:6.2f} tok/s  ITL p50 {run['itl_p50_ms']:5.0f} ms  "
                  f"p99 {run['itl_p99_ms']:5.0f} ms  ({run['tokens']} tokens in {run['wall_s']:.1f} s)", flush=True)
    tok_s = {(run["repeat"], run["drafter"]): run["tok_s"] for run in runs}
    base = drafters[0]
    for drafter in drafters[1:]:
        ratios = [tok_s[repeat, drafter] / tok_s[repeat, base] for repeat in range(args.repeats)]
        print(f"{drafter} / {base} by repeat: " + ", ".join(f"{ratio:.2f}x" for ratio in ratios)
              + f"; mean {np.mean(ratios):.2f}x")


if __name__ == "__main__":
    main()
