"""The host tier's memory against its byte budget: a loop on an engine-like thread keeps saving
states of 1-8 MiB (written once into new bytes, as the runners' saves are) into a
`HostPromptCache` of `--budget`, which evicts the least recently used, while each step also makes
and drops logits arrays as the llama.cpp runner does; the process's resident memory beyond the
tier's entries is printed as it goes, with the freed memory handed back every
RELEASE_EVERY_BYTES (the default) or never (`--no-release`).

    python scripts/measure_host_tier_rss.py [--budget 256M] [--saves 3000] [--no-release]
"""

import argparse
import ctypes
import random
import threading
import time

import numpy as np

from tandem.engine import host_cache
from tandem.engine.host_cache import HostEntry, HostPromptCache, parse_cache_ram
from tandem.engine.prefix_index import BLOCK
from tandem.hardware import cpu_model
from tandem.heap import resident_bytes
from tandem.models.host_bytes import bytes_address, new_bytes

VOCAB = 151936  # Qwen2.5's logits row


def resident_mib() -> float:
    return resident_bytes() / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=parse_cache_ram, default=parse_cache_ram("256M"))
    parser.add_argument("--saves", type=int, default=3000)
    parser.add_argument("--no-release", action="store_true")
    args = parser.parse_args()
    if args.no_release:
        host_cache.release_freed = lambda: False
    print(f"CPU: {cpu_model()}; host tier {args.budget / 2**20:.0f} MiB, "
          f"{'never handing freed memory back' if args.no_release else 'handing freed memory back'}")
    worker = threading.Thread(target=save_loop, args=(args.budget, args.saves))
    start = time.perf_counter()
    worker.start()
    worker.join()
    print(f"{time.perf_counter() - start:.1f} s")


def save_loop(budget: int, saves: int) -> None:
    rng = random.Random(1)
    cache = HostPromptCache(budget, "model")
    logits: list[np.ndarray] = []
    beyond = []
    for i in range(saves):
        size = rng.randint(1 << 20, 8 << 20)
        state = new_bytes(size)
        ctypes.memset(bytes_address(state), 1, size)  # every page written once, as a save does
        cache.put(HostEntry(tuple(range(i * BLOCK, (i + 1) * BLOCK)), state), "model")
        del state
        for _ in range(3):  # a step's logits: 1-17 rows, the last few steps' kept
            logits.append(np.ones((rng.randint(1, 17), VOCAB), np.float32))
            del logits[:-4]
        if i >= saves // 5:  # after warm-up
            beyond.append(resident_mib() - cache.nbytes / 2**20)
        if i % (saves // 6) == 0:
            print(f"  save {i:5d}: resident {resident_mib():6.0f} MiB, tier {cache.nbytes / 2**20:4.0f} MiB")
    print(f"resident beyond the tier after warm-up: median {sorted(beyond)[len(beyond) // 2]:.0f} MiB, "
          f"peak {max(beyond):.0f} MiB")


if __name__ == "__main__":
    main()
