"""Incremental detokenization: token ids arrive a few at a time, final text leaves.

Contract: after every `push`, the concatenation of everything `push` returned equals
`decode(all ids so far)` without its trailing U+FFFD run. U+FFFD is what decoding shows for an
incomplete UTF-8 character (one whose later bytes are in tokens still to come) and for invalid
bytes; a trailing run is held until a real character follows it, so no text is ever taken back
and a delta never ends in U+FFFD. `flush` at the end returns that run too, so the whole output's
text is decode(all ids), as a decoder of the finished output shows it. This holds for decoders
whose output only grows at the end as tokens are added (byte-level BPE; not
`clean_up_tokenization_spaces`).

The only thing known about the tokenizer is `decode(ids) -> str` (its decode with special tokens
skipped). Decoding the whole output on every push is quadratic, so this decodes a small window
`ids[prefix_offset:]`. Its prefix `ids[prefix_offset:read_offset]` is settled text (it can no
longer change), kept as context so that word-initial spaces and the bytes of a split multi-byte
character decode as they do in the whole output; the text after `prefix_length` is the new part.
The window moves on (the prefix becomes the tokens just settled) whenever its text ends in a
complete character, so each push decodes about the previous round's tokens and its own.

A window only grows while its text ends in U+FFFD. After `MAX_PENDING_TOKENS` such tokens they
cannot all be one character in progress, so the window moves on at the latest token boundary
whose text is final (see `_final_boundary`). A long run of tokens with no text at all (skipped
special tokens) after an incomplete character is the one case where the window keeps growing.
"""

from typing import Callable

DecodeFn = Callable[[list[int]], str]
REPLACEMENT = "\ufffd"  # what decoding shows for an incomplete or invalid UTF-8 sequence
MAX_PENDING_TOKENS = 4  # a UTF-8 character has at most 4 bytes, so it spans at most 4 tokens
BOUNDARY_SEARCH = 8  # token boundaries tried, from the end, when the window must move on


class IncrementalDetokenizer:
    """push(new_ids) -> the text that became final; the contract is in the module docstring."""

    def __init__(self, decode: DecodeFn):
        self.decode = decode
        self.ids: list[int] = []
        self.prefix_offset = 0  # the window starts here: context whose text is settled
        self.read_offset = 0  # the text of ids[:read_offset] is settled: it can no longer change
        self.prefix_length = 0  # len(decode(ids[prefix_offset:read_offset]))
        self.owed = 0  # the settled text ends in this many U+FFFD; the pending text starts there
        self.shown = 0  # characters of the pending text already returned

    def push(self, new_ids: list[int]) -> str:
        """Add tokens; return the text that became final with them (possibly empty)."""
        if not new_ids:
            return ""
        self.ids += new_ids
        text = self.decode(self.ids[self.prefix_offset :])
        known = (REPLACEMENT * self.owed + text[self.prefix_length :]).rstrip(REPLACEMENT)
        delta = known[self.shown :]
        self.shown = max(self.shown, len(known))
        self._move_window(text)
        return delta

    def flush(self) -> str:
        """At the end of the output: the text not returned yet, its trailing U+FFFD run included
        (an output cut inside a character ends in U+FFFD, as decoding it whole shows). After it,
        everything returned equals decode(all ids)."""
        text = self.decode(self.ids[self.prefix_offset :])
        known = REPLACEMENT * self.owed + text[self.prefix_length :]
        delta = known[self.shown :]
        self.shown = max(self.shown, len(known))
        return delta

    def _move_window(self, text: str) -> None:
        """Settle what can no longer change; `text` is decode(ids[prefix_offset:])."""
        if not text.endswith(REPLACEMENT):
            self._settle_through(len(self.ids), text)
        elif len(self.ids) - self.read_offset > MAX_PENDING_TOKENS:
            boundary = self._final_boundary(text)
            if boundary is not None:
                self._settle_through(*boundary)

    def _settle_through(self, end: int, text: str) -> None:
        """Settle ids[read_offset:end]; `text` is decode(ids[prefix_offset:end])."""
        new_text = text[self.prefix_length :]
        if not new_text:  # e.g. skipped special tokens: keep the context the window has
            self.read_offset, self.prefix_length = end, len(text)
            return
        run = len(new_text) - len(new_text.rstrip(REPLACEMENT))
        owed = self.owed + run if run == len(new_text) else run
        self.shown = max(0, self.shown - (self.owed + len(new_text) - owed))  # pending starts later
        self.owed = owed
        self.prefix_offset, self.read_offset = self.read_offset, end
        self.prefix_length = len(self.decode(self.ids[self.prefix_offset : end]))

    def _final_boundary(self, text: str) -> tuple[int, str] | None:
        """The latest token boundary `end` whose text decode(ids[prefix_offset:end]) no later
        byte can change, with that text; None if none of the last BOUNDARY_SEARCH is.

        The text through `end` is final when it is a prefix of the window's text and either ends
        in a complete character or is followed by more characters (its trailing U+FFFD was then
        ended by an invalid byte, not completed into a character)."""
        lowest = max(self.read_offset, len(self.ids) - 1 - BOUNDARY_SEARCH)
        for end in range(len(self.ids) - 1, lowest, -1):
            head = self.decode(self.ids[self.prefix_offset : end])
            if text.startswith(head) and (len(text) > len(head) or not head.endswith(REPLACEMENT)):
                return end, head
        return None
