"""Acceptance rules: which drafted tokens the target keeps.

Terms, used everywhere in Tandem:
- draft tokens d_1..d_k: proposed by a drafter, with draft probabilities `q_draft` [k, vocab]
  (None for a deterministic proposal such as an n-gram match, i.e. a one-hot q).
- target probabilities `p_target` [k + 1, vocab]: row i is the target's distribution for the
  position of d_{i+1}; row k is for the position after the last draft token.
- accepted tokens: the longest prefix of the drafts the rule keeps.
- rejected token: the first draft token not kept; the target then emits a *recovered* token
  sampled from the residual distribution.
- bonus token: when every draft token is accepted, one more token sampled from row k.
Each round therefore emits `accepted + 1` tokens.

Greedy (temperature 0) keeps d_i while it equals the target's argmax. Speculative sampling
(Leviathan et al. 2023, "Fast Inference from Transformers via Speculative Decoding";
Chen et al. 2023, "Accelerating LLM Decoding with Speculative Sampling") keeps d_i with
probability min(1, p(d_i) / q(d_i)) and on rejection samples from norm(max(0, p - q)); the
emitted tokens then follow p exactly.

A seeded request (`SamplingParams.seed`) takes the positional rule instead: the target's token at
output position i is the winner of an exponential race over its processed p_i, run with times
E_i (one Exp(1) per token id) that depend on the seed and i alone (`position_race`: token t
finishes at E_i[t] / p_i[t], and wins with probability p_i[t]), and a draft is kept while it
equals that token, as greedy keeps the argmax. Each emitted token is then the token
non-speculative sampling with the same races emits, whatever was drafted: p_i is conditioned on
the tokens before i, which are functions of E_<i, and E_i is independent of them, so token i
follows p_i exactly; and the same seed gives the same output at any k, drafter or load, which a
seed promises, up to logits that differ between kernels: those change the winner only where two
tokens' times nearly tie. A draft model couples to it by running the same race over q
(lockstep.py): draft and target then pick the same token with probability at least
(1 - TV) / (1 + TV), near speculative sampling's where q is near p; a one-hot draft is kept with
probability p(d_i), as speculative sampling keeps it.
"""

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import numpy as np

from tandem.speculation.sampling import SamplingParams, position_race, probs_from_logits, race_winner, sample

if TYPE_CHECKING:
    import torch

HOST_DEVICES: tuple[str, ...] = ("cpu",)  # device logits read by the numpy rules in place


@dataclass(frozen=True, slots=True)
class AcceptResult:
    accepted: int  # number of draft tokens kept
    next_token: int  # recovered token (after a rejection) or bonus token (all accepted)

    def emitted(self, draft_tokens: list[int]) -> list[int]:
        return list(draft_tokens[: self.accepted]) + [self.next_token]


def accept_round(
    draft_tokens: list[int],
    q_draft: np.ndarray | None,  # [k, draft_vocab] or None (one-hot / greedy)
    target_logits: "np.ndarray | torch.Tensor",  # [k + 1, vocab]
    sampling: SamplingParams,
    rng: np.random.Generator,
    position: int,  # the output position of the round's first token (the positional rule's)
) -> AcceptResult:
    """One round's acceptance: greedy at temperature 0, the positional rule for a seeded
    request, else exact speculative sampling on the processed distributions (the one dispatch
    every engine and verifier uses).

    numpy logits take the rules below (the reference); a torch.Tensor, which stays on its
    device, takes the same rules in device_acceptance.py. torch is imported only then, so
    llama.cpp-only paths never need it. A float32 tensor in host memory is already where numpy
    reads it (a view, no copy), and numpy's argmax there is ~15x faster than torch's (measured:
    50 us vs 0.7 ms at vocab 151936), so it takes the numpy rules (HOST_DEVICES)."""
    if not isinstance(target_logits, np.ndarray):
        if target_logits.device.type in HOST_DEVICES and str(target_logits.dtype) == "torch.float32":
            target_logits = target_logits.numpy()
        else:
            from tandem.speculation.device_acceptance import accept_round_on_device

            return accept_round_on_device(draft_tokens, q_draft, target_logits, sampling, rng, position)
    if sampling.greedy:
        return accept_greedy(draft_tokens, target_logits)
    p_target = probs_from_logits(target_logits, sampling)  # [k + 1, vocab]
    if sampling.seed is not None:
        return accept_positional(draft_tokens, p_target,
                                 lambda i: position_race(sampling.seed, position + i, p_target.shape[-1]))
    return accept_sampling(draft_tokens, fit_vocab(q_draft, p_target.shape[-1]), p_target, rng)


def fit_vocab(q_draft: np.ndarray | None, vocab: int) -> np.ndarray | None:
    """Draft and target may pad their embeddings differently: q over the target's width."""
    if q_draft is None or q_draft.shape[-1] == vocab:
        return q_draft
    if q_draft.shape[-1] > vocab:
        return q_draft[:, :vocab]
    return np.pad(q_draft, ((0, 0), (0, vocab - q_draft.shape[-1])))


def accept_greedy(draft_tokens: list[int], target_logits: np.ndarray) -> AcceptResult:
    """target_logits: [k + 1, vocab]."""
    target_choice = np.argmax(target_logits, axis=-1)  # [k + 1]
    accepted = 0
    for token, choice in zip(draft_tokens, target_choice):
        if token != choice:
            break
        accepted += 1
    return AcceptResult(accepted, int(target_choice[accepted]))


def accept_sampling(
    draft_tokens: list[int],
    q_draft: np.ndarray | None,  # [k, vocab] or None for a deterministic (one-hot) proposal
    p_target: np.ndarray,  # [k + 1, vocab]
    rng: np.random.Generator,
) -> AcceptResult:
    for i, token in enumerate(draft_tokens):
        p_row = p_target[i]  # [vocab]
        q_row = _one_hot(token, p_row.shape[-1]) if q_draft is None else q_draft[i]
        q_token = q_row[token]
        if q_token > 0 and rng.random() * q_token < p_row[token]:
            continue
        return AcceptResult(i, sample(_residual(p_row, q_row), rng))
    k = len(draft_tokens)
    return AcceptResult(k, sample(p_target[k], rng))


def accept_positional(
    draft_tokens: list[int],
    p_target: np.ndarray,  # [k + 1, vocab]
    race_of: Callable[[int], np.ndarray],  # row i -> the race of its output position, [vocab]
) -> AcceptResult:
    """Keep drafts while each equals the target's token at its position (the winner of its
    row's race); the first that differs is replaced by that token. Races are drawn only for
    the rows reached."""
    for i, token in enumerate(draft_tokens):
        choice = race_winner(p_target[i], race_of(i))
        if token != choice:
            return AcceptResult(i, choice)
    k = len(draft_tokens)
    return AcceptResult(k, race_winner(p_target[k], race_of(k)))


def _residual(p_row: np.ndarray, q_row: np.ndarray) -> np.ndarray:
    """norm(max(0, p - q)); falls back to p when p == q (then rejection has probability 0)."""
    residual = np.maximum(p_row - q_row, 0.0)  # [vocab]
    total = residual.sum()
    return residual / total if total > 0 else p_row


def _one_hot(token: int, vocab: int) -> np.ndarray:
    row = np.zeros(vocab)
    row[token] = 1.0
    return row
