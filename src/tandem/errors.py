"""User-facing errors.

A `TandemError` carries one clear sentence for the person at the terminal or HTTP client.
The CLI prints it without a traceback and exits non-zero; anything else is a bug.
"""


class TandemError(Exception):
    """A problem with the user's input or environment, explained in plain words."""


class ModelNotFoundError(TandemError):
    """A name that is neither a catalog entry nor an existing local file or folder."""


class ChecksumError(TandemError):
    """Assembled weights whose SHA-256 differs from the catalog's."""


class VocabularyMismatchError(TandemError):
    """Draft and target do not share a tokenizer."""
