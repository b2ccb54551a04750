"""`tandem simulate`: predict a cluster's throughput and latency by discrete-event simulation.

    tandem simulate --cluster FILE [--rate R | --concurrency C] [--requests N] [--max-tokens T]
                    [--acceptance A] [--seed S] [--json] [--out DIR] [--measured RUN.json]
    tandem simulate --scaling FILE --out DIR [--sizes 1,2,4,...]

The first simulates one cluster file under one workload (the planner's placement, or the roles
as written); the second sweeps the number of devices of a mix and writes scaling.json,
scaling.md and scaling.png. Results go to stdout; notes to stderr. The main options only:
`--help` and docs/cli.md list them all.
"""

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from tandem.cli.int_list import int_list, real_number, whole_number
from tandem.errors import TandemError
from tandem.speculation.depth import K_LIMIT

if TYPE_CHECKING:  # the cluster modules load only when a simulation runs (fast --help)
    from tandem.cluster.config.cluster_spec import ClusterSpec

DEFAULT_CONCURRENCY = 8
DEFAULT_REQUESTS = 64
DEFAULT_MAX_TOKENS = 128
DEFAULT_WAVES = 3


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "simulate", help="predict a cluster's throughput and latency by simulation",
        description="A discrete-event simulation of a speculative-decoding cluster: the devices' cost "
        "curves (measured or public-spec profiles), network round trips, request arrivals and acceptance. "
        "Predicts throughput and latency percentiles; --scaling sweeps the number of devices.")
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--cluster", help="cluster file to simulate")
    what.add_argument("--scaling", help="cluster file whose device mix to sweep (needs --out)")
    load = parser.add_mutually_exclusive_group()
    load.add_argument("--rate", type=real_number(0, above=True), help="Poisson arrivals, requests per second")
    load.add_argument("--concurrency", type=whole_number(1), help=f"closed-loop clients (default {DEFAULT_CONCURRENCY})")
    parser.add_argument("--requests", type=whole_number(1), default=None, help=f"requests (default {DEFAULT_REQUESTS})")
    parser.add_argument("--max-tokens", type=whole_number(1), default=None,
                        help=f"output tokens per request (default {DEFAULT_MAX_TOKENS})")
    parser.add_argument("--prompt-tokens", type=whole_number(1), default=None,
                        help="prompt tokens per request (default: estimated from the default bench workload)")
    parser.add_argument("--shared-prefix-tokens", type=whole_number(0), default=None,
                        help="every prompt opens with these same tokens (a system prompt), which a replica scores "
                        "once and then reuses (default: the openings the --measured run's prompts share, where "
                        "they are replayed; else none)")
    parser.add_argument("--max-running", type=whole_number(1), default=None,
                        help="the router's cap on requests in flight, as `tandem serve --max-running` (default: "
                        "none beyond the replicas' slots, or the --conversations run's own where it records one)")
    parser.add_argument("--conversations", default=None, metavar="FILE",
                        help="replay a multi-turn run (scripts/measure_cluster_multiturn.py --out DIR writes "
                        "DIR/SCENARIO.json): its conversations turn by turn, each turn resending the history, at "
                        "its concurrency (--concurrency overrides); prints TTFT p50 by turn and the router's "
                        "placements against the run's")
    parser.add_argument("--acceptance", type=real_number(0, 1, below=True), default=None,
                        help="per-token acceptance of the model and hybrid drafters, from 0 to below 1 (default: the "
                        "file's acceptance, else the drafter table's prior)")
    parser.add_argument("--seed", type=whole_number(0), default=0, help="the simulation's random seed (default 0)")
    parser.add_argument("--roles", choices=("plan", "as-written"), default="plan",
                        help="simulate the planner's placement (default) or the file's roles as written")
    parser.add_argument("--batching", choices=("backend", "fused", "serial"), default=None,
                        help="how verifiers batch: backend (as each backend does today: fused for llama.cpp and "
                        "torch's fused runner), fused, or serial (torch's --torch-runner serial). Default: backend "
                        "with --cluster, fused with --scaling")
    parser.add_argument("--max-batch", type=whole_number(1), default=None, help="sequences per verifier step (default: the plan's batch; "
                        "with --roles as-written, a replica's slots, 8)")
    parser.add_argument("--step-overhead-ms", type=real_number(0), default=None,
                        help="per-step time besides the calls: bookkeeping, RPC (default 1.0, the engine's prior)")
    parser.add_argument("--k", type=whole_number(0, K_LIMIT), default=None,
                        help="draft this many tokens every round (default: the file's k, else the engine's planner)")
    parser.add_argument("--host-cores", type=whole_number(1), default=None,
                        help="the cluster's CPU workers share one machine with this many cores (a local "
                        "cluster): calls that overlap there slow each other down (default: each worker "
                        "has its own cores)")
    parser.add_argument("--measured", help="a measured run (JSON) to compare the prediction with; where it gives "
                        "call_seconds (bench-cluster's measured.json), also simulated again with every device "
                        "at the speed the run found it")
    parser.add_argument("--sizes", type=int_list(), default=None, help="--scaling: comma-separated device counts (default "
                        "1,2,4,8,16,32,64)")  # scaling.SWEEP_SIZES (a test checks), not imported for --help
    parser.add_argument("--waves", type=whole_number(1), default=None, help=f"--scaling: requests per planned batch slot (default {DEFAULT_WAVES})")
    parser.add_argument("--json", action="store_true", help="--cluster: print the result as JSON")
    parser.add_argument("--out", help="folder for simulation.json (or the scaling files)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from tandem.bench.out_dir import prepare_out_dir

    only_scaling = [option for option, value in (("--sizes", args.sizes), ("--waves", args.waves)) if value is not None]
    if not args.scaling and only_scaling:
        raise TandemError(f"{' and '.join(only_scaling)} {'apply' if len(only_scaling) > 1 else 'applies'} only with --scaling")
    if args.scaling and args.measured:
        raise TandemError("--measured applies only with --cluster (a sweep has no one measured run)")
    if args.scaling and args.json:
        raise TandemError("--json applies only with --cluster (a sweep writes scaling.json into --out)")
    only_cluster = [option for option, value in (
        ("--shared-prefix-tokens", args.shared_prefix_tokens), ("--rate", args.rate), ("--concurrency", args.concurrency),
        ("--requests", args.requests), ("--k", args.k), ("--max-running", args.max_running),
        ("--max-batch", args.max_batch), ("--step-overhead-ms", args.step_overhead_ms),
        ("--host-cores", args.host_cores), ("--conversations", args.conversations),
        ("--roles as-written", None if args.roles == "plan" else args.roles)) if value is not None]
    if args.scaling and only_cluster:  # the sweep sets its own load and plans every size
        raise TandemError(f"{', '.join(only_cluster)}: {'apply' if len(only_cluster) > 1 else 'applies'} only with "
                          "--cluster (a --scaling sweep takes --sizes, --waves, --max-tokens, --prompt-tokens, "
                          "--acceptance, --batching and --seed)")
    if args.conversations:
        given = [option for option, value in (("--scaling", args.scaling), ("--measured", args.measured),
                                              ("--rate", args.rate), ("--requests", args.requests),
                                              ("--max-tokens", args.max_tokens), ("--prompt-tokens", args.prompt_tokens))
                 if value is not None]
        if given:
            raise TandemError(f"--conversations replays a run's own requests: leave out {', '.join(given)}")
    from tandem.cluster.config.load import load_cluster

    spec = load_cluster(args.scaling or args.cluster)  # a bad file leaves no output folder behind
    if args.scaling:
        from tandem.cluster.sim.scaling import SWEEP_SIZES, check_sizes

        check_sizes(spec, args.sizes or SWEEP_SIZES)
    _check_context(spec, args.prompt_tokens, args.max_tokens)
    if args.out:
        prepare_out_dir(Path(args.out))  # before the work, not after it
    if args.scaling:
        return _scaling(args, spec)
    return _simulate(args, spec)


def _check_context(spec, prompt_tokens: int | None, max_tokens: int | None) -> None:
    """Refuse requests longer than a catalog model of the cluster can hold (a server answers
    them 400; priced anyway, a 100,000-token prompt on an 8,192-token model read as a latency)."""
    from tandem.models.catalog import CATALOG

    needed = (prompt_tokens or 0) + (DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens)
    models = {name for w in spec.workers for name in (w.model, w.draft_model) if name in CATALOG}
    for name in sorted(models, key=lambda name: CATALOG[name].context_length):
        if needed > CATALOG[name].context_length:
            given = " and ".join(f"{option} {value}" for option, value in (("--prompt-tokens", prompt_tokens),
                                                                            ("--max-tokens", max_tokens)) if value)
            raise TandemError(f"{given or 'the requests'}: {needed} tokens a sequence, more than the "
                              f"{CATALOG[name].context_length} that {name} holds (a server refuses such a request)")


def _simulate(args: argparse.Namespace, spec: "ClusterSpec") -> int:
    from tandem.cluster.planning.planner import plan_cluster
    from tandem.cluster.profiles.profile_store import cluster_profiles
    from tandem.cluster.sim.adapter import SimOptions, simulation_from_cluster
    from tandem.cluster.sim.multiturn import MultiTurnRun, compare_turns, turn_lines
    from tandem.cluster.sim.simulator import simulate
    from tandem.cluster.sim.summary import comparison_lines, summary_lines
    from tandem.cluster.sim.validation import MeasuredRun, compare_with_measurement, run_speed

    plan = plan_cluster(spec, cluster_profiles(spec)) if args.roles == "plan" else None
    overhead = {} if args.step_overhead_ms is None else {"step_overhead_ms": args.step_overhead_ms}
    measured = MeasuredRun.load(args.measured) if args.measured else None
    conversations = MultiTurnRun.load(args.conversations) if args.conversations else None
    max_running = args.max_running or (conversations.max_running if conversations else None)
    options = _checked(lambda: SimOptions(acceptance=args.acceptance, max_batch=args.max_batch, seed=args.seed,
                                          fused=_fused(args.batching, default=None), host_cores=args.host_cores,
                                          fixed_k=args.k, max_running=max_running, **overhead))
    if conversations is not None:
        workload = _checked(lambda: conversations.workload(args.concurrency, _shared_prefixes(args, ())))
    else:
        _as_measured(args, measured)
        recorded = _recorded_prompts(args, measured)
        workload = _workload(args, recorded, _shared_prefixes(args, measured.prompt_prefixes if recorded is not None else ()))
    simulation = _checked(lambda: simulation_from_cluster(spec, workload, options, plan))
    result = simulate(simulation)
    comparison = compare_with_measurement(result, measured) if measured else None
    turns = compare_turns(result, conversations) if conversations else None
    for figures, run, compare in ((comparison, measured, compare_with_measurement), (turns, conversations, compare_turns)):
        if run is not None and run.call_seconds:  # again, every device at the speed the run found it
            speed = run_speed(result, run.call_seconds)
            again = simulate(simulation_from_cluster(spec, workload, replace(options, device_speed=speed), plan))
            figures["at_run_speed"] = {"device_speed": round(speed, 4), **compare(again, run)}
    report = {"cluster": args.cluster, "roles": args.roles, "plan": plan.chosen.label() if plan else None,
              "options": {name: value for name, value in vars(args).items() if name != "func"},
              "simulated": _as_simulated(simulation), "result": result.to_json(), "comparison": comparison,
              **({"turns": turns} if turns else {})}
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        placement = _placement_label(plan, args.k if args.k is not None else spec.k)
        print("\n".join(summary_lines(result, f"simulated {result.requests} requests on {args.cluster} "
                                               f"({placement})")))
        if comparison:
            print("\n".join(comparison_lines(comparison)))
        if turns:
            print("\n".join(turn_lines(turns)))
    if args.out:
        path = Path(args.out) / "simulation.json"
        path.write_text(json.dumps(report, indent=1))
        print(f"wrote {path}", file=sys.stderr)
    return 0


def _placement_label(plan, fixed_k: int | None) -> str:
    """What was simulated: the plan's placement and drafter, and the depth the rounds drafted (the
    engine's planner per round unless --k or the file fixes it; the header said the plan's k,
    which is its estimate, not what ran)."""
    if plan is None:
        return "roles as written" + (f", k={fixed_k}" if fixed_k is not None else "")
    chosen = plan.chosen
    if chosen.drafter_kind == "none":
        return "plan: none"
    depth = f"k={fixed_k}" if fixed_k is not None else f"k auto per round; the plan estimated k={chosen.k}"
    return f"plan: {chosen.drafter_kind}, {depth}"


def _scaling(args: argparse.Namespace, spec: "ClusterSpec") -> int:
    from tandem.cluster.sim.lengths import FixedLength
    from tandem.cluster.sim.scaling import SWEEP_SIZES, SweepOptions, sweep
    from tandem.cluster.sim.scaling_report import steady, write_scaling

    if not args.out:
        raise TandemError("--scaling needs --out DIR")
    sizes = SWEEP_SIZES if args.sizes is None else args.sizes
    prompts = FixedLength(args.prompt_tokens) if args.prompt_tokens else None
    waves = DEFAULT_WAVES if args.waves is None else args.waves
    max_tokens = DEFAULT_MAX_TOKENS if args.max_tokens is None else args.max_tokens
    options = _checked(lambda: SweepOptions(sizes, waves, max_tokens, prompts, args.acceptance,
                                            _fused(args.batching, default=True), seed=args.seed))

    def row_line(row: dict) -> None:
        print(f"{row['devices']:3d} devices  {row['mode']:11s}  {row['plan']['drafter']:12s}  "
              f"steady {steady(row):>10,.0f} tok/s  whole run {row['throughput_tok_s']:>10,.0f} tok/s  "
              f"p50 {row['latency_ms']['p50']:>7,.0f} ms", flush=True)

    result = sweep(spec, options, said=lambda line: print(line, file=sys.stderr, flush=True),
                   on_row=row_line)  # each row as its size is done: a large size simulates for minutes
    paths = write_scaling(result, args.out)
    print(f"wrote {', '.join(str(p) for p in paths)}", file=sys.stderr)
    return 0


def _as_measured(args: argparse.Namespace, measured) -> None:
    """A measured run is simulated as it ran: its requests, concurrency and answer length (the
    mean answer, else max_tokens) where the options do not say them, and a note where they say
    otherwise or the run does not record them (the comparison is then of another workload: 64
    default requests of 128 tokens against a run of 2 gave errors of +266% and +854%)."""
    if measured is None:
        return
    taken, differ, unknown = [], [], []
    for option, name, value in (("--requests", "requests", measured.requests),
                                ("--concurrency", "concurrency", measured.concurrency),
                                ("--max-tokens", "max_tokens", measured.answer_tokens())):
        given = getattr(args, name)
        if value is None:
            if given is None and not (name == "concurrency" and args.rate is not None):
                unknown.append(option)
        elif name == "concurrency" and args.rate is not None:
            differ.append(f"--rate {args.rate:g} (the run: concurrency {value})")
        elif given is None:
            setattr(args, name, value)
            taken.append(f"{option} {value}")
        elif given != value:
            differ.append(f"{option} {given} (the run: {value})")
    if taken:
        print(f"from the measured run: {', '.join(taken)}", file=sys.stderr)
    if differ:
        print(f"note: simulating {', '.join(differ)}: the comparison below is with another workload", file=sys.stderr)
    if unknown:
        print(f"note: {args.measured} does not say its {', '.join(o[2:] for o in unknown)}: simulated with the "
              f"defaults; give {', '.join(unknown)} as the run had {'them' if len(unknown) > 1 else 'it'}", file=sys.stderr)


def _recorded_prompts(args: argparse.Namespace, measured):
    """A measured run that lists its requests' prompt lengths is replayed with them, unless
    --prompt-tokens says otherwise."""
    if measured is None or args.prompt_tokens or not measured.prompt_tokens:
        return None
    from tandem.cluster.sim.lengths import RecordedLengths

    count = len(measured.prompt_tokens)
    print(f"prompt lengths: the {count} recorded in {args.measured}, in the order sent", file=sys.stderr)
    return _checked(lambda: RecordedLengths(measured.prompt_tokens))


def _shared_prefixes(args: argparse.Namespace, replayed: tuple) -> tuple:
    """--shared-prefix-tokens N: every prompt opens with the same N tokens; else the openings of
    the measured run whose prompts are replayed (`replayed`, empty where none are)."""
    if args.shared_prefix_tokens is not None:
        if args.prompt_tokens and args.shared_prefix_tokens >= args.prompt_tokens:
            raise TandemError(f"--shared-prefix-tokens {args.shared_prefix_tokens} must be below --prompt-tokens "
                              f"{args.prompt_tokens}: a prompt's last token is always scored")
        return ((0, args.shared_prefix_tokens),) if args.shared_prefix_tokens else ()
    return replayed


def _workload(args: argparse.Namespace, recorded=None, prefixes: tuple = ()):
    from tandem.bench.workload import DEFAULT_WORKLOAD
    from tandem.cluster.sim.config import Workload
    from tandem.cluster.sim.lengths import FixedLength, workload_prompt_lengths

    if recorded is not None:
        prompts = recorded
    elif args.prompt_tokens:
        prompts = FixedLength(args.prompt_tokens)
    else:
        prompts = workload_prompt_lengths(DEFAULT_WORKLOAD)
    concurrency = None if args.rate is not None else (args.concurrency or DEFAULT_CONCURRENCY)
    requests = DEFAULT_REQUESTS if args.requests is None else args.requests
    max_tokens = DEFAULT_MAX_TOKENS if args.max_tokens is None else args.max_tokens
    return _checked(lambda: Workload(requests, prompts, FixedLength(max_tokens), args.rate, concurrency,
                                     prefixes))


def _as_simulated(simulation) -> dict:
    """What the options resolved to (they record None where a default or the plan decided)."""
    workload = simulation.workload
    prompts = workload.prompt_tokens
    return {"verifiers": [{"device": v.device.name, "drafter": v.drafter, "max_batch": v.max_batch,
                           "fused": v.device.fused} for v in simulation.verifiers],
            "requests": workload.num_requests, "concurrency": workload.concurrency, "rate_per_s": workload.rate_per_s,
            "prompt_tokens": _lengths(prompts),
            "fixed_k": simulation.depth.fixed_k, "step_overhead_ms": simulation.step_overhead_ms,
            "seed": simulation.seed}


def _lengths(model) -> int | dict:
    """A fixed prompt length, or how lengths were drawn: from which values, in order or at random."""
    from tandem.cluster.sim.lengths import RecordedLengths

    tokens = getattr(model, "tokens", None)
    if tokens is not None:
        return tokens
    values = model.values
    return {"drawn": "in order" if isinstance(model, RecordedLengths) else "at random",
            "from": len(values), "min": min(values), "mean": round(sum(values) / len(values), 1), "max": max(values)}


def _fused(batching: str | None, default: bool | None) -> bool | None:
    return {None: default, "backend": None, "fused": True, "serial": False}[batching]


def _checked(build):
    """Configuration errors (ValueError from the dataclasses) as user errors."""
    try:
        return build()
    except ValueError as error:
        raise TandemError(str(error)) from None
