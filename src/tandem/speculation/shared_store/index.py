"""N-gram keys and continuations as bytes: what the n-gram stores index and look up.

Terms: an *n-gram* is n consecutive token ids of a finished sequence (prompt + output); its
*continuation* is the tokens that followed it there, at most `continuation_tokens`. Token ids
are encoded as little-endian int32, so an n-gram's key is 4n bytes, the same in every process
(the Redis store shares keys between servers) and hashed once by Python. N-grams of different
lengths never collide, since their keys differ in length.
"""

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from tandem.errors import TandemError
from tandem.numbers import is_int

TOKEN_DTYPE = np.dtype("<i4")
TOKEN_BYTES = TOKEN_DTYPE.itemsize
DEFAULT_MIN_NGRAM = 3  # shorter n-grams recur by chance across unrelated requests
DEFAULT_MAX_NGRAM = 8  # longer ones add little once 8 tokens agree
DEFAULT_CONTINUATION_TOKENS = 16  # past the deepest useful draft (k is rarely above 8)
DEFAULT_MAX_INDEXED_TOKENS = 8192  # a sequence's tail indexed per add: <= ~40 ms of work


@dataclass(frozen=True, slots=True)
class NgramConfig:
    min_ngram: int = DEFAULT_MIN_NGRAM
    max_ngram: int = DEFAULT_MAX_NGRAM
    continuation_tokens: int = DEFAULT_CONTINUATION_TOKENS
    max_indexed_tokens: int = DEFAULT_MAX_INDEXED_TOKENS

    def __post_init__(self):
        if not (is_int(self.min_ngram) and is_int(self.max_ngram)
                and 1 <= self.min_ngram <= self.max_ngram):
            raise TandemError(f"n-gram lengths need 1 <= min <= max, got {self.min_ngram!r}, {self.max_ngram!r}")
        if not (is_int(self.continuation_tokens) and self.continuation_tokens >= 1):
            raise TandemError(f"continuation_tokens must be >= 1, got {self.continuation_tokens!r}")
        if not (is_int(self.max_indexed_tokens) and self.max_indexed_tokens > self.max_ngram):
            raise TandemError(f"max_indexed_tokens must exceed max_ngram, got {self.max_indexed_tokens!r}")

    def indexed(self, token_ids: Sequence[int]) -> Sequence[int]:
        """The part of a sequence an add indexes: its last `max_indexed_tokens` tokens, where the
        output is, so one long prompt never stalls the engine thread."""
        return token_ids[-self.max_indexed_tokens :]


DEFAULT_NGRAM_CONFIG = NgramConfig()


def encode_tokens(token_ids: Sequence[int]) -> bytes:
    return np.asarray(token_ids, dtype=TOKEN_DTYPE).tobytes()


def decode_tokens(data: bytes, max_tokens: int) -> list[int]:
    """The first `max_tokens` token ids in `data` (a trailing partial id is ignored)."""
    count = min(max_tokens, len(data) // TOKEN_BYTES)
    return np.frombuffer(data, dtype=TOKEN_DTYPE, count=count).tolist()


def ngram_entries(token_ids: Sequence[int], config: NgramConfig) -> dict[bytes, bytes]:
    """Every n-gram (n in [min_ngram, max_ngram]) that some token follows -> its continuation at
    its last occurrence, over `config.indexed(token_ids)`. Ordered most recent first. All n-grams
    ending at one position share one continuation object: memory is one continuation per token."""
    token_ids = config.indexed(token_ids)
    data = encode_tokens(token_ids)
    span = config.continuation_tokens * TOKEN_BYTES
    entries: dict[bytes, bytes] = {}
    for end in range(len(token_ids) - 1, config.min_ngram - 1, -1):  # end: the first following token
        at = end * TOKEN_BYTES
        follow = data[at : at + span]
        for n in range(config.min_ngram, min(config.max_ngram, end) + 1):
            entries.setdefault(data[at - n * TOKEN_BYTES : at], follow)
    return entries


def suffix_keys(context: Sequence[int], config: NgramConfig) -> list[tuple[int, bytes]]:
    """(n, key of the context's last n tokens), longest first: the candidates of a lookup."""
    tail = encode_tokens(context[-config.max_ngram :]) if len(context) else b""
    longest = min(config.max_ngram, len(tail) // TOKEN_BYTES)
    return [(n, tail[len(tail) - n * TOKEN_BYTES :]) for n in range(longest, config.min_ngram - 1, -1)]
