"""What the prompt cache's disk tier costs against recomputing: a history of N tokens prefilled
cold, then saved to disk, read back by a new cache (as after a restart) and restored into a fresh
runner, each step timed; the restored state's next-token logits checked against the saved one's.

    python scripts/measure_disk_tier.py [--target qwen2.5-coder-1.5b-instruct] [--tokens 500,1000,2000]

Prints one row per history length (name the CPU beside the figures: it prints the model line of
/proc/cpuinfo). With --drop-caches (root only) the page cache is dropped before each read, so the
read comes from the disk itself.
"""

import argparse
import os
import tempfile
import time

import numpy as np

from tandem.engine.build import EngineConfig, disk_model_key
from tandem.engine.disk_cache import DiskPromptCache
from tandem.engine.host_cache import HostEntry
from tandem.hardware import cpu_model
from tandem.models.backends import RunnerSpec
from tandem.models.batch_runner import BatchItem
from tandem.models.llamacpp_batch_runner import LlamaCppBatchRunner
from tandem.models.resolve import gguf_path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    parser.add_argument("--tokens", default="500,1000,2000")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--drop-caches", action="store_true")
    args = parser.parse_args()
    path = str(gguf_path(args.target))
    lengths = [int(t) for t in args.tokens.split(",")]
    context = max(lengths) + 64
    started = time.perf_counter()
    key = disk_model_key(EngineConfig(RunnerSpec(path, backend="llamacpp"), drafter="ngram"), with_draft=False)
    key_seconds = time.perf_counter() - started
    print(f"CPU: {cpu_model()}; target {args.target}, {args.threads} threads; "
          f"model key (checksum) {key_seconds * 1000:.0f} ms once per start")
    print("| history | cold prefill | save_state | file | write | restart scan | read + verify | restore | logits equal |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    rng = np.random.default_rng(0)
    for length in lengths:
        tokens = tuple(int(t) for t in rng.integers(100, 20000, length))
        with tempfile.TemporaryDirectory() as folder:
            runner = LlamaCppBatchRunner(path, 1, context_length=context, threads=args.threads)
            prefill = _timed(lambda: runner.forward_batch([BatchItem(0, tokens, 0)]))[0]
            save, state = _timed(lambda: runner.save_state(0))
            disk = DiskPromptCache(folder, 1 << 34, key)
            write = _timed(lambda: (disk.put(HostEntry(tokens, state), key), disk.close()))[0]
            expected = runner.forward_batch([BatchItem(0, (7,), length)])[0]
            runner = None  # the model freed before the restart
            if args.drop_caches:
                os.system("sync; echo 3 > /proc/sys/vm/drop_caches")
            scan, restarted = _timed(lambda: DiskPromptCache(folder, 1 << 34, key))
            read, entry = _timed(lambda: restarted.load(restarted.lookup(tokens, key)))
            fresh = LlamaCppBatchRunner(path, 1, context_length=context, threads=args.threads)
            restore, ok = _timed(lambda: fresh.restore_state(0, entry.target_state, len(entry.tokens)))
            equal = ok and np.array_equal(fresh.forward_batch([BatchItem(0, (7,), length)])[0], expected)
            file_mb = len(state) / 2**20
            print(f"| {length} | {prefill:.2f} s | {save * 1000:.0f} ms | {file_mb:.0f} MiB | {write * 1000:.0f} ms | "
                  f"{scan * 1000:.1f} ms | {read * 1000:.0f} ms | {restore * 1000:.0f} ms | {equal} |")
            fresh = None


def _timed(fn):
    start = time.perf_counter()
    value = fn()
    return time.perf_counter() - start, value


if __name__ == "__main__":
    main()
