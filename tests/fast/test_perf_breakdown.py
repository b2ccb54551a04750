"""scripts/perf_breakdown.py: a `perf script` sample goes to the kind of work its stack names,
innermost named frame first, else to its innermost library (by file name, not path)."""

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "perf_breakdown.py"
spec = importlib.util.spec_from_file_location("perf_breakdown", SCRIPT)
perf_breakdown = importlib.util.module_from_spec(spec)
spec.loader.exec_module(perf_breakdown)

VENV_GGML = "/work/main/.venv/lib/python3.11/site-packages/llama_cpp/lib/libggml-cpu.so.0"

SCRIPT_TEXT = f"""python 21178 32435.401146:    2004008 cpu-clock:ppp: 
\t           80746 [unknown] ({VENV_GGML})
\t           820a3 tiled_run_microtile<16, false, 32, true>+0x83 ({VENV_GGML})
\t1d193a121c2b0009 [unknown] ([unknown])

python 21181 32435.403261:    2004008 cpu-clock:ppp: 
\t          1397d4 ggml_gemv_q4_K_8x8_q8_K+0x484 ({VENV_GGML})
\t           410cf ggml::cpu::repack::tensor_traits<block_q4_K, 8l, 8l, (ggml_type)15>::compute_forward+0xe8f ({VENV_GGML})

python 21181 32435.405269:    2004008 cpu-clock:ppp: 
\t          16d92c __memmove_avx512_unaligned_erms+0x12c (/usr/lib/x86_64-linux-gnu/libc.so.6)
\t           e84e5 ggml_compute_forward_flash_attn_ext+0x2d5 ({VENV_GGML})

python 21181 32435.405270:    2004008 cpu-clock:ppp: 
\t           5a707 [unknown] ({VENV_GGML})
\t           66251 [unknown] ({VENV_GGML})

python 21178 32435.409155:    2004008 cpu-clock:ppp: 
\t          13cd42 ggml_gemm_q4_K_8x8_q8_K+0x23f2 ({VENV_GGML})
\t           411a5 ggml::cpu::repack::tensor_traits<block_q4_K, 8l, 8l, (ggml_type)15>::compute_forward+0xf65 ({VENV_GGML})

python 21179 32435.409160:    2004008 cpu-clock:ppp: 
\t           1e02a [unknown] (/usr/lib/x86_64-linux-gnu/libgomp.so.1)

python 21170 32435.409161:    2004008 cpu-clock:ppp: 
\t           2b0c1 _PyEval_EvalFrameDefault+0x31 (/usr/lib/x86_64-linux-gnu/libpython3.11.so.1.0)
"""


def test_each_sample_goes_to_the_work_its_stack_names():
    counts = perf_breakdown.count_kinds(SCRIPT_TEXT)
    assert counts == {
        "attention": 2,  # an unnamed helper under the tiled kernel, libc's memmove under flash attention
        "matmul Q4_K, row by row (gemv)": 1,
        "matmul Q4_K, 4+ rows (gemm)": 1,
        "other ggml": 1,  # a stripped library's unnamed frames: its file's name, not the venv's path ("python")
        "OpenMP barriers (libgomp)": 1,
        "Python": 1,
    }


def test_a_trailing_sample_without_a_blank_line_is_counted():
    assert sum(perf_breakdown.count_kinds(SCRIPT_TEXT.rstrip("\n")).values()) == 7
