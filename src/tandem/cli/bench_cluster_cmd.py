"""`tandem bench-cluster --cluster FILE`: cluster vs single worker, each replica solo, verify-only."""

import argparse
from pathlib import Path

from tandem.cli.options import depth_option
from tandem.speculation.drafters.registry import drafter_help


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("bench-cluster", help="measure a cluster against one worker on the same hardware")
    parser.add_argument("--cluster", required=True, help="cluster YAML file")
    parser.add_argument("--drafter", default=None, metavar="NAME", help=drafter_help())
    parser.add_argument("--k", type=depth_option, default="auto", help="speculation depth: an integer, or auto")
    parser.add_argument("--configs", default="single,cluster,cluster-verify-only",
                        help="comma-separated, run in this order: single, solo (each verifier replica alone), "
                        "cluster (the router over the replicas), cluster+draft-ahead (drafters draft the next "
                        "round while one verifies), cluster-verify-only (no drafts); default %(default)s")
    parser.add_argument("--concurrency", type=int, default=4, help="requests in flight (default %(default)s)")
    parser.add_argument("--requests", type=int, default=16,
                        help="requests per configuration, the same for each (default %(default)s)")
    parser.add_argument("--max-tokens", type=int, default=50, help="max new tokens per request (default %(default)s)")
    parser.add_argument("--repeat", type=int, default=1,
                        help="run the configurations this many times in turn (default 1); the report adds "
                        "each one's mean and the cluster's ratio to the mean solo sum")
    parser.add_argument("--ray-address", default=None, help="join this Ray cluster (default: start a local one)")
    parser.add_argument("--out", default="bench-cluster-out",
                        help="output folder for report.md, results.json and measured*.json (default %(default)s)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from tandem.bench.cluster.run import CONFIGS, run_cluster_bench
    from tandem.bench.out_dir import prepare_out_dir
    from tandem.cluster.runtime.launch import ClusterOptions, check_draft_ahead
    from tandem.cluster.config.load import load_cluster
    from tandem.errors import TandemError
    from tandem.speculation.depth import parse_depth
    from tandem.speculation.drafters.registry import check_drafter, default_drafter

    configs = tuple(c.strip() for c in args.configs.split(",") if c.strip())
    unknown = [c for c in configs if c not in CONFIGS]
    if unknown or not configs:
        named = f"unknown configs {', '.join(unknown)}" if unknown else "no config named"
        raise TandemError(f"{named}; choose from {', '.join(CONFIGS)}")
    if len(set(configs)) < len(configs):
        raise TandemError(f"--configs names one more than once: {args.configs} (use --repeat to run them again)")
    if args.concurrency < 1 or args.requests < 1 or args.max_tokens < 1 or args.repeat < 1:
        raise TandemError("--concurrency, --requests, --max-tokens and --repeat must be positive")
    cluster = ClusterOptions(load_cluster(args.cluster), args.ray_address)
    drafter = check_drafter(args.drafter or default_drafter(cluster.has_drafter), cluster.has_drafter,
                            how_to_add="the cluster file has no worker with a draft_model")
    if "cluster+draft-ahead" in configs:
        check_draft_ahead(drafter)
    prepare_out_dir(Path(args.out))  # after the inputs are read (no folder left by a typo), before the runs
    run_cluster_bench(cluster, drafter, parse_depth(args.k), args.concurrency, args.requests,
                      args.max_tokens, configs, Path(args.out), repeats=args.repeat)
    print((Path(args.out) / "report.md").read_text())
    return 0
