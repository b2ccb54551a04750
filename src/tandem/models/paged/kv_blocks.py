"""Block bookkeeping of a paged KV cache: which fixed-size blocks of the preallocated pool each
slot's cache lives in. Host-side integers only; the tensors are in kv_cache.py.

A slot's cache is a block table plus a length: position p of the slot lives in row
`table[p // block_size] * block_size + p % block_size` of the pool. Blocks are reference
counted, so a prompt prefix is shared by pointing two tables at the same blocks. The rules:
- rollback moves the length back and returns whole blocks past it to the free list (no copy),
- `share_prefix` references the source's blocks (no copy),
- a write into a block that another table also references copies that block first
  (copy-on-write); `prepare_write` returns those copies for the caller to apply to the tensors,
- a pool that cannot hold a write raises KvPoolFullError before anything changes.
"""

from dataclasses import dataclass, field

from tandem.errors import TandemError
from tandem.models.batch_runner import KvPoolFullError


@dataclass(slots=True)
class SlotBlocks:
    table: list[int] = field(default_factory=list)  # block ids, in position order
    length: int = 0  # cached positions


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, num_slots: int):
        if num_blocks < 1 or block_size < 1:
            raise TandemError(f"a KV pool needs at least one block of one token, got {num_blocks} x {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.free: list[int] = list(range(num_blocks - 1, -1, -1))  # popped from the end: 0 first
        self.refs = [0] * num_blocks
        self.slots = [SlotBlocks() for _ in range(num_slots)]

    @property
    def num_free(self) -> int:
        return len(self.free)

    @property
    def pool_tokens(self) -> int:
        return self.num_blocks * self.block_size

    def length(self, slot: int) -> int:
        return self.slots[slot].length

    def blocks_for(self, length: int) -> int:
        return -(-length // self.block_size)

    def rows(self, slot: int, start: int, stop: int) -> list[int]:
        """Pool rows of positions start..stop-1 of slot (they must be within its blocks)."""
        table, size = self.slots[slot].table, self.block_size
        return [table[p // size] * size + p % size for p in range(start, stop)]

    def blocks_needed(self, slot: int, new_tokens: int) -> int:
        """Free blocks a write of new_tokens after the slot's length takes (copies included)."""
        if new_tokens <= 0:
            return 0
        state = self.slots[slot]
        last = self.blocks_for(state.length + new_tokens)
        shared = sum(1 for b in state.table[state.length // self.block_size: last] if self.refs[b] > 1)
        return max(0, last - len(state.table)) + shared

    def prepare_write(self, slot: int, new_tokens: int) -> list[tuple[int, int]]:
        """Make positions length..length+new_tokens-1 of slot writable: copy the shared blocks
        they fall in and allocate missing ones. Returns the (source, destination) block copies
        the caller must apply to the KV tensors before writing. The length is not moved."""
        if new_tokens <= 0:
            return []
        state = self.slots[slot]
        copies = []
        last = self.blocks_for(state.length + new_tokens)
        for index in range(state.length // self.block_size, min(last, len(state.table))):
            block = state.table[index]
            if self.refs[block] > 1:
                fresh = self._take()
                self.refs[block] -= 1
                state.table[index] = fresh
                copies.append((block, fresh))
        while len(state.table) < last:
            state.table.append(self._take())
        return copies

    def advance(self, slot: int, new_tokens: int) -> None:
        self.slots[slot].length += new_tokens

    def rollback(self, slot: int, length: int) -> None:
        """Forget positions from `length` on; whole blocks past it go back to the pool."""
        state = self.slots[slot]
        state.length = min(state.length, length)
        keep = self.blocks_for(state.length)
        for block in state.table[keep:]:
            self._release(block)
        del state.table[keep:]

    def share_prefix(self, source: int, destination: int, length: int) -> None:
        """destination's cache becomes the first `length` positions of source's (no copy)."""
        self.rollback(destination, 0)
        length = min(length, self.slots[source].length)
        blocks = self.slots[source].table[: self.blocks_for(length)]
        for block in blocks:
            self.refs[block] += 1
        self.slots[destination] = SlotBlocks(list(blocks), length)

    def check_free(self, wanted: int) -> None:
        if wanted > len(self.free):
            raise KvPoolFullError(f"the KV pool is full: a step needs {wanted} more blocks of "
                                  f"{self.block_size} tokens and {len(self.free)} of {self.num_blocks} are free")

    def _take(self) -> int:
        self.check_free(1)
        block = self.free.pop()
        self.refs[block] = 1
        return block

    def _release(self, block: int) -> None:
        self.refs[block] -= 1
        if self.refs[block] == 0:
            self.free.append(block)
