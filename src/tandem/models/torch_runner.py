"""Torch backend: a transformers causal LM on any torch device, one sequence, a DynamicCache.

Loads an HF-format folder (the catalog converts GGUF files to one once). Works on `cpu`,
`cuda:N`, `mps`, `xpu`, `npu:N` (where the matching torch extension is installed), in fp32,
bf16 or fp16.
"""

import os
from typing import Sequence

import numpy as np

from tandem.errors import TandemError
from tandem.models.cost import CostModel

DTYPES = ("fp32", "bf16", "fp16")


def torch_dtype(name: str):
    import torch

    table = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
    if name not in table:
        raise TandemError(f"unknown dtype {name!r}; choose one of {', '.join(DTYPES)}")
    return table[name]


def torch_device(name: str):
    import torch

    try:
        device = torch.device(name)
    except RuntimeError as error:
        raise TandemError(f"unknown torch device {name!r}: {error}") from None
    if device.type == "cpu":
        return device
    backend = torch.backends.mps if device.type == "mps" else getattr(torch, device.type, None)
    available = getattr(backend, "is_available", lambda: False)()
    count = getattr(backend, "device_count", lambda: 1)() if available else 0
    if not available or (device.index or 0) >= count:
        raise TandemError(f"torch device {name!r} is not available here (this torch {torch.__version__} sees "
                          f"{count} {device.type} device(s)); use --device cpu, or a torch built for it")
    return device


class TorchRunner:
    def __init__(self, model_dir: str, device: str = "cpu", dtype: str = "fp32", threads: int | None = None):
        import torch
        from transformers import AutoModelForCausalLM

        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        if threads:
            torch.set_num_threads(threads)
        self._device = torch_device(device)
        try:
            model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch_dtype(dtype))
            self._model = model.to(self._device).eval()
        except (OSError, ValueError, RuntimeError) as error:
            raise TandemError(f"cannot load {model_dir} on {device} ({dtype}): {error}") from None
        self.name = f"{os.path.basename(os.path.normpath(model_dir))} [torch/{device}/{dtype}]"
        self.vocab_size = int(self._model.config.vocab_size)
        self.context_length = int(getattr(self._model.config, "max_position_embeddings", 4096))
        self.cost = CostModel()
        self._cache = None
        self.reset()

    @property
    def num_cached_tokens(self) -> int:
        return self._length

    def reset(self) -> None:
        from transformers import DynamicCache

        self._cache = DynamicCache()
        self._length = 0

    def forward(self, token_ids: Sequence[int], num_logits: int | None = None) -> np.ndarray:
        import torch

        if not token_ids:
            return np.zeros((0, self.vocab_size), dtype=np.float32)
        ids = torch.tensor([list(token_ids)], dtype=torch.long, device=self._device)  # [1, n]
        keep = 1 if num_logits == 0 else (num_logits or 0)  # transformers: 0 keeps all
        with torch.inference_mode():
            output = self._model(
                input_ids=ids, past_key_values=self._cache, use_cache=True, logits_to_keep=keep
            )
        self._cache = output.past_key_values
        self._length += len(token_ids)
        if num_logits == 0:
            return np.zeros((0, self.vocab_size), dtype=np.float32)
        return output.logits[0].float().cpu().numpy()  # [num_logits, vocab]

    def fork(self) -> "TorchRunner":
        """A view with its own (empty) cache sharing this runner's weights: one per batch slot."""
        view = object.__new__(TorchRunner)
        view.__dict__.update(self.__dict__)
        view.reset()
        return view

    def copy_cache_from(self, other: "TorchRunner", length: int) -> None:
        """This view's cache becomes the first `length` cached tokens of `other`'s."""
        import copy

        self._cache = copy.deepcopy(other._cache)
        self._length = other._length
        self.rollback(length)

    def rollback(self, length: int) -> None:
        if length < self._length:
            self._cache.crop(length - self._length)
            self._length = length
