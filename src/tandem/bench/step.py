"""`tandem bench-step`: what one fused torch step costs, by batch size, and where the time goes.

For each batch size B, B slots hold a prompt of `context` tokens; a step then scores `tokens`
new tokens per slot (1: plain decode; k + 1: a verify round) in one `forward_batch`. Reported:
the step's wall time, the decoder's share (the model's forward, device synchronised), the rest
(overhead: block bookkeeping, the layout tensors, Python), and the throughput against B = 1.
The memory floor of a one-token decode is the bytes of weights it must read divided by the
measured memory bandwidth (a large copy on the device): no runner can decode faster than that.
The serial runner (transformers, one slot at a time) is measured beside it for the same B.

With `--backend llamacpp` the llama.cpp batch runner is timed instead, with its calls laid out
as it lays them out (`llamacpp`: short verify rounds of several slots in calls below the flash
kernel's tile, see `plan_calls`) and, with `--serial`, packed into one call (`one-call`, the
layout before); every position asks for logits, as a verify does.
"""

import time
from dataclasses import asdict, dataclass

import torch

from tandem.models.batch_runner import BatchItem, BatchRunner

BANDWIDTH_BYTES = 2**30  # copied to measure memory bandwidth


@dataclass(frozen=True, slots=True)
class StepTiming:
    runner: str
    batch: int
    tokens_per_slot: int
    step_ms: float
    model_ms: float | None  # None where the runner cannot tell (serial)

    @property
    def overhead_ms(self) -> float | None:
        return None if self.model_ms is None else self.step_ms - self.model_ms

    def as_dict(self) -> dict:
        return {**asdict(self), "overhead_ms": self.overhead_ms}


STEP_CONTEXT = 4096  # tokens a slot may hold, unless the cache asked for needs more


def load_runners(model: str, device: str, dtype: str, slots: int, threads: int | None,
                 serial: bool, context_length: int = STEP_CONTEXT) -> dict[str, BatchRunner]:
    """The fused runner and, if asked, the serial one over transformers (no cost profiles: the
    step times are what is measured)."""
    from tandem.models.batch_runner import SerialBatchRunner
    from tandem.models.paged.fused_runner import FusedTorchRunner
    from tandem.models.resolve import hf_path
    from tandem.models.torch_runner import TorchRunner

    folder = str(hf_path(model))
    runners: dict[str, BatchRunner] = {"fused": FusedTorchRunner.load(folder, device, dtype, slots, context_length, threads)}
    if serial:
        base = TorchRunner(folder, device, dtype, threads)
        views = iter([base] + [base.fork() for _ in range(slots - 1)])
        runners["serial"] = SerialBatchRunner(lambda: next(views), slots)
    return runners


def load_llamacpp_runners(model: str, slots: int, threads: int | None, one_call: bool,
                          context_length: int = STEP_CONTEXT) -> dict[str, BatchRunner]:
    """The llama.cpp batch runner, and the same runner packing every slot into one call."""
    from tandem.models.llamacpp_batch_runner import BATCH_TOKENS, MAX_POOL_TOKENS, LlamaCppBatchRunner, kv_pool_tokens
    from tandem.models.resolve import gguf_path

    # every slot filled to the context at once (a server's pool holds half of that)
    pool = min(MAX_POOL_TOKENS, max(kv_pool_tokens(slots, context_length), slots * context_length))
    runner = LlamaCppBatchRunner(str(gguf_path(model)), slots, context_length, threads, pool_tokens=pool)
    runners: dict[str, BatchRunner] = {"llamacpp": _TileRows(runner, runner.tile_rows)}
    if one_call:
        runners["one-call"] = _TileRows(runner, BATCH_TOKENS + 1)
    return runners


class _TileRows:
    """A llama.cpp runner seen with one call layout (its tile_rows) for every forward."""

    def __init__(self, runner, tile_rows: int):
        self.runner, self.tile_rows = runner, tile_rows

    def forward_batch(self, items, views: bool = False):
        self.runner.tile_rows = self.tile_rows
        return self.runner.forward_batch(items, views=views)

    @property
    def last_model_ms(self) -> float:
        """Time inside llama_decode in the last forward (the rest: batch filling, logits copies)."""
        return self.runner.last_model_ms

    @property
    def context_length(self) -> int:
        return self.runner.context_length

    @property
    def pool_tokens(self) -> int:
        """The KV cells all slots share (llama.cpp's unified pool; the check was skipped without it)."""
        return self.runner.pool_tokens

    pool_block = 1  # cells are counted one by one, not in pages

    def rollback(self, slot: int, length: int) -> None:
        self.runner.rollback(slot, length)

    def num_cached_tokens(self, slot: int) -> int:
        return self.runner.num_cached_tokens(slot)


def fill_slots(runner: BatchRunner, batch: int, context: int) -> None:
    for slot in range(batch):
        runner.rollback(slot, 0)
        runner.forward_batch([BatchItem(slot, tuple(100 + (i * 7 + slot) % 5000 for i in range(context)), 0)])


def time_step(runner: BatchRunner, label: str, batch: int, tokens: int, repeats: int) -> StepTiming:
    """The fastest of `repeats` steps (interference only ever adds time); slots roll back after each."""
    lengths = [runner.num_cached_tokens(slot) for slot in range(batch)]
    items = [BatchItem(slot, tuple(range(11, 11 + tokens)), tokens) for slot in range(batch)]
    best_step, best_model = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        runner.forward_batch(items, views=True)  # as the engine verifies
        step_ms = (time.perf_counter() - start) * 1000
        for slot, length in enumerate(lengths):
            runner.rollback(slot, length)
        if step_ms < best_step:
            best_step, best_model = step_ms, getattr(runner, "last_model_ms", None)
    return StepTiming(label, batch, tokens, best_step, best_model)


def memory_bandwidth(device: torch.device, repeats: int = 5) -> float:
    """Bytes per second of a large device copy (read + write counted)."""
    source = torch.empty(BANDWIDTH_BYTES // 2, dtype=torch.bfloat16, device=device)
    destination = torch.empty_like(source)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        destination.copy_(source)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - start)
    return 2 * BANDWIDTH_BYTES / best
