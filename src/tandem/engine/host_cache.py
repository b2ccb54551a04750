"""The host tier of the prompt cache: KV states of sequences evicted from the runner's pool,
kept in host memory and restored when a new prompt starts with what they hold.

A chat client resends the whole conversation every turn and an agent appends tool output to it,
so a finished sequence's cache is worth keeping after its KV slot is needed for another one.
When the engine evicts a slot's cache (its slot goes to another prompt, or the pool needs the
cells), the runner's per-sequence state (llama.cpp's `llama_state_seq_get_data`: the slot's KV
cells, target and draft) is copied here; admission restores the entry sharing the longest
prefix with the new prompt where that beats what the slots hold.

Entries are found through a block-hash chain (engine/prefix_index.py). Bounded by bytes, evicted least recently used
first; an entry larger than the whole budget is not kept. Every entry carries the model key of
the runners that saved it, and a cache answers only lookups made with its own key: a state is
never restored into another model (or another tokenizer's token ids). Every RELEASE_EVERY_BYTES
of entries dropped, the freed memory is handed back to the system (tandem/heap.py), so that the
process's memory follows the budget instead of creeping past it.
"""

import logging
import os
from collections import OrderedDict
from dataclasses import dataclass
from typing import Sequence

from tandem.engine.prefix_index import BLOCK, PrefixIndex
from tandem.heap import release_freed
from tandem.memory_size import MIB, human_size, parse_memory

log = logging.getLogger(__name__)


class TooLargeNote:
    """A tier whose budget is smaller than the states it is asked to keep keeps nothing, where an
    operator reads only that it started: said once, with the option that sizes it."""

    def __init__(self, tier: str, option: str):
        self.tier, self.option, self.told = tier, option, False

    def tell(self, nbytes: int, capacity_bytes: int) -> None:
        if capacity_bytes and not self.told:  # a budget of 0 turns the tier off: nothing to say
            self.told = True
            log.warning("prompt cache: a %s prompt state does not fit the %s tier's whole %s budget, so it is "
                        "not kept (nor any as large): give %s more", human_size(nbytes), self.tier,
                        human_size(capacity_bytes), self.option)


DEFAULT_MAX_BYTES = 8 << 30  # llama-server's --cache-ram default (8 GiB), or a quarter of the RAM if less
RELEASE_EVERY_BYTES = 64 << 20  # entries dropped between two hand-backs of freed memory


def physical_memory_bytes() -> int | None:
    """This machine's memory, or None where the system does not say."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return None


def default_cache_ram_bytes() -> int:
    """8 GiB, or a quarter of this machine's memory where that is less."""
    ram = physical_memory_bytes()
    return DEFAULT_MAX_BYTES if ram is None else min(DEFAULT_MAX_BYTES, ram // 4)


def parse_cache_ram(text: str) -> int:
    """`--cache-ram` and `--cache-disk`: '8G', '512M', '2GiB', or a plain number of MiB (llama-server's
    unit: '1024', '1.5'); 0 turns the host tier off."""
    return parse_memory(text, plain_unit=MIB, allow_zero=True)


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


class HostPromptCache:
    def __init__(self, capacity_bytes: int, model_key: str):
        if capacity_bytes < 0:
            raise ValueError(f"the host prompt cache needs a size of 0 bytes or more, got {capacity_bytes}")
        self.capacity_bytes = capacity_bytes
        self.model_key = model_key
        self.nbytes = 0
        self.saved = 0  # entries ever stored
        self.evicted = 0  # entries dropped for room
        self.dropped_bytes = 0  # bytes of entries dropped since freed memory was last handed back
        self._entries: OrderedDict[int, HostEntry] = OrderedDict()  # least recently used first
        self._index: PrefixIndex[int] = PrefixIndex()
        self._next_id = 0
        self.too_large = TooLargeNote("host", "--cache-ram")

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, tokens: Sequence[int], model_key: str) -> HostMatch | None:
        """The entry sharing the longest prefix (at least one block) with tokens, or None."""
        if model_key != self.model_key:
            return None
        best = self._index.longest(tokens)
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
        if model_key != self.model_key or len(entry.tokens) < BLOCK:
            return False
        if entry.nbytes > self.capacity_bytes:
            self.too_large.tell(entry.nbytes, self.capacity_bytes)
            return False
        superseded = self._index.extended_by(entry.tokens)
        if superseded is not None:
            self._remove(superseded)
        while self.nbytes + entry.nbytes > self.capacity_bytes:
            self._remove(next(iter(self._entries)))
            self.evicted += 1
        self._release_dropped()
        entry_id, self._next_id = self._next_id, self._next_id + 1
        self._entries[entry_id] = entry
        self.nbytes += entry.nbytes
        self._index.add(entry_id, entry.tokens)
        self.saved += 1
        return True

    def clear(self) -> None:
        for entry_id in list(self._entries):
            self._remove(entry_id)
        self._release_dropped(at_least=1)

    def _remove(self, entry_id: int) -> None:
        dropped = self._entries.pop(entry_id).nbytes
        self.nbytes -= dropped
        self.dropped_bytes += dropped
        self._index.remove(entry_id)

    def _release_dropped(self, at_least: int | None = None) -> None:
        """Hand freed memory back once at_least (RELEASE_EVERY_BYTES) bytes of entries were dropped
        since the last time (an entry a disk writer still holds is freed later, and handed back
        the next time)."""
        if self.dropped_bytes >= (RELEASE_EVERY_BYTES if at_least is None else at_least):
            release_freed()
            self.dropped_bytes = 0
