"""Helpers for the real-model tests (plain functions; fixtures live in conftest.py): the slow
references, target-only greedy decoding one token per forward, and the near-tie measure used
where a quantized backend may differ."""

import numpy as np

from tandem.token_ids import first_divergence

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


def parting_gap(forward, reset, prompt, output: list[int], reference: list[int], stop_ids) -> tuple[int, float]:
    """Where two greedy outputs of one prompt part (i), and the spread of the target's logits
    there, scored alone on the prompt and the tokens they share, over what each chose at i: its
    token, or, where it ended at i, its best stop token. (Both outputs are capped alike, so the
    shorter one stopped.)"""
    i = first_divergence(output, reference)
    assert i is not None, "the outputs are equal"
    reset()
    logits = forward(list(prompt) + list(reference[:i]), 1)[0]  # [vocab]

    def chose(tokens: list[int]) -> int:
        return tokens[i] if i < len(tokens) else max(stop_ids, key=lambda t: float(logits[t]))

    return i, abs(float(logits[chose(output)]) - float(logits[chose(reference)]))
