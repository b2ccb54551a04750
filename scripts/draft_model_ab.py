"""Two draft models side by side, in process: the same target and short answers at C=1
(bench-serve's default workload, caps of 25-75 tokens), each draft model in a fresh engine, in
turn, --repeats times. Prints tok/s, engine steps, acceptance and the seconds spent drafting,
so a draft's speed and its agreement with the target are read apart.

    .venv/bin/python scripts/draft_model_ab.py --drafts qwen2.5-coder-0.5b-instruct,qwen2.5-coder-0.5b-instruct-q4_0 --k 4

A fixed --k makes both draft every round (the figures then compare the drafts, not whether
drafting pays on this CPU); --k auto runs the defaults. Name the CPU beside the figures
(printed). Measure nothing else meanwhile.
"""

import argparse
import gc

from tandem.bench.cluster.drive import drive
from tandem.bench.serve.requests import level_requests
from tandem.bench.workload import DEFAULT_WORKLOAD, load_prompts
from tandem.cli.options import engine_prefill_floor
from tandem.engine.step_budget import THROUGHPUT_PREFILL_FLOOR
from tandem.engine.build import EngineConfig, build_engine
from tandem.engine.request import GenerationRequest
from tandem.hardware import cpu_model
from tandem.models.backends import RunnerSpec
from tandem.models.catalog import DEFAULT_TARGET
from tandem.models.resolve import tokenizer_path
from tandem.speculation.shared_store.store import open_ngram_store
from tandem.text.tokenizer import TextTokenizer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default=DEFAULT_TARGET)
    parser.add_argument("--drafts", required=True, help="two or more draft models, comma-separated")
    parser.add_argument("--drafter", default="model")
    parser.add_argument("--k", default="auto")
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    drafts = [d for d in args.drafts.split(",") if d]
    tokenizer = TextTokenizer(str(tokenizer_path(args.target)))
    requests = [GenerationRequest(tuple(tokenizer.chat_prompt_ids(list(r.messages))), max_tokens=50 + r.max_tokens_offset,
                                  stop_token_ids=tokenizer.stop_token_ids)
                for r in level_requests(load_prompts(DEFAULT_WORKLOAD), args.requests, 1, 25)]
    k = args.k if args.k == "auto" else int(args.k)
    print(f"CPU: {cpu_model()}; target {args.target}, drafter {args.drafter}, k {k}, {args.threads} threads, "
          f"C=1, {args.requests} requests (after 3 to warm each engine)")
    print("| repeat | draft | tok/s | steps | acceptance | drafting s | target calls s |")
    print("|---:|---|---:|---:|---:|---:|---:|")
    for repeat in range(args.repeats):
        for draft in drafts:
            engine = build_engine(EngineConfig(RunnerSpec(args.target, "llamacpp", dtype="fp32", threads=args.threads),
                                               RunnerSpec(draft, "llamacpp", dtype="fp32", threads=args.threads),
                                               drafter=args.drafter, k=k,
                                               prefill_floor=engine_prefill_floor(None, THROUGHPUT_PREFILL_FLOOR)),
                                  max_running=1, ngram_store=open_ngram_store(None))
            drive(engine, requests[:3], 1, "warm", 0.0)
            run = drive(engine, requests, 1, args.drafter, 0.0)
            acceptance = "-" if run.acceptance is None else f"{run.acceptance:.3f}"
            print(f"| {repeat + 1} | {draft} | {run.throughput_tok_s:.2f} | {run.steps} | {acceptance} | "
                  f"{run.draft_seconds:.1f} | {run.call_seconds - run.draft_seconds:.1f} |", flush=True)
            del engine
            gc.collect()


if __name__ == "__main__":
    main()
