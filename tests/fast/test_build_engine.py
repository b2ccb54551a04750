"""build_engine from an EngineConfig, on a tiny torch model built in the test."""

from tandem.engine.build import EngineConfig, build_engine
from tandem.models.backends import RunnerSpec


def test_a_context_longer_than_the_model_holds_is_capped_with_a_note(tiny_target, tmp_path, monkeypatch, capsys):
    """--context-length 100000 on a model trained for less was capped without a word (vLLM refuses)."""
    monkeypatch.setenv("TANDEM_HOME", str(tmp_path))
    spec = RunnerSpec(str(tiny_target), "torch", "cpu", threads=1, context_length=100_000, kv_memory=64 * 2**20)
    engine = build_engine(EngineConfig(spec, None, "ngram", "auto"), max_running=1, cache_ram_bytes=0)
    assert engine.context_length < 100_000
    assert (f"note: a sequence holds {engine.context_length} tokens, fewer than --context-length 100000"
            in capsys.readouterr().err)
