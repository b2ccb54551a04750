"""build_engine from an EngineConfig, on a tiny torch model built in the test."""

from dataclasses import replace

import pytest

from tandem.engine import build
from tandem.engine.build import EngineConfig, build_engine
from tandem.errors import TandemError
from tandem.models.backends import RunnerSpec


def test_a_context_longer_than_the_model_holds_is_capped_with_a_note(tiny_target, tmp_path, monkeypatch, capsys):
    """--context-length 100000 on a model trained for less was capped without a word (vLLM refuses)."""
    monkeypatch.setenv("TANDEM_HOME", str(tmp_path))
    spec = RunnerSpec(str(tiny_target), "torch", "cpu", threads=1, context_length=100_000, kv_memory=64 * 2**20)
    engine = build_engine(EngineConfig(spec, None, "ngram", "auto"), max_running=1, cache_ram_bytes=0)
    assert engine.context_length < 100_000
    assert (f"note: a sequence holds {engine.context_length} tokens, fewer than --context-length 100000"
            in capsys.readouterr().err)


def test_the_draft_pool_is_bounded_by_its_own_option_and_a_generous_bound_says_so(tiny_target, tiny_draft, tmp_path,
                                                                                 monkeypatch, capsys):
    """A torch draft's pool took its slots' contexts whatever --kv-memory said (1.4 GiB beside a
    256 MiB target); a --kv-memory above what the sequences need was shrunk without a word."""
    monkeypatch.setenv("TANDEM_HOME", str(tmp_path))
    monkeypatch.setattr(build, "tokenizer_path", lambda model: model)  # tiny models have no tokenizer: not checked
    monkeypatch.setattr(build, "TextTokenizer", lambda path: None)
    monkeypatch.setattr(build, "check_same_vocabulary", lambda target, draft: None)
    target = RunnerSpec(str(tiny_target), "torch", "cpu", threads=1, context_length=256, kv_memory=64 * 2**20)
    draft = RunnerSpec(str(tiny_draft), "torch", "cpu", threads=1, context_length=256)
    unbounded = build_engine(EngineConfig(target, draft, "model", "auto"), max_running=4, cache_ram_bytes=0)
    assert "less than the 64 MiB allowed: 4 sequences of 256 tokens, with room for their drafts, need no more" in capsys.readouterr().err
    bound = unbounded.draft.row_bytes * 16 * 20  # 20 blocks, fewer than 4 x 256 tokens need
    bounded = build_engine(EngineConfig(target, replace(draft, kv_memory=bound), "model", "auto"), max_running=4,
                           cache_ram_bytes=0)
    assert bounded.draft.kv_bytes <= bound < unbounded.draft.kv_bytes
    with pytest.raises(TandemError, match=r"raise --draft-kv-memory to at least"):
        build_engine(EngineConfig(target, replace(draft, kv_memory=1024), "model", "auto"), max_running=4,
                     cache_ram_bytes=0)


def test_draft_kv_memory_reaches_the_draft_spec_only():
    from tandem.cli.main import build_parser
    from tandem.cli.options import engine_config

    args = build_parser().parse_args(["generate", "--prompt", "hi", "--backend", "torch", "--draft-backend", "torch",
                                      "--kv-memory", "100", "--draft-kv-memory", "50"])
    config = engine_config(args)
    assert (config.target.kv_memory, config.draft.kv_memory) == (100 * 2**20, 50 * 2**20)


def test_a_runners_pool_line_names_its_role(monkeypatch, capsys):
    """The target's and the draft's `KV pool:` lines looked alike: a user sizing --kv-memory missed
    the draft's pool (--draft-kv-memory)."""
    from types import SimpleNamespace

    from tandem.models import batch_backends
    from tandem.models.backends import RunnerSpec

    pooled = SimpleNamespace(name="m [torch-fused/cpu/fp32/x1]", describe_pool=lambda: "KV pool: 180 MiB on cpu",
                             sized_by_budget=True)
    monkeypatch.setitem(batch_backends.BATCH_LOADERS, "torch", lambda spec, slots, cache_slots: pooled)
    spec = RunnerSpec("smollm2-135m-instruct", "torch", "cpu", "fp32", 1)
    batch_backends.load_batch_runner(spec, 1, role="draft, --draft-kv-memory")
    assert "m [torch-fused/cpu/fp32/x1] (draft, --draft-kv-memory): KV pool: 180 MiB" in capsys.readouterr().err
    cells = SimpleNamespace(name="m [llamacpp/cpu/gguf/x8]", describe_pool=lambda: "KV pool: 2048 cells")
    monkeypatch.setitem(batch_backends.BATCH_LOADERS, "llamacpp", lambda spec, slots, cache_slots: cells)
    batch_backends.load_batch_runner(RunnerSpec("smollm2-135m-instruct", "llamacpp"), 8, role="target, --kv-memory")
    said = capsys.readouterr().err  # no option sizes llama.cpp's pool: --kv-memory is refused there
    assert "m [llamacpp/cpu/gguf/x8] (target): KV pool: 2048 cells" in said and "--kv-memory" not in said
    batch_backends.load_batch_runner(RunnerSpec("smollm2-135m-instruct", "llamacpp"), 8)  # profile's, a replica's
    assert capsys.readouterr().err == ""  # the serving advice is for a server's pool


def test_a_huge_kv_budget_for_one_sequence_is_said_plainly(tiny_target, tmp_path, monkeypatch, capsys):
    """`--kv-memory 10T` for one sequence said "less than the 10240.0 GiB allowed: 1 sequences of
    ... need no more"."""
    monkeypatch.setenv("TANDEM_HOME", str(tmp_path))
    monkeypatch.setattr(build, "tokenizer_path", lambda model: model)
    target = RunnerSpec(str(tiny_target), "torch", "cpu", threads=1, context_length=256, kv_memory=10 * 2**40)
    build_engine(EngineConfig(target, None, "ngram", "auto"), max_running=1, cache_ram_bytes=0)
    assert "less than the 10.0 TiB allowed: 1 sequence of 256 tokens, with room for their drafts, needs no more" in capsys.readouterr().err


def test_a_cache_ram_the_runner_cannot_use_is_said(tiny_target, tmp_path, monkeypatch, capsys):
    """`--torch-runner serial --cache-ram 1G` started with "host tier off" and no word of why,
    where --cache-dir is warned of."""
    monkeypatch.setenv("TANDEM_HOME", str(tmp_path))
    monkeypatch.setattr(build, "tokenizer_path", lambda model: model)
    serial = RunnerSpec(str(tiny_target), "torch", "cpu", threads=1, context_length=256, torch_runner="serial")
    engine = build_engine(EngineConfig(serial, None, "ngram", "auto"), max_running=1, cache_ram_bytes=1 << 30)
    assert engine.prompt_cache.host is None
    assert "warning: --cache-ram is not used" in capsys.readouterr().err
    build_engine(EngineConfig(serial, None, "ngram", "auto"), max_running=1)  # not asked for: nothing said
    assert "--cache-ram" not in capsys.readouterr().err
