"""Incremental detokenization: turn growing token ids into text deltas that are complete UTF-8
and never contain (the start of) a stop string."""

from tandem.text.stops import DecodeFn, cut_at_stop, held_back_length


class TextStream:
    def __init__(self, decode: DecodeFn, stop_strings: list[str] | None = None):
        self.decode = decode
        self.stop_strings = stop_strings or []
        self.token_ids: list[int] = []
        self.sent = 0  # characters already emitted

    def push(self, new_ids: list[int]) -> str:
        """Add a round's tokens; return the text that is now safe to show."""
        self.token_ids += new_ids
        text = self._text()
        if text.endswith("\ufffd"):  # a multi-byte character is still incomplete
            return ""
        safe = len(text) - held_back_length(text, self.stop_strings)
        return self._emit(text[:safe])

    def finish(self) -> str:
        """Flush at the end of generation: everything left, cut at the first stop string."""
        return self._emit(self._text().rstrip("\ufffd"))

    def full_text(self) -> str:
        return self._text()

    def _text(self) -> str:
        return cut_at_stop(self.decode(self.token_ids), self.stop_strings)

    def _emit(self, text: str) -> str:
        delta = text[self.sent :]
        self.sent = max(self.sent, len(text))
        return delta
