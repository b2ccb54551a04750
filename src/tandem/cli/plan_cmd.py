"""`tandem plan --cluster FILE`: choose which workers verify and draft, the drafter kind and k,
and explain the choice with predicted numbers beside the naive article rule's placement."""

import argparse
import json

from tandem.cli.int_list import real_number, whole_number
from tandem.cluster.config.cluster_spec import ACCEPTANCE_SOURCES
from tandem.cluster.config.load import load_cluster
from tandem.cluster.planning.plan_report import plan_json, plan_text
from tandem.cluster.planning.planner import PLAN_K_MAX, options_for, plan_cluster
from tandem.cluster.profiles.profile_store import cluster_profiles
from tandem.errors import TandemError
from tandem.speculation.depth import K_LIMIT
from tandem.speculation.drafters.registry import DRAFTERS, check_drafter


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "plan", help="place drafters and verifiers on a cluster, explained",
        description="Choose which workers of a cluster file verify and which draft, the drafter kind and k, from "
                    "their saved profiles (`tandem profile --cluster FILE` measures them), with predicted tokens/s "
                    "and ms per token beside the naive rule's placement. Options default to the file's values.")
    parser.add_argument("--cluster", required=True, help="cluster file (see docs/cluster.md)")
    parser.add_argument("--latency-target-ms", type=real_number(0, above=True), default=None,
                        help="most ms per generated token at the planned load (default: the file's)")
    parser.add_argument("--drafter", choices=("auto", *DRAFTERS), default=None,
                        help="fix the drafter (default: the file's, else auto)")
    parser.add_argument("--k", type=whole_number(0, K_LIMIT), default=None, help=f"fix k (default: the file's, else 1..{PLAN_K_MAX})")
    parser.add_argument("--acceptance", default=None,
                        help="acceptance assumptions, e.g. model=0.7,ngram=0.45,hybrid=0.7 (default: the file's, "
                        "else the drafter table's priors)")
    parser.add_argument("--max-batch", type=whole_number(1), default=None, help="cap on sequences per verifier step (default: none; "
                        "the plan tries the batch sizes each profile measured, up to this)")
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.drafter == "none" and args.k:
        raise TandemError(f"--k {args.k} with --drafter none: that drafter drafts nothing")
    spec = load_cluster(args.cluster)
    drafter = spec.drafter if args.drafter is None else args.drafter  # the option, else the file's
    if drafter != "auto":  # as serve --cluster and bench-cluster refuse it
        check_drafter(drafter, spec.has_draft_model, how_to_add="the cluster file has no worker with a draft_model")
    options = options_for(spec, args.latency_target_ms, args.drafter, args.k,
                          _acceptance(args.acceptance), max_batch=args.max_batch)
    plan = plan_cluster(spec, cluster_profiles(spec), options)
    print(json.dumps(plan_json(plan), indent=1) if args.json else plan_text(plan, args.cluster))
    return 0




def _acceptance(text: str | None) -> dict[str, float] | None:
    if not text:
        return None
    values = {}
    for part in text.split(","):
        name, _, value = part.partition("=")
        try:
            values[name.strip()] = real_number(0, 1, below=True)(value)
        except argparse.ArgumentTypeError:
            raise TandemError(f"--acceptance wants NAME=RATE pairs with rates from 0 to below 1, like model=0.7 "
                              f"(got {part!r})") from None
    unknown = set(values) - set(ACCEPTANCE_SOURCES)
    if unknown:
        raise TandemError(f"--acceptance knows {', '.join(ACCEPTANCE_SOURCES)} (got {', '.join(sorted(unknown))})")
    return values
