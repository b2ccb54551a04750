"""Stop strings, checked on decoded text but answered in tokens for the engine."""

from typing import Callable

DecodeFn = Callable[[list[int]], str]
TAIL_TOKENS = 64  # stop strings are searched in the text of the last tokens only


class StopStrings:
    """tokens_to_keep: the output up to the token that completes the first stop string."""

    def __init__(self, decode: DecodeFn, strings: list[str]):
        self.decode = decode
        self.strings = [s for s in strings if s]
        self._checked = 0  # output tokens already known to complete no stop string

    def tokens_to_keep(self, output_ids: list[int]) -> int | None:
        if not self.strings:
            return None
        for end in range(max(self._checked, 1), len(output_ids) + 1):
            tail = self.decode(output_ids[max(0, end - TAIL_TOKENS) : end])
            if any(s in tail for s in self.strings):
                return end
        self._checked = len(output_ids)
        return None


def cut_at_stop(text: str, strings: list[str]) -> str:
    """The text before the first stop string (all of it when none occurs)."""
    cut = min((text.find(s) for s in strings if s and s in text), default=len(text))
    return text[:cut]


def held_back_length(text: str, strings: list[str]) -> int:
    """How many trailing characters might begin a stop string, so a stream must wait on them."""
    longest = 0
    for s in strings:
        for n in range(min(len(s) - 1, len(text)), 0, -1):
            if text.endswith(s[:n]):
                longest = max(longest, n)
                break
    return longest
