"""The runner interface: one model on one device, working on token ids only.

A runner owns a KV cache for one sequence. `forward` appends tokens to the cache and returns the
logits of the last `num_logits` new positions; `rollback` truncates the cache to a length, which
is how rejected draft tokens are forgotten. `cost` holds the measured time of scoring n tokens,
which the depth controller reads. Backends (llama.cpp, torch) implement this; the engine never
knows which one it talks to.
"""

from typing import Protocol, Sequence

import numpy as np

from tandem.models.cost import CostModel


class ModelRunner(Protocol):
    name: str  # a label for logs: "<model> [backend/device/dtype]"
    vocab_size: int  # width of the logits
    context_length: int
    cost: CostModel

    @property
    def num_cached_tokens(self) -> int: ...

    def forward(self, token_ids: Sequence[int], num_logits: int | None = None) -> np.ndarray:
        """Append `token_ids` to the cache; return logits [num_logits, vocab] float32 for the
        last `num_logits` new positions (all of them when None; 0 gives an empty array)."""
        ...

    def rollback(self, length: int) -> None:
        """Forget every cached position from `length` on."""
        ...

    def reset(self) -> None: ...
