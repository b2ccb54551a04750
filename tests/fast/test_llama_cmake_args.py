"""scripts/llama-cmake-args.py: llama.cpp's CPU flags chosen from /proc/cpuinfo, AVX-512 and AMX
where the CPU has them, and with AMX under GCC the flag that keeps the tile configuration's stores
(GCC 12 drops them and the first tile instruction raises SIGILL)."""

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "llama-cmake-args.py"
spec = importlib.util.spec_from_file_location("llama_cmake_args", SCRIPT)
llama_cmake_args = importlib.util.module_from_spec(spec)
spec.loader.exec_module(llama_cmake_args)

EPYC = {"avx", "avx2", "fma", "f16c", "bmi2"}  # the AMD hosts: AVX2, no AVX-512
SAPPHIRE_RAPIDS = EPYC | {"avx_vnni", "avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512_vnni", "avx512_bf16",
                          "avx512vbmi", "amx_tile", "amx_int8", "amx_bf16"}


def options(cpu_flags, compiler_is_gcc=True) -> dict[str, str]:
    args = llama_cmake_args.cmake_args(cpu_flags, compiler_is_gcc)
    return dict(arg.removeprefix("-D").split("=", 1) for arg in args)


def test_avx512_and_amx_are_used_where_present():
    chosen = options(SAPPHIRE_RAPIDS)
    for option in ("GGML_AVX2", "GGML_AVX512", "GGML_AVX512_VNNI", "GGML_AVX512_BF16", "GGML_AVX512_VBMI",
                   "GGML_AVX_VNNI", "GGML_AMX_TILE", "GGML_AMX_INT8", "GGML_AMX_BF16"):
        assert chosen[option] == "ON", option
    assert chosen["GGML_NATIVE"] == "OFF"


def test_amx_under_gcc_keeps_the_tile_configuration_stores():
    assert options(SAPPHIRE_RAPIDS)["CMAKE_CXX_FLAGS"] == "-fno-dse"
    assert "CMAKE_CXX_FLAGS" not in options(SAPPHIRE_RAPIDS, compiler_is_gcc=False)
    assert "CMAKE_CXX_FLAGS" not in options(EPYC)  # nothing changes where AMX is off


def test_amx_needs_avx512_vnni_and_int8_tiles():
    """ggml's AMX kernels are built only beside AVX-512 VNNI; tiles without int8 are no use to Q4."""
    for missing in ("amx_int8", "avx512_vnni", "avx512f"):
        chosen = options(SAPPHIRE_RAPIDS - {missing})
        assert {chosen[o] for o in ("GGML_AMX_TILE", "GGML_AMX_INT8", "GGML_AMX_BF16")} == {"OFF"}, missing
        assert "CMAKE_CXX_FLAGS" not in chosen


def test_avx2_only_cpu_gets_no_avx512():
    chosen = options(EPYC)
    assert chosen["GGML_AVX2"] == "ON" and chosen["GGML_FMA"] == "ON"
    assert chosen["GGML_AVX512"] == "OFF" and chosen["GGML_AVX512_VNNI"] == "OFF"


def test_partial_avx512_is_not_enough():
    """ggml's AVX512 build assumes F, BW, DQ and VL together; an extension alone turns nothing on."""
    chosen = options(EPYC | {"avx512f", "avx512_vnni"})
    assert chosen["GGML_AVX512"] == "OFF" and chosen["GGML_AVX512_VNNI"] == "OFF"


def test_reads_the_flags_line(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu avx avx2 avx512f\nbogomips\t: 1\n")
    assert llama_cmake_args.read_cpu_flags(cpuinfo) == {"fpu", "avx", "avx2", "avx512f"}
