"""Stop strings, checked on decoded text but answered in tokens for the engine.

Stop strings are matched against the text that is final after each token (what
`IncrementalDetokenizer` returns): the token that completes a stop string is the first whose text
contains it, also when a multi-byte character is split across tokens.
"""

import bisect

from tandem.errors import TandemError
from tandem.text.detokenizer import DecodeFn, IncrementalDetokenizer


def stop_list(strings) -> list[str]:
    """Stop strings as a list, empty ones dropped: None is none, a string is one (as OpenAI's
    `stop` takes it; iterated, "end" was the three stops "e", "n", "d")."""
    if strings is None:
        return []
    if isinstance(strings, str):
        strings = [strings]
    if not (isinstance(strings, (list, tuple)) and all(isinstance(s, str) for s in strings)):
        raise TandemError(f"stop strings are a string or a list of strings, got {strings!r}")
    return [s for s in strings if s]


class StopStrings:
    """tokens_to_keep(output_ids): the number of output tokens up to and including the token
    that completes the first stop string (the one that ends first in the text), or None.

    The engine calls it after each round with the whole output so far. Each call decodes only
    the new tokens (incrementally) and searches only their text plus the last `longest - 1`
    characters before it, so the decoding work over a generation is linear in its length. A list
    that does not extend the one seen before (a shorter or different output) starts over.
    """

    def __init__(self, decode: DecodeFn, strings: list[str] | str | None):
        self.decode = decode
        self.strings = stop_list(strings)
        self._overlap = max((len(s) for s in self.strings), default=1) - 1
        self._start_over()

    def tokens_to_keep(self, output_ids: list[int]) -> int | None:
        if not self.strings:
            return None
        seen = len(self._seen)
        if output_ids[:seen] != self._seen:  # pointer compares in C; no decoding
            self._start_over()
            seen = 0
        if self._stop_at is None and len(output_ids) > seen:
            self._stop_at = self._scan(output_ids[seen:])
        return self._stop_at

    def _start_over(self) -> None:
        self._detokenizer = IncrementalDetokenizer(self.decode)
        self._seen: list[int] = []
        self._tail = ""  # the last `_overlap` characters of the text known so far
        self._stop_at: int | None = None

    def _scan(self, new_ids: list[int]) -> int | None:
        """Decode the new tokens one by one; return the stop's token count, or None."""
        pieces, char_ends, end = [self._tail], [], len(self._tail)
        for token in new_ids:
            pieces.append(self._detokenizer.push([token]))
            end += len(pieces[-1])
            char_ends.append(end)  # where the text final after this token ends in `window`
        window = "".join(pieces)
        first_new = len(self._seen)
        self._seen += new_ids
        stop_end = first_stop_end(window, self.strings)
        if stop_end is not None:
            return first_new + bisect.bisect_left(char_ends, stop_end) + 1
        self._tail = window[-self._overlap :] if self._overlap else ""
        return None


def first_stop_end(text: str, strings: list[str]) -> int | None:
    """Where the first stop string to be completed in `text` ends, or None."""
    ends = [text.find(s) + len(s) for s in strings if s in text]
    return min(ends, default=None)


def first_stop_start(text: str, strings: list[str]) -> int | None:
    """Where the first stop string in `text` begins, or None."""
    return min((text.find(s) for s in strings if s and s in text), default=None)


def held_back_length(text: str, strings: list[str]) -> int:
    """How many trailing characters might begin a stop string, so a stream must wait on them."""
    longest = 0
    for s in strings:
        for n in range(min(len(s) - 1, len(text)), 0, -1):
            if text.endswith(s[:n]):
                longest = max(longest, n)
                break
    return longest
