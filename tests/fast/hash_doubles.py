"""Fast numpy doubles for the engine tests (test_engine_doubles.py): a model runner whose logits
are a pure function of its cached prefix, a broken variant, a test drafter proposing the target's
own greedy continuation, stop conditions, and the naive no-cache greedy reference."""

import numpy as np

from tandem.models.cost import CostModel
from tandem.speculation.batch_depth import DraftCandidate
from tandem.speculation.depth import K_LIMIT
from tandem.speculation.drafters.base import DraftOffer, SequenceDraft

VOCAB = 32


class HashRunner:
    """A ModelRunner double: deterministic logits from the cached prefix, milliseconds per run."""

    def __init__(self, seed=0, context_length=256, copy=False, vocab=VOCAB):
        self.name = f"hash-{seed}"
        self.vocab_size = vocab
        self.context_length = context_length
        self.cost = CostModel({1: 20.0, 16: 20.0})  # GPU-like: verifying is nearly free
        rng = np.random.default_rng(seed)
        self.table = rng.normal(scale=3.0, size=(vocab + 1, vocab, vocab)).astype(np.float32)
        self.copy = copy
        self.cache: list[int] = []

    def next_logits(self, prefix) -> np.ndarray:
        """The pure function of the model.  -> [vocab]."""
        previous = prefix[-2] if len(prefix) > 1 else self.vocab_size  # row vocab: no previous
        logits = self.table[previous, prefix[-1]].copy()
        if self.copy:  # favour what followed the latest earlier occurrence of the last token
            for i in range(len(prefix) - 2, -1, -1):
                if prefix[i] == prefix[-1]:
                    logits[prefix[i + 1]] += 20.0
                    break
        return logits

    @property
    def num_cached_tokens(self) -> int:
        return len(self.cache)

    def forward(self, token_ids, num_logits=None) -> np.ndarray:
        self.cache.extend(int(t) for t in token_ids)
        if len(self.cache) > self.context_length:
            raise OverflowError(f"cache of {len(self.cache)} past context {self.context_length}")
        n = len(token_ids) if num_logits is None else num_logits
        end = len(self.cache)
        rows = [self.next_logits(self.cache[:i]) for i in range(end - n + 1, end + 1)]
        return np.stack(rows) if rows else np.zeros((0, self.vocab_size), np.float32)  # [n, vocab]

    def rollback(self, length: int) -> None:
        assert 0 <= length <= len(self.cache), (length, len(self.cache))
        del self.cache[length:]

    def reset(self) -> None:
        self.cache = []


class LeakyRollbackRunner(HashRunner):
    """A broken runner that keeps one token too many on rollback (the first rejected draft)."""

    def rollback(self, length: int) -> None:
        super().rollback(min(length + 1, len(self.cache)))


class OracleDrafter:
    """A test drafter: proposes the target's own greedy continuation, as a free copy (source
    "oracle"). `corrupt(round)` names a draft index to change (so the target rejects it);
    `ignore_limit` offers up to K_LIMIT tokens whatever the limit. Records every limit offered."""

    name = "oracle"
    uses_model = False

    def __init__(self, model: HashRunner, corrupt=lambda round_index: None, ignore_limit=False):
        self.model = model
        self.corrupt = corrupt
        self.ignore_limit = ignore_limit
        self.limits: list[int] = []
        self.rounds = 0

    def offer(self, seq, limit: int) -> DraftOffer:
        self.limits.append(limit)
        cap = K_LIMIT if self.ignore_limit else limit
        return DraftOffer(DraftCandidate(self.name, cap, False, fixed_k=seq.fixed_k))

    def propose_batch(self, jobs, keep_drafting=None) -> list[SequenceDraft]:
        return [self._propose(job.seq.tokens, job.k) for job in jobs]

    def _propose(self, token_ids, k: int) -> SequenceDraft:
        tokens = list(token_ids)
        for _ in range(k):
            tokens.append(int(np.argmax(self.model.next_logits(tokens))))
        drafts = tokens[len(token_ids):]
        bad = self.corrupt(self.rounds)
        self.rounds += 1
        if bad is not None and bad < k:
            drafts[bad] = (drafts[bad] + 1) % VOCAB
        return SequenceDraft(self.name, drafts)


class StopAfter:
    def __init__(self, n: int):
        self.n = n

    def tokens_to_keep(self, output_ids):
        return self.n if len(output_ids) >= self.n else None


class StopBeforeSequence:
    """Like a stop string: stop at the first occurrence of `sequence`, which is not emitted."""

    def __init__(self, sequence: list[int]):
        self.sequence = sequence

    def tokens_to_keep(self, output_ids):
        n = len(self.sequence)
        for start in range(len(output_ids) - n + 1):
            if output_ids[start : start + n] == self.sequence:
                return start
        return None


def naive_greedy(model: HashRunner, prompt, max_tokens: int) -> list[int]:
    """The slow reference: every token from the whole sequence, no cache, no drafts."""
    tokens = list(prompt)
    for _ in range(max_tokens):
        tokens.append(int(np.argmax(model.next_logits(tokens))))
    return tokens[len(prompt):]
