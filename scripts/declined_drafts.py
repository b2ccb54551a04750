"""Which copies Tandem's planner declined, and what they would have given: Tandem's drafting
replayed on a bench-serve run's answers (bench/ceiling/drafting_replay.py), priced on a
bench-ceiling's curves, every round of the replay sorted by what it did against what the oracle
could copy there (the longest verbatim run of the rest of the answer in the prompt and the answer
so far), and every round the planner gave a copy nothing (k = 0) checked against the answer:
how many of the copy's tokens the target would have accepted.

    .venv/bin/python scripts/declined_drafts.py docs/serve/long-zen3/results.json \
        --curves docs/serve/long-zen3/ceiling.txt

Replay only (a target double, no model is run): it takes a minute and measures nothing.
"""

import argparse
import sys
from collections import Counter, defaultdict
from pathlib import Path

MANY = 9  # would-accept counts at or above this are counted together


def kind_of(k: int, accepted: int, run: int) -> str:
    """A round against the oracle's run at its position (LONG_RUN: the long-run ceiling's shortest)."""
    from tandem.bench.ceiling.oracle import LONG_RUN

    if k == 0:
        return f"no draft, oracle run >= {LONG_RUN}" if run >= LONG_RUN else (
            f"no draft, oracle run 1-{LONG_RUN - 1}" if run else "no draft, no run")
    if accepted < k:
        return f"draft rejected, oracle run >= {LONG_RUN}" if run >= LONG_RUN else "draft rejected, oracle run short"
    return "draft accepted, shorter than oracle's" if k < run else "draft accepted, oracle's or longer"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", help="a bench-serve results.json")
    parser.add_argument("--curves", required=True, help="a bench-ceiling output holding its 'verify curve at' lines")
    parser.add_argument("--categories", default=None, help="comma-separated (default: all)")
    args = parser.parse_args()

    from tandem.bench.ceiling.drafting_replay import DraftingReplay, replay_pricing
    from tandem.bench.ceiling.oracle import MAX_DRAFT, longest_copy_run
    from tandem.bench.ceiling.report import load_level, read_curves, recorded_answers
    from tandem.models.resolve import tokenizer_path
    from tandem.speculation.drafters.ngram import FOLLOW_BUCKETS
    from tandem.text.tokenizer import TextTokenizer
    from tandem.token_ids import common_prefix

    cost_ms, planner = replay_pricing(read_curves(Path(args.curves).read_text()))
    results, level = load_level(Path(args.results), None)
    tokenizer = TextTokenizer(str(tokenizer_path(results["settings"]["target"])))
    wanted = set(args.categories.split(",")) if args.categories else None

    replay = DraftingReplay(cost_ms, planner)
    hybrid = replay.engine.drafters["hybrid"]
    offered: dict = {}  # this step's copies (the offer and its alternatives) and the alignment's run
    plain_offer = hybrid.offer

    def recording_offer(seq, limit):
        offer = plain_offer(seq, limit)
        follow = hybrid.ngram.follows.get(seq.seq_id)
        offered.update(copies=[offer.copy, *(a.copy for a in offer.alternatives)], run=follow.run if follow else None)
        return offer

    hybrid.offer = recording_offer
    kinds: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])  # rounds, priced ms
    declined: dict[str, Counter] = defaultdict(Counter)  # source -> would-accept counts
    follow0_by_run: dict[str, list[tuple[int, int]]] = defaultdict(list)  # band -> (would accept, context) a round
    for recorded in recorded_answers(results, level, tokenizer)[1]:
        if wanted and recorded.category not in wanted:
            continue
        prompt, answer = recorded.prompt, recorded.answer
        source: list[int] = []  # the prompt and the answer so far, grown as the replay moves on
        positions: dict[int, list[int]] = defaultdict(list)

        def study(before: int, report) -> None:
            copies, held = offered.pop("copies", []), offered.pop("run", None)  # what this step offered
            if before == 0 or before >= len(answer) or report is None:
                return  # the prompt's step, or past the answer
            for token in (list(prompt) + list(answer[:before]))[len(source):]:
                positions[token].append(len(source))
                source.append(token)
            run = longest_copy_run(source, positions, answer[before:], MAX_DRAFT)
            for round_ in report.rounds:
                kind = kind_of(round_.k, round_.accepted, run)
                kinds[kind][0] += 1
                kinds[kind][1] += cost_ms(round_.k + 1, len(source))
                if round_.k == 0 and round_.source != "none":
                    best = max((common_prefix(copy, answer[before:]) for copy in copies), default=0)
                    declined[round_.source][min(best, MANY)] += 1
                    if round_.source == "follow0" and held:
                        band = "1" if held == 1 else "2-3" if held < 4 else f"4-{FOLLOW_BUCKETS[0] - 1}"
                        follow0_by_run[band].append((min(best, MANY), len(source)))

        replay.replay_ms(prompt, answer, on_step=study)
        print(f"{recorded.prompt_id} ({recorded.category}): {len(answer)} tokens replayed", file=sys.stderr)

    total_ms = sum(ms for _, ms in kinds.values())
    print("| round | rounds | priced s | share |\n|---|---:|---:|---:|")
    for kind, (rounds, ms) in sorted(kinds.items(), key=lambda item: -item[1][1]):
        print(f"| {kind} | {rounds} | {ms / 1000:.1f} | {ms / total_ms:.0%} |")
    print(f"\ncopies given k = 0, by source: how many of their tokens the target would have accepted ({MANY}: {MANY} or more)")
    for source, counts in sorted(declined.items(), key=lambda item: -sum(item[1].values())):
        print(f"  {source}: {sum(counts.values())} rounds; " + ", ".join(f"{n}: {c}" for n, c in sorted(counts.items())))
    print("\nfollow0 copies given k = 0, by the tokens their alignment had held; time per token emitted had each "
          "drafted j tokens (priced at its context), against decoding one token (j = 0):")
    for band, rounds in sorted(follow0_by_run.items()):
        counts = Counter(best for best, _ in rounds)
        per_token = {j: sum(cost_ms(j + 1, context) for _, context in rounds)
                     / sum(min(best, j) + 1 for best, _ in rounds) for j in range(MANY)}
        print(f"  {band} held: {len(rounds)} rounds; would accept 0: {counts[0] / len(rounds):.0%}, >= 4: "
              f"{sum(c for n, c in counts.items() if n >= 4) / len(rounds):.0%}, >= {MANY}: {counts[MANY] / len(rounds):.0%}; "
              "ms a token: " + ", ".join(f"j={j} {ms:.0f}" for j, ms in per_token.items()))

if __name__ == "__main__":
    main()
