"""One sequence's decode step, llama-cpp-python's own loop against Tandem's llama.cpp batch runner,
same GGUF and threads, in one process, alternating: where does a single request's gap to
llama.cpp's own loop come from (`tandem bench`'s `none` vs `llamacpp-plain`)?

Each variant prefills the same prompt, then decodes greedily token by token; the median step is
reported. Variants: llama-cpp-python's `Llama.eval` with its default attention and with flash
attention on; Tandem's runner (one slot, flash attention as it runs in the engine) and the same
runner with flash attention off. Prefill is timed too (one call of the whole prompt).

    .venv/bin/python scripts/decode_ab.py --context 300 --tokens 40 --repeats 2
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))


def own_loop(path: str, prompt: list[int], tokens: int, threads: int, flash: bool | None) -> tuple[float, float]:
    from llama_cpp import Llama

    options = {} if flash is None else {"flash_attn": flash}
    llm = Llama(model_path=path, n_ctx=4096, n_threads=threads, n_threads_batch=threads, verbose=False, **options)
    start = time.perf_counter()
    llm.eval(prompt)
    prefill = time.perf_counter() - start
    token, steps = int(np.argmax(llm.scores[llm.n_tokens - 1])), []
    for _ in range(tokens):
        start = time.perf_counter()
        llm.eval([token])
        steps.append(time.perf_counter() - start)
        token = int(np.argmax(llm.scores[llm.n_tokens - 1]))
    return prefill * 1000, statistics.median(steps) * 1000


def tandem_runner(path: str, prompt: list[int], tokens: int, threads: int, flash: bool) -> tuple[float, float]:
    import llama_cpp

    from tandem.models.batch_runner import BatchItem
    from tandem.models.llamacpp_batch_runner import LlamaCppBatchRunner

    enabled = llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED
    if not flash:  # the runner reads this constant when it makes its context
        llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED = llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
    try:
        runner = LlamaCppBatchRunner(path, 1, 4096, threads)
    finally:
        llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED = enabled
    start = time.perf_counter()
    logits = runner.forward_batch([BatchItem(0, tuple(prompt), 1)])[0]
    prefill = time.perf_counter() - start
    token, steps = int(np.argmax(logits[-1])), []
    for _ in range(tokens):
        start = time.perf_counter()
        logits = runner.forward_batch([BatchItem(0, (token,), 1)])[0]
        steps.append(time.perf_counter() - start)
        token = int(np.argmax(logits[-1]))
    return prefill * 1000, statistics.median(steps) * 1000


def main() -> None:
    from tandem.hardware import cpu_model
    from tandem.models.resolve import gguf_path

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    parser.add_argument("--context", type=int, default=300, help="prompt tokens before decoding")
    parser.add_argument("--tokens", type=int, default=40, help="decode steps timed")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    path = str(gguf_path(args.model))
    prompt = [100 + (i * 7) % 5000 for i in range(args.context)]
    variants = {
        "llama-cpp-python eval, its default": lambda: own_loop(path, prompt, args.tokens, args.threads, None),
        "llama-cpp-python eval, flash on": lambda: own_loop(path, prompt, args.tokens, args.threads, True),
        "tandem runner (flash on, as served)": lambda: tandem_runner(path, prompt, args.tokens, args.threads, True),
        "tandem runner, flash off": lambda: tandem_runner(path, prompt, args.tokens, args.threads, False),
    }
    print(f"{cpu_model()}, {args.model}, {args.context}-token prompt, {args.threads} threads")
    print(f"{'variant':38s} {'repeat':>6s} {'prefill ms':>11s} {'decode ms':>10s}")
    for repeat in range(args.repeats):
        names = list(variants) if repeat % 2 == 0 else list(variants)[::-1]
        for name in names:
            prefill, decode = variants[name]()
            print(f"{name:38s} {repeat:6d} {prefill:11.1f} {decode:10.2f}", flush=True)


if __name__ == "__main__":
    main()
