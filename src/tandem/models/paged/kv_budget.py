"""How much memory the KV pool may take: `--kv-memory` when given, else a fraction of what the
device has free at start-up (CUDA: torch's free-memory query; CPU: MemAvailable)."""

import torch

from tandem.errors import TandemError

FREE_MEMORY_FRACTION = 0.25  # of the device memory free after the weights are loaded
UNITS = {"k": 2**10, "m": 2**20, "g": 2**30}


def parse_memory(text: str) -> int:
    """'512M', '2G', '2GiB' or a number of bytes."""
    cleaned = text.strip().lower().removesuffix("ib").removesuffix("b")
    factor = UNITS.get(cleaned[-1:], 1)
    number = cleaned[:-1] if cleaned[-1:] in UNITS else cleaned
    try:
        value = int(float(number) * factor)
    except ValueError:
        raise TandemError(f"cannot read a memory size from {text!r}; write it like 512M or 2G") from None
    if value <= 0:
        raise TandemError(f"a memory size must be positive, got {text!r}")
    return value


def kv_budget_bytes(device: torch.device, kv_memory: int | None) -> int:
    if kv_memory is not None:
        return kv_memory
    return int(free_memory(device) * FREE_MEMORY_FRACTION)


def free_memory(device: torch.device) -> int:
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return free
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 4 * 2**30  # a device that cannot say: assume 4 GiB
