"""How much memory the KV pool may take: `--kv-memory` when given, else a fraction of what the
device has free at start-up (CUDA: torch's free-memory query; CPU: MemAvailable)."""

import torch


FREE_MEMORY_FRACTION = 0.25  # of the device memory free after the weights are loaded


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
