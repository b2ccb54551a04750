"""The torch backend's engine runner: every slot's new tokens in ONE forward pass over a paged
KV cache (`fused = True`), logits kept on the device.

`forward_batch` lays the items out flat (paged/layout.py), makes their blocks writable
(paged/kv_blocks.py: allocation and copy-on-write), runs the compact decoder
(paged/decoder.py) once, and returns each item's logits [num_logits, vocab] as a float32
tensor on the model's device; acceptance runs there too (speculation/device_acceptance.py), so
only token ids cross to the host. A step the pool cannot hold raises KvPoolFullError before
any state changes. `SerialBatchRunner` over transformers' model stays the slow reference.

Prompt cache (engine/prompt_cache.py): the runner has `cache_slots` block tables, more than the
`max_slots` sequences that run at once, so finished sequences' blocks stay in the pool,
reference counted (a shared prefix is held once), until the engine needs their blocks and evicts
the least recently used. Unlike llama.cpp's unified pool, a resident cache costs a step nothing:
attention gathers only the slot's own rows. `save_state`/`restore_state` copy a slot's rows to
host memory and back (the host tier; on cuda it is the only copy outside the device's pool):
gathered straight into the bytes kept, and read back from them in place.
"""

import os
import time
from typing import Sequence

import torch

from tandem.errors import TandemError
from tandem.memory_size import MIB, human_size
from tandem.models.batch_runner import KV_HEADROOM_TOKENS, BatchItem
from tandem.models.cost import CostModel
from tandem.models.host_bytes import bytes_buffer, new_bytes
from tandem.models.paged.decoder import PagedDecoder
from tandem.models.paged.kv_blocks import BlockManager, KvPoolFullError
from tandem.models.paged.kv_cache import PagedKvCache
from tandem.models.paged.kv_budget import kv_budget_bytes
from tandem.models.paged.layout import SlotSpan, build_layout

BLOCK_SIZE = 16  # tokens per KV block

__all__ = ["FusedTorchRunner", "KvPoolFullError"]


class FusedTorchRunner:
    fused = True
    can_copy_prefix = True
    device_logits = True  # forward_batch returns torch tensors on `device`
    sized_by_budget = True  # its pool is --kv-memory's (load_batch_runner names the option in its line)

    idle_caches_slow_steps = False  # a resident cache is not read by other slots' attention

    def __init__(self, decoder: PagedDecoder, max_slots: int, context_length: int,
                 kv_memory: int | None = None, name: str = "torch-fused", cache_slots: int | None = None):
        config = decoder.config
        self.decoder = decoder
        self.device = decoder.device
        self.name = name
        self.vocab_size = config.vocab_size
        self.context_length = min(context_length, config.max_positions)
        self.max_slots = max_slots
        self.cache_slots = max(cache_slots or max_slots, max_slots)  # block tables: running + resident
        self.cost = CostModel()
        row_bytes = PagedKvCache.bytes_per_row(config.num_layers, config.num_kv_heads, config.head_dim, decoder.dtype)
        # every slot's full context, and the headroom the engine admits with (all slots could not run otherwise)
        wanted_blocks = -(-(max_slots * self.context_length + KV_HEADROOM_TOKENS * (max_slots + 1)) // BLOCK_SIZE)
        budget = kv_budget_bytes(decoder.device, kv_memory)
        num_blocks = min(wanted_blocks, budget // (row_bytes * BLOCK_SIZE))
        if num_blocks * BLOCK_SIZE < self.context_length:
            needed = self.context_length * row_bytes
            said_budget, said_needed = _apart(budget, needed)
            raise TandemError(f"a KV budget of {said_budget} holds {num_blocks * BLOCK_SIZE} tokens, less than "
                              f"one context of {self.context_length} ({said_needed}): raise --kv-memory to "
                              f"at least {-(-needed // MIB)}M, or lower --context-length")
        self.blocks = BlockManager(num_blocks, BLOCK_SIZE, self.cache_slots)
        self.cache = PagedKvCache(config.num_layers, num_blocks * BLOCK_SIZE, config.num_kv_heads,
                                  config.head_dim, decoder.dtype, decoder.device)
        self.pool_tokens = self.blocks.pool_tokens
        self.kv_bytes = num_blocks * BLOCK_SIZE * row_bytes
        self.row_bytes = row_bytes
        self.kv_memory_asked = kv_memory  # bytes the caller allowed (None: a share of free memory)
        self.last_model_ms = 0.0  # the decoder's share of the last forward_batch (the rest is overhead)

    @classmethod
    def load(cls, model_dir: str, device: str, dtype: str, max_slots: int, context_length: int,
             threads: int | None = None, kv_memory: int | None = None,
             cache_slots: int | None = None) -> "FusedTorchRunner":
        from tandem.models.torch_runner import torch_device, torch_dtype

        if threads:
            torch.set_num_threads(threads)
        decoder = PagedDecoder.load(model_dir, torch_dtype(dtype), torch_device(device))
        name = f"{os.path.basename(os.path.normpath(model_dir))} [torch-fused/{device}/{dtype}/x{max_slots}]"
        return cls(decoder, max_slots, context_length, kv_memory, name, cache_slots)

    def describe_pool(self) -> str:
        pool = (f"KV pool: {self.blocks.num_blocks} blocks x {BLOCK_SIZE} tokens = {self.pool_tokens} tokens, "
                f"{self.kv_bytes / 2**20:.0f} MiB on {self.device}")
        if self.kv_memory_asked is not None and self.kv_bytes + self.row_bytes * BLOCK_SIZE <= self.kv_memory_asked:
            sequences = f"{self.max_slots} sequence{'s' if self.max_slots != 1 else ''}"
            pool += (f" (less than the {human_size(self.kv_memory_asked)} allowed: {sequences} of "
                     f"{self.context_length} tokens, with room for their drafts, need{'s' if self.max_slots == 1 else ''} "
                     f"no more)")
        return pool

    def num_cached_tokens(self, slot: int) -> int:
        return self.blocks.length(slot)

    def rollback(self, slot: int, length: int) -> None:
        self.blocks.rollback(slot, length)

    def copy_prefix(self, source: int, destination: int, length: int) -> None:
        self.blocks.share_prefix(source, destination, length)

    def save_state(self, slot: int) -> bytes:
        """The slot's cached keys and values, every layer, as bytes in host memory, gathered
        straight into the bytes returned (models/host_bytes.py). A layout change must bump
        engine/disk_cache.py's TORCH_STATE_LAYOUT: files on disk outlive it."""
        length = self.blocks.length(slot)
        if length == 0:
            return b""
        state = new_bytes(length * self.row_bytes)
        self.cache.read_rows(self._rows(slot, length), self._host_view(state, length))
        return state

    def restore_state(self, slot: int, state: bytes, length: int) -> bool:
        """Make the slot hold a state `save_state` returned for `length` tokens; False (the slot
        left empty) where the state does not fit this pool or this model's rows."""
        self.blocks.rollback(slot, 0)
        if length < 1 or len(state) != length * self.row_bytes or length > self.context_length:
            return False
        if self.blocks.blocks_needed(slot, length) > self.blocks.num_free:
            return False
        self.blocks.prepare_write(slot, length)
        self.cache.write_rows(self._rows(slot, length), self._host_view(state, length))  # read in place
        self.blocks.advance(slot, length)
        return True

    def _host_view(self, state: bytes, length: int) -> torch.Tensor:
        """A saved state's bytes seen as [2 * layers, length, kv_heads, head_dim] (no copy; the
        caller holds `state` while the view is in use)."""
        pool = self.cache.keys[0]  # [rows, kv_heads, head_dim]
        shape = (2 * len(self.cache.keys), length, *pool.shape[1:])
        return torch.frombuffer(bytes_buffer(state), dtype=torch.uint8).view(pool.dtype).view(shape)

    def _rows(self, slot: int, length: int) -> torch.Tensor:
        """Pool rows of the slot's positions 0..length-1: [length]."""
        return torch.tensor(self.blocks.rows(slot, 0, length), dtype=torch.long, device=self.device)

    def forward_batch(self, items: Sequence[BatchItem], views: bool = False) -> list[torch.Tensor]:
        """Per item, float32 logits [num_logits, vocab] on the device, in the order of `items`
        (new tensors whether or not the caller asks for `views`)."""
        live = [item for item in items if item.token_ids]
        if len({item.slot for item in live}) != len(live):
            raise ValueError("a fused step takes each slot at most once")
        for item in live:
            if self.blocks.length(item.slot) + len(item.token_ids) > self.context_length:
                raise TandemError(f"slot {item.slot} would exceed the context of {self.context_length} tokens")
        self.blocks.check_free(sum(self.blocks.blocks_needed(i.slot, len(i.token_ids)) for i in live))
        if not live:
            return [self._empty() for _ in items]
        spans, logit_rows, offset = [], [], 0
        for item in live:
            self.cache.copy_blocks(self.blocks.prepare_write(item.slot, len(item.token_ids)), BLOCK_SIZE)
            count = len(item.token_ids)
            spans.append(SlotSpan(item.slot, self.blocks.length(item.slot), count, offset))
            logit_rows.extend(range(offset + count - min(item.num_logits, count), offset + count))
            offset += count
        layout = build_layout(spans, logit_rows, self.blocks, self.device)
        token_ids = torch.tensor([t for item in live for t in item.token_ids], device=self.device)  # [tokens]
        model_start = time.perf_counter()
        logits = self.decoder.forward(token_ids, layout, self.cache)  # [logits, vocab]
        self._synchronize()
        self.last_model_ms = (time.perf_counter() - model_start) * 1000
        for item in live:
            self.blocks.advance(item.slot, len(item.token_ids))
        return self._split(items, logits)

    def _synchronize(self) -> None:
        """Make the model time true on an asynchronous device (a no-op on the CPU)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _split(self, items: Sequence[BatchItem], logits: torch.Tensor) -> list[torch.Tensor]:
        out, row = [], 0
        for item in items:
            wanted = min(item.num_logits, len(item.token_ids))
            out.append(logits[row: row + wanted])  # [num_logits, vocab]
            row += wanted
        return out

    def _empty(self) -> torch.Tensor:
        return torch.zeros((0, self.vocab_size), dtype=torch.float32, device=self.device)


def _apart(first: int, second: int) -> tuple[str, str]:
    """Two byte sizes said finely enough to differ ("22 MiB ... (22 MiB)" read as a contradiction)."""
    for said in (human_size, lambda n: f"{n / MIB:.2f} MiB", lambda n: f"{n / 1024:.1f} KiB", lambda n: f"{n} bytes"):
        if said(first) != said(second):
            return said(first), said(second)
    return human_size(first), human_size(second)
