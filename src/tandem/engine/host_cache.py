"""The host tier of the prompt cache: KV states of sequences evicted from the runner's pool,
kept in host memory and restored when a new prompt starts with what they hold.

A chat client resends the whole conversation every turn and an agent appends tool output to it,
so a finished sequence's cache is worth keeping after its KV slot is needed for another one.
When the engine evicts a slot's cache (its slot goes to another prompt, or the pool needs the
cells), the runner's per-sequence state (llama.cpp's `llama_state_seq_get_data`: the slot's KV
cells, target and draft) is copied here; admission restores the entry sharing the longest
prefix with the new prompt where that beats what the slots hold.

Entries are found through a block-hash chain: the hash of block i covers every token up to the
end of block i (BLOCK tokens a block), so a prompt's hashes, looked up in order, stop at the
deepest block some entry shares; the exact common prefix is then counted against that entry's
tokens (which also rules out a hash collision). Bounded by bytes, evicted least recently used
first; an entry larger than the whole budget is not kept. Every entry carries the model key of
the runners that saved it, and a cache answers only lookups made with its own key: a state is
never restored into another model (or another tokenizer's token ids).
"""

import os
from collections import OrderedDict
from dataclasses import dataclass
from typing import Sequence

from tandem.memory_size import parse_memory
from tandem.token_ids import common_prefix

BLOCK = 16  # tokens per hashed block; a match shorter than this is not found (nor worth a restore)
DEFAULT_MAX_BYTES = 8 << 30  # llama-server's --cache-ram default (8 GiB), or a quarter of the RAM if less


def default_cache_ram_bytes() -> int:
    """8 GiB, or a quarter of this machine's memory where that is less."""
    try:
        ram = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return DEFAULT_MAX_BYTES
    return min(DEFAULT_MAX_BYTES, ram // 4)


def parse_cache_ram(text: str) -> int:
    """`--cache-ram`: '8G', '512M', '2GiB', or a plain number of MiB (llama-server's unit); 0 turns
    the host tier off."""
    text = str(text).strip()
    if text.isdigit():
        return int(text) << 20
    return parse_memory(text)


@dataclass(frozen=True, slots=True)
class HostEntry:
    tokens: tuple[int, ...]  # what the target state holds, in order
    target_state: bytes
    draft_tokens: tuple[int, ...] = ()  # what the draft state holds (a prefix of tokens, maybe empty)
    draft_state: bytes | None = None

    @property
    def nbytes(self) -> int:
        return len(self.target_state) + len(self.draft_state or b"")


@dataclass(frozen=True, slots=True)
class HostMatch:
    entry: HostEntry
    common: int  # leading tokens the entry shares with the prompt looked up


def block_hashes(tokens: Sequence[int]) -> list[int]:
    """One hash per whole block of tokens, each covering every token before its block's end."""
    hashes, running = [], 0
    for end in range(BLOCK, len(tokens) + 1, BLOCK):
        running = hash((running, tuple(tokens[end - BLOCK:end])))
        hashes.append(running)
    return hashes


class HostPromptCache:
    def __init__(self, capacity_bytes: int, model_key: str):
        if capacity_bytes < 0:
            raise ValueError(f"the host prompt cache needs a size of 0 bytes or more, got {capacity_bytes}")
        self.capacity_bytes = capacity_bytes
        self.model_key = model_key
        self.nbytes = 0
        self.saved = 0  # entries ever stored
        self.evicted = 0  # entries dropped for room
        self._entries: OrderedDict[int, HostEntry] = OrderedDict()  # least recently used first
        self._by_block: dict[int, set[int]] = {}  # block-chain hash -> entry ids holding that prefix
        self._next_id = 0

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, tokens: Sequence[int], model_key: str) -> HostMatch | None:
        """The entry sharing the longest prefix (at least one block) with tokens, or None."""
        if model_key != self.model_key or not self._entries:
            return None
        candidates: set[int] = set()
        for block_hash in block_hashes(tokens):
            deeper = self._by_block.get(block_hash)
            if not deeper:
                break
            candidates = deeper
        best = None
        for entry_id in candidates:
            common = common_prefix(self._entries[entry_id].tokens, tokens)
            if common >= BLOCK and (best is None or common > best[1]):
                best = (entry_id, common)
        if best is None:
            return None
        self._entries.move_to_end(best[0])
        return HostMatch(self._entries[best[0]], best[1])

    def holds(self, tokens: Sequence[int], model_key: str) -> bool:
        """Whether some entry already holds all of tokens (saving them again would add nothing)."""
        match = self.lookup(tokens, model_key)
        return match is not None and match.common == len(tokens)

    def put(self, entry: HostEntry, model_key: str) -> bool:
        """Keep entry, evicting least recently used ones for room; False where it cannot fit (or
        belongs to another model). An entry whose tokens all begin the new one's is replaced."""
        if model_key != self.model_key or entry.nbytes > self.capacity_bytes or len(entry.tokens) < BLOCK:
            return False
        match = self.lookup(entry.tokens, model_key)
        if match is not None and match.common == len(match.entry.tokens):
            self._remove(next(i for i, e in self._entries.items() if e is match.entry))
        while self.nbytes + entry.nbytes > self.capacity_bytes:
            self._remove(next(iter(self._entries)))
            self.evicted += 1
        entry_id, self._next_id = self._next_id, self._next_id + 1
        self._entries[entry_id] = entry
        self.nbytes += entry.nbytes
        for block_hash in block_hashes(entry.tokens):
            self._by_block.setdefault(block_hash, set()).add(entry_id)
        self.saved += 1
        return True

    def clear(self) -> None:
        for entry_id in list(self._entries):
            self._remove(entry_id)

    def _remove(self, entry_id: int) -> None:
        entry = self._entries.pop(entry_id)
        self.nbytes -= entry.nbytes
        for block_hash in block_hashes(entry.tokens):
            holders = self._by_block.get(block_hash)
            if holders is not None:
                holders.discard(entry_id)
                if not holders:
                    del self._by_block[block_hash]
