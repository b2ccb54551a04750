"""Build a batch runner (several sequences, one model) from a `RunnerSpec`, with its measured
cost curve. llama.cpp gets one context with a sequence id per slot, and torch (by default) the fused
runner over a paged KV cache: both score every slot's tokens in one forward (fused batches,
profiled up to BATCH_PROFILE_SIZES tokens, since a batch scores many sequences' tokens at once,
on a short cache and on a deep one: models/cost.py).
`torch_runner="serial"` gives torch one transformers cache per slot over shared weights (serial
batches: the slow reference).
"""

import sys
from typing import Callable

from tandem.models.backends import RunnerSpec, cached_profile, load_torch_runner
from tandem.models.batch_runner import BatchRunner, SerialBatchRunner, SlotView
from tandem.models.checksum import model_version
from tandem.models.cost import PROFILE_SIZES

# 63 and 64 both: llama.cpp's CPU flash attention scores 64 query positions as one tile and
# fewer position by position, so 64 tokens cost less than 63 (measured, 1.5B Q4 at 1,024 cached
# tokens: 48 727 ms, 63 998 ms, 64 732 ms, 65 838 ms; docs/copy-ceiling.md): the planner must see
# the dip to choose a 64-token round, and would not between 48 and 64 alone. The dip grows with
# the cache (on 64 cached tokens 48 cost less than 64): hence the deep profile.
BATCH_PROFILE_SIZES = PROFILE_SIZES + (24, 32, 48, 63, 64)


def _load_llamacpp(spec: RunnerSpec, slots: int, cache_slots: int | None = None) -> BatchRunner:
    from tandem.hardware import llama_cpp_version
    from tandem.models.llamacpp_batch_runner import LlamaCppBatchRunner
    from tandem.models.resolve import gguf_path

    runner = LlamaCppBatchRunner(str(gguf_path(spec.model)), slots, spec.context_length, spec.threads,
                                 cache_slots)
    runner.name = f"{spec.model} [llamacpp/cpu/gguf/x{slots}]"
    # what its saved states mean (not how many slots): the model's version (a catalog model's
    # checksum; a file's path, size and time) and the llama.cpp that wrote them, so that a state a
    # cluster moves between nodes is never restored into another file at the same path
    runner.state_format = f"{model_version(spec.model)} [llamacpp/gguf/{llama_cpp_version()}]"
    runner.cost = cached_profile(spec, SlotView(runner), BATCH_PROFILE_SIZES, variant="-batch", deep=True)
    runner.rollback(0, 0)
    return runner


def _load_torch(spec: RunnerSpec, slots: int, cache_slots: int | None = None) -> BatchRunner:
    if spec.torch_runner == "fused":
        return _load_torch_fused(spec, slots, cache_slots)
    base = load_torch_runner(spec)
    views = iter([base] + [base.fork() for _ in range(slots - 1)])
    return SerialBatchRunner(lambda: next(views), slots)


def _load_torch_fused(spec: RunnerSpec, slots: int, cache_slots: int | None = None) -> BatchRunner:
    from tandem.models.paged.fused_runner import FusedTorchRunner
    from tandem.models.resolve import hf_path

    runner = FusedTorchRunner.load(str(hf_path(spec.model)), spec.device, spec.dtype, slots, spec.context_length,
                                   spec.threads, spec.kv_memory, cache_slots)
    runner.name = f"{spec.model} [torch-fused/{spec.device}/{spec.dtype}/x{slots}]"
    runner.state_format = f"{model_version(spec.model)} [torch-fused/{spec.dtype}]"  # rows read to the host: any device
    runner.cost = cached_profile(spec, SlotView(runner), BATCH_PROFILE_SIZES, variant="-fused", deep=True)
    runner.rollback(0, 0)
    return runner


BATCH_LOADERS: dict[str, Callable[[RunnerSpec, int, int | None], BatchRunner]] = {
    "llamacpp": _load_llamacpp,
    "torch": _load_torch,
}


def load_batch_runner(spec: RunnerSpec, slots: int, cache_slots: int | None = None, role: str = "") -> BatchRunner:
    """slots: sequences run at once; cache_slots: slots in all, where the runner keeps finished
    sequences resident beside the running ones (llama.cpp, torch's fused runner; the serial
    torch runner has `slots`). A runner with a KV pool of its own says its size on stderr, with
    its role ("target", "draft": both pools' lines looked alike, and a user sizing --kv-memory
    missed the draft's)."""
    spec = spec.resolved()
    runner = BATCH_LOADERS[spec.backend](spec, slots, cache_slots)
    pool = runner.describe_pool() if hasattr(runner, "describe_pool") else None
    sized_by_budget = getattr(runner, "sized_by_budget", False)  # torch's pool; llama.cpp's follows the slots
    if pool is not None and (role or sized_by_budget):  # llama.cpp's line is a server's (not profile's)
        if not sized_by_budget:  # no option sizes it: --kv-memory is refused on llama.cpp
            role = role.split(",")[0]
        print(f"{runner.name}{f' ({role})' if role else ''}: {pool}", file=sys.stderr)
    return runner
