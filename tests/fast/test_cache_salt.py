"""A cache salt keeps one user's prompts from another's: every cache that requests share (slots,
the draft model's slot, the host tier, the shared n-gram store) is shared only within a salt.
The engine-level check, with outputs, is test_batch_engine.py's
test_a_cache_salt_shares_cached_prompts_only_with_its_own_salt."""

from types import SimpleNamespace

from tandem.engine.host_cache import HostEntry, HostPromptCache
from tandem.engine.prompt_cache import PromptCache
from tandem.speculation.drafters.ngram import NgramDrafter
from tandem.speculation.shared_store.store import InProcessNgramStore

PROMPT = list(range(100, 160))  # 60 tokens: several blocks, more than MIN_COPY_TOKENS


class Runner:
    """A runner double that records what the prompt cache asks of its one slot."""

    can_copy_prefix = True
    max_slots = 1

    def __init__(self):
        self.cached = {0: 0}
        self.restored = 0

    def rollback(self, slot, n):
        self.cached[slot] = min(self.cached[slot], n)

    def copy_prefix(self, src, dst, n):
        self.cached[dst] = n

    def num_cached_tokens(self, slot):
        return self.cached[slot]

    def save_state(self, slot):
        return b"state" * 10

    def restore_state(self, slot, state, n):
        self.cached[slot], self.restored = n, self.restored + 1
        return True


def filled(cache: PromptCache, target: Runner, draft: Runner, salt):
    """A request of `salt` placed, run over PROMPT (target and draft caches full), and finished."""
    slot, _, _ = cache.place("r", PROMPT, True, lambda s: [], salt)
    cache.slots.cached[slot] = list(PROMPT)
    target.cached[slot] = draft.cached[slot] = len(PROMPT)
    cache.release(slot, list(PROMPT))
    return slot


def test_another_salt_finds_neither_the_slot_nor_its_draft_cache_nor_the_host_tier():
    """The draft model's slot kept the last user's tokens where the target's was emptied: the next
    user's draft caught up faster when it shared that user's prompt."""
    target, draft, host = Runner(), Runner(), HostPromptCache(1 << 20, "k")
    cache = PromptCache(target, draft, host)
    filled(cache, target, draft, "alice")
    slot, reuse, draft_cached = cache.place("b", PROMPT + [7], True, lambda s: [], None)
    assert (reuse, draft_cached, draft.cached[slot], target.cached[slot]) == (0, [], 0, 0)
    assert len(host) == 0  # alice's cache was not saved where others restore from
    cache.release(slot, [])
    cache.slots.cached[slot] = []
    host.put(HostEntry(tuple(PROMPT), b"s" * 50), "k")  # an unsalted user's state in the host tier
    slot, reuse, _ = cache.place("c", PROMPT + [8], True, lambda s: [], "carol")
    assert reuse == 0 and target.restored == 0  # a salted request restores nothing from the tiers
    cache.release(slot, [])
    slot, reuse, _ = cache.place("d", PROMPT + [9], True, lambda s: [], None)
    assert reuse == len(PROMPT) and target.restored == 1  # the unsalted one does


def test_a_salted_request_drafts_nothing_from_the_shared_ngram_store():
    store = InProcessNgramStore()
    store.add([1, 2, 3, 4, 5, 6, 7, 8, 9])
    drafter = NgramDrafter(store=store)

    def offer(salt):
        seq = SimpleNamespace(seq_id=f"s-{salt}", tokens=[40, 2, 3, 4], fixed_k=None,
                              request=SimpleNamespace(prompt_ids=(40, 2, 3, 4), cache_salt=salt))
        return drafter.offer(seq, 4)

    assert offer(None).candidate.source.startswith("shared") and offer(None).copy == (5, 6, 7, 8)
    assert offer("alice").copy == ()
