"""llama.cpp's log, minus one line that misleads here.

The runner keeps every slot's KV in one unified pool (`kv_unified`: slots share cells, so a
prompt cached in one can be copied to another), and llama.cpp then takes the pool's size for
each sequence's: with 8 slots of 2,048 tokens on SmolLM2 it warns "n_ctx_seq (16384) >
n_ctx_train (8192) -- possible training context overflow" at every start, while no sequence
holds more than the --context-length the runner caps at the model's training length. That line
is dropped; every other goes to llama-cpp-python's own callback (which prints by its verbosity).
"""

import ctypes

UNIFIED_POOL_WARNING = (b"n_ctx_seq", b"n_ctx_train")
_installed = []  # the callback llama.cpp holds, kept alive here


def install_log_filter() -> None:
    """Route llama.cpp's log through `_filtered` (once a process)."""
    if _installed:
        return
    import llama_cpp
    from llama_cpp import _logger

    @llama_cpp.llama_log_callback
    def filtered(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
        if not all(part in (text or b"") for part in UNIFIED_POOL_WARNING):
            _logger.llama_log_callback(level, text, user_data)

    llama_cpp.llama_log_set(filtered, ctypes.c_void_p(0))
    _installed.append(filtered)
