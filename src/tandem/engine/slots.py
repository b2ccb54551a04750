"""Which sequence owns which KV slot, and which cached prompt prefixes a new sequence reuses.

A finished sequence's slot keeps its cache ("retained") until the slot is needed again, so a
request that repeats a prompt prefix (a system prompt, a conversation's history, a file being
edited) skips recomputing it. A runner may have more slots than sequences running at once
(llama.cpp: `cache_slots`), so finished sequences stay resident beside the running ones.

For a new prompt, `choose` finds the slot sharing the longest prefix with it, running or not.
A free slot whose cache is (nearly) all a prefix of the prompt is taken as it is: the sequence
extends it, nothing is lost. So is one that holds the whole prompt (a repeated request: its old
answer's tail is cut, and the prompt's cells stay where they were, so llama.cpp scores the repeat
on the same cell layout as the first). Otherwise the new sequence goes to an empty slot, else to the free
slot used least recently, and, where the runner can copy (llama.cpp shares the cells), the
shared prefix is copied in from the slot holding it, which keeps its own cache: many users of
one system prompt each get its cells without recomputing them or taking each other's history.
"""

from dataclasses import dataclass

from tandem.token_ids import common_prefix

MIN_COPY_TOKENS = 16  # copying (or restoring) a shorter prefix than this is not worth a cache operation


@dataclass(frozen=True, slots=True)
class SlotChoice:
    slot: int
    reuse_tokens: int  # cached prompt tokens the new sequence keeps
    copy_from: int | None  # a slot whose prefix is copied in first


class SlotTable:
    def __init__(self, num_slots: int):
        self.owner: list[str | None] = [None] * num_slots
        self.cached: list[list[int]] = [[] for _ in range(num_slots)]  # target cache, per slot
        self.salt: list[str | None] = [None] * num_slots  # the cache salt of the request that filled it
        self.last_used: list[int] = [0] * num_slots  # tick of the slot's last placement or release
        self._tick = 0

    @property
    def num_free(self) -> int:
        return self.owner.count(None)

    def touch(self, slot: int) -> None:
        self._tick += 1
        self.last_used[slot] = self._tick

    def cached_total(self) -> int:
        """KV cells the slots' caches take, counting a prefix two slots share once (copied
        prefixes share cells; two slots that computed the same prefix apart are undercounted,
        which only makes the pool overflow a step early: the engine frees room then)."""
        ordered = sorted(tokens for tokens in self.cached if tokens)
        shared = sum(common_prefix(a, b) for a, b in zip(ordered, ordered[1:]))
        return sum(len(tokens) for tokens in ordered) - shared

    def choose(self, prefix: list[int], can_copy: bool, salt: str | None = None) -> SlotChoice:
        """The slot for a new sequence whose target cache must become `prefix`; it shares only
        caches filled under its own cache salt (engine/request.py)."""
        free = [s for s, owner in enumerate(self.owner) if owner is None]
        shared = [common_prefix(cached, prefix) if self.salt[s] == salt else 0 for s, cached in enumerate(self.cached)]
        lost = lambda s: len(self.cached[s]) - shared[s]  # noqa: E731  cached tokens the prompt does not share
        if not can_copy:  # the free slot sharing the most, the least recently used among equals
            best = max(free, key=lambda s: (shared[s], -self.last_used[s]))
            return SlotChoice(best, shared[best], None)
        extendable = [s for s in free if shared[s] and (lost(s) < MIN_COPY_TOKENS or shared[s] == len(prefix))]
        if extendable:
            best = max(extendable, key=lambda s: shared[s])
            return SlotChoice(best, shared[best], None)
        victim = min(free, key=lambda s: (bool(self.cached[s]), self.last_used[s]))
        donor = max(range(len(self.owner)), key=lambda s: shared[s])
        if donor != victim and shared[donor] >= max(shared[victim] + MIN_COPY_TOKENS, MIN_COPY_TOKENS):
            return SlotChoice(victim, shared[donor], donor)
        return SlotChoice(victim, shared[victim], None)

    def retained_slots(self) -> list[int]:
        """Free slots holding a cache, least recently used first (the order to evict them)."""
        retained = [s for s, owner in enumerate(self.owner) if owner is None and self.cached[s]]
        return sorted(retained, key=lambda s: self.last_used[s])
