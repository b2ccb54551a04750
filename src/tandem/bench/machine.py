"""What the benchmark ran on: CPU, memory, accelerator and library versions."""

import os
import platform
import sys
from importlib import metadata
from pathlib import Path

from tandem.hardware import cpu_family_model, cpu_model, llama_cpp_features, other_llama_library

LIBRARIES = ("torch", "transformers", "llama-cpp-python", "numpy")


def machine_info() -> dict:
    info = {
        "cpu_count": os.cpu_count(),
        "cpu_model": cpu_model(),
        "cpu_family_model": cpu_family_model(),
        "memory_gb": _memory_gb(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "gpu": _gpu_name(),
    }
    info.update({name: _version(name) for name in LIBRARIES})
    info["llama_cpp_cpu"] = llama_cpp_features()
    if library := other_llama_library():  # llama-cpp-python's bindings over another llama.cpp
        info["llama_cpp_lib"] = library
    return info


def machine_line(info: dict) -> str:
    """One line for a table printed at the terminal: a figure is read with the machine it came
    from (the report's Machine section has the rest)."""
    family = f" ({info['cpu_family_model']})" if info.get("cpu_family_model") else ""
    parts = [f"{info.get('cpu_model') or 'unknown CPU'}{family}, {info.get('cpu_count')} CPUs"]
    if info.get("gpu"):
        parts.append(str(info["gpu"]))
    if info.get("llama_cpp_cpu"):
        vector = [f for f in info["llama_cpp_cpu"].split() if f.startswith(("AVX512", "AMX")) or f == "AVX2"]
        parts.append(f"llama.cpp built for {' '.join(vector) or 'baseline x86-64'}")
    return "machine: " + "; ".join(parts)


def _version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


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
