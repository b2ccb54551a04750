"""llama.cpp's log through Tandem's filter: the unified pool's n_ctx_seq warning goes, the rest
reaches llama-cpp-python's callback."""

import pytest

pytest.importorskip("llama_cpp")


def test_the_unified_pool_warning_is_dropped_and_other_lines_pass(monkeypatch):
    from llama_cpp import _logger

    from tandem.models import llamacpp_log

    seen = []
    monkeypatch.setattr(_logger, "llama_log_callback", lambda level, text, user_data: seen.append(text))
    llamacpp_log.install_log_filter()
    filtered = llamacpp_log._installed[0]
    filtered(3, b"llama_context: n_ctx_seq (16384) > n_ctx_train (8192) -- possible training context overflow\n", None)
    filtered(4, b"llama_model_load: error loading model\n", None)
    assert seen == [b"llama_model_load: error loading model\n"]
