"""Number checks for values from users (JSON, YAML, Python callers): True and False are ints to
Python, never a count or a size to us."""


def is_int(value) -> bool:
    """An int, not a bool (numpy's integers are not ints either: convert them first)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value) -> bool:
    """An int or a float, not a bool."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)
