"""What an engine is built from (`EngineConfig`: target and draft runner specs, the default
drafter and depth, the tokens one step's target forward may score), and `build_engine`: batch
runners for the target and the draft (the draft only when the drafter uses a model; same
tokenizer checked) and the batching engine over them.
`tandem generate`, `tandem bench` and `tandem serve` all build their engine here."""

import sys
from collections.abc import Callable
from dataclasses import dataclass

from tandem.engine.batch_engine import BatchEngine
from tandem.engine.step_budget import STEP_TOKEN_BUDGET, check_prefill_floor, check_step_token_budget
from tandem.engine.disk_cache import TORCH_STATE_LAYOUT, DiskPromptCache, default_cache_disk_bytes
from tandem.engine.host_cache import HostPromptCache, default_cache_ram_bytes
from tandem.errors import TandemError
from tandem.hardware import llama_cpp_features, llama_cpp_version
from tandem.models.backends import RunnerSpec, precision_of
from tandem.models.batch_backends import load_batch_runner
from tandem.models.checksum import model_checksum
from tandem.models.resolve import check_model_name, tokenizer_path
from tandem.numbers import is_int
from tandem.speculation.depth import Auto, Depth, parse_depth
from tandem.speculation.drafters.registry import USES_MODEL, check_drafter
from tandem.text.tokenizer import TextTokenizer, check_same_vocabulary

DEFAULT_MAX_RUNNING = 8
MAX_RUNNING = 64  # sequences one engine decodes together
# Slots beyond the running ones, per running slot, that keep finished sequences resident, by backend.
# llama.cpp: none. Every running sequence's attention spans its unified pool's used cells, so
# resident caches slow every step (8 x 5-token verify rounds over 300-token caches: +5-8% beside
# 8 resident ones, docs/prompt-cache.md); free slots keep theirs while no prompt needs them, and
# evicted ones go to the host tier, which restores a 1,000-token history in milliseconds.
# torch (fused runner): a paged pool's resident blocks cost a step nothing, so finished
# sequences stay until the pool needs their blocks.
RESIDENT_PER_RUNNING = {"llamacpp": 0, "torch": 3}


@dataclass(frozen=True, slots=True)
class EngineConfig:
    target: RunnerSpec
    draft: RunnerSpec | None = None
    drafter: str = "hybrid"
    k: Depth = Auto()  # "auto" or an int are parsed on creation
    step_token_budget: int = STEP_TOKEN_BUDGET  # rounds first, prompt chunks fill the rest
    prefill_floor: int | None = None  # prompt tokens a step may always score beside streams (None: from the profile)
    prefill_waves: bool = False  # a wave of new prompts keeps the whole step budget until all are in

    def __post_init__(self):
        object.__setattr__(self, "k", parse_depth(self.k))
        check_step_token_budget(self.step_token_budget)
        check_prefill_floor(self.prefill_floor)
        check_drafter(self.drafter, has_draft_model=self.draft is not None)

    @property
    def uses_draft_model(self) -> bool:
        return USES_MODEL[self.drafter]

    @property
    def loading_note(self) -> str:
        """What a command says on stderr before it loads these models."""
        from tandem.models.catalog import CATALOG
        from tandem.models.pull import is_pulled

        draft = f" and {self.draft.model}" if self.draft is not None else ""
        models = [spec.model for spec in (self.target, self.draft) if spec is not None]
        if all(is_pulled(model) for model in models if model in CATALOG):  # profiling says so itself
            return f"loading {self.target.model}{draft} ..."
        return (f"loading {self.target.model}{draft} (a first start also pulls and profiles "
                f"{'them' if draft else 'it'}: minutes) ...")


def build_engine(config: EngineConfig, max_running: int = DEFAULT_MAX_RUNNING, ngram_store=None,
                 cache_ram_bytes: int | None = None, cache_dir: str | None = None,
                 cache_disk_bytes: int | None = None) -> BatchEngine:
    """cache_ram_bytes: the host tier of the prompt cache (None: default_cache_ram_bytes(); 0: off;
    runners that cannot save a slot's state, torch's serial one, have none). cache_dir: the disk
    tier's folder (None: no disk tier), holding up to cache_disk_bytes (None:
    default_cache_disk_bytes())."""
    if not (is_int(max_running) and 1 <= max_running <= MAX_RUNNING):
        raise TandemError(f"max running sequences must be an integer between 1 and {MAX_RUNNING}, got {max_running!r}")
    cache_slots = max_running * (1 + RESIDENT_PER_RUNNING.get(config.target.resolved().backend, 0))
    uses_draft = config.draft is not None and config.uses_draft_model
    for spec in [config.target] + ([config.draft] if uses_draft else []):
        check_model_name(spec.model)  # both, before either is pulled (a --draft typo was said after the target's)
    draft = None
    if uses_draft:
        target_tokenizer = TextTokenizer(str(tokenizer_path(config.target.model)))
        check_same_vocabulary(target_tokenizer, TextTokenizer(str(tokenizer_path(config.draft.model))))
        try:
            draft = load_batch_runner(config.draft, max_running, cache_slots, role="draft, --draft-kv-memory")
        except TandemError as error:  # a pool too small for one context names the draft's option
            raise TandemError(str(error).replace("--kv-memory", "--draft-kv-memory")) from None
    target = load_batch_runner(config.target, max_running, cache_slots, role="target, --kv-memory")
    if target.context_length < config.target.context_length:  # it was capped without a word (vLLM refuses)
        print(f"note: a sequence holds {target.context_length} tokens, fewer than --context-length "
              f"{config.target.context_length}: what {config.target.model} was trained for, or its KV pool holds "
              f"for {max_running} sequence{'s' if max_running > 1 else ''}", file=sys.stderr)
    host_cache = host_cache_for(target, draft, cache_ram_bytes)
    disk_cache = None
    if cache_dir is not None and host_cache is None:
        print(f"warning: --cache-dir {cache_dir} is not used: {target.name} cannot save a slot's state",
              file=sys.stderr)
    elif cache_dir is not None and cache_disk_bytes != 0:
        capacity = default_cache_disk_bytes(cache_dir) if cache_disk_bytes is None else cache_disk_bytes
        disk_cache = DiskPromptCache(cache_dir, capacity, disk_model_key(config, draft is not None))
    return BatchEngine(target, draft, config.drafter, config.k, ngram_store, max_running,
                       step_token_budget=config.step_token_budget, host_cache=host_cache,
                       disk_cache=disk_cache, prefill_floor=config.prefill_floor,
                       prefill_waves=config.prefill_waves)


def disk_model_key(config: EngineConfig, with_draft: bool) -> str:
    """What a disk-tier state belongs to: each model's content checksum, backend, device and
    precision, and for llama.cpp its build (a state is only restored where the same kernels
    computed it; for torch the fused runner's state layout, which a source checkout's unchanging
    version would not tell apart), and Tandem's version. Threads and slot counts are left out:
    they do not change a state."""
    specs = [config.target] + ([config.draft] if with_draft else [])
    parts = [f"tandem {_tandem_version()}"]
    for spec in specs:
        layout = "" if spec.resolved().backend == "llamacpp" else f"|layout {TORCH_STATE_LAYOUT}"
        parts.append(runner_identity(spec, model_checksum) + layout)
    return " + ".join(parts)


def runner_identity(spec: RunnerSpec, model_version: Callable[[str], str]) -> str:
    """What a runner computes with, as keys name it: the model's version (`model_version` of its
    name), backend, device, precision and, for llama.cpp, its build."""
    spec = spec.resolved()
    build = f"{llama_cpp_version()} {llama_cpp_features()}" if spec.backend == "llamacpp" else ""
    return f"{model_version(spec.model)}|{spec.backend}|{spec.device}|{precision_of(spec.backend, spec.dtype)}|{build}"


def _tandem_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("tandem")
    except PackageNotFoundError:
        return "unknown"


def host_cache_for(target, draft, cache_ram_bytes: int | None = None) -> HostPromptCache | None:
    """The host tier, keyed by what the runners' saved states mean (model, backend, precision:
    `state_format`, else the name), so that its states are restored only into the models that
    saved them, and a cluster's move restores one into any replica of the same model whatever
    its device or slot count."""
    capacity = default_cache_ram_bytes() if cache_ram_bytes is None else cache_ram_bytes
    if not hasattr(target, "save_state") or (draft is not None and not hasattr(draft, "save_state")):
        if cache_ram_bytes:  # asked for by name: said, as --cache-dir is
            print(f"warning: --cache-ram is not used: {target.name if not hasattr(target, 'save_state') else draft.name} "
                  "cannot save a slot's state (torch's serial runner; the fused one can)", file=sys.stderr)
        return None
    return HostPromptCache(capacity, "|".join(getattr(runner, "state_format", runner.name)
                                              for runner in (target, draft) if runner is not None))
