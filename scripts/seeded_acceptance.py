"""What the positional rule costs model drafts: acceptance of the draft model's tokens for seeded
requests (the positional rule, drafts coupled to the target's uniforms) against unseeded ones
(speculative sampling), on the same prompts, in one process, the two modes alternating.

k is fixed (the planner would often draft nothing on a CPU), so both modes verify the same
number of drafts a round; the default models (Qwen2.5-Coder 1.5B target, 0.5B draft, Q4 on
llama.cpp). Prints each pass and the pooled acceptance and tok/s of each mode.

    .venv/bin/python scripts/seeded_acceptance.py --temperature 0.7 --k 4 --num-prompts 8 --max-tokens 48
"""

import argparse
import time

from tandem.bench.workload import DEFAULT_WORKLOAD, format_prompt, load_prompts
from tandem.engine.build import EngineConfig, build_engine
from tandem.engine.request import GenerationRequest
from tandem.engine.run_request import generate
from tandem.models.backends import RunnerSpec
from tandem.models.catalog import DEFAULT_DRAFT, DEFAULT_TARGET
from tandem.models.resolve import tokenizer_path
from tandem.speculation.sampling import SamplingParams
from tandem.text.tokenizer import TextTokenizer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--num-prompts", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--passes", type=int, default=2, help="each mode this many times, alternating order")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    prompts = load_prompts(DEFAULT_WORKLOAD)
    prompts = prompts[:: max(1, len(prompts) // args.num_prompts)][: args.num_prompts]  # across categories
    config = EngineConfig(RunnerSpec(DEFAULT_TARGET, threads=args.threads),
                          RunnerSpec(DEFAULT_DRAFT, threads=args.threads), drafter="model", k=args.k)
    engine = build_engine(config, max_running=1)
    tokenizer = TextTokenizer(str(tokenizer_path(DEFAULT_TARGET)))
    prompt_ids = [format_prompt(tokenizer, p) for p in prompts]
    totals = {mode: [0, 0, 0, 0.0] for mode in ("seeded", "unseeded")}  # drafted, accepted, tokens, seconds
    for run in range(args.passes):
        for mode in ("seeded", "unseeded") if run % 2 == 0 else ("unseeded", "seeded"):
            drafted = accepted = tokens = 0
            start = time.perf_counter()
            for i, ids in enumerate(prompt_ids):
                seed = 1000 * run + i if mode == "seeded" else None
                sampling = SamplingParams(temperature=args.temperature, seed=seed)
                output, stats = generate(engine, GenerationRequest(ids, args.max_tokens, sampling,
                                                                   tokenizer.stop_token_ids))
                drafted, accepted, tokens = drafted + stats.drafted, accepted + stats.accepted, tokens + len(output)
            seconds = time.perf_counter() - start
            for index, value in enumerate((drafted, accepted, tokens, seconds)):
                totals[mode][index] += value
            print(f"pass {run} {mode}: {accepted}/{drafted} drafts accepted ({accepted / max(drafted, 1):.3f}), "
                  f"{tokens} tokens in {seconds:.1f} s", flush=True)
    for mode, (drafted, accepted, tokens, seconds) in totals.items():
        print(f"{mode}: acceptance {accepted / max(drafted, 1):.3f} ({accepted}/{drafted}), {tokens / seconds:.2f} tok/s")


if __name__ == "__main__":
    main()
