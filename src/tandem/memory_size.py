"""Memory sizes as people write them on a command line ('512M', '2G', '2GiB', '1.5T') and as we print them."""

import math

from tandem.errors import TandemError

UNITS = {"k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}
MIB = 2**20


def parse_memory(text: str, plain_unit: int = 1, allow_zero: bool = False) -> int:
    """'512M', '2G', '2GiB', '1.5T' or a plain number of `plain_unit` bytes (bytes unless said);
    bytes, positive (0 too where allow_zero)."""
    lowered = str(text).strip().lower()
    cleaned = lowered.removesuffix("ib").removesuffix("b")
    unit = cleaned[-1:]
    bytes_said = cleaned != lowered  # '100B': bytes, whatever the plain unit
    number, factor = (cleaned[:-1], UNITS[unit]) if unit in UNITS else (cleaned, 1 if bytes_said else plain_unit)
    try:
        value = float(number) * factor
        if not math.isfinite(value):
            raise ValueError
    except ValueError:
        raise TandemError(f"cannot read a memory size from {text!r}; write it like 512M, 2G or 1.5T") from None
    if value < 0 or value == 0 and not allow_zero:
        raise TandemError(f"a memory size must be {'0 or more' if allow_zero else 'positive'}, got {text!r}")
    if 0 < value < 1:
        raise TandemError(f"a memory size of less than one byte: {text!r}")
    return int(value)


def human_size(num_bytes: float) -> str:
    for unit in ("B", "KiB", "MiB"):
        if num_bytes < 1024:  # a decimal below 10 of a unit: 1.5 MiB is not "2 MiB"
            return f"{num_bytes:.1f} {unit}" if unit != "B" and num_bytes < 9.95 else f"{num_bytes:.0f} {unit}"
        num_bytes /= 1024
    if num_bytes < 1024:
        return f"{num_bytes:.1f} GiB"
    return f"{num_bytes / 1024:.1f} TiB"  # not "10240.0 GiB" for 10T
