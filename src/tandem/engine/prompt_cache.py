"""The prompt cache: where a new prompt's longest cached prefix is found, and where a slot's cache
goes when the slot is needed for another prompt. It spans the runners' slots (running
sequences' caches, and finished ones' while their slot is free: engine/slots.py) and the host
tier (evicted slots' KV states in host memory: engine/host_cache.py). docs/prompt-cache.md.

`place` gives a prompt a slot holding as much of it as is cached anywhere: a slot it extends, a
prefix copied in from any slot holding it, or a host entry restored where that beats the slots
by MIN_COPY_TOKENS; what the slot held that the prompt does not share is saved to the host tier
first. `evict` saves a free slot's caches to the host tier and empties it (the pool needs its
cells). `evict_idle` does so for the slots free for IDLE_STEPS engine steps while others run: in
llama.cpp's unified pool every running sequence's attention spans the used cells, so an idle
cache slows every step (llama-server moves idle slots to host memory likewise), while a
conversation's next turn arriving at once still extends its slot in place; a paged pool
(torch's fused runner, `idle_caches_slow_steps = False`) keeps idle caches until it needs room.
The draft model's slot follows the target's: copied from the same donor, saved and restored
with it. With a disk tier (`--cache-dir`: engine/disk_cache.py) every entry saved to the host tier
is also written to disk, a lookup takes the longer of the two tiers' matches, and `close` saves
the free slots' caches, so that a restarted server starts where this one stopped.
"""

from typing import Callable

from tandem.engine.disk_cache import DiskPromptCache
from tandem.engine.host_cache import BLOCK, HostEntry, HostPromptCache
from tandem.engine.slots import MIN_COPY_TOKENS, SlotChoice, SlotTable
from tandem.memory_size import human_size
from tandem.models.batch_runner import BatchRunner
from tandem.token_ids import common_prefix

RunningDraft = Callable[[int], list[int]]  # a running slot -> what its draft cache holds
IDLE_STEPS = 8  # engine steps a free slot keeps its cache in the pool while others run (then: host tier)


class PromptCache:
    def __init__(self, target: BatchRunner, draft: BatchRunner | None, host: HostPromptCache | None,
                 disk: DiskPromptCache | None = None):
        self.target = target
        self.draft = draft
        self.slots = SlotTable(min(getattr(runner, "cache_slots", runner.max_slots)  # running + resident
                                   for runner in (target, draft) if runner is not None))
        self.retained_draft: dict[int, list[int]] = {}  # draft cache of each free slot
        saves = hasattr(target, "save_state") and (draft is None or hasattr(draft, "save_state"))
        self.host = host if saves and host is not None and host.capacity_bytes else None
        self.disk = disk if saves and disk is not None and disk.capacity_bytes else None
        self.queries = 0  # prompt tokens looked up (first placements only), and found cached
        self.hits = 0
        self.host_restores = 0  # placements that restored a host-tier entry (or a disk one)
        self.disk_restores = 0
        self._idle_evicts = getattr(target, "idle_caches_slow_steps", True)  # llama.cpp's unified pool
        self._released_at: dict[int, int] = {}  # free slot -> engine step it was released at
        self._step = 0

    @property
    def host_bytes(self) -> int:
        return self.host.nbytes if self.host is not None else 0

    @property
    def disk_bytes(self) -> int:
        return self.disk.nbytes if self.disk is not None else 0

    def describe(self) -> str:
        """One line for a server's start-up: the slots and the tiers' budgets."""
        # `is not None`: an empty tier (every tier at start-up) has len 0, so it reads as false
        host = (f"host tier {human_size(self.host.capacity_bytes)} (--cache-ram)" if self.host is not None
                else "host tier off")
        disk = (f", disk tier {human_size(self.disk.capacity_bytes)} in {self.disk.folder} "
                f"({_count(len(self.disk), 'entry', 'entries')}, {human_size(self.disk.nbytes)})") \
            if self.disk is not None else ""
        return f"prompt cache: {_count(len(self.slots.owner), 'slot')}, {host}{disk}"

    def place(self, owner: str, prefix: list[int], first: bool, running_draft: RunningDraft,
              salt: str | None = None) -> tuple[int, int, list[int]]:
        """A slot for `owner`, whose target cache must become `prefix`: the slot, the prompt
        tokens it holds already, and what its draft cache holds. `first`: the sequence's first
        placement (a preempted one's return is not counted again). A salted request (its cache
        salt, engine/request.py) reuses only slots filled under the same salt, never the tiers."""
        choice = self.slots.choose(prefix, self.target.can_copy_prefix, salt)
        slot = choice.slot
        if choice.copy_from is not None or choice.reuse_tokens < len(self.slots.cached[slot]):
            self._save(slot, running_draft)
        if self.slots.salt[slot] != salt and self.draft is not None:  # the draft model's cache too: another
            self.draft.rollback(slot, 0)  # user's prompt there made this one's catch-up shorter
            self.retained_draft[slot] = []
        reuse = self._restore(slot, prefix, choice.reuse_tokens) if salt is None else None
        if reuse is None:
            reuse = self._reuse_slots(choice, prefix, running_draft)
        self.slots.salt[slot] = salt
        self.slots.owner[slot] = owner
        self.slots.touch(slot)
        self.slots.cached[slot] = prefix[:reuse]  # grows chunk by chunk
        if first:
            self.queries += len(prefix)
            self.hits += reuse
        return slot, reuse, self.retained_draft.get(slot, [])

    def release(self, slot: int, draft_cached: list[int]) -> None:
        """A finished sequence's slot: free, its caches kept for reuse."""
        self.slots.owner[slot] = None
        self.slots.touch(slot)
        self.retained_draft[slot] = draft_cached
        self._released_at[slot] = self._step

    def evict_idle(self, running: int) -> None:
        """Count an engine step; with `running` sequences, free slots idle for IDLE_STEPS steps go
        to the host tier (only where there is one: without it they stay, for later reuse)."""
        self._step += 1
        if (self.host is None and self.disk is None) or not running or not self._idle_evicts:
            return
        for slot in self.slots.retained_slots():
            if self._step - self._released_at.get(slot, self._step) >= IDLE_STEPS:
                self.evict(slot)

    def evict(self, slot: int) -> None:
        """A free slot's caches to the host tier (where there is one), then empty."""
        self._save(slot, lambda _slot: [])
        self.forget(slot)

    def forget(self, slot: int) -> None:
        self.target.rollback(slot, 0)
        self.slots.cached[slot] = []
        self.slots.salt[slot] = None
        if self.draft is not None:
            self.draft.rollback(slot, 0)
        self.retained_draft.pop(slot, None)

    def clear(self) -> None:
        """Forget every free slot's cache and the host tier (a benchmark starts each prompt cold)."""
        for slot, owner in enumerate(self.slots.owner):
            if owner is None:
                self.forget(slot)
        if self.host is not None:
            self.host.clear()
        if self.disk is not None:
            self.disk.clear()

    def close(self) -> None:
        """With a disk tier: write the free slots' caches to it and wait for the writes."""
        if self.disk is None:
            return
        for slot in self.slots.retained_slots():
            self._save(slot, lambda _slot: [])
        self.disk.close()

    def _reuse_slots(self, choice: SlotChoice, prefix: list[int], running_draft: RunningDraft) -> int:
        """Apply the slot table's choice; the prompt tokens the slot keeps. The draft slot copies
        the same donor's draft prefix where it can."""
        slot = choice.slot
        if choice.copy_from is None:
            self.target.rollback(slot, choice.reuse_tokens)
            return choice.reuse_tokens
        self.target.copy_prefix(choice.copy_from, slot, choice.reuse_tokens)
        draft_reuse = 0
        if self.draft is not None and self.draft.can_copy_prefix:
            draft_reuse = common_prefix(self._draft_tokens(choice.copy_from, running_draft), prefix)
            self.draft.copy_prefix(choice.copy_from, slot, draft_reuse)
        elif self.draft is not None:
            self.draft.rollback(slot, 0)
        self.retained_draft[slot] = prefix[:draft_reuse]
        return choice.reuse_tokens

    def _restore(self, slot: int, prefix: list[int], slot_reuse: int) -> int | None:
        """Restore into slot the tier entry sharing the longest prefix with the prompt, where it
        shares MIN_COPY_TOKENS more than the slots do: the prompt tokens then kept (0 where the
        runner could not take it: the slot is left empty), or None where no entry beats the slots."""
        found = self._lookup(prefix, slot_reuse + MIN_COPY_TOKENS)
        if found is None:
            return None
        entry, common = found
        if not self.target.restore_state(slot, entry.target_state, len(entry.tokens)):
            self.forget(slot)
            return 0
        self.target.rollback(slot, common)
        draft_tokens = []
        if self.draft is not None:
            if entry.draft_state is not None and self.draft.restore_state(slot, entry.draft_state,
                                                                           len(entry.draft_tokens)):
                draft_tokens = list(entry.draft_tokens)
            else:
                self.draft.rollback(slot, 0)
        self.retained_draft[slot] = draft_tokens
        self.host_restores += 1
        return common

    def _lookup(self, prefix: list[int], at_least: int) -> tuple[HostEntry, int] | None:
        """The entry sharing the longest prefix with the prompt in either tier (the host's on a
        tie), and that length, where it shares at least `at_least` tokens (a disk file is read
        only then); a disk file that cannot be read counts as no match."""
        host = self.host.lookup(prefix, self.host.model_key) if self.host is not None else None
        disk = self.disk.lookup(prefix, self.disk.model_key) if self.disk is not None else None
        if disk is not None and disk.common >= at_least and (host is None or disk.common > host.common):
            entry = self.disk.load(disk)
            if entry is not None:
                self.disk_restores += 1
                return entry, disk.common
        return None if host is None or host.common < at_least else (host.entry, host.common)

    def _save(self, slot: int, running_draft: RunningDraft) -> None:
        """Copy a slot's caches (target and draft) to the tiers that do not hold them already."""
        tokens = self.slots.cached[slot]
        if len(tokens) < BLOCK or self.target.num_cached_tokens(slot) != len(tokens) or self.slots.salt[slot] is not None:
            return  # a salted cache stays in its slot: the tiers are shared
        tiers = [tier for tier in (self.host, self.disk)
                 if tier is not None and not tier.holds(tokens, tier.model_key)]
        if not tiers:
            return
        draft_tokens = self._draft_tokens(slot, running_draft)
        if self.draft is None or self.draft.num_cached_tokens(slot) != len(draft_tokens):
            draft_tokens = []  # a draft cache not known token for token is not kept
        draft_state = self.draft.save_state(slot) if draft_tokens else None
        entry = HostEntry(tuple(tokens), self.target.save_state(slot), tuple(draft_tokens), draft_state)
        for tier in tiers:
            tier.put(entry, tier.model_key)

    def _draft_tokens(self, slot: int, running_draft: RunningDraft) -> list[int]:
        """What the draft model's cache holds in slot."""
        if self.slots.owner[slot] is not None:
            return running_draft(slot)
        return self.retained_draft.get(slot, [])


def _count(n: int, one: str, many: str | None = None) -> str:
    return f"{n} {one if n == 1 else many or one + 's'}"
