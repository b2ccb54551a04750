"""Drafting with a small model: k steps of one-token decoding on the draft runner.

The draft runner's KV cache is kept in step with the sequence lazily: before each round the
drafter finds the common prefix of what it has cached and the committed token ids, rolls back to
it and forwards only the difference (the tokens the target accepted or added last round).
"""

import time
from typing import Sequence

import numpy as np

from tandem.models.runner import ModelRunner
from tandem.spec.drafters.base import Draft, DraftRequest
from tandem.spec.sampling import probs_from_logits, sample


class ModelDrafter:
    name = "model"

    def __init__(self, runner: ModelRunner):
        self.runner = runner
        self._cached: list[int] = []  # token ids in the draft runner's KV cache

    def cost_ms(self, num_tokens: int) -> float:
        """Steady-state cost: one one-token forward per draft token."""
        return self.runner.cost.cost_ms(1) * num_tokens

    def _reusable_prefix(self, token_ids: Sequence[int]) -> int:
        """Cached tokens still valid for `token_ids`; at least the last token is forwarded again
        so there are logits to draft from."""
        return min(_common_prefix(self._cached, token_ids), len(token_ids) - 1)

    def _catch_up_ms(self, unseen: int) -> float:
        """Extra cost of the first forward when the draft has not seen `unseen` tokens (the
        whole prompt, the first time in a request), beyond a normal one-token step."""
        return max(0.0, self.runner.cost.cost_ms(unseen) - self.runner.cost.cost_ms(1))

    def reset(self) -> None:
        self.runner.reset()
        self._cached = []

    def propose(self, token_ids: Sequence[int], request: DraftRequest) -> Draft:
        reusable = self._reusable_prefix(token_ids)
        catch_up = self._catch_up_ms(len(token_ids) - reusable)
        k = request.depth.choose_k(self.name, self.cost_ms, request.limit, catch_up)
        if k == 0:
            return Draft([], source=self.name)
        k = max(k, request.depth.max_k(request.limit))  # confidence decides how deep
        logits = self._sync(token_ids, reusable)  # [vocab]
        tokens, q_rows, confidences = [], [], []
        forwards = 1
        while True:
            token, q_row, confidence = self._pick(logits, request)
            tokens.append(token)
            q_rows.append(q_row)
            confidences.append(confidence)
            if len(tokens) >= k or not request.depth.keep_drafting(self.name, confidences, self.cost_ms):
                break
            logits = self._timed_forward([token])
            self._cached.append(token)
            forwards += 1
        q_draft = None if request.sampling.greedy else np.stack(q_rows)  # [k, vocab]
        return Draft(tokens, q_draft, self.name, forwards, confidences)

    def _sync(self, token_ids: Sequence[int], reusable: int) -> np.ndarray:
        """Bring the cache to all of token_ids; return the next-token logits [vocab]."""
        self.runner.rollback(reusable)
        logits = self._timed_forward(list(token_ids[reusable:]))
        self._cached = list(token_ids)
        return logits

    def _timed_forward(self, token_ids: list[int]) -> np.ndarray:
        """Next-token logits [vocab] after `token_ids`; the step time refines the cost curve."""
        start = time.perf_counter()
        logits = self.runner.forward(token_ids, num_logits=1)[0]
        self.runner.cost.observe(len(token_ids), (time.perf_counter() - start) * 1000)
        return logits

    @staticmethod
    def _pick(logits: np.ndarray, request: DraftRequest) -> tuple[int, np.ndarray | None, float]:
        if request.sampling.greedy:
            shifted = np.exp(logits - logits.max())
            token = int(np.argmax(logits))
            return token, None, float(shifted[token] / shifted.sum())
        q_row = probs_from_logits(logits[None, :], request.sampling)[0]  # [vocab]
        token = sample(q_row, request.rng)
        return token, q_row, float(q_row[token])


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    limit = min(len(a), len(b))
    for i in range(limit):
        if a[i] != b[i]:
            return i
    return limit
