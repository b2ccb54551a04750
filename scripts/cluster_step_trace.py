"""What each replica's engine steps held during a `tandem bench-cluster` run: per replica, its
steps, the tokens they scored, how many carried prompt tokens and how many, and the verify
call's time with and without them; and the inter-token gaps as the benchmark counts them. Held
beside `tandem simulate`'s picture of the same run (the simulated replicas' steps, counted the
same way), it says where a simulation and a run part.

    .venv/bin/python scripts/cluster_step_trace.py --out /tmp/trace -- \\
        --cluster examples/clusters/mixed-replicas.yaml --drafter none --k 0 --configs cluster \\
        --concurrency 8 --requests 32 --max-tokens 50 --repeat 1
    .venv/bin/python scripts/cluster_step_trace.py --simulate /tmp/trace/measured.json -- \\
        --cluster examples/clusters/mixed-replicas.yaml --roles as-written --concurrency 8 \\
        --requests 32 --max-tokens 50 --host-cores 2 --k 0

The first runs `tandem bench-cluster` with the arguments after `--` (its `--out` is this
script's) and writes step-trace.json beside the run's files; the second runs `tandem simulate
--measured RUN` with them and prints the simulated replicas' steps (the first simulation only,
not the one at the run's speed); `--read TRACE.json` prints a trace's summary again. Measure nothing else meanwhile: the figures are wall times.
"""

import argparse
import json
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="bench-cluster's output folder (trace a run)")
    parser.add_argument("--simulate", help="a measured.json to simulate against (trace a simulation)")
    parser.add_argument("--read", help="a step-trace.json written before: print its summary again")
    parser.add_argument("--priced-on", help="a device profile: price each traced step of --replica's on it, as "
                        "the simulator does (one call, its prompt tokens without logits rows) and on the prompt curve (the chunks apart)")
    parser.add_argument("--replica", default="fast-verify-0", help="the replica whose steps --priced-on prices")
    parser.add_argument("--context", type=int, default=512, help="cached tokens the profile is read at (the file's)")
    parser.add_argument("rest", nargs=argparse.REMAINDER, help="-- then the tandem command's arguments")
    args = parser.parse_args()
    rest = args.rest[1:] if args.rest[:1] == ["--"] else args.rest
    if sum(bool(x) for x in (args.out, args.simulate, args.read)) != 1:
        parser.error("give one of --out (trace a run), --simulate RUN.json (trace a simulation), --read TRACE.json")
    if args.read:
        trace = json.loads(Path(args.read).read_text())
        steps, gaps = trace["steps"], trace["gaps_ms"]
    elif args.out:
        steps, gaps = trace_run(Path(args.out), rest)
    else:
        steps, gaps = trace_simulation(args.simulate, rest), None
    for line in step_lines(steps):
        print(line)
    if gaps:
        print(f"inter-token gaps: {len(gaps)}, p50 {np.percentile(gaps, 50):.0f} ms, p99 {np.percentile(gaps, 99):.0f} ms")
    if args.priced_on:
        for line in priced_lines(steps, args.priced_on, args.replica, args.context):
            print(line)
    return 0


# -- a run --------------------------------------------------------------------------------------


def trace_run(out: Path, bench_args: list[str]) -> tuple[list[dict], list[float]]:
    """bench-cluster with the router's steps recorded: each replica step's report, named by the
    replica its sequences were placed on, and each token-bearing update's arrival."""
    from tandem.cli.main import main as tandem
    from tandem.cluster.runtime import router as router_module

    placed, steps, updates = {}, [], []
    step, submit = router_module.ClusterRouter.step, router_module.ClusterRouter._submit

    def traced_step(self):
        news, report = step(self)
        now = time.perf_counter()
        updates.extend((now, u.seq_id, len(u.token_ids)) for u in news)
        if report is not None:
            ids = [r.seq_id for r in report.rounds] + list(report.prefilled)
            steps.append({"replica": "/".join(sorted({placed.get(i, "?") for i in ids})), "at": report.started_at,
                          "verify_s": report.verify_seconds, "rounds": len(report.rounds),
                          "round_tokens": report.batch_tokens, "prompt_tokens": report.prefill_tokens})
        return news, report

    def traced_submit(self, routed, replica, reason, moved=None):
        placed[routed.seq_id] = replica.name
        return submit(self, routed, replica, reason, moved)

    router_module.ClusterRouter.step, router_module.ClusterRouter._submit = traced_step, traced_submit
    code = tandem(["bench-cluster", *bench_args, "--out", str(out)])
    if code:
        raise SystemExit(code)
    trace = {"steps": steps, "gaps_ms": _gaps_ms(updates)}
    (out / "step-trace.json").write_text(json.dumps(trace))
    print(f"wrote {out / 'step-trace.json'}", file=sys.stderr)
    return steps, trace["gaps_ms"]


def _gaps_ms(updates: list[tuple[float, str, int]]) -> list[float]:
    """Gaps between a request's successive token-bearing updates, as bench-cluster counts them."""
    last, gaps = {}, []
    for now, seq_id, tokens in updates:
        if tokens:
            if seq_id in last:
                gaps.append(1000 * (now - last[seq_id]))
            last[seq_id] = now
    return gaps


# -- a simulation -------------------------------------------------------------------------------


def trace_simulation(measured: str, simulate_args: list[str]) -> list[dict]:
    from tandem.cli.main import main as tandem
    from tandem.cluster.sim import step as step_module
    from tandem.cluster.sim.planning import verify_ms

    steps, runs = [], []
    verify = step_module.ReplicaSteps._verify

    def traced_verify(self, now):
        if self._rounds or self._chunks:
            prompt = sum(s.unprefilled for s, _ in self._rounds) + sum(n for _, n in self._chunks)
            device = self.replica.spec.device
            call_ms = verify_ms(device, [k for _, k in self._rounds],
                                [s.unprefilled for s, _ in self._rounds] + [n for _, n in self._chunks])
            steps.append({"replica": device.name, "at": now / 1000, "verify_s": call_ms / 1000,
                          "rounds": len(self._rounds), "round_tokens": sum(k + 1 for _, k in self._rounds),
                          "prompt_tokens": prompt, "run": len(runs)})
        return verify(self, now)

    init = step_module.ReplicaSteps.__init__

    def counting_init(self, ctx, *more):  # a new simulation starts when its replicas are built
        if not runs or runs[-1] is not ctx:
            runs.append(ctx)
        init(self, ctx, *more)

    step_module.ReplicaSteps._verify, step_module.ReplicaSteps.__init__ = traced_verify, counting_init
    if tandem(["simulate", *simulate_args, "--measured", measured]):
        raise SystemExit(2)
    return [s for s in steps if s["run"] == 1]  # the first simulation, as profiled


# -- the steps priced ---------------------------------------------------------------------------


def priced_lines(steps: list[dict], profile_path: str, replica: str, context: int) -> list[str]:
    """Each traced step of `replica` (every round one token: k = 0) against its price on the
    profile: as one call over every token less the logits rows its prompt tokens do not ask (the
    simulator's), and with its prompt tokens on the prompt curve apart (the simulator's before
    2026-11-29); medians by shape, and the run's totals."""
    from tandem.cluster.profiles.profile_store import load_profile
    from tandem.cluster.sim.from_profile import device_from_profile
    from tandem.cluster.sim.planning import verify_ms

    device = device_from_profile(replica, load_profile(profile_path), context=context)
    shapes = defaultdict(list)
    for s in steps:
        if s["replica"] != replica:
            continue
        rounds, prompt = s["rounds"], s["prompt_tokens"]
        apart = device.forward_ms([1] * rounds) + (device.prompt_ms([prompt]) if prompt else 0.0)
        shape = "rounds only" if not prompt else ("beside a chunk of 1-23" if prompt <= 23 else "beside prompts of 24+")
        shapes[(shape, rounds)].append((1000 * s["verify_s"], verify_ms(device, [0] * rounds, [prompt]), apart))
    lines = [f"{replica}'s steps priced on {profile_path} at {context} cached tokens "
             "(ms, medians: measured, one call, prompt curve apart):"]  # one call: the simulator's price
    totals = np.zeros(3)
    for (shape, rounds), rows in sorted(shapes.items()):
        a = np.array(rows)
        totals += a.sum(axis=0)
        lines.append(f"  {rounds} rounds {shape:22s} x{len(a):3d}: {np.median(a[:, 0]):6.0f} {np.median(a[:, 1]):6.0f} "
                     f"{np.median(a[:, 2]):6.0f}   measured / priced {np.median(a[:, 0] / a[:, 1]):.2f}, "
                     f"{np.median(a[:, 0] / a[:, 2]):.2f}")
    lines.append(f"  all steps: measured {totals[0] / 1000:.1f} s, one call {totals[1] / 1000:.1f} s, "
                 f"prompt curve apart {totals[2] / 1000:.1f} s")
    return lines


# -- the summary --------------------------------------------------------------------------------


def step_lines(steps: list[dict]) -> list[str]:
    lines = []
    by_replica = defaultdict(list)
    for s in steps:
        by_replica[s["replica"]].append(s)
    for replica, mine in sorted(by_replica.items()):
        prompt = [s for s in mine if s["prompt_tokens"]]
        plain = [s for s in mine if not s["prompt_tokens"]]
        sizes = Counter(_band(s["prompt_tokens"]) for s in prompt)
        lines += [
            f"{replica}: {len(mine)} steps, {sum(s['round_tokens'] + s['prompt_tokens'] for s in mine):,} tokens scored "
            f"({sum(s['prompt_tokens'] for s in mine):,} of prompts); rounds a step: "
            + ", ".join(f"{n} x{c}" for n, c in sorted(Counter(s['rounds'] for s in mine).items())),
            f"  {len(prompt)} steps carried prompt tokens: "
            + ", ".join(f"{band} x{count}" for band, count in sorted(sizes.items(), key=lambda kv: _band_order(kv[0]))),
            f"  verify call p50: {_p50(prompt)} ms with prompt tokens, {_p50(plain)} ms without",
        ]
    return lines


BANDS = ((1, 15), (16, 23), (24, 63), (64, 255), (256, 10**9))


def _band(tokens: int) -> str:
    low, high = next(b for b in BANDS if b[0] <= tokens <= b[1])
    return f"{low}+" if high == 10**9 else f"{low}-{high}"


def _band_order(band: str) -> int:
    return int(band.split("-")[0].rstrip("+"))


def _p50(steps: list[dict]) -> str:
    return f"{1000 * float(np.median([s['verify_s'] for s in steps])):.0f}" if steps else "-"


if __name__ == "__main__":
    sys.exit(main())
