"""What this machine's CPU is and what the llama.cpp build uses of it: read by the benchmarks'
machine record and by the cost-profile cache key (a profile measured on another CPU, or with
another build, is not this one's)."""

import os
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


def cpu_family_model() -> str | None:
    """"family F model M" from /proc/cpuinfo: VMs that all say "AMD EPYC" are told apart by it
    (family 25 model 1 is Zen 3, model 17 Zen 4; family 26 Zen 5); None where it is not there."""
    fields = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("cpu family", "model") and key.strip() not in fields:
                fields[key.strip()] = value.strip()
            if not line.strip() and fields:
                break
    except OSError:
        return None
    if "cpu family" not in fields or "model" not in fields:
        return None
    return f"family {fields['cpu family']} model {fields['model']}"


def llama_cpp_features() -> str | None:
    """The CPU features llama-cpp-python's build uses (AVX2, AVX512, ...: "X = 1" ones), as it prints them."""
    try:
        import llama_cpp

        text = llama_cpp.llama_print_system_info().decode(errors="replace")
    except Exception:  # noqa: BLE001  (a missing or broken build is simply not reported)
        return None
    return " ".join(part.split("=")[0].split(":")[-1].strip() for part in text.split("|") if part.strip().endswith("= 1")) or text


def llama_cpp_version() -> str:
    """llama-cpp-python's version, and the library it loads where LLAMA_CPP_LIB_PATH names another:
    the bindings then run another llama.cpp, whose speed and saved states may differ (0.3.36's
    LLAMA_STATE_SEQ_VERSION is 3, a newer build's 4, with the same llama.h otherwise)."""
    import llama_cpp

    return llama_cpp.__version__ + _library_suffix()


def llama_cpp_build() -> str:
    """What a cost profile's key names of llama.cpp: its build's CPU features, and another library."""
    return f"{llama_cpp_features()}{_library_suffix()}"


def other_llama_library() -> str | None:
    """The llama.cpp library LLAMA_CPP_LIB_PATH makes llama-cpp-python load instead of its own."""
    return os.environ.get("LLAMA_CPP_LIB_PATH") or None


def _library_suffix() -> str:
    library = other_llama_library()
    return f" lib {library}" if library else ""
