"""`tandem bench-ceiling`: how close a bench-serve run came to the copy ceiling, per category
(bench/ceiling/oracle.py: an oracle drafting the longest verbatim run of the answer from the prompt
and the answer so far, priced on the target's verify curve measured here), and how close
Tandem's own copy drafting, replayed on the same answers and priced the same way, comes
(bench/ceiling/drafting_replay.py)."""

import argparse
import sys
from pathlib import Path

from tandem.bench.ceiling.oracle import MAX_DRAFT
from tandem.cli.int_list import int_list, thread_count, whole_number

DEFAULT_CONTEXTS = "512,1024,2048"
_contexts = int_list(1, 32768, sort=True)  # cached tokens a curve is measured at
PREFILL_CHUNK = 512  # tokens per call while filling the cache up to a context
CURVE_REPEATS = 5  # samples per size at each context; a size is priced at their median


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "bench-ceiling", help="a bench-serve run's decode rates against the copy ceiling of its workload",
        description="Reads a bench-serve results.json, measures the target's verify curve (1..64 tokens at "
        "each of --contexts cached tokens, llama.cpp, --threads), and prints per category: plain decoding, a "
        "3-token suffix matcher and the oracle ceiling, every round priced at its own context (the prompt and "
        "the answer so far) between those curves; Tandem's copy drafting and depth planner replayed on the same "
        "answers and priced the same way (unless --no-replay); and each config's measured decode rate against "
        "the ceiling.")
    parser.add_argument("results", help="a bench-serve results.json")
    parser.add_argument("--concurrency", type=whole_number(1), default=None, help="the level to read (default: the lowest)")
    parser.add_argument("--reference", default=None,
                        help="the config whose answers define the workload (default: the first tandem one)")
    parser.add_argument("--contexts", type=_contexts, default=DEFAULT_CONTEXTS,
                        help=f"cached tokens the curves are measured at, comma-separated (default {DEFAULT_CONTEXTS}; "
                        "one value prices every round at it)")
    parser.add_argument("--max-draft", type=whole_number(1, MAX_DRAFT), default=MAX_DRAFT,
                        help=f"longest draft, at most {MAX_DRAFT}: a round of {MAX_DRAFT + 1} tokens, the largest the curves price (default {MAX_DRAFT})")
    parser.add_argument("--threads", type=thread_count, default=None, help="threads for the curve (default: the run's)")
    parser.add_argument("--curves", default=None,
                        help="price on the verify curves a previous bench-ceiling printed (its --out file or its "
                        "'verify curve at ...' lines) instead of measuring them here: a run from another machine "
                        "re-priced at that machine's costs (--contexts and --threads are then ignored)")
    parser.add_argument("--no-replay", action="store_true",
                        help="skip replaying Tandem's copy drafting on the answers")
    parser.add_argument("--out", default=None, help="also write the table to this markdown file")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from tandem.bench.ceiling.report import ceilings, check_inputs, curve_lines, load_level, read_curves, render
    from tandem.bench.ceiling.drafting_replay import DraftingReplay, replay_pricing
    from tandem.bench.out_dir import check_out_file
    from tandem.models.resolve import tokenizer_path
    from tandem.text.tokenizer import TextTokenizer

    if args.out:
        check_out_file(Path(args.out))  # before the work, not after it
    results, level = load_level(Path(args.results), args.concurrency)
    check_inputs(results, level, args.reference)
    settings = results["settings"]
    target = settings["target"]
    tokenizer = TextTokenizer(str(tokenizer_path(target)))
    if args.curves:
        curves = read_curves(_read_text(args.curves))
        source = f"curves read from {args.curves}"
    else:
        curves = measure_verify_curves(target, args.contexts, args.threads or settings.get("threads"))
        source = "curves measured here"
    print("\n".join(curve_lines(curves)), file=sys.stderr)
    cost_ms, planner = replay_pricing(curves)
    replay = None if args.no_replay else DraftingReplay(cost_ms, planner).replay_ms
    label, table = ceilings(results, level, tokenizer, cost_ms, args.reference, args.max_draft, replay)
    contexts = ", ".join(str(c) for c in sorted(curves))
    lines = [f"answers: {label}'s at C={level['concurrency']}; machine: {(results.get('machine') or {}).get('cpu_model', 'not recorded')}; "
             f"rounds priced at their context between curves at {contexts} cached tokens ({source})", "",
             *render(table, list(level["configs"]))]
    print("\n".join(lines))
    if args.out:  # with the curves' lines, so that a later --curves may read this file
        Path(args.out).write_text("\n".join(lines + ["", *curve_lines(curves)]) + "\n")
    return 0


def _read_text(path: str) -> str:
    from tandem.errors import TandemError

    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise TandemError(f"cannot read curves from {path}: {error}") from None


def measure_verify_curves(target: str, contexts: tuple[int, ...], threads: int | None) -> dict:
    """The llama.cpp target's time to score n tokens (all their logits) on each of `contexts`
    cached ones (one cache, grown from one context to the next): the median of CURVE_REPEATS
    calls, what a round typically costs. The fastest (a profile's planning figure) priced the
    ceiling below what any run could hold: on the Zen 3 EPYC VM, where calls of 64 tokens vary
    by 10-30% from one minute to the next, an edits run's own calls took 8% longer than the
    fastest-of-3 curve priced them (scripts/round_trace.py, docs/copy-ceiling.md)."""
    from statistics import median

    from tandem.bench.ceiling.report import CURVE_SIZES
    from tandem.models.batch_runner import SlotView
    from tandem.models.cost import measure_cost
    from tandem.models.llamacpp_batch_runner import LlamaCppBatchRunner
    from tandem.models.resolve import gguf_path
    from tandem.progress import ProgressBar

    runner = LlamaCppBatchRunner(str(gguf_path(target)), 1, max(contexts) + max(CURVE_SIZES) + 8, threads)
    view = SlotView(runner)
    filler = [100 + (i * 7) % 5000 for i in range(max(contexts))]
    curves, cached = {}, 0
    with ProgressBar(total=len(contexts) * (1 + CURVE_REPEATS * len(CURVE_SIZES)), desc="measuring the verify curves",
                     unit="call", file=sys.stderr, leave=False) as bar:
        for context in sorted(contexts):
            for start in range(cached, context, PREFILL_CHUNK):
                view.forward(filler[start:min(start + PREFILL_CHUNK, context)], num_logits=0)
            cached = context
            curves[context] = measure_cost(view.forward, view.rollback, context, CURVE_SIZES, CURVE_REPEATS,
                                           bar.update, statistic=median)
    return curves
