"""Servers side by side at one concurrency, repeated: each repeat is a closed loop of fresh requests,
run on every server in turn, the order flipping every repeat.

`tandem bench-serve` runs each level once, and one run of ~70 s on this VM moves by 5-10% from
one minute to the next: one level cannot tell a 4% gap from noise. Here the servers start once,
then repeat r sends every server the same requests (the workload's interleaved list from offset
r x requests: no request repeats, so no response or prompt cache answers one), first server first
on even repeats, last first on odd ones. Per repeat it prints each server's tok/s, TPOT p50,
ITL p99 and its CPU time per completion token (the server process and its children, user +
system, read before and after), the CPU seconds of each of its busy threads and of this client
process over the level, the seconds the hypervisor took from this VM meanwhile (steal), for
Tandem its engine's steps and their time outside the verify calls (read off its /metrics), and
every server's ratio to the first one named; at the end the median ratio and the pooled one (all
tokens over all wall time). `--requests-out` keeps each request's TTFT, end-to-end time, token
counts and token gaps in results.json.

    .venv/bin/python scripts/serve_ab.py --configs tandem-spec,llama-server --concurrency 4 \
        --requests 20 --repeats 4 --max-tokens-spread 25 --threads 2
"""

import argparse
import json
import shutil
import signal
import subprocess
import sys
from contextlib import ExitStack
from pathlib import Path
from statistics import median

import psutil

from tandem.bench.serve.draft_sources import read_metrics
from tandem.bench.serve.engine_steps import parse_steps, step_delta
from tandem.bench.serve.metrics import summarize
from tandem.bench.serve.requests import level_requests
from tandem.bench.serve.server_kinds import SERVER_KINDS
from tandem.bench.serve.session import server_launch
from tandem.bench.serve.settings import ServeBenchSettings, parse_configs
from tandem.bench.serve.sweep import LevelPlan, run_level, start_servers
from tandem.bench.workload import DEFAULT_WORKLOAD, load_prompts
from tandem.errors import TandemError
from tandem.models.catalog import DEFAULT_DRAFT, DEFAULT_TARGET

PERF_HZ = 499  # samples a second per CPU with --perf: ~1,000 a second on two busy cores


def process_tree(pid: int) -> list[psutil.Process]:
    """A process and its living children."""
    process = psutil.Process(pid)
    return [process, *process.children(recursive=True)]


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process and its living children so far."""
    return sum(times.user + times.system for times in (one.cpu_times() for one in process_tree(pid)))


def thread_cpu_seconds(pid: int) -> dict[tuple[int, int], float]:
    """User + system CPU seconds of every thread of a process and its living children so far, by
    (process id, thread id)."""
    return {(one.pid, thread.id): thread.user_time + thread.system_time
            for one in process_tree(pid) for thread in one.threads()}


def busy_threads(before: dict, after: dict, at_least_s: float = 0.05) -> list[dict]:
    """The threads that ran at least `at_least_s` CPU seconds between two readings, busiest
    first; `main`: a process's first thread (Tandem's event loop, llama-server's compute)."""
    spent = [(after[key] - before.get(key, 0.0), key) for key in after]
    return [{"cpu_s": round(seconds, 2), "main": key[0] == key[1]}
            for seconds, key in sorted(spent, reverse=True) if seconds >= at_least_s]


def steal_seconds() -> float:
    """CPU seconds the hypervisor gave to other guests while this VM's CPUs wanted to run, all
    CPUs together, since boot (0 where the kernel does not count it): a level whose kernels ran
    slow with steal beside it lost them to the host, not to the server."""
    return getattr(psutil.cpu_times(), "steal", 0.0)


def own_cpu_seconds() -> float:
    times = psutil.Process().cpu_times()
    return times.user + times.system


def perf_record(pid: int, out: Path) -> subprocess.Popen:
    """`perf record` sampling process `pid` (all its threads) with call graphs into `out`, until
    stopped with SIGINT."""
    return subprocess.Popen(["perf", "record", "-F", str(PERF_HZ), "-g", "-p", str(pid), "-o", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def request_timings(records) -> list[dict]:
    """Each request's own timings, in request-list order (a closed loop's schedule follows from
    them: the first C start at once, each next one as a client's last one ends)."""
    return [{"prompt_id": r.prompt_id, "ok": r.ok, "ttft_s": r.ttft_s, "e2e_s": r.e2e_s,
             "prompt_tokens": r.prompt_tokens, "cached_tokens": r.cached_tokens,
             "completion_tokens": r.completion_tokens, "itl_s": [round(gap, 5) for gap in r.itl_s]}
            for r in records]


def run_repeat(endpoint, plan: LevelPlan, max_tokens: int, perf_out: Path | None = None,
               keep_requests: bool = False) -> dict:
    steps_before = read_metrics(endpoint.metrics_url)
    before = cpu_seconds(endpoint.pid)
    threads_before, client_before, steal_before = thread_cpu_seconds(endpoint.pid), own_cpu_seconds(), steal_seconds()
    sampler = perf_record(endpoint.pid, perf_out) if perf_out else None
    try:
        result = run_level(endpoint, plan, max_tokens, progress=False)
    finally:
        if sampler:
            sampler.send_signal(signal.SIGINT)
            sampler.wait()
    cpu = cpu_seconds(endpoint.pid) - before
    threads = busy_threads(threads_before, thread_cpu_seconds(endpoint.pid))
    client_cpu, steal = own_cpu_seconds() - client_before, steal_seconds() - steal_before
    steps_after = read_metrics(endpoint.metrics_url)
    summary = summarize(result)
    tokens = sum(record.completion_tokens or 0 for record in result.records)
    timings = {"requests": request_timings(result.records)} if keep_requests else {}
    return {"tok_s": summary["throughput_tok_s"], "tokens": tokens, "wall_s": result.wall_s, **timings,
            "errors": summary["errors"], "tpot_ms_p50": summary["tpot_ms_p50"], "itl_ms_p99": summary["itl_ms_p99"],
            "cpu_ms_per_token": 1000 * cpu / tokens if tokens else None,
            "threads_cpu_s": threads, "client_cpu_s": round(client_cpu, 2), "steal_s": round(steal, 2),
            "engine_steps": (step_delta(parse_steps(steps_before), parse_steps(steps_after))
                             if steps_before is not None and steps_after is not None else None)}


def engine_line(steps: dict) -> str:
    """Tandem's engine over the level, from its /metrics: the steps, and their time outside the
    target's verify calls (planning, drafting, admission and its prompt-cache copies, committing)."""
    outside = steps["step_s"] - steps["verify_s"]
    per_step = 1000 * outside / steps["steps"] if steps["steps"] else 0.0
    return (f"engine: {steps['steps']} steps, {steps['step_s']:.2f} s in them, {steps['verify_s']:.2f} s in verify "
            f"calls, {outside:.2f} s outside them ({per_step:.2f} ms a step)")


def pooled_rate(runs: list[dict]) -> float:
    """All of a server's completion tokens over all its wall time, across repeats."""
    wall = sum(run["wall_s"] for run in runs)
    return sum(run["tokens"] for run in runs) / wall if wall else 0.0


def _ms(value: float | None) -> str:
    return "     -" if value is None else f"{value:6.1f}"


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.3f}x" if b else "n/a"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--configs", default="tandem-spec,llama-server",
                        help=f"comma-separated bench-serve configs, ratios against the first (known: {', '.join(SERVER_KINDS)})")
    parser.add_argument("--target", default=DEFAULT_TARGET)
    parser.add_argument("--draft", default=DEFAULT_DRAFT)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--requests", type=int, default=20, help="requests per repeat")
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=50)
    parser.add_argument("--max-tokens-spread", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--out", default="serve-ab-results", help="folder for server logs and results.json")
    parser.add_argument("--perf", action="store_true",
                        help="sample each server with `perf record -g` during its levels: OUT/perf/<config>-<repeat>.data "
                             "(scripts/perf_breakdown.py sums them by kind of work)")
    parser.add_argument("--requests-out", action="store_true",
                        help="keep each request's TTFT, end-to-end time, token counts and gaps in results.json")
    args = parser.parse_args()
    try:
        configs = parse_configs(args.configs)
        if len(configs) < 2:
            raise TandemError("--configs needs at least two servers to compare")
        if args.repeats < 1 or args.requests < args.concurrency:
            raise TandemError("--repeats must be at least 1 and --requests at least --concurrency")
        if args.perf and not shutil.which("perf"):
            raise TandemError("--perf needs Linux perf on the PATH (Debian: apt install linux-perf)")
        settings = ServeBenchSettings(args.target, args.draft, configs, (args.concurrency,), DEFAULT_WORKLOAD,
                                      Path(args.out), num_prompts=args.requests, max_tokens=args.max_tokens,
                                      max_tokens_spread=args.max_tokens_spread, threads=args.threads)
        kinds = [SERVER_KINDS[name]() for name in configs]
        launch = server_launch(settings, kinds)
        prompts = load_prompts(DEFAULT_WORKLOAD)
        if args.requests * args.repeats > len(prompts):  # a later pair would repeat an earlier one's prompts
            print(f"note: {args.repeats} repeats of {args.requests} requests take {args.requests * args.repeats} "
                  f"of the workload's {len(prompts)} prompts: later pairs repeat earlier prompts (marked, but "
                  "their greedy answers are the earlier ones, which Tandem's shared n-gram store and suffix "
                  "index, kept between pairs, copy)", file=sys.stderr)
    except TandemError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    runs: dict[str, list[dict]] = {label: [] for label in configs}
    with ExitStack() as servers:
        endpoints, _ = start_servers(servers, kinds, launch, args.max_tokens, settings.out_dir / "logs")
        for repeat in range(args.repeats):
            plan = LevelPlan(args.concurrency, tuple(level_requests(prompts, args.requests, repeat * args.requests,
                                                                    args.max_tokens_spread)))
            order = list(configs) if repeat % 2 == 0 else list(reversed(configs))
            for label in order:
                perf_out = settings.out_dir / "perf" / f"{label}-{repeat}.data" if args.perf else None
                if perf_out:
                    perf_out.parent.mkdir(parents=True, exist_ok=True)
                runs[label].append(run_repeat(endpoints[label], plan, args.max_tokens, perf_out,
                                                 args.requests_out))
            first = runs[configs[0]][-1]
            print(f"repeat {repeat} (order {', '.join(order)}):", flush=True)
            for label in configs:
                run = runs[label][-1]
                print(f"  {label:<18} {run['tok_s']:6.2f} tok/s  TPOT p50 {_ms(run['tpot_ms_p50'])} ms  "
                      f"ITL p99 {_ms(run['itl_ms_p99'])} ms  CPU {_ms(run['cpu_ms_per_token'])} ms/token  "
                      f"errors {run['errors']}  {configs[0]} / this {_ratio(first['tok_s'], run['tok_s'])}", flush=True)
                threads = ", ".join(f"{one['cpu_s']:.2f}{' (main)' if one['main'] else ''}" for one in run["threads_cpu_s"])
                print(f"  {'':<18} CPU s by thread: {threads}; this client's: {run['client_cpu_s']:.2f}; "
                      f"stolen by the host: {run['steal_s']:.2f}", flush=True)
                if run["engine_steps"]:
                    print(f"  {'':<18} {engine_line(run['engine_steps'])}", flush=True)
    print(f"C={args.concurrency}, {args.repeats} repeats of {args.requests} requests:")
    summary = {}
    first_rate = pooled_rate(runs[configs[0]])
    for label in configs[1:]:
        pairs = [(a, b) for a, b in zip(runs[configs[0]], runs[label])]
        # a pair where either side had an error has no ratio (failed requests count no tokens,
        # which would favour the other side), whichever side failed
        each = [a["tok_s"] / b["tok_s"] for a, b in pairs if b["tok_s"] and not a["errors"] and not b["errors"]]
        rate = pooled_rate(runs[label])
        if not each or not rate:
            print(f"  {configs[0]} / {label}: no ratio: every pair had an error, or {label} produced no tokens")
            continue
        if len(each) < len(pairs):
            print(f"  {configs[0]} / {label}: {len(pairs) - len(each)} of {len(pairs)} pairs left out (errors)")
        pooled = first_rate / rate
        summary[label] = {"ratios": each, "median": median(each), "pooled": pooled}
        print(f"  {configs[0]} / {label}: median {median(each):.3f}x, pooled {pooled:.3f}x, "
              f"each {', '.join(f'{r:.3f}' for r in each)}")
    settings.out_dir.mkdir(parents=True, exist_ok=True)
    (settings.out_dir / "results.json").write_text(json.dumps(
        {"command": " ".join(sys.argv), "args": vars(args), "runs": runs, "ratios": summary}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
