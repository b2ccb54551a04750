"""llama.cpp with several sequences in one context: one `llama_decode` scores the new tokens of
every slot (llama.cpp sequence ids), which is how the server verifies all running sequences'
drafts in one forward pass.

The KV cache is unified (one pool of cells shared by all sequences), so `copy_prefix` shares
the cells of a common prompt prefix instead of copying them. The pool holds `pool_tokens`
positions in all; a slot's cache counts against it until rolled back.

llama.cpp keeps a logits buffer as large as the most positions any call has asked logits for
(vocab x 4 bytes each: 0.6 MB a position for Qwen2.5), and never shrinks it. So a call asks for
at most `max_outputs` positions (every slot verifying the deepest auto model draft, or one slot
its deepest copy; more are split into further calls), and the buffer is grown to that size at
start: the memory a server will use is reached when it starts, not at some busy minute later (a
soak measured +6% RSS after warm-up from this buffer growing in steps).

Attention is llama.cpp's flash attention: llama.cpp's default (llama-server's too) picks it where
the device has it, as CPUs do; llama-cpp-python turns it off. In a unified cache each token's
attention spans every used cell, other sequences' included, masked out; the plain kernel
multiplies through the masked cells, the flash kernel skips them. Measured on the 1.5B Q4 target,
2 threads: 64 prompt tokens of one sequence beside 15 others' 250-token caches 1,240 ms plain,
873 ms flash (873 ms alone); sixteen sequences' one-token decode 449 ms plain, 348 ms flash; a
16-request serving level 72 s flash, 85 s plain (docs/vs-llama-server.md).

A call of FLASH_TILE_ROWS query positions or more takes the flash kernel's tiled path, which
scores a tile of 64 consecutive positions against every cache cell any of them may see: sixteen
slots' 4-token verify rounds in one tile attend over all sixteen caches. Below that the kernel
goes position by position, slower per cell, so the tile pays while it holds a few slots' items
(sixteen slots x 16 tokens: 4,334 ms in one call, 5,324 ms in 63-position calls). So a forward
that reaches a tile scores its items of fewer than FEW_ROWS positions in calls below the tile
and the rest together (`plan_calls`). See docs/vs-llama-server.md for the measurements.

Logits rows are copied out of llama.cpp's buffer into arrays the caller keeps, unless the caller
asks for `views` (the engine's verify call and the draft model's rounds, which read every row
before the next call): then the rows of the last llama_decode are handed over in place. A deep
copy round's 64 rows are 39 MB, which numpy takes from fresh pages every call (above glibc's
32 MB mmap threshold), and faulting them in cost ~95 ms of a 2.2 s round on a 2-core AMD EPYC
(Zen 3) VM; the views cost nothing.

A saved state (`save_state`: the prompt cache keeps a slot's KV before the slot takes another
prompt, 3-15 MB for the 1.5B) lands in new memory, whose pages the kernel faults in one by one
as they are first written. So llama.cpp writes it straight into the bytes object that is kept,
made unwritten (models/host_bytes.py): a zeroed buffer copied into bytes afterwards touched
twice the pages, and one C=4 serving level's 20 saves took 0.42-0.50 s that way and 0.06 s this
way (AMD EPYC VM).
"""

import ctypes
import os
import time
from pathlib import Path
from typing import Sequence

import numpy as np
import numpy.ctypeslib  # noqa: F401  at start-up: numpy loads it at first use, and a server out of file
# handles then failed its first step

from tandem.errors import TandemError
from tandem.sigterm import deferring_ctrl_c
from tandem.models.batch_runner import BatchItem, KvPoolFullError
from tandem.models.cost import CostModel
from tandem.models.gguf_extent import truncation
from tandem.models.host_bytes import bytes_address, new_bytes
from tandem.models.llamacpp_log import install_log_filter

DEFAULT_CONTEXT = 4096  # per sequence
MAX_POOL_TOKENS = 32768  # KV cells shared by all slots
MAX_SEQUENCES = 256  # llama.cpp's LLAMA_MAX_SEQ: sequence ids one context holds (running and resident slots)
BATCH_TOKENS = 512  # tokens per llama_decode call; longer inputs are split
OUTPUTS_PER_SLOT = 17  # logits a slot's verify asks for: the deepest auto model draft (16) plus the bonus
LONGEST_ROUND = 64  # one slot's deepest auto copy (63, speculation/depth.py COPY_K_MAX) plus the bonus
FLASH_TILE_ROWS = 64  # ggml's CPU flash attention tiles calls of this many positions or more (GGML_FA_TILE_Q)
FEW_ROWS = 8  # items with fewer positions put more than 8 slots in a tile: scored apart (module notes)

Position = tuple[int, BatchItem, int]  # (item index, item, token index in the item)


def _bytes_pointer(data: bytes):
    """Where a bytes object's own buffer starts, as llama.cpp's state calls take it (no copy)."""
    return ctypes.cast(bytes_address(data), ctypes.POINTER(ctypes.c_uint8))


def kv_pool_tokens(max_slots: int, context_length: int) -> int:
    """KV cells of the pool all slots share: half of every slot's full context, at least one
    context, at most MAX_POOL_TOKENS."""
    return min(MAX_POOL_TOKENS, max(context_length, max_slots * context_length // 2))


def plan_calls(items: Sequence[BatchItem], max_tokens: int, max_outputs: int,
               tile_rows: int = FLASH_TILE_ROWS) -> list[list[Position]]:
    """The llama_decode calls for one forward: each of at most max_tokens positions and
    max_outputs logits rows. A forward of tile_rows positions or more scores the items of fewer
    than FEW_ROWS positions (verify rounds) in calls below tile_rows, the rest together (module
    notes). An item's positions stay in order, so its slot's cache grows in order."""
    everything = list(range(len(items)))
    if sum(len(item.token_ids) for item in items) < tile_rows:
        groups = [(everything, max_tokens)]
    else:
        few = [index for index in everything if len(items[index].token_ids) < FEW_ROWS]
        rest = [index for index in everything if len(items[index].token_ids) >= FEW_ROWS]
        groups = [(indices, limit) for indices, limit in ((few, min(tile_rows - 1, max_tokens)), (rest, max_tokens))
                  if indices]
    calls = []
    for indices, limit in groups:
        call, wanted = [], 0
        for index in indices:
            item = items[index]
            for i in range(len(item.token_ids)):
                want = i >= len(item.token_ids) - item.num_logits
                if len(call) == limit or (want and wanted == max_outputs):
                    calls.append(call)
                    call, wanted = [], 0
                call.append((index, item, i))
                wanted += want
        if call:
            calls.append(call)
    return calls


def _runs(owners: list[int]) -> list[tuple[int, int, int]]:
    """(item index, first row, rows) for each run of consecutive rows one item owns."""
    runs: list[tuple[int, int, int]] = []
    for row, index in enumerate(owners):
        if runs and runs[-1][0] == index and runs[-1][1] + runs[-1][2] == row:
            runs[-1] = (index, runs[-1][1], runs[-1][2] + 1)
        else:
            runs.append((index, row, 1))
    return runs


class LlamaCppBatchRunner:
    fused = True
    can_copy_prefix = True
    idle_caches_slow_steps = True  # every running sequence's attention spans the unified pool's used cells

    def __init__(self, gguf_path: str, max_slots: int, context_length: int = DEFAULT_CONTEXT,
                 threads: int | None = None, cache_slots: int | None = None, pool_tokens: int | None = None):
        """pool_tokens: the KV cells all slots share (None: kv_pool_tokens, a server's pool)."""
        import llama_cpp
        from llama_cpp import Llama
        from llama_cpp._internals import LlamaBatch, LlamaContext

        install_log_filter()

        threads = threads or os.cpu_count() or 1
        try:  # the Llama object owns the model; its own small context stays unused
            # n_threads_batch too: llama-cpp-python would give multi-token calls every core; Ctrl-C is
            # held to the end (raised in llama.cpp's log callback, ctypes swallowed it: the command ran on)
            with deferring_ctrl_c():
                self._llm = Llama(model_path=str(gguf_path), n_ctx=64, n_batch=64, n_threads=threads,
                                  n_threads_batch=threads, logits_all=False, verbose=False)
        except (ValueError, RuntimeError, OSError) as error:
            truncated = truncation(Path(gguf_path))  # llama.cpp says why in its log only
            raise TandemError(f"{gguf_path} is {truncated}" if truncated else
                              f"llama.cpp cannot load {gguf_path}: {error}") from None
        params = llama_cpp.llama_context_default_params()
        ctypes.pointer(params)[0] = self._llm.context_params
        self.pool_tokens = pool_tokens or kv_pool_tokens(max_slots, context_length)
        params.n_ctx = self.pool_tokens
        params.n_batch = BATCH_TOKENS
        params.n_ubatch = BATCH_TOKENS
        self.cache_slots = max(cache_slots or max_slots, max_slots)  # sequence ids: running + resident
        if self.cache_slots > MAX_SEQUENCES:
            raise TandemError(f"llama.cpp holds at most {MAX_SEQUENCES} sequences in one context, {self.cache_slots} "
                              "were asked for: lower --max-running (or bench-step's and profile's --batches)")
        params.n_seq_max = self.cache_slots
        params.kv_unified = True
        params.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED  # see the module notes
        try:
            with deferring_ctrl_c():
                self._ctx = LlamaContext(model=self._llm._model, params=params, verbose=False)
        except ValueError as error:  # llama.cpp says why in its log only
            raise TandemError(f"llama.cpp cannot make a context of {self.pool_tokens} KV cells for {self.cache_slots} "
                              f"sequences on {gguf_path}: {error}") from None
        self._batch = LlamaBatch(n_tokens=BATCH_TOKENS, embd=0, n_seq_max=1, verbose=False)
        self.name = f"{os.path.basename(str(gguf_path))} [llamacpp/cpu/{threads}t/x{max_slots}]"
        self.vocab_size = int(self._llm.n_vocab())
        # a sequence never outgrows the pool (capped at MAX_POOL_TOKENS cells), nor what the model was trained on
        self.context_length = min(context_length, int(self._llm._model.n_ctx_train()), self.pool_tokens)
        self.max_slots = max_slots
        # logits positions per call: every slot's model round, or one slot's longest copy round
        self.max_outputs = min(BATCH_TOKENS, max(max_slots * OUTPUTS_PER_SLOT, LONGEST_ROUND))
        self.cost = CostModel()
        self.tile_rows = FLASH_TILE_ROWS  # bench-step sets BATCH_TOKENS + 1: every slot in one call
        self._lengths = [0] * self.cache_slots
        self.last_model_ms = 0.0  # time inside llama_decode in the last forward_batch (the rest is overhead)
        self._reserve_outputs()

    def _reserve_outputs(self) -> None:
        """One throwaway call asking logits for `max_outputs` positions: llama.cpp's logits buffer
        takes its final size now (the logits are not read, so nothing else is allocated)."""
        item = BatchItem(0, [0] * self.max_outputs, self.max_outputs)
        self._fill_batch([(0, item, i) for i in range(self.max_outputs)])
        self._ctx.decode(self._batch)
        self._ctx.kv_cache_seq_rm(0, 0, -1)

    def describe_pool(self) -> str | None:
        """Where the pool holds fewer than every slot's full context (kv_pool_tokens: half of
        them, at most MAX_POOL_TOKENS), how many full-length sequences it holds at once; None
        where it holds them all."""
        if self.pool_tokens >= self.max_slots * self.context_length:
            return None
        full = self.pool_tokens // self.context_length
        return (f"KV pool: {self.pool_tokens} cells shared by {self.max_slots} sequences of up to "
                f"{self.context_length} tokens, {full} at full length at once (half of every slot's context, "
                f"at most {MAX_POOL_TOKENS}): more wait, or the youngest is recomputed later")

    def num_cached_tokens(self, slot: int) -> int:
        return self._lengths[slot]

    def rollback(self, slot: int, length: int) -> None:
        if length < self._lengths[slot]:
            self._ctx.kv_cache_seq_rm(slot, length, -1)
            self._lengths[slot] = length

    def copy_prefix(self, source: int, destination: int, length: int) -> None:
        self.rollback(destination, 0)
        length = min(length, self._lengths[source])
        if length:
            self._ctx.kv_cache_seq_cp(source, destination, 0, length)
        self._lengths[destination] = length

    def save_state(self, slot: int) -> bytes:
        """The slot's KV cells (every layer, its positions), as llama.cpp serializes one sequence,
        written by llama.cpp straight into the bytes returned (module notes: new memory)."""
        import llama_cpp

        size = llama_cpp.llama_state_seq_get_size(self._ctx.ctx, slot)
        state = new_bytes(size)
        written = llama_cpp.llama_state_seq_get_data(self._ctx.ctx, _bytes_pointer(state), size, slot)
        return state if written == size else state[:written]

    def restore_state(self, slot: int, state: bytes, length: int) -> bool:
        """Make the slot hold a state `save_state` returned for `length` tokens; False (the slot
        left empty) where the pool has no room for it or llama.cpp refuses it."""
        import llama_cpp

        self.rollback(slot, 0)
        if not llama_cpp.llama_state_seq_set_data(self._ctx.ctx, _bytes_pointer(state), len(state), slot):
            self._ctx.kv_cache_seq_rm(slot, 0, -1)
            return False
        self._lengths[slot] = length
        return True

    def forward_batch(self, items: Sequence[BatchItem], views: bool = False) -> list[np.ndarray]:
        """Score the items' tokens in the llama_decode calls `plan_calls` lays out. With `views`,
        an item whose rows all come from the last call gets a view of llama.cpp's logits buffer
        instead of a copy, valid only until this runner's next call (module notes)."""
        calls = plan_calls(items, BATCH_TOKENS, self.max_outputs, self.tile_rows)
        outputs: list[np.ndarray | None] = [None] * len(items)
        filled = [0] * len(items)
        self.last_model_ms = 0.0
        for number, chunk in enumerate(calls):
            owners = self._fill_batch(chunk)
            start = time.perf_counter()
            try:
                self._ctx.decode(self._batch)
            except RuntimeError as error:
                raise KvPoolFullError(f"llama.cpp decode failed ({error}); the KV pool may be full") from None
            self.last_model_ms += (time.perf_counter() - start) * 1000
            for _, item, _ in chunk:
                self._lengths[item.slot] += 1
            if not owners:
                continue
            logits = np.ctypeslib.as_array(self._ctx.get_logits(), shape=(len(owners) * self.vocab_size,))
            rows = logits.reshape(len(owners), self.vocab_size)  # [flagged, vocab]: llama.cpp's buffer
            last = views and number == len(calls) - 1
            for index, first, count in _runs(owners):
                if last and filled[index] == 0 and count == items[index].num_logits:
                    outputs[index] = rows[first:first + count]  # [num_logits, vocab], no copy
                    continue
                if outputs[index] is None:
                    outputs[index] = np.empty((items[index].num_logits, self.vocab_size), np.float32)
                outputs[index][filled[index]:filled[index] + count] = rows[first:first + count]
                filled[index] += count
        return [np.empty((0, self.vocab_size), np.float32) if rows is None else rows for rows in outputs]

    def _fill_batch(self, chunk) -> list[int]:
        """Write a chunk into the llama batch; return, per flagged position, the item index."""
        batch = self._batch.batch
        batch.n_tokens = len(chunk)
        offsets: dict[int, int] = {}
        owners = []
        for position, (index, item, i) in enumerate(chunk):
            seen = offsets.get(item.slot, 0)
            offsets[item.slot] = seen + 1
            batch.token[position] = item.token_ids[i]
            batch.pos[position] = self._lengths[item.slot] + seen
            batch.seq_id[position][0] = item.slot
            batch.n_seq_id[position] = 1
            want = i >= len(item.token_ids) - item.num_logits
            batch.logits[position] = want
            if want:
                owners.append(index)
        return owners
