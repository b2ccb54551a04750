"""In-process closed loops on the batching engine, drafter settings alternating, paired by repeat.

No HTTP, no detokenizer: C sequences run in one `BatchEngine` (bench-cluster's closed-loop
driver, bench/cluster/drive.py), and each finished one is replaced by the next request of the
serving benchmark's interleaved workload, as `tandem bench-serve`'s clients would. Every run is a fresh subprocess (one engine, one OpenMP team), and repeat r gives
each drafter the same requests (offset r x requests), the order flipping every repeat, so this
VM's drift over minutes falls on both sides of a ratio.

    .venv/bin/python scripts/engine_ab.py --backend torch --dtype bf16 --draft-backend llamacpp \
        --drafters none,hybrid --concurrency 8 --requests 16 --repeats 3
"""

import argparse
import json
import subprocess
import sys
from statistics import fmean

TARGET = "qwen2.5-coder-1.5b-instruct"
DRAFT = "qwen2.5-coder-0.5b-instruct"


def run_one(args) -> dict:
    """One closed loop in this process (bench-cluster's driver), its figures as JSON."""
    from tandem.bench.cluster.drive import drive
    from tandem.bench.serve.requests import level_requests
    from tandem.bench.workload import DEFAULT_WORKLOAD, load_prompts
    from tandem.cli.options import engine_prefill_floor, prefill_floor_option
    from tandem.engine.step_budget import THROUGHPUT_PREFILL_FLOOR
    from tandem.engine.build import EngineConfig, build_engine
    from tandem.engine.request import GenerationRequest
    from tandem.models.backends import RunnerSpec
    from tandem.models.resolve import tokenizer_path
    from tandem.text.tokenizer import TextTokenizer

    target = RunnerSpec(args.target, args.backend, dtype=args.dtype, threads=args.threads)
    draft = RunnerSpec(args.draft, args.draft_backend or args.backend, dtype=args.dtype, threads=args.threads)
    setting, store, _ = args.one.partition("+store")
    setting, _, waves = setting.partition("@")
    drafter, _, floor = setting.partition(":")
    from tandem.speculation.shared_store.store import open_ngram_store

    prefill_floor = engine_prefill_floor(prefill_floor_option(floor) if floor else None, THROUGHPUT_PREFILL_FLOOR)
    engine = build_engine(EngineConfig(target, draft, drafter=drafter, prefill_floor=prefill_floor,
                                       prefill_waves=waves == "1"),
                          max_running=args.concurrency, ngram_store=open_ngram_store(None) if store else None)
    tokenizer = TextTokenizer(str(tokenizer_path(args.target)))
    requests = [GenerationRequest(tuple(tokenizer.chat_prompt_ids(list(request.messages))),
                                  max_tokens=args.max_tokens + request.max_tokens_offset,
                                  stop_token_ids=tokenizer.stop_token_ids)
                for request in level_requests(load_prompts(DEFAULT_WORKLOAD), args.requests, args.offset,
                                              args.max_tokens_spread)]
    return {"drafter": args.one, **drive(engine, requests, args.concurrency, drafter, args.join_delay_ms / 1000).to_json()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default=TARGET)
    parser.add_argument("--draft", default=DRAFT)
    parser.add_argument("--backend", default="llamacpp")
    parser.add_argument("--draft-backend", default=None)
    parser.add_argument("--dtype", default="fp32")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--drafters", default="none,hybrid",
                        help="comma-separated drafter settings, each optionally with :N or :auto (a prefill floor "
                             "of N tokens, or the profile's; default tandem serve's on one engine), "
                             "@0 or @1 (--prefill-waves off or on) and +store (the server's shared n-gram store), in that order")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--requests", type=int, default=16, help="requests per run")
    parser.add_argument("--max-tokens", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-tokens-spread", type=int, default=0,
                        help="as bench-serve's: request i may produce --max-tokens plus a fixed offset in [-N, N], so a "
                             "closed loop's answers do not all end in the same step")
    parser.add_argument("--join-delay-ms", type=float, default=0.0,
                        help="a client's next request arrives this long after its last finished (a server's round "
                             "trip); 0: before the next step")
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
            print(f"repeat {repeat} {drafter:8s} {run['throughput_tok_s']:6.2f} tok/s  TTFT p50 {run['ttft_ms_p50']:6.0f} ms  "
                  f"ms/token p50 {run['ms_per_token_p50']:5.0f}  ITL p50/p99 {run['itl_ms_p50'] or 0:5.0f}/"
                  f"{run['itl_ms_p99'] or 0:5.0f} ms  ({run['completion_tokens']} tokens in {run['seconds']:.1f} s; "
                  f"calls {run['call_seconds']:.1f} s, of them drafting {run['draft_seconds']:.2f} s; "
                  f"{run['steps']} steps, {run['step_overhead_ms_mean']:.2f} ms each outside calls; "
                  f"{run['scored_tokens']} tokens scored)", flush=True)
    tok_s = {(run["repeat"], run["drafter"]): run["throughput_tok_s"] for run in runs}
    base = drafters[0]
    for drafter in drafters[1:]:
        ratios = [tok_s[repeat, drafter] / tok_s[repeat, base] for repeat in range(args.repeats)]
        print(f"{drafter} / {base} by repeat: " + ", ".join(f"{ratio:.2f}x" for ratio in ratios)
              + f"; mean {fmean(ratios):.2f}x")


if __name__ == "__main__":
    main()
