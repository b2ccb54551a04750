"""What a prompt part costs beside rounds in one llama.cpp call, timed directly: R sequences of
one token each (a logits row each, as plain decode rounds) at C cached tokens, beside one
sequence's prompt part of P tokens at C2 cached, with logits at none of the part's rows (as the
engine asks) and at all of them (as the profile's cost curve does); the rounds and the part
alone; and the simulator's price of the call on a profile (cluster/sim/planning.py `verify_ms`),
with every row's logits (its price before 2026-11-30) and without the part's, the device's curves
read at each --sim-contexts (the call itself is priced at the mean context its sequences hold).

    .venv/bin/python scripts/mixed_call_cost.py --profile docs/cluster/sim-zen5/profile-smollm2-1t.json

Medians of --repeats calls, each slot rolled back after every call. Measure nothing else meanwhile.
"""

import argparse
import statistics
import time
from dataclasses import replace

from tandem.cluster.profiles.profile_store import load_profile
from tandem.cluster.sim.from_profile import device_from_profile
from tandem.cluster.sim.planning import verify_ms
from tandem.models.backends import RunnerSpec
from tandem.models.batch_backends import load_batch_runner
from tandem.models.batch_runner import BatchItem

PARTS = ((16, 100), (64, 100), (300, 0), (300, 100))  # (prompt part P, tokens its sequence holds C2)


def filler(count: int) -> tuple[int, ...]:
    return tuple(1 + i % 200 for i in range(count))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3, help="R: sequences decoding one token each")
    parser.add_argument("--context", type=int, default=150, help="C: tokens each decoding sequence holds")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--profile", help="a device profile of the same model and threads: the simulator's price beside")
    parser.add_argument("--sim-contexts", default="64,512", help="the cached tokens the simulated device's curves are "
                        "read at, as a cluster file's context_tokens sets them (default 64,512: the profile's shortest, "
                        "and the cluster files' default)")
    args = parser.parse_args()
    rounds_n, context = args.rounds, args.context
    part_slot = rounds_n
    runner = load_batch_runner(RunnerSpec(args.model, "llamacpp", "cpu", threads=args.threads, context_length=2048),
                               rounds_n + 1)
    sim_contexts = [int(c) for c in args.sim_contexts.split(",") if c]
    devices = [device_from_profile("profiled", load_profile(args.profile), context=c) for c in sim_contexts] \
        if args.profile else []

    def hold(part_context: int) -> None:
        for slot in range(rounds_n + 1):
            runner.rollback(slot, 0)
        for slot in range(rounds_n):
            runner.forward_batch([BatchItem(slot, filler(context), 0)])
        if part_context:
            runner.forward_batch([BatchItem(part_slot, filler(part_context), 0)])

    def median_ms(items: list[BatchItem], part_context: int) -> float:
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            runner.forward_batch(items, views=True)
            times.append((time.perf_counter() - start) * 1000)
            for slot in range(rounds_n):
                runner.rollback(slot, context)
            runner.rollback(part_slot, part_context)
        return statistics.median(times)

    rounds = [BatchItem(slot, filler(1), 1) for slot in range(rounds_n)]
    print(f"{args.model}, {args.threads} thread(s): {rounds_n} rounds of 1 token at {context} cached, beside a part of "
          f"P prompt tokens at C2 cached (ms, medians of {args.repeats})")
    prices = "".join(f"  price at {c}: rows / none" for c in sim_contexts) if devices else ""
    print(f"    P    C2  rounds   part  sum apart  fused, no part rows  fused, all rows  all/none{prices}")
    for part, part_context in PARTS:
        hold(part_context)
        alone = median_ms(rounds, part_context)
        part_alone = median_ms([BatchItem(part_slot, filler(part), 0)], part_context)
        no_rows = median_ms(rounds + [BatchItem(part_slot, filler(part), 0)], part_context)
        all_rows = median_ms(rounds + [BatchItem(part_slot, filler(part), part)], part_context)
        priced = ""
        held = (rounds_n * context + part_context) / (rounds_n + 1)
        for device in devices:  # the price before logits rows were taken off, and now
            with_rows = verify_ms(replace(device, logits_row_ms=0.0), [0] * rounds_n, [part], held)
            priced += f"  {with_rows:9.1f} / {verify_ms(device, [0] * rounds_n, [part], held):7.1f}"
        print(f"{part:5d} {part_context:5d} {alone:7.1f} {part_alone:6.1f} {alone + part_alone:9.1f} "
              f"{no_rows:20.1f} {all_rows:16.1f} {all_rows / no_rows:9.2f}  {priced}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
