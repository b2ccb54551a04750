#!/usr/bin/env python3
"""The CMake flags that build llama.cpp for the x86-64 CPU this runs on, printed on one line.

llama.cpp's `GGML_NATIVE=ON` (-march=native) turns on AMX where the CPU has it, and that build
segfaults on every multi-token `llama_decode` inside the AMX VMs we run on. So the flags are
chosen here from /proc/cpuinfo instead: AVX2, FMA, F16C and BMI2 where present, AVX-512 with its
VNNI, BF16 and VBMI extensions where present (prompt processing ~1.5x AVX2's on those VMs), AVX-VNNI
where present, and AMX always off. The Makefile and scripts/build-llama-server.sh both call it, so
Tandem's llama.cpp and the peer llama-server get the same kernels, and the Makefile rebuilds
llama-cpp-python when the flags it was built with differ from this CPU's.

`--generic` prints the AVX2 baseline that runs on any x86-64 host we use (a build to copy
elsewhere); TANDEM_LLAMA_CPU=generic does the same. Off x86-64 nothing is printed (llama.cpp's
defaults). Standard library only: it runs before the venv exists.
"""

import os
import platform
import sys
from pathlib import Path

BASELINE = ("-DGGML_NATIVE=OFF", "-DGGML_AVX=ON", "-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON",
            "-DGGML_BMI2=ON")
AMX_OFF = ("-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_BF16=OFF")
# (cpuinfo flag, ggml option) in the order ggml's CMake lists them; each needs the one before it
# only where noted
BASE_FLAGS = (("avx", "GGML_AVX"), ("avx2", "GGML_AVX2"), ("fma", "GGML_FMA"), ("f16c", "GGML_F16C"),
              ("bmi2", "GGML_BMI2"), ("avx_vnni", "GGML_AVX_VNNI"))
AVX512_FLAGS = (("avx512_vnni", "GGML_AVX512_VNNI"), ("avx512_bf16", "GGML_AVX512_BF16"),
                ("avx512vbmi", "GGML_AVX512_VBMI"))
AVX512_NEEDS = ("avx512f", "avx512bw", "avx512dq", "avx512vl")  # what ggml's AVX512 build assumes


def cmake_args(cpu_flags: set[str]) -> list[str]:
    """The -D options for a CPU with these /proc/cpuinfo flags."""
    args = ["-DGGML_NATIVE=OFF"]
    args += [f"-D{option}={'ON' if flag in cpu_flags else 'OFF'}" for flag, option in BASE_FLAGS]
    avx512 = all(flag in cpu_flags for flag in AVX512_NEEDS)
    args.append(f"-DGGML_AVX512={'ON' if avx512 else 'OFF'}")
    args += [f"-D{option}={'ON' if avx512 and flag in cpu_flags else 'OFF'}" for flag, option in AVX512_FLAGS]
    return args + list(AMX_OFF)


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
    print(" ".join(cmake_args(flags)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
