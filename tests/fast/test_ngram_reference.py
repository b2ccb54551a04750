"""The fast n-gram matcher against a slow, obviously-correct reference on random contexts."""

import random

from tandem.speculation.drafters.ngram import find_ngram_match


def reference_match(tokens, k, min_ngram, max_ngram):
    """For n from max_ngram down: the most recent earlier occurrence of the last n tokens."""
    for n in range(min(max_ngram, len(tokens) - 1), min_ngram - 1, -1):
        tail = tokens[-n:]
        for start in range(len(tokens) - n - 1, -1, -1):
            if tokens[start : start + n] == tail:
                return n, tokens[start + n : start + n + k]
    return None


def test_fast_matcher_equals_reference():
    rng = random.Random(0)
    for trial in range(3000):
        vocab = rng.choice([2, 3, 5, 20])
        tokens = [rng.randrange(vocab) for _ in range(rng.randrange(1, 60))]
        k, min_ngram, max_ngram = rng.randrange(1, 10), rng.randrange(1, 4), rng.randrange(3, 9)
        expected = reference_match(tokens, k, min_ngram, max_ngram)
        got = find_ngram_match(tokens, k, min_ngram, max_ngram)
        assert (None if got is None else (got.ngram_len, got.continuation)) == expected, (tokens, k, min_ngram, max_ngram)
