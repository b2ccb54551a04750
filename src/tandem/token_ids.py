"""Helpers on lists of token ids shared by the engine, drafters and caches."""

from typing import Sequence


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading token ids a and b share."""
    limit = min(len(a), len(b))
    i = 0
    while i < limit and a[i] == b[i]:
        i += 1
    return i


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Index of the first differing token (where one is a prefix of the other, the shorter's
    length), or None when equal."""
    shared = common_prefix(a, b)
    return None if shared == len(a) == len(b) else shared


def cut_at_stop(token_ids: Sequence[int], stop_ids: frozenset[int], max_tokens: int) -> list[int]:
    """New tokens up to (not including) the first stop id, at most `max_tokens`."""
    kept = []
    for token in list(token_ids)[:max_tokens]:
        if token in stop_ids:
            break
        kept.append(token)
    return kept
