"""argparse types for whole numbers: one (`--threads 2`) or a comma-separated list
(`--batches 1,4,16`), shared by every command, so each refuses the same nonsense with the same
words (one `error:` line and exit 2, never a traceback or a silent default)."""

import argparse
from typing import Callable


def int_list(lowest: int = 1, highest: int | None = None,
             sort: bool = False) -> Callable[[str], tuple[int, ...]]:
    """A parser of "a,b,c" into whole numbers within [lowest, highest], in the order given
    (sort: ascending, each once). Empty parts are skipped; an empty list, a word or a number out
    of range is an argparse error (one `error:` line, not a traceback)."""

    def parse(text: str) -> tuple[int, ...]:
        try:
            values = tuple(int(part) for part in str(text).split(",") if part.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"wants whole numbers separated by commas, got {text!r}") from None
        if not values:
            raise argparse.ArgumentTypeError(f"wants at least one number, got {text!r}")
        out_of_range = [v for v in values if v < lowest or (highest is not None and v > highest)]
        if out_of_range:
            bounds = f"from {lowest} to {highest}" if highest is not None else f"of at least {lowest}"
            raise argparse.ArgumentTypeError(f"wants numbers {bounds}, got {text!r}")
        return tuple(sorted(set(values))) if sort else values

    return parse


def whole_number(lowest: int = 1, highest: int | None = None) -> Callable[[str], int]:
    """A parser of one whole number within [lowest, highest]."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"wants a whole number, got {text!r}") from None
        if value < lowest or (highest is not None and value > highest):
            bounds = f"from {lowest} to {highest}" if highest is not None else f"of at least {lowest}"
            raise argparse.ArgumentTypeError(f"wants a number {bounds}, got {text!r}")
        return value

    return parse
