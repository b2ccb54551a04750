"""`tandem generate`: stream a completion to the terminal, or print it as JSON with --json."""

import argparse
import json
import sys

from tandem.cli.int_list import whole_number
from tandem.cli.options import add_model_options, check_max_tokens_fit, engine_config
from tandem.engine.stats import GenerationStats
from tandem.errors import TandemError
from tandem.speculation.sampling import SamplingParams
from tandem.text.chat_messages import checked_messages
from tandem.text.text_generator import DEFAULT_MAX_TOKENS, TextGenerator


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("generate", help="generate text with speculative decoding")
    add_model_options(parser)
    prompt = parser.add_mutually_exclusive_group(required=True)
    prompt.add_argument("--prompt", help="raw prompt text (no chat template)")
    prompt.add_argument("--messages", help='chat messages as JSON: [{"role": "user", "content": "..."}]')
    parser.add_argument("--max-tokens", type=whole_number(1), default=None,
                        help=f"new tokens at most (default {DEFAULT_MAX_TOKENS}, capped by what the context leaves)")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default), at most 2")
    parser.add_argument("--top-p", type=float, default=1.0,
                        help="sample from the smallest set of tokens whose probabilities sum to P (default 1 = off)")
    parser.add_argument("--top-k", type=whole_number(-1), default=0,
                        help="sample from the K likeliest tokens (default 0 = off; -1 is off too, as the server and vLLM take it)")
    parser.add_argument("--seed", type=int, default=None,
                        help="sampling seed, for repeatable sampled runs (default: none; -1 is none too, as the server takes it)")
    parser.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    parser.add_argument("--json", action="store_true", help="print one JSON object at the end")
    parser.add_argument("--verbose", action="store_true", help="log the depth chosen each round")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    sampling = sampling_of(args)
    messages = _parse_messages(args.messages) if args.messages is not None else None
    if args.prompt is not None and not args.prompt:
        raise TandemError("--prompt is empty")  # before the models load, not after
    check_max_tokens_fit(args)
    config = engine_config(args)
    print(config.loading_note, file=sys.stderr, flush=True)
    generator = TextGenerator(config)
    prompt_ids = generator.prompt_ids(args.prompt, messages)
    request = generator.request(prompt_ids, args.max_tokens, sampling, args.stop)
    stats = GenerationStats()
    text, token_ids = [], []
    try:
        for delta, ids in generator.stream_text(request, stats):
            token_ids += ids
            text.append(delta)
            if not args.json and delta:
                sys.stdout.write(delta)
                sys.stdout.flush()
    except KeyboardInterrupt:  # Ctrl-C: --json still prints what was generated (it printed nothing)
        if args.json:
            print(json.dumps({"text": "".join(text), "token_ids": token_ids, "interrupted": True}))
        raise
    summary = stats.summary()
    if args.json:
        print(json.dumps({"text": "".join(text), "token_ids": token_ids,
                          "finish_reason": summary.pop("finish_reason"), "stats": summary}))
    else:
        sys.stdout.write("\n")
        _print_stats(summary, args.verbose)
    return 0


def sampling_of(args: argparse.Namespace) -> SamplingParams:
    """The options' sampling; a seed of -1 is none (llama.cpp's "random"), as the server takes it."""
    seed = None if args.seed == -1 else args.seed
    return SamplingParams(args.temperature, max(args.top_k, 0), args.top_p, seed)


def _parse_messages(raw: str) -> list[dict]:
    try:
        messages = json.loads(raw)
    except json.JSONDecodeError as error:
        raise TandemError(f"--messages is not valid JSON: {error}") from None
    if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
        raise TandemError('--messages must be a non-empty JSON list of objects: [{"role": "user", "content": "..."}]')
    return checked_messages(messages)  # before the models load, not after


def _print_stats(summary: dict, verbose: bool) -> None:
    split = summary["time_split_s"]
    drafts = (f"acceptance {summary['acceptance_rate']:.0%}, mean accepted {summary['mean_accepted_len']:.2f}"
              if summary["drafted_tokens"] else "no drafts")
    print(
        f"[{summary['new_tokens']} tokens ({summary['finish_reason']}) in {summary['seconds']:.2f}s = "
        f"{summary['tokens_per_s']:.1f} tok/s; "
        f"{drafts}; "
        f"prefill {split['prefill']:.2f}s draft {split['draft']:.2f}s verify {split['verify']:.2f}s "
        f"overhead {split['overhead']:.2f}s]",
        file=sys.stderr,
    )
    if verbose:
        print(f"[k per round: {summary['chosen_k']}; sources: {summary['draft_sources']}]", file=sys.stderr)
