"""How often a seeded request's output survives a change of kernel shapes on llama.cpp: each
request sampled alone (one sequence a step), then the same requests eight at a time (batched
calls, other Q4 kernels, logits that differ in their last bits), plain decoding, one process.
Prints how many outputs are identical and where the others first differ.

    .venv/bin/python scripts/seeded_alone_vs_batched.py --model smollm2-135m-instruct
"""

import argparse

from tandem.bench.workload import DEFAULT_WORKLOAD, load_prompts
from tandem.engine.build import EngineConfig, build_engine
from tandem.engine.request import GenerationRequest
from tandem.engine.run_request import generate
from tandem.models.backends import RunnerSpec
from tandem.models.resolve import tokenizer_path
from tandem.speculation.sampling import SamplingParams
from tandem.text.tokenizer import TextTokenizer

BATCH = 8


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--requests", type=int, default=24, help="a multiple of 8")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--temperature", type=float, default=0.8)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    prompts = load_prompts(DEFAULT_WORKLOAD)[::4][: args.requests]
    tokenizer = TextTokenizer(str(tokenizer_path(args.model)))
    requests = [GenerationRequest(tuple(tokenizer.chat_prompt_ids(list(prompt.messages))), max_tokens=args.max_tokens,
                                  sampling=SamplingParams(temperature=args.temperature, seed=seed),
                                  stop_token_ids=tokenizer.stop_token_ids)
                for seed, prompt in enumerate(prompts)]
    config = EngineConfig(RunnerSpec(args.model, "llamacpp", threads=args.threads), None, drafter="none")
    alone = build_engine(config, max_running=1)
    solo = [generate(alone, request)[0] for request in requests]
    batched_engine = build_engine(config, max_running=BATCH)
    batched: dict[int, list[int]] = {}
    for start in range(0, len(requests), BATCH):
        for index in range(start, min(start + BATCH, len(requests))):
            batched_engine.add(f"batched-{index}", requests[index])
            batched[index] = []
        while batched_engine.has_work:
            updates, _ = batched_engine.step()
            for update in updates:
                batched[int(update.seq_id.split("-")[1])] += list(update.token_ids)
    firsts = sorted(next((i for i, (a, b) in enumerate(zip(solo[n], batched[n])) if a != b),
                         min(len(solo[n]), len(batched[n])))
                    for n in range(len(requests)) if solo[n] != batched[n])
    print(f"{args.model}, temperature {args.temperature}, {args.max_tokens} tokens: identical alone and batched "
          f"{len(requests) - len(firsts)}/{len(requests)}; the others first differ at tokens {firsts}")


if __name__ == "__main__":
    main()
