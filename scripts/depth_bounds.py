"""How much of drafting's shortfall its depth rule could win back: Tandem's copy drafting replayed on a
bench-serve run's answers (bench/ceiling/drafting_replay.py), priced on one or more bench-ceiling
outputs' curves (another machine's curves price the same answers at that machine's costs), beside
other depth rules on the same proposals (two bounds and a rule that could run):

- per source: every round's k is the one that would have paid best for its source over the whole
  run (each source's accepted counts taken from a first replay: in sample, so an upper bound for
  any rule that sees a round's source alone);
- hindsight: every round drafts exactly the tokens of its copy the target accepts, where that pays
  at all (no rule can know this; it bounds what a better predictor of where copies break could give);
- token history: a rule that could run, with no model: each copied token's acceptance is what the
  target did with that token id when it was drafted earlier in the same answer (starting from its
  source's acceptance), and a round drafts the k whose expected tokens per millisecond are best
  (a copy that broke at a closing quote, a name or a number is expected to break there again).

With `--draft-model`, that model's greedy predictions over each prompt and answer (teacher
forced: one pass with every position's logits, minutes) give two more rules, a predictor that
could run: *draft checks* cuts the planner's k at the first copied token the draft model would
not have written, *draft decides* drafts as many copied tokens as it agrees with (where that pays
if all are accepted). The check is a draft-model call on the tokens examined; it is priced at
each `--check-shares` share of the target's call on as many tokens (the draft model's prompt
catch-up is not priced). `--check-min-k 8,16` adds *draft checks k>=N*: only rounds the planner
drafts N or more tokens deep are checked (where a break wastes most of a call), the rest as planned.

The proposals (which copy, from where) are Tandem's in all of them; the ceiling's oracle also chooses
its copies. Each is given / ceiling per category, as bench-ceiling gives its replay.

    .venv/bin/python scripts/depth_bounds.py docs/serve/long-zen3/results.json \\
        --curves docs/serve/long-zen3/ceiling.txt docs/serve/long-amd/ceiling.txt

Replay only (a target double, no model is run) unless `--draft-model`: about 20 seconds a curve
file and workload.
"""

import argparse
import sys
from collections import defaultdict
from pathlib import Path

from tandem.speculation.batch_depth import MIN_GAIN
from tandem.speculation.depth import COPY_K_MAX, MAX_ACCEPTANCE
from tandem.token_ids import common_prefix

RULES = ("replayed", "per source", "hindsight", "token history")
TOKEN_PRIOR_WEIGHT = 4.0  # pseudo-rounds of the source's acceptance behind each token's own record
DRAFT_RULES = ("draft checks", "draft decides")
CHECKS_FROM = "draft checks k>="  # + N: --check-min-k


class DepthRule:
    """A replay's planner with its k replaced: the step's copy (the one the planner chose among the
    offered) is compared with the rest of the answer; `rule` says what k it gets."""

    def __init__(self, replay, rule: str, by_source: dict[str, list[int]]):
        self.replay, self.cost_ms, self.rule = replay, replay.cost_ms, rule
        # source -> how many of its copies' tokens the target accepted, a round each: recorded while
        # the rule is "replayed", read by "per source"
        self.by_source = by_source
        self.tables: dict[str, list[float]] = {}  # source -> expected tokens of a round at each k
        self.copies: dict[str, tuple[int, ...]] = {}  # this step's offered copies by source
        self.length = 0  # tokens before this step
        # at i: the draft model's greedy token after the first i + 1 tokens of prompt + answer; set per answer
        self.draft_next: list[int] = []
        self.check_ms = 0.0  # the draft rules' checks, priced as target calls on as many tokens
        # token history: token id -> [times accepted, times drafted and reached] in this answer
        self.token_record: dict[int, list[int]] = defaultdict(lambda: [0, 0])
        hybrid = replay.engine.drafters["hybrid"]
        planner = replay.engine.planner
        self.plain_offer, self.plain_plan = hybrid.offer, planner.plan
        hybrid.offer, planner.plan = self.offer, self.plan

    def offer(self, seq, limit):
        offer = self.plain_offer(seq, limit)
        self.copies = {o.candidate.source: o.copy for o in (offer, *offer.alternatives)}
        self.length = len(seq.tokens)
        return offer

    def plan(self, candidates, fallbacks=None, context=None):
        ks, used = self.plain_plan(candidates, fallbacks, context)
        candidate = candidates[0]
        copy = self.copies.get(candidate.source)
        if not copy or candidate.fixed_k is not None:
            return ks, used
        rest = self.replay.target.expected[self.length:]  # the rest of the answer
        accepted = common_prefix(copy, rest)
        if self.rule == "replayed":
            self.by_source.setdefault(candidate.source, []).append(accepted)
            return ks, used
        limit = min(self.replay.engine.planner.depth_limit(candidate), max(0, len(rest) - 1))
        if self.rule == "hindsight":
            return [self._if_it_pays(min(accepted, limit))], [False]
        if self.rule == "per source":
            return [self._best_for_source(candidate.source, limit)], [False]
        if self.rule == "token history":
            k = self._by_token_history(copy, limit, self.replay.engine.planner.acceptance(candidate.source))
            k = ks[0] if k == 0 and ks[0] == 1 else k  # the planner's probes go on
            self._record_tokens(copy[:k], accepted)
            return [k], [False]
        if self.rule.startswith(CHECKS_FROM):  # only the planner's deep rounds are checked
            if min(ks[0], limit) < int(self.rule[len(CHECKS_FROM):]):
                return ks, used
            examined = min(ks[0], limit)
            self.check_ms += self.cost_ms(examined + 1, self.length)
            return [min(ks[0], common_prefix(copy[:examined], self.draft_next[self.length - 1:]))], [False]
        examined = min(ks[0], limit) if self.rule == "draft checks" else limit
        if examined == 0:
            return ks, used
        self.check_ms += self.cost_ms(examined + 1, self.length)
        agreed = common_prefix(copy[:examined], self.draft_next[self.length - 1:])
        return [min(ks[0], agreed) if self.rule == "draft checks" else self._if_it_pays(agreed)], [False]

    def new_answer(self, draft_next: list[int]) -> None:
        self.draft_next, self.check_ms = draft_next, 0.0
        self.token_record.clear()

    def _by_token_history(self, copy: tuple[int, ...], limit: int, source_rate: float) -> int:
        """The k with the most expected tokens per millisecond (beating decoding by MIN_GAIN), each
        copied token surviving at its own acceptance in this answer so far."""
        overhead = self.replay.engine.planner.overhead_ms
        best_rate = (1 + MIN_GAIN) / (self.cost_ms(1, self.length) + overhead)
        best_k, tokens, survive = 0, 1.0, 1.0
        for j in range(1, limit + 1):
            accepted, reached = self.token_record[copy[j - 1]]
            survive *= min((accepted + source_rate * TOKEN_PRIOR_WEIGHT) / (reached + TOKEN_PRIOR_WEIGHT),
                           MAX_ACCEPTANCE)
            tokens += survive
            rate = tokens / (self.cost_ms(j + 1, self.length) + overhead)
            if rate > best_rate:
                best_rate, best_k = rate, j
        return best_k

    def _record_tokens(self, drafted: tuple[int, ...], accepted: int) -> None:
        """What verification tells: the drafted tokens up to the first rejected one were reached,
        all but that one accepted."""
        for position, token in enumerate(drafted[:accepted + 1]):
            record = self.token_record[token]
            record[0] += position < accepted
            record[1] += 1

    def _if_it_pays(self, k: int) -> int:
        """k, where a round of k drafts all accepted beats decoding one token; else 0."""
        return k if k and (k + 1) / self.cost_ms(k + 1, self.length) > 1 / self.cost_ms(1, self.length) else 0

    def _best_for_source(self, source: str, limit: int) -> int:
        counts = self.by_source.get(source)
        if not counts:
            return 0
        if source not in self.tables:
            self.tables[source] = [1 + sum(min(n, k) for n in counts) / len(counts) for k in range(COPY_K_MAX + 1)]
        table = self.tables[source]
        rates = [table[k] / self.cost_ms(k + 1, self.length) for k in range(limit + 1)]
        return max(range(limit + 1), key=lambda k: (rates[k], -k))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", help="a bench-serve results.json")
    parser.add_argument("--curves", nargs="+", required=True, help="bench-ceiling outputs holding 'verify curve at' lines")
    parser.add_argument("--draft-model", default=None, help="a model sharing the target's tokenizer (catalog name or .gguf)")
    parser.add_argument("--check-shares", default="0,0.05,0.45",
                        help="comma-separated: a draft check's price as a share of the target's call")
    parser.add_argument("--check-min-k", default="",
                        help="comma-separated: also check only rounds drafted at least this deep (with --draft-model)")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    try:
        shares = [float(share) for share in args.check_shares.split(",")]
        min_ks = [int(k) for k in args.check_min_k.split(",") if k.strip()]
    except ValueError:
        parser.error("--check-shares and --check-min-k take numbers separated by commas")

    from tandem.bench.ceiling.drafting_replay import DraftingReplay, replay_pricing
    from tandem.bench.ceiling.oracle import MAX_DRAFT, oracle_ms, oracle_rounds
    from tandem.bench.ceiling.report import load_level, read_curves, recorded_answers
    from tandem.models.resolve import tokenizer_path
    from tandem.text.tokenizer import TextTokenizer

    results, level = load_level(Path(args.results), None)
    tokenizer = TextTokenizer(str(tokenizer_path(results["settings"]["target"])))
    label, answers = recorded_answers(results, level, tokenizer)
    work = [(recorded.category, recorded.prompt, recorded.answer) for recorded in answers]
    print(f"# {args.results}: {label}'s answers, {len(work)} requests; replay only")
    sequences = [list(prompt) + list(answer) for _, prompt, answer in work]
    draft_next = greedy_predictions(args.draft_model, sequences, args.threads) if args.draft_model else None
    rules = RULES + (DRAFT_RULES + tuple(f"{CHECKS_FROM}{k}" for k in min_ks) if draft_next else ())
    for curves_file in args.curves:
        cost_ms, planner = replay_pricing(read_curves(Path(curves_file).read_text()))
        ceiling: dict[str, float] = defaultdict(float)
        for category, prompt, answer in work:
            ceiling[category] += oracle_ms(oracle_rounds(prompt, answer, MAX_DRAFT), cost_ms)
        spent: dict[str, dict[str, float]] = {}
        checks: dict[str, dict[str, float]] = {}
        by_source: dict[str, list[int]] = {}
        for rule in rules:  # "replayed" first: it records what "per source" reads
            replay = DraftingReplay(cost_ms, planner)
            depth = DepthRule(replay, rule, by_source)
            spent[rule], checks[rule] = defaultdict(float), defaultdict(float)
            for index, (category, prompt, answer) in enumerate(work):
                depth.new_answer(draft_next[index] if draft_next else [])
                spent[rule][category] += replay.replay_ms(prompt, answer)
                checks[rule][category] += depth.check_ms
            print(f"{curves_file}: {rule} replayed", file=sys.stderr)
        machine = next((line for line in Path(curves_file).read_text().splitlines() if "machine:" in line), "")
        print(f"\n## priced on {curves_file}" + (f" ({machine.split('machine:')[1].split(';')[0].strip()})"
                                                 if machine else ""))
        columns = [(rule, 0.0) for rule in RULES] + [(rule, share) for rule in rules[len(RULES):] for share in shares]
        print("| category | " + " | ".join(f"{rule} / ceiling" + (f", checks at {share:g}" if rule not in RULES else "")
                                             for rule, share in columns) + " |")
        print("|---|" + "---:|" * len(columns))
        for category in sorted(ceiling) + ["all"]:
            pick = (lambda d: sum(d.values())) if category == "all" else (lambda d: d[category])  # noqa: E731
            print(f"| {category} | " + " | ".join(
                f"{pick(ceiling) / (pick(spent[rule]) + share * pick(checks[rule])):.2f}" for rule, share in columns) + " |")


def greedy_predictions(model: str, sequences: list[list[int]], threads: int) -> list[list[int]]:
    """The model's greedy token after each prefix of each sequence: one pass a sequence with every
    position's logits (llama.cpp through llama-cpp-python)."""
    import numpy as np
    from llama_cpp import Llama

    from tandem.models.resolve import gguf_path
    from tandem.progress import ProgressBar

    longest = max(len(sequence) for sequence in sequences)
    llm = Llama(model_path=str(gguf_path(model)), n_ctx=longest + 16, n_batch=512, logits_all=True,
                n_threads=threads, flash_attn=True, verbose=False)
    predictions = []
    with ProgressBar(sequences, desc=f"{model}: greedy tokens", unit="sequence", file=sys.stderr) as bar:
        for sequence in bar:
            llm.reset()
            llm.eval(sequence)
            predictions.append(np.asarray(llm.scores[:len(sequence)]).argmax(axis=1).tolist())  # [tokens]
    return predictions


if __name__ == "__main__":
    main()
