#!/usr/bin/env python3
"""The CMake flags that build llama.cpp for the x86-64 CPU this runs on, printed on one line.

The flags are chosen from /proc/cpuinfo: AVX2, FMA, F16C and BMI2 where present, AVX-512 with its
VNNI, BF16 and VBMI extensions where present (prompt processing ~1.5x AVX2's on the Xeon VMs),
AVX-VNNI where present, and AMX (TILE, INT8, BF16) where the CPU has it beside AVX-512 VNNI (its
int8 tiles score a 64-token batch of the Q4_K_M 1.5B ~1.5x faster again; decode within a few
percent).

llama.cpp's own `GGML_NATIVE=ON` build with AMX dies on the first multi-token `llama_decode` with
GCC 12 (Debian 12's compiler): GCC treats `_tile_loadconfig`'s 64-byte operand as one byte and
drops the stores that fill in the tile shapes as dead, so the tiles are never configured and the
first `tilezero` raises SIGILL (objdump shows `ldtilecfg` after only the palette byte is stored).
With AMX on and GCC as the compiler, C++ is therefore built with `-fno-dse`, which keeps the
stores; it is the only change (decode measured within 2-5% of the AMX-off build).

The Makefile and scripts/build-llama-server.sh both call this, so Tandem's llama.cpp and the peer
llama-server get the same kernels, and the Makefile rebuilds llama-cpp-python when the flags it
was built with differ from this CPU's.

`--generic` prints the AVX2 baseline that runs on any x86-64 host we use (a build to copy
elsewhere); TANDEM_LLAMA_CPU=generic does the same. Off x86-64 nothing is printed (llama.cpp's
defaults). Standard library only: it runs before the venv exists.
"""

import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

BASELINE = ("-DGGML_NATIVE=OFF", "-DGGML_AVX=ON", "-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON",
            "-DGGML_BMI2=ON")
AMX_OFF = ("-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_BF16=OFF")
AMX_NEEDS = ("amx_tile", "amx_int8", "avx512_vnni")  # ggml's AMX kernels need int8 tiles and AVX-512 VNNI
GCC_TILE_CONFIG_FIX = "-DCMAKE_CXX_FLAGS=-fno-dse"  # keeps the tile shapes' stores before ldtilecfg
# (cpuinfo flag, ggml option) in the order ggml's CMake lists them; each needs the one before it
# only where noted
BASE_FLAGS = (("avx", "GGML_AVX"), ("avx2", "GGML_AVX2"), ("fma", "GGML_FMA"), ("f16c", "GGML_F16C"),
              ("bmi2", "GGML_BMI2"), ("avx_vnni", "GGML_AVX_VNNI"))
AVX512_FLAGS = (("avx512_vnni", "GGML_AVX512_VNNI"), ("avx512_bf16", "GGML_AVX512_BF16"),
                ("avx512vbmi", "GGML_AVX512_VBMI"))
AVX512_NEEDS = ("avx512f", "avx512bw", "avx512dq", "avx512vl")  # what ggml's AVX512 build assumes


def cmake_args(cpu_flags: set[str], compiler_is_gcc: bool = True) -> list[str]:
    """The -D options for a CPU with these /proc/cpuinfo flags."""
    args = ["-DGGML_NATIVE=OFF"]
    args += [f"-D{option}={'ON' if flag in cpu_flags else 'OFF'}" for flag, option in BASE_FLAGS]
    avx512 = all(flag in cpu_flags for flag in AVX512_NEEDS)
    args.append(f"-DGGML_AVX512={'ON' if avx512 else 'OFF'}")
    args += [f"-D{option}={'ON' if avx512 and flag in cpu_flags else 'OFF'}" for flag, option in AVX512_FLAGS]
    if not (avx512 and all(flag in cpu_flags for flag in AMX_NEEDS)):
        return args + list(AMX_OFF)
    args += ["-DGGML_AMX_TILE=ON", "-DGGML_AMX_INT8=ON", f"-DGGML_AMX_BF16={'ON' if 'amx_bf16' in cpu_flags else 'OFF'}"]
    return args + [GCC_TILE_CONFIG_FIX] if compiler_is_gcc else args


def compiler_is_gcc() -> bool:
    """Whether the C++ compiler CMake will pick ($CXX, else c++) is GCC (clang has no -fno-dse)."""
    compiler = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    if not compiler:
        return True
    try:
        version = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return True
    return "Free Software Foundation" in version


def read_cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> set[str]:
    for line in cpuinfo.read_text().splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def main(argv: list[str]) -> int:
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return 0
    if "--generic" in argv or os.environ.get("TANDEM_LLAMA_CPU") == "generic":
        print(" ".join(BASELINE + AMX_OFF))
        return 0
    try:
        flags = read_cpu_flags()
    except OSError:
        print(" ".join(BASELINE + AMX_OFF))
        return 0
    print(" ".join(cmake_args(flags, compiler_is_gcc())))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
