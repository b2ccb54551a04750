"""Build a batch runner (several sequences, one model) from a `RunnerSpec`, with its measured
cost curve. llama.cpp gets one context with a sequence id per slot (fused batches, profiled up
to BATCH_PROFILE_SIZES tokens, since a batch scores many sequences' tokens at once); torch gets
one cache per slot over shared weights (serial batches).
"""

from typing import Callable

from tandem.models.backends import RunnerSpec, cached_profile, load_runner
from tandem.models.batch_runner import BatchRunner, SerialBatchRunner, SlotView
from tandem.models.cost import PROFILE_SIZES

BATCH_PROFILE_SIZES = PROFILE_SIZES + (24, 32, 48, 64)


def _load_llamacpp(spec: RunnerSpec, slots: int) -> BatchRunner:
    from tandem.models.llamacpp_batch_runner import LlamaCppBatchRunner
    from tandem.models.resolve import gguf_path

    runner = LlamaCppBatchRunner(str(gguf_path(spec.model)), slots, spec.context_length, spec.threads)
    runner.name = f"{spec.model} [llamacpp/cpu/gguf/x{slots}]"
    runner.cost = cached_profile(spec, SlotView(runner), BATCH_PROFILE_SIZES, variant="-batch")
    runner.rollback(0, 0)
    return runner


def _load_torch(spec: RunnerSpec, slots: int) -> BatchRunner:
    base = load_runner(spec)
    views = iter([base] + [base.fork() for _ in range(slots - 1)])
    return SerialBatchRunner(lambda: next(views), slots)


BATCH_LOADERS: dict[str, Callable[[RunnerSpec, int], BatchRunner]] = {
    "llamacpp": _load_llamacpp,
    "torch": _load_torch,
}


def load_batch_runner(spec: RunnerSpec, slots: int) -> BatchRunner:
    spec = spec.resolved()
    return BATCH_LOADERS[spec.backend](spec, slots)
