"""What the benchmark ran on: CPU, memory, accelerator and library versions."""

import os
import platform
import sys
from importlib import metadata
from pathlib import Path

LIBRARIES = ("torch", "transformers", "llama-cpp-python", "numpy")


def machine_info() -> dict:
    info = {
        "cpu_count": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "memory_gb": _memory_gb(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "gpu": _gpu_name(),
    }
    info.update({name: _version(name) for name in LIBRARIES})
    info["llama_cpp_cpu"] = _llama_cpp_cpu()
    return info


def _llama_cpp_cpu() -> str | None:
    """The CPU features llama-cpp-python's build uses (AVX2, AVX512, ...: "X = 1" ones), as it prints them."""
    try:
        import llama_cpp

        text = llama_cpp.llama_print_system_info().decode(errors="replace")
    except Exception:  # noqa: BLE001  (a missing or broken build is simply not reported)
        return None
    return " ".join(part.split("=")[0].split(":")[-1].strip() for part in text.split("|") if part.strip().endswith("= 1")) or text


def _version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _memory_gb() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return None


def _gpu_name() -> str | None:
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_name(0)
