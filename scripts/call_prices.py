"""What the target's calls cost against what the planner priced them, by tokens scored: short
answers at C=1, in process (bench-serve's default workload, caps of 25-75 tokens, the engine
`tandem serve` builds, a shared n-gram store). Each call's price is read off the runner's cost
model (its profile and what it has learned so far) just before the call, as the planner read it.

    .venv/bin/python scripts/call_prices.py [--drafter hybrid] [--requests 24] [--threads 2]

A size whose calls run dearer than priced is drafted where it loses. Name the CPU beside the
figures (printed). Measure nothing else meanwhile.
"""

import argparse
import time
from collections import defaultdict

from tandem.bench.cluster.drive import drive
from tandem.bench.serve.requests import level_requests
from tandem.bench.workload import DEFAULT_WORKLOAD, load_prompts
from tandem.cli.options import engine_prefill_floor
from tandem.engine.step_budget import THROUGHPUT_PREFILL_FLOOR
from tandem.engine.build import EngineConfig, build_engine
from tandem.engine.request import GenerationRequest
from tandem.hardware import cpu_model
from tandem.models.backends import RunnerSpec
from tandem.models.batch_runner import cached_context
from tandem.models.resolve import tokenizer_path
from tandem.speculation.shared_store.store import open_ngram_store
from tandem.text.tokenizer import TextTokenizer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    parser.add_argument("--draft", default="qwen2.5-coder-0.5b-instruct")
    parser.add_argument("--drafter", default="hybrid")
    parser.add_argument("--requests", type=int, default=24)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    target = RunnerSpec(args.target, "llamacpp", dtype="fp32", threads=args.threads)
    draft = RunnerSpec(args.draft, "llamacpp", dtype="fp32", threads=args.threads)
    engine = build_engine(EngineConfig(target, draft, drafter=args.drafter,
                                       prefill_floor=engine_prefill_floor(None, THROUGHPUT_PREFILL_FLOOR)),
                          max_running=1, ngram_store=open_ngram_store(None))
    calls = _priced_calls(engine.target)
    tokenizer = TextTokenizer(str(tokenizer_path(args.target)))
    requests = [GenerationRequest(tuple(tokenizer.chat_prompt_ids(list(r.messages))), max_tokens=50 + r.max_tokens_offset,
                                  stop_token_ids=tokenizer.stop_token_ids)
                for r in level_requests(load_prompts(DEFAULT_WORKLOAD), args.requests, 0, 25)]
    result = drive(engine, requests, 1, args.drafter, 0.0).to_json()
    print(f"CPU: {cpu_model()}; {args.target}, {args.threads} threads, drafter {args.drafter}, C=1, "
          f"{args.requests} requests: {result['seconds']:.1f} s, {result['steps']} steps, "
          f"{result['call_seconds']:.1f} s in target calls")
    print("| tokens scored | calls | measured ms (mean) | priced ms (mean) | measured / priced |")
    print("|---:|---:|---:|---:|---:|")
    for tokens, (count, measured, priced) in sorted(calls.items()):
        if tokens <= 16:
            print(f"| {tokens} | {count} | {measured / count:.1f} | {priced / count:.1f} | {measured / priced:.2f} |")


def _priced_calls(runner) -> dict[int, list]:
    """Wrap the runner's forward_batch: per call size, [calls, measured ms, priced ms]."""
    calls: dict[int, list] = defaultdict(lambda: [0, 0.0, 0.0])
    forward = runner.forward_batch

    def timed(items, views=False):
        tokens = sum(len(item.token_ids) for item in items)
        priced = runner.cost.cost_ms(tokens, cached_context(runner, items))
        start = time.perf_counter()
        out = forward(items, views=views)
        row = calls[tokens]
        row[0] += 1
        row[1] += (time.perf_counter() - start) * 1000
        row[2] += priced
        return out

    runner.forward_batch = timed
    return calls


if __name__ == "__main__":
    main()
