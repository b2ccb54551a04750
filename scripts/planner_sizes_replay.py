"""Whether the planner would draft better if its profile held more call sizes: a bench-serve run's
answers replayed (bench/ceiling/drafting_replay.py) on a verify curve measured at every size
from 1 to 64 tokens, with the planner reading that curve only at each set of sizes below (the
engine's profile holds BATCH_PROFILE_SIZES, and between them the planner interpolates).

llama.cpp's AVX-512 Q4_K product takes rows in blocks of 16 (and its gemm in blocks of 4), so a
call of 15 tokens costs more than one of 16 (Zen 5, 1,024 cached tokens: 226 against 187 ms);
the profile's sizes miss most of those steps. `--measure FILE` first measures the fine curve
(every size, the median of 5 calls, at 512, 1,024 and 2,048 cached tokens: ~6 minutes on 2
cores) and writes it in bench-ceiling's format; otherwise `--curves FILE` reads one.

    .venv/bin/python scripts/planner_sizes_replay.py docs/serve/long-zen5/results.json \\
        --curves docs/serve/long-zen5/fine-curves.txt

Prints drafting replayed / ceiling per category for each set of sizes (the ceiling priced on the
fine curve). Replay only once the curve exists: seconds.
"""

import argparse
import sys
from collections import defaultdict
from pathlib import Path

SIZE_SETS = {
    "the profile's (BATCH_PROFILE_SIZES)": None,
    "both sides of each 16-row step": (1, 2, 3, 4, 6, 8, 12, 15, 16, 24, 31, 32, 40, 47, 48, 56, 63, 64),
    "every 4, both sides of each 16": (1, 2, 3, 4, 6, 8, 12, 15, 16, 20, 24, 28, 31, 32, 36, 40, 44, 47, 48, 52, 56,
                                       60, 63, 64),
    "every size": tuple(range(1, 65)),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", help="a bench-serve results.json")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--curves", help="a fine curve file (bench-ceiling's 'verify curve at' lines)")
    source.add_argument("--measure", help="measure the fine curve here first, then replay on it")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    import tandem.bench.ceiling.report as report
    from tandem.bench.ceiling.drafting_replay import DraftingReplay, planner_curve
    from tandem.bench.ceiling.oracle import MAX_DRAFT, ContextCurves, oracle_ms, oracle_rounds
    from tandem.models.batch_backends import BATCH_PROFILE_SIZES
    from tandem.models.resolve import tokenizer_path
    from tandem.text.tokenizer import TextTokenizer

    results, level = report.load_level(Path(args.results), None)
    if args.measure:
        from tandem.cli.bench_ceiling_cmd import measure_verify_curves
        from tandem.hardware import cpu_model

        report.CURVE_SIZES = tuple(range(1, 65))  # every size, where bench-ceiling measures ten
        measured = measure_verify_curves(results["settings"]["target"], (512, 1024, 2048), args.threads)
        Path(args.measure).write_text(f"# machine: {cpu_model()}; every size 1..64, the median of 5 calls; "
                                      f"{results['settings']['target']}, llama.cpp, {args.threads} threads\n"
                                      + "\n".join(report.curve_lines(measured)) + "\n")
    curves = report.read_curves(Path(args.measure or args.curves).read_text())
    cost_ms = ContextCurves({context: curve.cost_ms for context, curve in curves.items()}).cost_ms
    tokenizer = TextTokenizer(str(tokenizer_path(results["settings"]["target"])))
    label, answers = report.recorded_answers(results, level, tokenizer)
    work = [(recorded.category, recorded.prompt, recorded.answer) for recorded in answers]
    ceiling: dict[str, float] = defaultdict(float)
    for category, prompt, answer in work:
        ceiling[category] += oracle_ms(oracle_rounds(prompt, answer, MAX_DRAFT), cost_ms)
    categories = sorted(ceiling)
    print(f"# {args.results}: {label}'s answers, {len(work)} requests; truth: {args.measure or args.curves}")
    print("| the planner reads sizes | " + " | ".join(categories) + " | all | replayed s |")
    print("|---|" + "---:|" * (len(categories) + 2))
    for name, sizes in SIZE_SETS.items():
        planner = planner_curve(cost_ms, sizes or BATCH_PROFILE_SIZES, min(curves), max(curves))
        replay = DraftingReplay(cost_ms, planner)
        spent: dict[str, float] = defaultdict(float)
        for category, prompt, answer in work:
            spent[category] += replay.replay_ms(prompt, answer)
        print(f"| {name} | " + " | ".join(f"{ceiling[c] / spent[c]:.3f}" for c in categories)
              + f" | {sum(ceiling.values()) / sum(spent.values()):.3f} | {sum(spent.values()) / 1000:.1f} |")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
