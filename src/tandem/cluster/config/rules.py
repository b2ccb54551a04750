"""Field rules shared by the cluster file loader and the spec dataclasses.

A rule is a callable that takes a plain Python value and returns it (possibly normalised) or
raises `RuleError` with a message that reads after the field's name: "must be one of draft,
verify, both (got 'verfy')". The loader prefixes the file, line and field path; the
dataclasses prefix the worker's name. One set of rules, two callers, no drift.
"""

import math
import re
from typing import Any, Callable

from tandem.errors import did_you_mean
from tandem.numbers import is_int, is_number

Rule = Callable[[Any], Any]


class RuleError(ValueError):
    """A value that breaks a field rule; the message omits the field's name."""


def one_of(*choices: str) -> Rule:
    def rule(value: Any) -> str:
        if not isinstance(value, str) or value not in choices:
            hint = did_you_mean(value, choices) if isinstance(value, str) else ""
            raise RuleError(f"must be one of {', '.join(choices)} (got {value!r}){hint}")
        return value

    return rule


def text(pattern: str = r".+", description: str = "a non-empty string") -> Rule:
    compiled = re.compile(pattern)

    def rule(value: Any) -> str:
        if not isinstance(value, str) or not compiled.fullmatch(value):
            raise RuleError(f"must be {description} (got {value!r})")
        return value

    return rule


def integer(minimum: int | None = None, maximum: int | None = None) -> Rule:
    def rule(value: Any) -> int:
        if not is_int(value):
            raise RuleError(f"must be an integer (got {value!r}{_looks_like_a_number(value)})")
        _check_range(value, minimum, maximum)
        return value

    return rule


def number(minimum: float | None = None, maximum: float | None = None, below: float | None = None) -> Rule:
    """A real number in [minimum, maximum], and < below when given."""

    def rule(value: Any) -> float:
        if not is_number(value):
            raise RuleError(f"must be a number (got {value!r}{_looks_like_a_number(value)})")
        if not math.isfinite(value):
            raise RuleError(f"must be a finite number (got {value!r})")
        _check_range(value, minimum, maximum)
        if below is not None and value >= below:
            raise RuleError(f"must be < {below} (got {value!r})")
        return float(value)

    return rule


def optional(inner: Rule) -> Rule:
    """`inner`, or None."""
    return lambda value: None if value is None else inner(value)


def either(first: Rule, second: Rule, description: str) -> Rule:
    """`first` or else `second`; the error names both."""

    def rule(value: Any) -> Any:
        for candidate in (first, second):
            try:
                return candidate(value)
            except RuleError:
                continue
        raise RuleError(f"must be {description} (got {value!r})")

    return rule


def mapping_of(key: Rule, value: Rule) -> Rule:
    """A mapping whose keys and values follow the rules; messages name the offending key."""

    def rule(data: Any) -> dict:
        if not isinstance(data, dict):
            raise RuleError(f"must be a mapping (got {data!r})")
        checked = {}
        for k, v in data.items():
            try:
                checked[key(k)] = value(v)
            except RuleError as error:
                raise RuleError(f"key {k!r}: {error}") from None
        return checked

    return rule


def _looks_like_a_number(value: Any) -> str:
    """YAML reads 1e9 (no dot) and 1e400 as strings: say so where a string looks numeric."""
    if isinstance(value, str):
        try:
            finite = math.isfinite(float(value))
        except ValueError:
            return ""
        return ": YAML reads it as text; write a plain number such as 1000000000 or 1.0e+9" if finite else ""
    return ""


def _check_range(value: float, minimum: float | None, maximum: float | None) -> None:
    if minimum is not None and value < minimum:
        raise RuleError(f"must be >= {minimum} (got {value!r})")
    if maximum is not None and value > maximum:
        raise RuleError(f"must be <= {maximum} (got {value!r})")
