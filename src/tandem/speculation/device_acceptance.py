"""The acceptance rules of acceptance.py, in torch, for target logits that stay on the device.

A fused torch runner returns each sequence's target logits [k + 1, vocab] on the model's device;
these rules decide there and bring back to the host only two integers per round (the accepted
count and the next token) in one transfer. The numpy rules in acceptance.py stay the slow
reference, and tests/fast/test_device_acceptance.py compares the two.

Randomness is the sequence's numpy `rng`, used exactly as `accept_sampling` uses it: one
`rng.random()` per tested draft token (none for a token with q = 0, which is rejected without a
test), then one for the recovered or bonus token, which `sample_with_uniform` turns into a token
by the same inverse CDF as `sample`. Since how many uniforms a round uses is known only after
the device has decided, the rule draws the most a round can use (k + 1), sends them as one small
tensor, and afterwards rewinds the rng and draws again only the number actually used. So the
same seed gives the same tokens as the numpy rule (for probabilities equal to the last bit; see
device_sampling.py) and leaves the rng in the same state for the next round. A seeded request's
positional rule takes its races from the seed and the positions, and uses no rng: drawn on
the host (`sampling.position_race`, float32 values) for every row at once and sent as one
tensor, so both sides run the same race.
"""

import numpy as np
import torch

from tandem.speculation.acceptance import AcceptResult, fit_vocab
from tandem.speculation.device_sampling import compute_dtype, probs_from_logits, race_winners, sample_with_uniform
from tandem.speculation.sampling import SamplingParams, position_race


def accept_round_on_device(
    draft_tokens: list[int],
    q_draft: np.ndarray | None,  # [k, draft_vocab] on the host, or None (one-hot / greedy)
    target_logits: torch.Tensor,  # [k + 1, vocab] on the device, float32 or bf16
    sampling: SamplingParams,
    rng: np.random.Generator,
    position: int,
) -> AcceptResult:
    """`accept_round` for device logits: greedy at temperature 0, the positional rule for a
    seeded request, else exact speculative sampling."""
    if sampling.greedy:
        return accept_greedy_on_device(draft_tokens, target_logits)
    p_target = probs_from_logits(target_logits, sampling)  # [k + 1, vocab] float64
    if sampling.seed is not None:
        vocab = p_target.shape[-1]
        races = np.stack([position_race(sampling.seed, position + i, vocab)
                          for i in range(len(draft_tokens) + 1)])  # [k + 1, vocab] float32
        return accept_positional_on_device(draft_tokens, p_target, races)
    q_on_device = _q_to_device(fit_vocab(q_draft, p_target.shape[-1]), p_target)  # [k, vocab] or None
    return accept_sampling_on_device(draft_tokens, q_on_device, p_target, rng)


def accept_greedy_on_device(draft_tokens: list[int], target_logits: torch.Tensor) -> AcceptResult:
    """Keep drafts while they equal the target's argmax.  target_logits: [k + 1, vocab]."""
    target_choice = target_logits.argmax(dim=-1)  # [k + 1]; the first maximum, as numpy's
    drafts = _tokens_to_device(draft_tokens, target_logits.device)  # [k]
    matches = (target_choice[: len(draft_tokens)] == drafts).long()  # [k]
    accepted = matches.cumprod(dim=0).sum()  # []: the length of the matching prefix
    next_token = target_choice.index_select(0, accepted.reshape(1))[0]  # []
    accepted_count, token = torch.stack([accepted, next_token]).tolist()  # the one transfer
    return AcceptResult(accepted_count, token)


def accept_sampling_on_device(
    draft_tokens: list[int],
    q_draft: torch.Tensor | None,  # [k, vocab] on the device, or None for a one-hot proposal
    p_target: torch.Tensor,  # [k + 1, vocab] on the device
    rng: np.random.Generator,
) -> AcceptResult:
    """Speculative sampling, the same rule and the same uniforms as `accept_sampling`."""
    k, vocab, device = len(draft_tokens), p_target.shape[-1], p_target.device
    rng_before = rng.bit_generator.state
    uniforms = torch.tensor(rng.random(k + 1), dtype=p_target.dtype, device=device)  # [k + 1]
    drafts = _tokens_to_device(draft_tokens, device)  # [k]
    if q_draft is None:
        q_draft = torch.zeros(k, vocab, dtype=p_target.dtype, device=device).scatter_(1, drafts[:, None], 1.0)
    # 1. the accept tests: test i uses uniform i, since every test before it kept its token
    p_token = p_target[:k].gather(1, drafts[:, None])[:, 0]  # [k]
    q_token = q_draft.gather(1, drafts[:, None])[:, 0]  # [k]
    kept = (q_token > 0) & (uniforms[:k] * q_token < p_token)  # [k]
    accepted = kept.long().cumprod(dim=0).sum()  # []
    # 2. the recovered token (residual of row `accepted`) or the bonus token (row k)
    q_extended = torch.cat([q_draft, q_draft.new_zeros(1, vocab)])  # [k + 1, vocab]
    p_row = p_target.index_select(0, accepted.reshape(1))[0]  # [vocab]
    q_row = q_extended.index_select(0, accepted.reshape(1))[0]  # [vocab]
    row = torch.where(accepted < k, _residual(p_row, q_row), p_row)  # [vocab]
    # 3. its uniform comes after the tests drawn: `accepted` of them, plus the failed one if q > 0
    tested_positive = torch.cat([q_token > 0, q_token.new_zeros(1, dtype=torch.bool)])  # [k + 1]
    slot = accepted + tested_positive.index_select(0, accepted.reshape(1))[0].long()  # []
    next_token = sample_with_uniform(row, uniforms.index_select(0, slot.reshape(1))[0])  # []
    accepted_count, token, used_slot = torch.stack([accepted, next_token, slot]).tolist()  # the one transfer
    rng.bit_generator.state = rng_before  # rewind, then use exactly what the numpy rule uses
    rng.random(used_slot + 1)
    return AcceptResult(accepted_count, token)


def accept_positional_on_device(
    draft_tokens: list[int],
    p_target: torch.Tensor,  # [k + 1, vocab] on the device
    races: np.ndarray,  # [k + 1, vocab] float32 on the host: each row's position's race
) -> AcceptResult:
    """`accept_positional`: every row's race at once, then greedy's prefix."""
    k, device = len(draft_tokens), p_target.device
    times = torch.from_numpy(races).to(device, non_blocking=True).to(p_target.dtype)  # [k + 1, vocab]
    choices = race_winners(p_target, times)  # [k + 1]
    matches = (choices[:k] == _tokens_to_device(draft_tokens, device)).long()  # [k]
    accepted = matches.cumprod(dim=0).sum()  # []
    next_token = choices.index_select(0, accepted.reshape(1))[0]  # []
    accepted_count, token = torch.stack([accepted, next_token]).tolist()  # the one transfer
    return AcceptResult(accepted_count, token)


def _residual(p_row: torch.Tensor, q_row: torch.Tensor) -> torch.Tensor:
    """norm(max(0, p - q)), else p when p == q, as acceptance._residual; [vocab], no sync."""
    residual = torch.clamp_min(p_row - q_row, 0.0)  # [vocab]
    total = residual.sum()
    return torch.where(total > 0, residual / total, p_row)


def _q_to_device(q_draft: np.ndarray | None, p_target: torch.Tensor) -> torch.Tensor | None:
    """q_draft [k, vocab] onto p_target's device, in the compute dtype (float64 unless MPS)."""
    if q_draft is None:
        return None
    return torch.as_tensor(q_draft, dtype=compute_dtype(p_target.device), device=p_target.device)


def _tokens_to_device(draft_tokens: list[int], device) -> torch.Tensor:
    return torch.tensor(draft_tokens, dtype=torch.long, device=device)  # [k]
