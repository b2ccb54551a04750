"""Which sequence owns which KV slot, and which cached prompt prefixes can be reused.

A finished sequence's slot keeps its cache ("retained") until the slot is needed again, so a
request that repeats a prompt prefix (a system prompt, a file being edited) skips recomputing
it: either it takes that free slot and keeps the common prefix, or, when the prefix lives in a
running sequence's slot, the runner copies it (llama.cpp shares the cells).
"""

from dataclasses import dataclass

from tandem.token_ids import common_prefix

MIN_COPY_TOKENS = 16  # copying a shorter prefix than this is not worth a cache operation


@dataclass(frozen=True, slots=True)
class SlotChoice:
    slot: int
    reuse_tokens: int  # cached prompt tokens the new sequence keeps
    copy_from: int | None  # a running slot whose prefix is copied in first


class SlotTable:
    def __init__(self, num_slots: int):
        self.owner: list[str | None] = [None] * num_slots
        self.cached: list[list[int]] = [[] for _ in range(num_slots)]  # target cache, per slot

    @property
    def num_free(self) -> int:
        return self.owner.count(None)

    def cached_total(self) -> int:
        return sum(len(tokens) for tokens in self.cached)

    def choose(self, prefix: list[int], can_copy: bool) -> SlotChoice:
        """The slot for a new sequence whose target cache must become `prefix`."""
        free = [s for s, owner in enumerate(self.owner) if owner is None]
        best_free = max(free, key=lambda s: common_prefix(self.cached[s], prefix))
        reuse = common_prefix(self.cached[best_free], prefix)
        if can_copy:
            running = [s for s, owner in enumerate(self.owner) if owner is not None]
            shared = {s: common_prefix(self.cached[s], prefix) for s in running}
            donor = max(shared, key=shared.get, default=None)
            if donor is not None and shared[donor] >= max(reuse + MIN_COPY_TOKENS, MIN_COPY_TOKENS):
                victim = min(free, key=lambda s: len(self.cached[s]))  # lose the least retained cache
                return SlotChoice(victim, shared[donor], donor)
        return SlotChoice(best_free, reuse, None)

    def retained_slots(self) -> list[int]:
        return [s for s, owner in enumerate(self.owner) if owner is None and self.cached[s]]
