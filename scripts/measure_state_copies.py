"""What the fused torch runner's KV state copies cost: `save_state` (a slot's rows, every layer,
into host bytes) and `restore_state` (those bytes into another slot's blocks), for slots of N
cached tokens, every saved state kept alive as the host tier keeps them, so that each save lands
in new memory as it does in a server.

    python scripts/measure_state_copies.py [--layers 28 --kv-heads 2 --head-dim 128 --dtype bf16] [--tokens 256,1024,2048]

The defaults are Qwen2.5-Coder-1.5B's KV shape; the pool is filled with random values (the copies
do not read the model). Prints, per length, the median time and minor page faults of each copy,
and checks that a state saved back out of the restored slot equals the one restored. Name the
CPU beside the figures (it prints the model line of /proc/cpuinfo).
"""

import argparse
import resource
import statistics
import time
import types

import torch

from tandem.cli.int_list import int_list
from tandem.hardware import cpu_model
from tandem.models.paged.fused_runner import FusedTorchRunner
from tandem.models.torch_runner import torch_dtype


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=28)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--dtype", default="bf16")
    parser.add_argument("--tokens", type=int_list(), default=(256, 1024, 2048))
    parser.add_argument("--repeats", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    config = types.SimpleNamespace(vocab_size=1, max_positions=max(args.tokens), num_layers=args.layers,
                                   num_kv_heads=args.kv_heads, head_dim=args.head_dim)
    decoder = types.SimpleNamespace(config=config, device=torch.device("cpu"), dtype=torch_dtype(args.dtype))
    runner = FusedTorchRunner(decoder, max_slots=2, context_length=max(args.tokens))
    for pool in (*runner.cache.keys, *runner.cache.values):
        pool.normal_()
    print(f"CPU: {cpu_model()}; KV {args.layers} layers x {args.kv_heads} heads x {args.head_dim} {args.dtype}, "
          f"{runner.row_bytes:,} bytes a token")
    kept = []  # the host tier keeps every state: each save lands in new memory
    for length in args.tokens:
        runner.rollback(0, 0)
        runner.blocks.prepare_write(0, length)
        runner.blocks.advance(0, length)
        saves, restores = [], []
        for _ in range(args.repeats):
            state, seconds, faults = _timed(runner.save_state, 0)
            saves.append((seconds, faults))
            kept.append(state)
            restored, seconds, faults = _timed(runner.restore_state, 1, state, length)
            restores.append((seconds, faults))
            if not restored or runner.save_state(1) != state:
                raise SystemExit(f"{length} tokens: the restored slot does not hold the state restored")
        print(f"{length:>6} tokens, {len(state) / 2**20:6.1f} MiB: save {_median_ms(saves)}, restore {_median_ms(restores)}")


def _timed(call, *args):
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    start = time.perf_counter()
    result = call(*args)
    return (result, time.perf_counter() - start,
            resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults)


def _median_ms(samples: list[tuple[float, int]]) -> str:
    return (f"{statistics.median(s for s, _ in samples) * 1e3:6.1f} ms "
            f"({statistics.median(f for _, f in samples):,.0f} page faults)")


if __name__ == "__main__":
    main()
