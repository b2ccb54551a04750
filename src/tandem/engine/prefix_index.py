"""A block-hash chain over token sequences: which stored sequence shares the longest prefix with
a prompt, found without comparing the prompt against every one.

The hash of block i covers every token up to the end of block i (BLOCK tokens a block), so a
prompt's hashes, looked up in order, stop at the deepest block some stored sequence shares; the
exact common prefix is then counted against those sequences' tokens (which also rules out a
hash collision). The prompt cache's host and disk tiers each keep one (engine/host_cache.py,
engine/disk_cache.py).
"""

from typing import Generic, Hashable, Sequence, TypeVar

from tandem.token_ids import common_prefix

BLOCK = 16  # tokens per hashed block; a match shorter than this is not found (nor worth a restore)

Key = TypeVar("Key", bound=Hashable)


def block_hashes(tokens: Sequence[int]) -> list[int]:
    """One hash per whole block of tokens, each covering every token before its block's end."""
    hashes, running = [], 0
    for end in range(BLOCK, len(tokens) + 1, BLOCK):
        running = hash((running, tuple(tokens[end - BLOCK:end])))
        hashes.append(running)
    return hashes


class PrefixIndex(Generic[Key]):
    def __init__(self):
        self.tokens: dict[Key, tuple[int, ...]] = {}
        self._by_block: dict[int, set[Key]] = {}  # block-chain hash -> keys holding that prefix

    def __len__(self) -> int:
        return len(self.tokens)

    def add(self, key: Key, tokens: Sequence[int]) -> None:
        self.tokens[key] = tuple(tokens)
        for block_hash in block_hashes(tokens):
            self._by_block.setdefault(block_hash, set()).add(key)

    def remove(self, key: Key) -> None:
        for block_hash in block_hashes(self.tokens.pop(key)):
            holders = self._by_block.get(block_hash)
            if holders is not None:
                holders.discard(key)
                if not holders:
                    del self._by_block[block_hash]

    def longest(self, tokens: Sequence[int]) -> tuple[Key, int] | None:
        """The key sharing the longest prefix (at least one block) with tokens, and that length."""
        candidates: set[Key] = set()
        for block_hash in block_hashes(tokens):
            deeper = self._by_block.get(block_hash)
            if not deeper:
                break
            candidates = deeper
        best = None
        for key in candidates:
            common = common_prefix(self.tokens[key], tokens)
            if common >= BLOCK and (best is None or common > best[1]):
                best = (key, common)
        return best

    def extended_by(self, tokens: Sequence[int]) -> Key | None:
        """A stored key whose tokens all begin `tokens` (storing them would supersede it)."""
        match = self.longest(tokens)
        if match is not None and match[1] == len(self.tokens[match[0]]):
            return match[0]
        return None
