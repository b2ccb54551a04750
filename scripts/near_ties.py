"""Greedy outputs of the default engine against target-only decoding on a real Q4 model, and where
they part, whether the target's logits there are a near-tie.

Each prompt of a workload runs through two engines in this process, one request at a time: the
default (hybrid drafter, k auto) and the target alone (`--drafter none`, one token a forward).
Where the two outputs differ, the target scores the common prefix with a one-token forward (the
reference's own kernel) and the gap between the logits of the two tokens chosen there is
printed. A verify call scores several tokens in one batched Q4 product that rounds differently
from the one-token product, so a near-tie can flip (docs/design.md#same-answers-in-a-batch);
a divergence with a large gap would be a bug.

    .venv/bin/python scripts/near_ties.py --prompts edits --num-prompts 8 --max-tokens 1024
"""

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

NEAR_TIE_LOGITS = 0.5  # tests/real's bound: batched and one-token Q4 logits differ by up to ~0.5
PREFILL_CHUNK = 512


def one_token_logits(runner, prefix: list[int]) -> np.ndarray:
    """The target's logits [vocab] after `prefix`, its last token scored alone."""
    from tandem.models.batch_runner import SlotView

    view = SlotView(runner)
    view.rollback(0)
    for start in range(0, len(prefix) - 1, PREFILL_CHUNK):
        view.forward(prefix[start:min(start + PREFILL_CHUNK, len(prefix) - 1)], num_logits=0)
    return np.asarray(view.forward(prefix[-1:], num_logits=1))[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", default="edits", help="a workload name or JSONL file")
    parser.add_argument("--num-prompts", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=1024)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default=None, help="also write the rows as JSON here")
    parser.add_argument("--draft", default=None, help="the default engine's draft (default: the catalog's, as `tandem serve`)")
    args = parser.parse_args()

    from tandem.hardware import cpu_model
    from tandem.models.catalog import DEFAULT_DRAFT, DEFAULT_TARGET
    from tandem.token_ids import first_divergence
    from tandem.bench.workload import format_prompt, load_prompts
    from tandem.engine.build import EngineConfig, build_engine
    from tandem.engine.request import GenerationRequest
    from tandem.engine.run_request import generate
    from tandem.models.backends import RunnerSpec
    from tandem.models.llamacpp_batch_runner import LlamaCppBatchRunner
    from tandem.models.resolve import gguf_path, tokenizer_path
    from tandem.text.tokenizer import TextTokenizer

    target = RunnerSpec(DEFAULT_TARGET, "llamacpp", threads=args.threads)
    tokenizer = TextTokenizer(str(tokenizer_path(DEFAULT_TARGET)))
    draft = RunnerSpec(args.draft or DEFAULT_DRAFT, "llamacpp", threads=args.threads)
    print(f"CPU: {cpu_model()}; target {DEFAULT_TARGET}, draft {draft.model}, {args.threads} threads", flush=True)
    default = build_engine(EngineConfig(target, draft), max_running=1)
    alone = build_engine(EngineConfig(target, None, drafter="none"), max_running=1)
    prompts = load_prompts(args.prompts)[:args.num_prompts]
    longest = max(len(format_prompt(tokenizer, p)) for p in prompts) + args.max_tokens + 8
    scorer = LlamaCppBatchRunner(str(gguf_path(DEFAULT_TARGET)), 1, longest, args.threads)
    rows = []
    for prompt in prompts:
        ids = tuple(format_prompt(tokenizer, prompt))
        request = GenerationRequest(ids, max_tokens=args.max_tokens, stop_token_ids=tokenizer.stop_token_ids)
        spec, _ = generate(default, request)
        plain, _ = generate(alone, request)
        row = {"id": prompt.id, "tokens": [len(spec), len(plain)], "first_diff": first_divergence(spec, plain)}
        i = row["first_diff"]
        if i is not None and i < min(len(spec), len(plain)):
            logits = one_token_logits(scorer, list(ids) + plain[:i])
            chosen = [spec[i], plain[i]]
            row.update(chosen=[tokenizer.decode([t]) for t in chosen], chosen_ids=chosen, argmax=int(np.argmax(logits)),
                       gap=float(abs(logits[chosen[0]] - logits[chosen[1]])))
        rows.append(row)
        print(_line(row), flush=True)
    differ = [r for r in rows if r["first_diff"] is not None]
    gaps = [r["gap"] for r in differ if "gap" in r]
    print(f"{len(rows) - len(differ)} of {len(rows)} identical; "
          f"{sum(g < NEAR_TIE_LOGITS for g in gaps)} of {len(gaps)} divergences a near-tie (gap < {NEAR_TIE_LOGITS})"
          + (f"; gaps {', '.join(f'{g:.3f}' for g in gaps)}" if gaps else ""))
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))
    return 0


def _line(row: dict) -> str:
    spec, plain = row["tokens"]
    if row["first_diff"] is None:
        return f"{row['id']}: identical ({spec} tokens)"
    if "gap" not in row:
        return f"{row['id']}: one output ends where the other goes on ({spec} vs {plain} tokens)"
    return (f"{row['id']}: part at token {row['first_diff']} of {spec} / {plain}: {row['chosen'][0]!r} (default) vs "
            f"{row['chosen'][1]!r} (target alone), logit gap {row['gap']:.3f} (one-token argmax: "
            f"{_whose(row)})")


def _whose(row: dict) -> str:
    spec, plain = row["chosen_ids"]
    return "target alone's" if row["argmax"] == plain else "the default's" if row["argmax"] == spec else "neither"


if __name__ == "__main__":
    sys.exit(main())
