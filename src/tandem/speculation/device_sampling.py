"""`probs_from_logits` and `sample` of sampling.py, in torch, on the logits' device.

The numpy functions in sampling.py stay the reference; each step here mirrors one there, in the
same order (the shift by the largest logit, temperature, top-k, softmax, top-p) and in float64, so that for the same logits the
two give the same probabilities up to the last bits of exp and of the sums' order. Ties are kept
the same way: top-k keeps every token equal to the k-th largest logit, and top-p sorts with a
stable sort so equal probabilities keep their index order, as numpy's stable argsort does.

Randomness stays on the host: `sample_with_uniform` takes the uniform that `sample` would have
drawn from the sequence's numpy rng and inverts the CDF exactly as `sample` does, so the same
uniform gives the same token; `race_winners` takes a seeded position's race as `race_winner`
does.
"""

import torch

from tandem.speculation.sampling import SamplingParams


def compute_dtype(device: torch.device) -> torch.dtype:
    """float64 like the numpy reference; Apple's MPS has no float64, so float32 there."""
    return torch.float32 if device.type == "mps" else torch.float64


def probs_from_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Processed probabilities.  logits: [n, vocab] (any float dtype) -> [n, vocab] float64."""
    shifted = logits.to(compute_dtype(logits.device))  # [n, vocab]
    shifted = shifted - shifted.max(dim=-1, keepdim=True).values  # before dividing, as the reference does
    scaled = shifted / params.temperature  # [n, vocab], every row's largest 0
    if params.top_k and params.top_k < scaled.shape[-1]:
        kth = torch.topk(scaled, params.top_k, dim=-1).values[:, -1:]  # [n, 1]
        scaled = torch.where(scaled < kth, float("-inf"), scaled)
    probs = torch.exp(scaled)  # [n, vocab]
    probs = probs / probs.sum(dim=-1, keepdim=True)
    if params.top_p < 1.0:
        probs = _top_p_filter(probs, params.top_p)
    return probs


def _top_p_filter(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose mass reaches top_p.  [n, vocab]."""
    sorted_probs, order = torch.sort(probs, dim=-1, descending=True, stable=True)  # [n, vocab]
    mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
    keep_sorted = mass_before < top_p
    keep_sorted[..., 0] = True  # the most likely token always stays (top_p 0 keeps it alone)
    keep = torch.empty_like(keep_sorted).scatter_(-1, order, keep_sorted)  # [n, vocab]
    filtered = torch.where(keep, probs, 0.0)
    return filtered / filtered.sum(dim=-1, keepdim=True)


def sample_with_uniform(probs: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """A token per row by inverting the row's CDF at its uniform, as `sample` does.
    probs: [..., vocab]; uniform: [...] in [0, 1) -> token ids [...] (int64, on the device; no sync)."""
    cdf = torch.cumsum(probs, dim=-1)  # [..., vocab]
    target_mass = (uniform * cdf[..., -1])[..., None]  # [..., 1]
    index = torch.searchsorted(cdf, target_mass, right=True)[..., 0]  # [...]
    return index.clamp(max=probs.shape[-1] - 1)


def race_winners(probs: torch.Tensor, race: torch.Tensor) -> torch.Tensor:
    """Each row's exponential-race winner, as `sampling.race_winner`: the first token to finish
    at race / probs (inf where probs is 0).  probs, race: [..., vocab] -> token ids [...] (no sync)."""
    times = torch.where(probs > 0, race / probs, float("inf"))  # [..., vocab]; a time of 0 over 0 is no NaN
    return times.argmin(dim=-1)
