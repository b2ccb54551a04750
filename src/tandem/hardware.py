"""What this machine's CPU is and what the llama.cpp build uses of it: read by the benchmarks'
machine record and by the cost-profile cache key (a profile measured on another CPU, or with
another build, is not this one's)."""

import platform
from pathlib import Path


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def llama_cpp_features() -> str | None:
    """The CPU features llama-cpp-python's build uses (AVX2, AVX512, ...: "X = 1" ones), as it prints them."""
    try:
        import llama_cpp

        text = llama_cpp.llama_print_system_info().decode(errors="replace")
    except Exception:  # noqa: BLE001  (a missing or broken build is simply not reported)
        return None
    return " ".join(part.split("=")[0].split(":")[-1].strip() for part in text.split("|") if part.strip().endswith("= 1")) or text
