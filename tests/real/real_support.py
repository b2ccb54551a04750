"""Helpers for the real-model tests (plain functions; fixtures live in conftest.py): the slow
references, target-only greedy decoding one token per forward, and the near-tie measure used
where a quantized backend may differ."""

import numpy as np

MAX_TOKENS = 32
# A near-tie: the two candidate tokens' target logits differ by less than this. Batched and
# one-token forwards in llama.cpp use different kernels; their logits differ by up to ~0.5.
NEAR_TIE_LOGITS = 0.5


def greedy_alone(forward, reset, prompt, max_tokens: int, stop_ids) -> list[int]:
    """Target-only greedy decoding of one request, one token per forward, on a single-sequence
    `forward(token_ids, num_logits) -> logits [n, vocab]` after `reset()`."""
    reset()
    logits = forward(list(prompt), 1)[0]  # [vocab]
    output: list[int] = []
    while len(output) < max_tokens:
        token = int(np.argmax(logits))
        if token in stop_ids:
            break
        output.append(token)
        logits = forward([token], 1)[0]
    return output


def first_divergence(output: list[int], reference: list[int]) -> int:
    """Where two outputs first differ (one being a prefix of the other: where the shorter ends)."""
    i = next((i for i, (a, b) in enumerate(zip(output, reference)) if a != b), None)
    return min(len(output), len(reference)) - 1 if i is None else i


def logit_gap(logits, tokens: list[int]) -> float:
    """The spread of the target's logits [vocab] over the tokens the two outputs chose."""
    values = [float(logits[t]) for t in tokens]
    return max(values) - min(values)
