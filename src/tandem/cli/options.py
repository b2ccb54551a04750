"""Command-line options shared by `generate`, `bench` and `serve`: models, backends, devices, drafting."""

import argparse
import sys
from dataclasses import replace

from tandem.cli.int_list import thread_count, whole_number
from tandem.errors import TandemError
from tandem.models.backends import DTYPES, MIN_CONTEXT_LENGTH, TORCH_RUNNERS, RunnerSpec
from tandem.models.catalog import CATALOG, DEFAULT_DRAFT, DEFAULT_TARGET, SHIPPED_DRAFT, default_draft
from tandem.speculation.depth import Auto, Fixed, parse_depth
from tandem.speculation.drafters.registry import USES_MODEL, check_drafter, default_drafter, drafter_help
from tandem.engine.step_budget import STEP_TOKEN_BUDGET, THROUGHPUT_PREFILL_FLOOR, check_prefill_floor
from tandem.engine.build import EngineConfig


def add_model_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("models")
    group.add_argument("--target", default=DEFAULT_TARGET, help="catalog name, .gguf file or HF folder (default %(default)s)")
    group.add_argument("--draft", default=None, help=f"draft model, same tokenizer as the target (default "
                       f"{DEFAULT_DRAFT} on llama.cpp, {SHIPPED_DRAFT} on torch)")
    group.add_argument("--drafter", default=None, metavar="NAME", help=drafter_help(
        "hybrid; ngram for a catalog target of another family than the default draft"))
    group.add_argument("--backend", default="auto", help="target backend: llamacpp | torch | auto (default: torch where a GPU exists, else llamacpp)")
    group.add_argument("--device", default="auto", help="target device: cpu, cuda:0, mps, npu:0, xpu ... (default: auto, the backend's)")
    group.add_argument("--dtype", default="fp32", help="target dtype for torch: fp32 | bf16 | fp16 (default %(default)s)")
    group.add_argument("--draft-backend", default="auto", help="draft backend: llamacpp | torch | auto (default %(default)s)")
    group.add_argument("--draft-device", default="auto", help="draft device (default %(default)s: the backend's)")
    group.add_argument("--draft-dtype", default="fp32", help="draft dtype for torch (default %(default)s)")
    group.add_argument("--threads", type=thread_count, default=None, help="CPU threads per model (default: all)")
    group.add_argument("--context-length", type=whole_number(MIN_CONTEXT_LENGTH), default=4096, metavar="TOKENS",
                       help="most tokens a sequence holds, prompt and answer (default 4096; capped at what the "
                       "model was trained for)")
    group.add_argument("--k", type=depth_option, default="auto", help="speculation depth: an integer from 0 to 64, or auto (default: "
                       "the planner chooses, up to 16 tokens of a draft model and 63 of a copy)")
    group.add_argument("--step-tokens", type=whole_number(1), default=STEP_TOKEN_BUDGET,
                       help=f"most tokens one engine step scores; long prompts are prefilled in chunks "
                       f"(default {STEP_TOKEN_BUDGET})")
    group.add_argument("--prefill-floor", default=None, type=prefill_floor_option, metavar="auto|N",
                       help=f"prompt tokens a step may always score beside decoding streams: a number, or "
                       f"auto (the fewest within 15%% of the cheapest cost a token of calls below 64 tokens, read off the target's "
                       f"profile: short inter-token gaps, dearer prompts on a CPU). Default: "
                       f"{THROUGHPUT_PREFILL_FLOOR} on one engine (prompts near batch speed, longer gaps), "
                       f"auto on a cluster's replicas")
    group.add_argument("--prefill-waves", action="store_true",
                       help="let a wave of new prompts (more than the streams decoding) keep the whole step "
                       "budget until all are in: more throughput for closed loops of short answers, "
                       "long inter-token gaps for the streams beside the wave (off by default)")
    group.add_argument("--torch-runner", default="fused", choices=TORCH_RUNNERS,
                       help="torch backend: fused (one paged forward for all sequences, default) or serial "
                       "(transformers, one sequence at a time)")
    group.add_argument("--kv-memory", default=None, type=kv_memory_option,
                       help="KV pool size for the fused torch runner's target, e.g. 2G; a plain number is MiB "
                       "(default: a quarter of free memory)")
    group.add_argument("--draft-kv-memory", default=None, type=kv_memory_option,
                       help="the same for a torch draft model's pool (default: what its sequences' contexts "
                       "need, within a quarter of free memory)")


def check_max_tokens_fit(args: argparse.Namespace) -> None:
    """--max-tokens of the context's length or more leaves no room for any prompt: said before the
    models load (generate said it after; bench capped it silently and recorded the number given)."""
    if args.max_tokens is not None and args.max_tokens >= args.context_length:
        raise TandemError(f"--max-tokens {args.max_tokens} leaves no room for a prompt in a context of "
                          f"{args.context_length} tokens (--context-length): ask for fewer")


def depth_option(text: str) -> str:
    """`--k`: "auto" or a depth, checked as argparse checks the others (the error names --k)."""
    try:
        parse_depth(text)
    except TandemError as error:
        raise argparse.ArgumentTypeError(str(error).removeprefix("k ")) from None
    return text


def prefill_floor_option(text: str) -> int | str:
    """`--prefill-floor`: "auto" or a token count (None, the argparse default, is "not given")."""
    if text == "auto":
        return "auto"
    try:
        tokens = int(text)
        check_prefill_floor(tokens)
    except (ValueError, TandemError):
        raise argparse.ArgumentTypeError(f"must be auto or a number of tokens from 1 to 4096, got {text!r}") from None
    return tokens


def engine_prefill_floor(option: int | str | None, default: int | None) -> int | None:
    """`--prefill-floor` as the engine takes it (None: read off the profile); `default` where
    the option was not given: THROUGHPUT_PREFILL_FLOOR on one engine, None on a cluster's replicas."""
    if option is None:
        return default
    return None if option == "auto" else option


def kv_memory_option(text: str) -> int:
    """'2G', '512M', or a plain number of MiB (as --cache-ram takes it: '1024' was 1024 bytes)."""
    from tandem.memory_size import MIB, parse_memory

    try:
        return parse_memory(text, plain_unit=MIB)
    except TandemError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _default_draft_mismatch(args: argparse.Namespace) -> str | None:
    """Why the default draft cannot draft for the target, or None where it can or a --draft is
    named: the target is a catalog model of another family (another tokenizer: SmolLM2 cannot be
    drafted for by a Qwen), or a local model whose tokenizer has another size (a local SmolLM2 file
    pulled the default draft, ~900 MiB, to be refused for its tokenizer; offline, the pull's error
    said nothing of --drafter)."""
    if args.draft is not None:
        return None
    draft = CATALOG[draft_spec(args).model]  # the default draft for its backend
    if args.target in CATALOG:
        target = CATALOG[args.target]
        if target.family == draft.family:
            return None
        return f"a {draft.family} model, with another tokenizer than {target.name}'s"
    from tandem.models.resolve import tokenizer_path
    from tandem.text.tokenizer import TextTokenizer

    target_spec(args)  # a bad backend or dtype is its own error first
    size = len(TextTokenizer(str(tokenizer_path(args.target))).vocabulary())
    if size == draft.vocab_size:
        return None  # the same size: checked token by token when the engine is built
    return f"a {draft.family} model, whose tokenizer has {draft.vocab_size} entries against the target's {size}"


def _drafter(args: argparse.Namespace) -> str:
    """--drafter, else the default for what exists: without a draft model where the default draft
    cannot draft for the target (said on stderr). A drafter named that drafts with a model, where
    only the default draft would, is refused then, before anything is pulled (it pulled ~470 MiB,
    re-quantized it, and then refused its tokenizer)."""
    default = default_drafter(has_draft_model=False)
    if args.drafter is not None:
        if USES_MODEL.get(args.drafter, False):
            check_default_draft_fits(args, f"--drafter {args.drafter} drafts", f"--drafter {default}, which needs no model")
        return check_drafter(args.drafter)
    why = _default_draft_mismatch(args)
    if why is None:
        return check_drafter(default_drafter(has_draft_model=True))
    print(f"drafter: {default} (the default draft {draft_spec(args).model} is {why}; --draft names a draft "
          "model that shares it)", file=sys.stderr)
    return default


def check_default_draft_fits(args: argparse.Namespace, who: str, instead: str) -> None:
    """Refused before anything is pulled: `who` ("--drafter model drafts"), drafting with a model,
    given no --draft where the default draft cannot draft for the target; `instead` is the way
    without a model."""
    why = _default_draft_mismatch(args)
    if why is not None:
        raise TandemError(f"{who} with the default draft {draft_spec(args).model}, {why}: give --draft a "
                          f"draft model of the target's family (one that shares its tokenizer), or {instead}")


def target_spec(args: argparse.Namespace) -> RunnerSpec:
    return RunnerSpec(args.target, args.backend, args.device, args.dtype, args.threads, args.context_length,
                      torch_runner=args.torch_runner, kv_memory=args.kv_memory)


def draft_spec(args: argparse.Namespace) -> RunnerSpec:
    """The draft named, or where none is, the one its backend runs best (catalog.default_draft)."""
    spec = RunnerSpec(args.draft or DEFAULT_DRAFT, args.draft_backend, args.draft_device, args.draft_dtype,
                      args.threads, args.context_length, torch_runner=args.torch_runner,
                      kv_memory=args.draft_kv_memory)
    _check_draft_placement(spec)
    if args.draft is None:
        spec = replace(spec, model=default_draft(spec.resolved().backend))
    return spec


def check_model_names(args: argparse.Namespace) -> None:
    """--target and --draft, each a catalog name or something on disk, checked before anything is
    pulled (a typo in --draft was said after the target's pull, 1 GiB for the default one)."""
    from tandem.models.resolve import check_model_name

    for model in (args.target, args.draft):
        if model is not None:
            check_model_name(model)


def engine_config(args: argparse.Namespace) -> EngineConfig:
    check_model_names(args)
    drafter = _drafter(args)
    if drafter == "none" and parse_depth(args.k) not in (Auto(), Fixed(0)):
        raise TandemError(f"--k {args.k} with --drafter none: that drafter drafts nothing")
    draft = draft_spec(args) if USES_MODEL[drafter] else None
    if draft is None and args.draft_dtype not in DTYPES:  # unread without a draft model, but a wrong name still
        raise TandemError(f"--draft-dtype: unknown dtype {args.draft_dtype!r}; choose one of {', '.join(DTYPES)}")
    _check_torch_options(args, target_spec(args), draft)
    for option, given, spec in (("--kv-memory", args.kv_memory, target_spec(args)),
                                ("--draft-kv-memory", args.draft_kv_memory, draft)):
        if given is not None and spec is not None and args.torch_runner == "serial" and spec.resolved().backend == "torch":
            raise TandemError(f"{option} sizes the fused runner's paged KV pool; --torch-runner serial keeps a cache "
                              "per sequence that it does not bound: drop one of them")
    return EngineConfig(target_spec(args), draft, drafter, args.k, step_token_budget=args.step_tokens,
                        prefill_floor=engine_prefill_floor(args.prefill_floor, THROUGHPUT_PREFILL_FLOOR),
                        prefill_waves=args.prefill_waves)


def _check_draft_placement(draft: RunnerSpec) -> None:
    """The draft's backend and device, checked before any model loads, in the draft's own option
    names (a draft on cuda said "use --backend torch", the target's option)."""
    try:
        resolved = draft.resolved()
        if resolved.backend == "torch":
            from tandem.models.torch_runner import torch_device

            torch_device(resolved.device)
    except TandemError as error:
        raise TandemError(f"the draft model: {error}".replace("--backend ", "--draft-backend ")
                          .replace("--device ", "--draft-device ")) from None


def _check_torch_options(args: argparse.Namespace, target: RunnerSpec, draft: RunnerSpec | None) -> None:
    """Options only the torch backend reads, given for models llama.cpp runs (it reads a GGUF
    file's own precision and sizes its own KV pool): refused where the side an option belongs to
    was put on llama.cpp by name (--backend or --draft-backend llamacpp), noted where auto chose
    llama.cpp (no GPU here), since a script may pass them everywhere. Without a draft model (a
    drafter that needs none) the draft's options have nothing to act on, whatever its backend."""
    target_side = ("--backend", target.resolved().backend == "llamacpp", args.backend == "llamacpp")
    draft_sides = [] if draft is None else [
        ("--draft-backend", draft.resolved().backend == "llamacpp", args.draft_backend == "llamacpp")]
    unread = []  # (option, the sides that would read it)
    for option, given, sides in (
        (f"--dtype {args.dtype}", args.dtype != "fp32", [target_side]),
        ("--kv-memory", args.kv_memory is not None, [target_side]),
        ("--draft-kv-memory", args.draft_kv_memory is not None and draft is not None, draft_sides),
        (f"--draft-dtype {args.draft_dtype}", args.draft_dtype != "fp32" and draft is not None, draft_sides),
        (f"--torch-runner {args.torch_runner}", args.torch_runner != "fused", [target_side, *draft_sides]),
    ):
        if given and all(on_llamacpp for _, on_llamacpp, _ in sides):
            unread.append((option, sides))
    named = sorted({flag for _, sides in unread for flag, _, by_name in sides if by_name})
    refused = [option for option, sides in unread if any(by_name for _, _, by_name in sides)]
    if refused:
        models = " and ".join("the target" if flag == "--backend" else "the draft" for flag in named)
        raise TandemError(f"{_torch_only(refused)}, and llama.cpp runs {models} "
                          f"({', '.join(f'{flag} llamacpp' for flag in named)}), which reads each GGUF file's own "
                          "precision and sizes its own KV pool: drop them, or use --backend torch")
    if unread:
        print(f"note: {_torch_only([option for option, _ in unread])}; the models run on llama.cpp here (no GPU "
              "found), which reads each GGUF file's own precision: ignored (--backend torch runs them)",
              file=sys.stderr)


def _torch_only(options: list[str]) -> str:
    return f"{' and '.join(options)} appl{'ies' if len(options) == 1 else 'y'} to the torch backend only"
