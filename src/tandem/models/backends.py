"""Backend registry: build a runner from a `RunnerSpec`, and attach its measured cost curve.

Cost profiles are cached under `$TANDEM_HOME/profiles`, keyed by model file, backend, device,
dtype, threads, the CPU model with its family and model numbers (VMs that all say "AMD EPYC"
differ) and (llama.cpp) the CPU features its build uses, so the profile is measured once per
machine and build (a cache carried to another CPU is measured again) and refined while
generating.
"""

import hashlib
import json
import os
import sys
from dataclasses import dataclass, replace

from tandem.errors import ModelNotFoundError, TandemError
from tandem.hardware import cpu_family_model, cpu_model, llama_cpp_build
from tandem.models.checksum import model_version
from tandem.models.pull import catalog_name_of
from tandem.models.cost import PROFILE_SIZES, CostModel, measure_cost
from tandem.models.runner import ModelRunner
from tandem.models.torch_runner import DTYPES
from tandem.numbers import is_int
from tandem.paths import make_dir, profiles_dir, write_text_atomic
from tandem.progress import ProgressBar

PROFILE_BASE_LENGTH = 64  # cost is measured on top of a cache of this many tokens
DEEP_PROFILE_LENGTH = 1024  # and, for batch runners, of this many too: where long answers run (models/cost.py)
DEEP_REPEATS = 3  # the deep sweep is the slower one; interference only adds time, and the fastest is kept
PROFILE_CACHE_BYTES = 4 << 20  # the profiles folder's bound (~5,000 profiles); least recently used go first
MIN_CONTEXT_LENGTH = 64  # tokens; the CLI's least --context-length too
BACKENDS = ("llamacpp", "torch")
TORCH_RUNNERS = ("fused", "serial")  # one paged forward for all slots | transformers, one slot at a time


@dataclass(frozen=True, slots=True)
class RunnerSpec:
    model: str  # catalog name, .gguf file or HF folder
    backend: str = "auto"  # llamacpp | torch | auto (torch where a GPU exists, else llamacpp)
    device: str = "auto"
    dtype: str = "fp32"
    threads: int | None = None
    context_length: int = 4096
    torch_runner: str = "fused"  # how the torch backend batches slots (see TORCH_RUNNERS)
    kv_memory: int | None = None  # bytes for the fused runner's KV pool (None: a share of free memory)

    def __post_init__(self):
        if not isinstance(self.model, (str, os.PathLike)):  # None became the model "None"
            raise TandemError(f"a model is a catalog name, a .gguf file or a Hugging Face folder, got {self.model!r}")
        if not str(self.model).strip():  # "" would be read as the current folder
            raise TandemError("a model is empty: give a catalog name, a .gguf file or a Hugging Face folder")
        if self.backend not in BACKENDS + ("auto",):
            raise TandemError(f"unknown backend {self.backend!r}; choose one of {', '.join(BACKENDS + ('auto',))}")
        if self.dtype not in DTYPES:  # llama.cpp reads its file as it is, but a wrong name is still one
            raise TandemError(f"unknown dtype {self.dtype!r}; choose one of {', '.join(DTYPES)}")
        if not is_int(self.context_length) or self.context_length < MIN_CONTEXT_LENGTH:  # 10 aborted inside llama.cpp
            raise TandemError(f"the context length must be a whole number of at least {MIN_CONTEXT_LENGTH} tokens, "
                              f"got {self.context_length!r}")
        if self.threads is not None and not (is_int(self.threads) and self.threads >= 1):  # "1" failed deep in llama.cpp
            raise TandemError(f"threads must be a whole number of at least 1 (or None: all), got {self.threads!r}")
        if self.torch_runner not in TORCH_RUNNERS:
            raise TandemError(f"unknown torch runner {self.torch_runner!r}; choose one of {', '.join(TORCH_RUNNERS)}")

    def describe(self) -> str:
        """For reports: "qwen2.5-coder-1.5b-instruct on llamacpp/cpu, fp32, 2 threads, 4096-token context"."""
        threads = "all threads" if self.threads is None else f"{self.threads} thread{'s' if self.threads > 1 else ''}"
        return f"{self.model} on {self.backend}/{self.device}, {self.dtype}, {threads}, {self.context_length}-token context"

    def resolved(self) -> "RunnerSpec":
        backend, device = self.backend, self.device
        if backend == "auto":
            backend = "torch" if _gpu_device() else "llamacpp"
        if device == "auto":
            device = (_gpu_device() or "cpu") if backend == "torch" else "cpu"
        if backend == "llamacpp" and device != "cpu":
            raise TandemError(f"the llamacpp backend runs on the cpu here, not {device!r}: use --backend torch")
        return replace(self, backend=backend, device=device)


def _gpu_device() -> str | None:
    try:
        import torch
    except ImportError:
        return None
    return "cuda:0" if torch.cuda.is_available() else None


def load_torch_runner(spec: RunnerSpec, profile: bool = True) -> ModelRunner:
    """One sequence on transformers' model (the serial torch batch runner's slots)."""
    from tandem.models.resolve import hf_path
    from tandem.models.torch_runner import TorchRunner

    spec = spec.resolved()
    runner = TorchRunner(str(hf_path(spec.model)), spec.device, spec.dtype, spec.threads)
    runner.name = f"{spec.model} [{spec.backend}/{spec.device}/{_precision(spec)}]"
    if profile:
        runner.cost = cached_profile(spec, runner)
    return runner


def _precision(spec: RunnerSpec) -> str:
    return precision_of(spec.backend, spec.dtype)


def precision_of(backend: str, dtype: str) -> str:
    """What a model's weights are stored in on a backend: llama.cpp reads a GGUF file as it is."""
    return "gguf" if backend == "llamacpp" else dtype


def cached_profile(spec: RunnerSpec, runner: ModelRunner, sizes: tuple[int, ...] = PROFILE_SIZES,
                   variant: str = "", deep: bool = False) -> CostModel:
    """The runner's cost curve at `sizes`, measured once per machine (`variant` tells apart
    profiles of the same model loaded differently, e.g. a batched context). `deep`: also on a
    cache of DEEP_PROFILE_LENGTH tokens (fewer where the context is short), so that reads can
    follow the context (models/cost.py)."""
    path = profiles_dir() / f"{_profile_key(spec, runner)}{variant}.json"
    deep_context = deep_profile_length(runner.context_length, max(sizes)) if deep else 0
    cached = _read_profile(path)
    # a profile of other sizes (or without the deep curve asked for) is measured again
    if cached is not None and set(sizes) <= set(cached.latency_ms) and (
            not deep_context or set(sizes) <= set(cached.deep_ms)):
        try:
            os.utime(path)  # used: the last to be evicted
        except OSError:  # evicted meanwhile by another process: the curve read stands
            pass
        return cached
    try:
        make_dir(path.parent)  # said before the minute of measuring, not after
        keepable = ""
    except TandemError as error:  # a read-only home (a model volume mounted read-only): measured, not kept
        print(f"warning: {error}; the profile is measured at each start", file=sys.stderr)
        keepable = ", not kept"
    print(f"profiling {spec.model} on this machine (once{keepable}; a minute or two, more for larger models) ...",
          file=sys.stderr, flush=True)
    base = profile_base_length(runner.context_length, max(sizes))
    cost = _measure_at(runner, base, sizes)
    record = {"runner": runner.name, "spec": spec.__repr__(), "latency_ms": cost.to_json(), "base_context": base}
    if deep_context:
        record |= {"deep_latency_ms": _measure_at(runner, deep_context, sizes, DEEP_REPEATS).to_json(),
                   "deep_context": deep_context}
    runner.reset()
    if keepable:
        return _cost_from_record(record)
    try:
        write_text_atomic(path, json.dumps(record, indent=1))  # two processes may profile at once
    except OSError as error:  # a read-only home (a model volume mounted read-only): this run still has it
        print(f"warning: cannot save the profile {path} ({error.strerror or error}): it is measured again at "
              "each start; make its folder writable to keep it", file=sys.stderr)
        return _cost_from_record(record)
    evict_profiles(path.parent, PROFILE_CACHE_BYTES, keep=path)
    return _cost_from_record(record)


def _read_profile(path) -> CostModel | None:
    """The curves stored at `path`; None if there is none, or if it cannot be read (a damaged
    file is removed, to be measured again, rather than stopping every start)."""
    try:
        return _cost_from_record(json.loads(path.read_text()))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as error:
        why = f"no {error} field" if isinstance(error, KeyError) else f"{type(error).__name__}: {error}"
        print(f"warning: the profile {path} cannot be read ({why}): measuring it again", file=sys.stderr)
        path.unlink(missing_ok=True)
        return None


def evict_profiles(folder, capacity_bytes: int, keep=None) -> None:
    """Delete the least recently used profiles (by modification time, which a read refreshes)
    until the folder's profiles fit in capacity_bytes; `keep` (the one just written) stays."""
    entries = []
    for path in folder.glob("*.json"):
        try:
            stat = path.stat()
        except OSError:  # removed meanwhile by another process
            continue
        entries.append((stat.st_mtime, stat.st_size, path))
    total = sum(size for _, size, _ in entries)
    for _, size, path in sorted(entries, key=lambda entry: entry[0]):
        if total <= capacity_bytes:
            break
        if path == keep:
            continue
        path.unlink(missing_ok=True)
        total -= size


def deep_profile_length(context_length: int, largest: int) -> int:
    """Cached tokens of the deep profile: DEEP_PROFILE_LENGTH where the context holds it and the
    largest call after it, else what does (0, no deep profile, where that is barely above the base)."""
    length = min(DEEP_PROFILE_LENGTH, context_length - largest - 1)
    return length if length >= 2 * PROFILE_BASE_LENGTH else 0


def profile_base_length(context_length: int, largest_call: int) -> int:
    """The cached tokens the profile's calls are timed on: PROFILE_BASE_LENGTH, fewer where a
    short context (--context-length 64 to 127) would not hold them and the largest call."""
    return max(0, min(PROFILE_BASE_LENGTH, context_length - largest_call))


def _measure_at(runner: ModelRunner, cached: int, sizes: tuple[int, ...], repeats: int = 5) -> CostModel:
    """The sweep on `cached` tokens, with a progress bar (a first start spends ~20-40 s a model here)."""
    runner.reset()
    if cached:
        runner.forward([1] * cached, num_logits=0)
    with ProgressBar(total=1 + repeats * len(sizes), desc=f"profiling {runner.name} on {cached} cached tokens",
              unit="call", file=sys.stderr, leave=False) as bar:
        return measure_cost(runner.forward, runner.rollback, cached, sizes, repeats, bar.update)


def _cost_from_record(record: dict) -> CostModel:
    """A profile JSON's curves (a record from before deep profiles has the short one only)."""
    return CostModel(_curve_of(record["latency_ms"]), deep_ms=_curve_of(record.get("deep_latency_ms", {})),
                     base_context=int(record.get("base_context", PROFILE_BASE_LENGTH)),
                     deep_context=int(record.get("deep_context", 0)))


def _curve_of(points: dict[str, float]) -> dict[int, float]:
    return {int(n): float(ms) for n, ms in points.items()}


def _profile_key(spec: RunnerSpec, runner: ModelRunner) -> str:
    threads = spec.threads or os.cpu_count()
    named = catalog_name_of(spec.model)
    model = named or (os.path.abspath(spec.model) if os.path.exists(spec.model) else spec.model)
    build = llama_cpp_build() if spec.backend == "llamacpp" else ""
    text = (f"{model}|{_version(named or spec.model)}|{spec.backend}|{spec.device}|{_device_name(spec.device)}|"
            f"{_precision(spec)}|{threads}|{spec.context_length}|{cpu_model()}|{cpu_family_model()}|{build}")
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _version(model: str) -> str:
    """The model's size and time (a catalog model's checksum): another model written at the same
    path is profiled again. No hashing: profiles only steer speed."""
    try:
        return model_version(model)
    except ModelNotFoundError:  # a runner not loaded from a file (a test's double)
        return ""


def _device_name(device: str) -> str:
    """A GPU's model (an H100 and an A10 on one host read as cuda:0 alike); the CPU's is in the key."""
    if not device.startswith("cuda"):
        return ""
    try:
        import torch

        return torch.cuda.get_device_name(torch.device(device))
    except (ImportError, RuntimeError, AssertionError, ValueError):  # no torch, CUDA or such device
        return ""
