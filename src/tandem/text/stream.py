"""Streaming text for a client: growing token ids in, text deltas out that are complete UTF-8
and never contain any part of a stop string.

Decoding is incremental (`IncrementalDetokenizer`) and stop strings are searched only in the
text not shown yet, so a whole generation costs time linear in its length.
"""

from tandem.text.detokenizer import DecodeFn, IncrementalDetokenizer
from tandem.text.stop_strings import first_stop_start, held_back_length, stop_list


class TextStream:
    """push(new_ids) -> the text now safe to show: final characters (see IncrementalDetokenizer),
    cut before the first stop string, holding back a trailing piece that may begin one.
    finish() -> the rest at the end of generation.

    The stream ends at the first stop string to appear (the earliest-starting one if several
    appear at once), as the engine stops generating there; later calls return "".

    The text shown never holds any part of a stop string, so a stop string can only begin in the
    held-back text: searching that plus the new text is enough.
    """

    def __init__(self, decode: DecodeFn, stop_strings: list[str] | str | None = None):
        self.stop_strings = stop_list(stop_strings)
        self._detokenizer = IncrementalDetokenizer(decode)
        self._held = ""  # final text not shown yet: it may begin a stop string
        self._done = False
        self.stopped = False  # a stop string ended the text (the engine may have ended on its cap just before)

    def push(self, new_ids: list[int]) -> str:
        """Add a round's tokens; return the text that is now safe to show."""
        if self._done:
            return ""
        text = self._held + self._detokenizer.push(new_ids)
        stop = first_stop_start(text, self.stop_strings)
        if stop is not None:
            self._done = self.stopped = True
            return text[:stop]
        safe = len(text) - held_back_length(text, self.stop_strings)
        self._held = text[safe:]
        return text[:safe]

    def finish(self) -> str:
        """Flush at the end of generation: the text held back and, where the output ends inside
        a character (a token cap cut it), the U+FFFD that decoding the whole output shows there;
        cut before a stop string as push cuts. Not before one the U+FFFD completes: the model
        wrote no such character, its cap cut one (a stop "\ufffd" emptied such an answer and
        left it finished by its length)."""
        if self._done:
            return ""
        self._done = True
        text = self._held + self._detokenizer.flush()
        stop = first_stop_start(text.rstrip("\ufffd"), self.stop_strings)
        if stop is None:
            return text
        self.stopped = True
        return text[:stop]
