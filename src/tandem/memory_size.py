"""Memory sizes as people write them on a command line ('512M', '2G', '2GiB') and as we print them."""

from tandem.errors import TandemError

UNITS = {"k": 2**10, "m": 2**20, "g": 2**30}


def parse_memory(text: str) -> int:
    """'512M', '2G', '2GiB' or a number of bytes; positive."""
    cleaned = text.strip().lower().removesuffix("ib").removesuffix("b")
    factor = UNITS.get(cleaned[-1:], 1)
    number = cleaned[:-1] if cleaned[-1:] in UNITS else cleaned
    try:
        value = int(float(number) * factor)
    except (ValueError, OverflowError):
        raise TandemError(f"cannot read a memory size from {text!r}; write it like 512M or 2G") from None
    if value <= 0:
        raise TandemError(f"a memory size must be positive, got {text!r}")
    return value


def human_size(num_bytes: float) -> str:
    for unit in ("B", "KiB", "MiB"):
        if num_bytes < 1024:
            return f"{num_bytes:.0f} {unit}"
        num_bytes /= 1024
    return f"{num_bytes:.1f} GiB"
