"""The batched runner interface: one model serving several sequences, each in its own slot.

A slot is one sequence's KV cache. `forward_batch` appends tokens to several slots in one call
and returns each item's logits for its last `num_logits` positions; `rollback` truncates one
slot; `copy_prefix` makes a slot start with the first tokens of another (shared prompt prefixes
reuse cached KV). `fused` says whether a call is one forward pass over all items (llama.cpp
sequence ids, the fused torch runner: cost grows with the total token count) or one pass per
item (cost is the sum of per-item costs); the depth planner reads it with `cost`, the measured
ms to score n tokens.

`SerialBatchRunner` gives any single-sequence `ModelRunner` this interface by keeping one runner
view per slot and running items one after another (each item's time refines the per-item cost
curve). It is the torch backend's `--torch-runner serial`, and the slow reference the fused
llama.cpp and torch paths are tested against.

Optional: `cache_slots` (slots in all, where a runner has more than `max_slots`: the extra ones
keep finished sequences' caches resident beside the running ones; the engine runs at most
`max_slots` sequences at once), and `save_state(slot) -> bytes` with
`restore_state(slot, state, length) -> bool` (a slot's cache copied out to host memory and back:
the host tier of the prompt cache, engine/host_cache.py; llama.cpp has them).
"""

import time
from dataclasses import dataclass
from typing import Callable, Protocol, Sequence

import numpy as np

from tandem.errors import TandemError
from tandem.models.cost import CostModel
from tandem.models.runner import ModelRunner


KV_HEADROOM_TOKENS = 64  # cells the engine keeps free per running sequence (and one more), for drafts being verified


class KvPoolFullError(TandemError):
    """A batch runner's KV pool cannot hold a step; raised before the runner changes any state
    (the engine frees room, preempting its youngest sequence if it must, and steps again)."""


@dataclass(frozen=True, slots=True)
class BatchItem:
    slot: int
    token_ids: tuple[int, ...]  # appended to the slot's cache
    num_logits: int  # logits wanted for the last num_logits of them (0: none)

    def __post_init__(self):
        if not 0 <= self.num_logits <= len(self.token_ids):  # more would be rows nobody scored
            raise ValueError(f"slot {self.slot}: {self.num_logits} logits asked of {len(self.token_ids)} tokens")


def cached_context(runner: "BatchRunner", items: Sequence[BatchItem]) -> float:
    """Tokens cached before the items' calls, per item on average: where their cost is read
    (models/cost.py). Asked before the forward."""
    return sum(runner.num_cached_tokens(item.slot) for item in items) / max(len(items), 1)


class BatchRunner(Protocol):
    name: str
    vocab_size: int
    context_length: int  # per sequence
    max_slots: int
    fused: bool
    can_copy_prefix: bool
    cost: CostModel

    def num_cached_tokens(self, slot: int) -> int: ...

    def forward_batch(self, items: Sequence[BatchItem], views: bool = False) -> list[np.ndarray]:
        """Per item, logits [num_logits, vocab] float32, in the order of `items`: numpy arrays,
        or torch tensors left on the device by runners with `device_logits = True` (the fused
        torch runner; speculation/acceptance.py takes either). With `views` the caller reads
        every row before its next call to this runner, so a runner may hand over its own
        buffer (llama.cpp's) instead of copies; without, the rows are the caller's to keep."""
        ...

    def rollback(self, slot: int, length: int) -> None: ...

    def copy_prefix(self, source: int, destination: int, length: int) -> None:
        """`destination`'s cache becomes the first `length` cached tokens of `source`."""
        ...


class SerialBatchRunner:
    """Slots backed by single-sequence runner views that share weights; one item at a time."""

    fused = False

    def __init__(self, make_view: Callable[[], ModelRunner], max_slots: int):
        first = make_view()
        self.views = [first] + [make_view() for _ in range(max_slots - 1)]
        self.name = first.name
        self.vocab_size = first.vocab_size
        self.context_length = first.context_length
        self.cost = first.cost
        self.max_slots = max_slots
        self.can_copy_prefix = hasattr(first, "copy_cache_from")

    def num_cached_tokens(self, slot: int) -> int:
        return self.views[slot].num_cached_tokens

    def forward_batch(self, items: Sequence[BatchItem], views: bool = False) -> list[np.ndarray]:
        """Each item in turn; each item's time refines the (per-item) cost curve. Every item's
        rows are its own (`views` asks nothing of a serial runner)."""
        return [self._timed_forward(item) for item in items]

    def _timed_forward(self, item: BatchItem) -> np.ndarray:
        context = self.views[item.slot].num_cached_tokens
        start = time.perf_counter()
        logits = self.views[item.slot].forward(list(item.token_ids), item.num_logits)  # [num_logits, vocab]
        self.cost.observe(len(item.token_ids), (time.perf_counter() - start) * 1000, context)
        return logits

    def rollback(self, slot: int, length: int) -> None:
        self.views[slot].rollback(length)

    def copy_prefix(self, source: int, destination: int, length: int) -> None:
        view = self.views[destination]
        copy = getattr(view, "copy_cache_from", None)
        if copy is None:
            raise NotImplementedError(f"{self.name} cannot copy caches between slots")
        copy(self.views[source], length)


class SlotView:
    """One slot of a batch runner seen as a single-sequence `ModelRunner` (used to profile it)."""

    def __init__(self, runner: BatchRunner, slot: int = 0):
        self._runner = runner
        self._slot = slot
        self.name = runner.name
        self.vocab_size = runner.vocab_size
        self.context_length = runner.context_length
        self.cost = runner.cost

    @property
    def num_cached_tokens(self) -> int:
        return self._runner.num_cached_tokens(self._slot)

    def forward(self, token_ids: Sequence[int], num_logits: int | None = None) -> np.ndarray:
        wanted = len(token_ids) if num_logits is None else min(num_logits, len(token_ids))
        return self._runner.forward_batch([BatchItem(self._slot, tuple(token_ids), wanted)])[0]

    def rollback(self, length: int) -> None:
        self._runner.rollback(self._slot, length)

    def reset(self) -> None:
        self.rollback(0)
