"""User-facing errors.

A `TandemError` carries one clear sentence for the person at the terminal or HTTP client.
The CLI prints it without a traceback and exits non-zero; anything else is a bug.
`client_message` is what a client is told of any other failure.
"""

import re
from difflib import get_close_matches
from typing import Iterable

ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")
MAX_ERROR_CHARS = 200


class TandemError(Exception):
    """A problem with the user's input or environment, explained in plain words."""


class ModelNotFoundError(TandemError):
    """A name that is neither a catalog entry nor an existing local file or folder."""


class ChecksumError(TandemError):
    """Assembled weights whose SHA-256 differs from the catalog's."""


class VocabularyMismatchError(TandemError):
    """Draft and target do not share a tokenizer."""


class InterruptSaid(KeyboardInterrupt):
    """A Ctrl-C whose command already said what it kept ("interrupted: wrote ..."): the CLI exits
    130 without a second "interrupted" line."""


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """' (did you mean 'role'?)' when `word` is close to one of `choices`, else ''."""
    close = get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def client_message(error: Exception) -> str:
    """What a client is told of a failure: its first and last lines (a remote error's where and
    what), without a remote worker's terminal colours or the traceback between them (Ray's error
    text carries both), at most MAX_ERROR_CHARS; an OSError's reason without its file's path."""
    if isinstance(error, OSError) and error.strerror:  # without the file's path, which tells a client the install
        return f"{type(error).__name__}: {error.strerror}"
    lines = [line.strip() for line in ANSI_ESCAPE.sub("", str(error)).splitlines() if line.strip()]
    text = (lines[0] if len(lines) == 1 else f"{lines[0]}: {lines[-1]}") if lines else type(error).__name__
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 3] + "..."
