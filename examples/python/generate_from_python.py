"""Tandem's engine from Python: token ids in, token ids out, the tokenizer at the edge.

    .venv/bin/python examples/python/generate_from_python.py --target smollm2-135m-instruct --drafter ngram

Models are catalog names (pulled on first use), .gguf files or Hugging Face folders. See
docs/library.md for what each piece does.
"""

import argparse
import asyncio

from tandem.engine.build import EngineConfig, build_engine
from tandem.engine.request import GenerationRequest
from tandem.engine.run_request import generate, stream_tokens
from tandem.engine.stats import GenerationStats
from tandem.engine.worker import EngineWorker
from tandem.models.backends import RunnerSpec
from tandem.models.resolve import tokenizer_path
from tandem.speculation.sampling import SamplingParams
from tandem.text.stop_strings import StopStrings
from tandem.text.stream import TextStream
from tandem.text.tokenizer import TextTokenizer


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    parser.add_argument("--draft", default=None, help="a draft model (the hybrid and model drafters need one)")
    parser.add_argument("--drafter", default="ngram")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()

    draft = RunnerSpec(args.draft, threads=args.threads) if args.draft else None
    config = EngineConfig(RunnerSpec(args.target, threads=args.threads), draft, drafter=args.drafter)
    tokenizer = TextTokenizer(str(tokenizer_path(args.target)))
    prompt = tuple(tokenizer.chat_prompt_ids([{"role": "user", "content": "Name three prime numbers."}]))

    engine = build_engine(config, max_running=4)

    # 1. one request, in this thread; greedy (temperature 0) by default
    request = GenerationRequest(prompt, args.max_tokens, stop_token_ids=tokenizer.stop_token_ids)
    output, stats = generate(engine, request)
    print("greedy:", repr(tokenizer.decode(output)), f"({stats.finish_reason}, {stats.new_tokens} tokens)")

    # 2. streamed: each step's committed ids; leaving the loop early cancels the request. The
    # prompt is forgotten first: found in the prompt cache, it would run other kernels, whose
    # rounding may flip a near-tie on llama.cpp (docs/design.md#same-answers-in-a-batch)
    engine.clear_caches()
    streamed = []
    for ids in stream_tokens(engine, request, GenerationStats()):
        streamed += ids
    assert streamed == output  # the same engine, the same greedy answer

    # 3. text out, cut at a stop string: the engine stops at the token that completes it, and the
    # text stream shows whole characters and never any part of it
    stops = [","]
    text = TextStream(tokenizer.decode, stops)
    stopped = GenerationRequest(prompt, args.max_tokens, stop_token_ids=tokenizer.stop_token_ids,
                                stop_condition=StopStrings(tokenizer.decode, stops))
    stats = GenerationStats()
    shown = "".join(text.push(ids) for ids in stream_tokens(engine, stopped, stats)) + text.finish()
    print("up to the first comma:", repr(shown), f"({stats.finish_reason})")

    # 4. several requests at once from asyncio (or threads): one EngineWorker steps the engine
    asyncio.run(concurrent(engine, tokenizer, prompt, args.max_tokens))


async def concurrent(engine, tokenizer, prompt, max_tokens) -> None:
    worker = EngineWorker(engine).start()
    try:
        seeded = [GenerationRequest(prompt, max_tokens, SamplingParams(temperature=0.8, seed=seed),
                                    stop_token_ids=tokenizer.stop_token_ids) for seed in (1, 2, 3)]
        answers = await asyncio.gather(*(collect(worker.submit(request)) for request in seeded))
        for seed, ids in zip((1, 2, 3), answers):
            print(f"seed {seed}:", repr(tokenizer.decode(ids)))
    finally:  # finishes what is in flight, then closes the engine; it blocks, so not on the loop
        await asyncio.to_thread(worker.shutdown)


async def collect(handle) -> list[int]:
    ids = []
    while not handle.finished:
        update = await handle.next_update()
        if update.error:
            raise RuntimeError(update.error)
        ids += update.token_ids
    return ids


if __name__ == "__main__":
    main()
