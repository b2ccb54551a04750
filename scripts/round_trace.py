"""Where a C=1 run's decode time goes between the priced replay and the run: `tandem serve`'s
engine in process on a workload, one request at a time, every target and draft-model call timed
and each target call priced on a bench-ceiling's verify curves.

`tandem bench-ceiling` sets a run's decode rate beside Tandem's drafting replayed and priced on
curves (bench/ceiling/drafting_replay.py); this splits what lies between them into
- plans: the run's own target calls priced on those curves, against the replay's (the engine
  plans on its profile and drafts with its draft model too; the replay plans on the curves),
- calls: the run's target calls as measured against the same calls priced (the kernels'
  time off the curve, at the sizes the run chose),
- draft model: its forwards' time,
- the rest: the engine's own time between calls (planning, copy drafting, acceptance).

    .venv/bin/python scripts/round_trace.py --prompts edits --num-prompts 8 --max-tokens 1024 \
        --curves docs/serve/edits-zen3/ceiling.txt

Measure nothing else meanwhile: the figures are wall times.
"""

import argparse
import json
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

TARGET = "qwen2.5-coder-1.5b-instruct"
DRAFT = "qwen2.5-coder-0.5b-instruct"


class TimedCalls:
    """Wraps a runner's forward_batch: every call's (tokens scored, tokens cached before, ms)."""

    def __init__(self, runner):
        self.runner = runner
        self.forward = runner.forward_batch
        self.calls: list[tuple[int, int, float]] = []
        runner.forward_batch = self

    def __call__(self, items, views: bool = False):
        tokens = sum(len(item.token_ids) for item in items)
        before = min(self.runner.num_cached_tokens(item.slot) for item in items)
        start = time.perf_counter()
        out = self.forward(items, views=views)
        self.calls.append((tokens, before, (time.perf_counter() - start) * 1000))
        return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", default="edits")
    parser.add_argument("--num-prompts", type=int, default=8, help="the workload's first N, in its file's order")
    parser.add_argument("--max-tokens", type=int, default=1024)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--curves", required=True, help="a bench-ceiling output holding its 'verify curve at' lines")
    parser.add_argument("--out", default=None, help="also write every call as JSON here")
    args = parser.parse_args()

    from tandem.bench.ceiling.drafting_replay import DraftingReplay, replay_pricing
    from tandem.bench.ceiling.report import read_curves
    from tandem.bench.workload import format_prompt, load_prompts
    from tandem.engine.step_budget import THROUGHPUT_PREFILL_FLOOR
    from tandem.engine.build import EngineConfig, build_engine
    from tandem.engine.request import GenerationRequest
    from tandem.models.backends import RunnerSpec
    from tandem.models.resolve import tokenizer_path
    from tandem.speculation.shared_store.store import open_ngram_store
    from tandem.text.tokenizer import TextTokenizer

    cost_ms, planner = replay_pricing(read_curves(Path(args.curves).read_text()))
    replay = DraftingReplay(cost_ms, planner)

    config = EngineConfig(RunnerSpec(TARGET, "llamacpp", dtype="fp32", threads=args.threads),
                          RunnerSpec(DRAFT, "llamacpp", dtype="fp32", threads=args.threads),
                          drafter="hybrid", prefill_floor=THROUGHPUT_PREFILL_FLOOR)
    engine = build_engine(config, max_running=1, ngram_store=open_ngram_store(None))
    target_calls = TimedCalls(engine.target)
    draft_calls = TimedCalls(engine.draft) if engine.draft is not None else None
    tokenizer = TextTokenizer(str(tokenizer_path(TARGET)))

    rows, every_call = [], []
    totals: dict[str, float] = defaultdict(float)
    for prompt in load_prompts(args.prompts)[:args.num_prompts]:
        prompt_ids = format_prompt(tokenizer, prompt)
        target_calls.calls.clear()
        if draft_calls:
            draft_calls.calls.clear()
        engine.add(prompt.id, GenerationRequest(tuple(prompt_ids), max_tokens=args.max_tokens,
                                                stop_token_ids=tokenizer.stop_token_ids))
        answer: list[int] = []
        first_at = None
        first_draft_calls = 0
        sources: Counter = Counter()
        while engine.has_work:
            updates, report = engine.step()
            for update in updates:
                if update.token_ids and first_at is None:
                    first_at = time.perf_counter()
                    first_draft_calls = len(draft_calls.calls) if draft_calls else 0
                answer.extend(update.token_ids)
            for round_ in (report.rounds if report else ()):
                sources[round_.source] += 1
        decode_ms = (time.perf_counter() - first_at) * 1000
        decode = [(n, before, ms) for n, before, ms in target_calls.calls if before >= len(prompt_ids)]
        draft_ms = sum(ms for _, _, ms in (draft_calls.calls[first_draft_calls:] if draft_calls else ()))
        row = {
            "id": prompt.id, "category": prompt.category, "prompt": len(prompt_ids), "answer": len(answer),
            "decode_ms": decode_ms,
            "calls": len(decode), "calls_ms": sum(ms for _, _, ms in decode),
            "calls_priced_ms": sum(cost_ms(n, before) for n, before, _ in decode),
            "draft_ms": draft_ms,
            "draft_calls": len(draft_calls.calls) - first_draft_calls if draft_calls else 0,
            "replay_ms": replay.replay_ms(prompt_ids, answer),
            "replay_calls": sum(1 for _, before in replay.target.calls if before >= len(prompt_ids)),
            "sources": dict(sources),
        }
        row["rest_ms"] = row["decode_ms"] - row["calls_ms"] - row["draft_ms"]
        rows.append(row)
        every_call.append({"id": prompt.id, "prompt": len(prompt_ids), "run": target_calls.calls[:],
                           "replay": replay.target.calls[:]})
        for key in ("decode_ms", "calls_ms", "calls_priced_ms", "draft_ms", "rest_ms", "replay_ms"):
            totals[key] += row[key]
        totals["tokens"] += len(answer) - 1
        print(f"{prompt.id} {prompt.category:9s} {len(answer):5d} tokens  decode {decode_ms / 1000:6.1f} s: "
              f"{row['calls']} target calls {row['calls_ms'] / 1000:6.1f} s (priced {row['calls_priced_ms'] / 1000:6.1f}), "
              f"draft model {row['draft_calls']} calls {draft_ms / 1000:5.1f} s, rest {row['rest_ms'] / 1000:5.2f} s; "
              f"replay {row['replay_calls']} calls priced {row['replay_ms'] / 1000:6.1f} s", flush=True)

    tokens = totals["tokens"]
    print(f"\nall: {int(tokens)} decode tokens; tok/s: run {tokens / totals['decode_ms'] * 1000:.1f}, "
          f"run's calls priced {tokens / totals['calls_priced_ms'] * 1000:.1f}, "
          f"replay priced {tokens / totals['replay_ms'] * 1000:.1f}")
    gap = totals["decode_ms"] - totals["replay_ms"]
    print(f"run - replay = {gap / 1000:.1f} s: plans (run's calls priced - replay) "
          f"{(totals['calls_priced_ms'] - totals['replay_ms']) / 1000:.1f} s, calls off their price "
          f"{(totals['calls_ms'] - totals['calls_priced_ms']) / 1000:.1f} s, draft model {totals['draft_ms'] / 1000:.1f} s, "
          f"rest {totals['rest_ms'] / 1000:.1f} s")
    if args.out:
        Path(args.out).write_text(json.dumps({"rows": rows, "calls": every_call}, indent=1))


if __name__ == "__main__":
    sys.exit(main())
