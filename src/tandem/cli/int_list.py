"""argparse types for numbers: whole numbers, one (`--threads 2`) or a comma-separated list
(`--batches 1,4,16`), and finite real numbers (`--rate 0.5`), shared by every command, so each
refuses the same nonsense with the same words (one `error:` line and exit 2, never a traceback,
a silent default, or a NaN that hangs a simulation)."""

import argparse
import math
import os
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


def real_number(lowest: float, highest: float | None = None, *, above: bool = False,
                below: bool = False) -> Callable[[str], float]:
    """A parser of one finite number within [lowest, highest] (above: lowest itself excluded;
    below: highest itself excluded); nan and inf are refused."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        inside = ((value > lowest if above else value >= lowest)
                  and (highest is None or (value < highest if below else value <= highest)))
        if not (math.isfinite(value) and inside):
            low = f"above {lowest:g}" if above else f"of at least {lowest:g}"
            bounds = low if highest is None else f"{low} and {'below' if below else 'at most'} {highest:g}"
            raise argparse.ArgumentTypeError(f"wants a finite number {bounds}, got {text!r}")
        return value

    return parse


def thread_count(text: str) -> int:
    """`--threads`: from 1 to this machine's CPUs. More only slows llama.cpp and torch down, and
    10,000 threads left a run silent for minutes."""
    cpus = os.cpu_count() or 1
    value = whole_number(1)(text)
    if value > cpus:
        raise argparse.ArgumentTypeError(f"wants at most this machine's {cpus} CPUs, got {text!r}")
    return value
