"""Unit tests of the benchmark's pure parts, with no model: config-name parsing, the order
alternation, the latency/acceptance/speedup math, greedy match rates, JSONL loading and the
markdown report."""

import json

import pytest

from tandem.bench import stats
from tandem.bench.single import metrics
from tandem.bench.single.config_base import ConfigSpec
from tandem.bench.single.harness import RunRecord, config_order
from tandem.bench.single.matching import match_against, match_table
from tandem.bench.single.memory import PeakMemory, rss_mb
from tandem.bench.single.registry import CONFIGS, parse_config_name, parse_config_names
from tandem.bench.workload import DEFAULT_WORKLOAD, BenchPrompt, format_prompt, load_prompts, select_prompts
from tandem.errors import TandemError
from tandem.token_ids import cut_at_stop, first_divergence
from tandem.speculation.depth import Auto, Fixed


def record(tokens, seconds=1.0, prompt_id="p", category="c", **stats) -> RunRecord:
    return RunRecord(prompt_id, category, tuple(tokens), seconds, stats)


def engine_stats(drafted_by_position, accepted_by_position, draft_s=0.1, verify_s=0.5) -> dict:
    return {
        "drafted": sum(drafted_by_position), "accepted": sum(accepted_by_position),
        "rounds_with_draft": drafted_by_position[0] if drafted_by_position else 0,
        "drafted_by_position": drafted_by_position, "accepted_by_position": accepted_by_position,
        "draft_s": draft_s, "verify_s": verify_s,
    }


# --- config names -----------------------------------------------------------------------------


def test_plain_names_parse_in_order():
    specs = parse_config_names("none, ngram,hybrid,llamacpp-plain")
    assert [s.label for s in specs] == ["none", "ngram", "hybrid", "llamacpp-plain"]
    assert all(s.options == () for s in specs)


def test_k_suffix_sets_an_option_and_the_label():
    auto, four = parse_config_names("hybrid:k=auto,hybrid:k=4")
    assert (auto.kind, auto.option("k"), auto.label) == ("hybrid", "auto", "hybrid:k=auto")
    assert (four.kind, four.option("k"), four.label) == ("hybrid", "4", "hybrid:k=4")
    assert ConfigSpec("hybrid").option("k", "auto") == "auto"


def test_prompt_lookup_takes_n():
    assert parse_config_name("hf-prompt-lookup:n=5").option("n") == "5"


def test_unknown_config_lists_the_known_ones():
    with pytest.raises(TandemError, match="unknown config 'medusa'") as error:
        parse_config_names("none,medusa")
    for name in CONFIGS:
        assert name in str(error.value)


@pytest.mark.parametrize("text, message", [
    ("hybrid:depth=4", "unknown option 'depth'"),
    ("none:k=4", "unknown option 'k' for none"),
    ("llamacpp-plain:k=2", "unknown option 'k'"),
    ("hybrid:k", "key=value"),
    ("hybrid:k=", "key=value"),
    ("hybrid:k=2:k=3", "given twice"),
    ("none,,hybrid", "empty entries"),
    ("", "empty entries"),
    ("hybrid,hybrid", "more than once"),
])
def test_bad_config_names_are_user_errors(text, message):
    with pytest.raises(TandemError, match=message):
        parse_config_names(text)


# --- order, stops -----------------------------------------------------------------------------


def test_order_alternates_forward_then_reversed():
    assert config_order("abc", 0) == ["a", "b", "c"]
    assert config_order("abc", 1) == ["c", "b", "a"]
    assert config_order("abc", 2) == ["a", "b", "c"]
    positions = [config_order("abc", i).index("a") for i in range(4)]
    assert sum(positions) / len(positions) == 1.0  # every config sits in the middle on average


def test_cut_at_stop_drops_the_stop_and_what_follows():
    assert cut_at_stop([5, 6, 2, 7], frozenset({2}), 10) == [5, 6]
    assert cut_at_stop([5, 6, 7], frozenset({2}), 2) == [5, 6]


# --- latency and speedup math -----------------------------------------------------------------


def test_percentile_interpolates_and_handles_empty():
    values = [10.0, 20.0, 30.0, 40.0, 50.0]
    assert stats.percentile(values, 50) == 30.0
    assert stats.percentile(values, 90) == pytest.approx(46.0)
    assert stats.percentile([7.0], 99) == 7.0
    assert stats.percentile([], 50) is None


def test_ms_per_token_weighs_by_tokens_and_skips_empty_prompts():
    runs = [record([1] * 10, seconds=1.0), record([1] * 30, seconds=1.0), record([], seconds=0.5)]
    assert metrics.ms_per_token(runs) == pytest.approx(2500 / 40)
    assert metrics.prompt_ms_per_token(runs) == pytest.approx([100.0, 1000 / 30])
    figures = metrics.latency(runs)
    assert figures["new_tokens"] == 40 and figures["tokens_per_s"] == pytest.approx(40 / 2.5)
    assert figures["p50_ms_per_token"] == pytest.approx((100 + 1000 / 30) / 2)
    assert metrics.ms_per_token([record([])]) is None


def test_speedup_is_reference_ms_over_config_ms():
    ms = {"none": 40.0, "hybrid": 20.0, "llamacpp-plain": 30.0}
    assert metrics.speedups(ms, "hybrid", ["none", "llamacpp-plain"]) == {"none": 2.0, "llamacpp-plain": 1.5}
    assert metrics.speedups(ms, "none", ["none", "hf-generate"]) == {}  # self and absent refs skipped
    assert stats.ratio(1.0, None) is None and stats.ratio(None, 1.0) is None


def test_acceptance_sums_counts_over_prompts():
    runs = [record([1], **engine_stats([4, 3, 1], [3, 1, 0])), record([1], **engine_stats([2], [2]))]
    figures = metrics.acceptance(runs)
    assert figures["acceptance_rate"] == pytest.approx(6 / 10)
    assert figures["mean_accepted_len"] == pytest.approx(6 / 6)
    positions = metrics.acceptance_by_position(runs)
    assert [(p["drafted"], p["accepted"]) for p in positions] == [(6, 5), (3, 1), (1, 0)]
    assert positions[0]["rate"] == pytest.approx(5 / 6)


def test_acceptance_of_a_run_that_never_drafted():
    runs = [record([1], **engine_stats([], []))]
    assert metrics.acceptance(runs)["acceptance_rate"] is None
    assert metrics.acceptance_by_position(runs) == []


def test_peers_have_no_acceptance_or_time_split():
    runs = [record([1, 2])]
    assert metrics.acceptance(runs)["acceptance_rate"] is None
    assert metrics.acceptance_by_position(runs) is None
    assert metrics.time_split(runs) is None


def test_time_split_is_a_share_of_wall_time():
    runs = [record([1], seconds=1.0, **engine_stats([1], [1], 0.2, 0.6)),
            record([1], seconds=1.0, **engine_stats([1], [1], 0.2, 0.6))]
    split = metrics.time_split(runs)
    assert (split["draft"], split["verify"], split["overhead"]) == pytest.approx((0.2, 0.6, 0.2))


def test_category_table_gives_speedup_per_category():
    records = {
        "none": [record([1] * 10, 1.0, "a", "code"), record([1] * 10, 2.0, "b", "chat")],
        "hybrid": [record([1] * 10, 0.5, "a", "code"), record([1] * 10, 2.0, "b", "chat")],
    }
    table = metrics.category_table(records, ["none", "llamacpp-plain"])
    assert list(table) == ["code", "chat"]
    assert table["code"]["hybrid"]["speedup"] == {"none": pytest.approx(2.0)}
    assert table["chat"]["hybrid"]["speedup"] == {"none": pytest.approx(1.0)}
    assert table["code"]["none"]["speedup"] == {}


# --- greedy match -----------------------------------------------------------------------------


def test_first_divergence():
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], [1, 9, 3]) == 1
    assert first_divergence([1, 2], [1, 2, 3]) == 2  # a prefix parts where the shorter ends
    assert first_divergence([], []) is None


def test_match_rate_and_divergences():
    reference = [record([1, 2], prompt_id="a"), record([3, 4], prompt_id="b"), record([5], prompt_id="c")]
    runs = [record([1, 2], prompt_id="a"), record([3, 7], prompt_id="b"), record([5], prompt_id="c")]
    match = match_against(runs, reference)
    assert match["rate"] == pytest.approx(2 / 3)
    assert match["divergences"] == [{"id": "b", "first_diff": 1}]


def test_match_table_compares_with_present_references_only():
    records = {"none": [record([1])], "hybrid": [record([1])], "llamacpp-plain": [record([2])]}
    table = match_table(records, ["none", "llamacpp-plain", "hf-generate"])
    assert set(table["hybrid"]) == {"none", "llamacpp-plain"}
    assert set(table["none"]) == {"llamacpp-plain"}
    assert table["hybrid"]["none"]["rate"] == 1.0 and table["hybrid"]["llamacpp-plain"]["rate"] == 0.0


# --- workload loading -------------------------------------------------------------------------


def write_lines(tmp_path, lines) -> str:
    path = tmp_path / "prompts.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_default_workload_loads():
    prompts = load_prompts(DEFAULT_WORKLOAD)
    assert len(prompts) == 100
    assert len(select_prompts(prompts, per_category=2)) == 10


def test_loading_fills_defaults_and_skips_blank_lines(tmp_path):
    path = write_lines(tmp_path, [json.dumps({"prompt": "hi"}), "",
                                  json.dumps({"id": 7, "category": "chat", "messages": [
                                      {"role": "user", "content": "hello"}]})])
    first, second = load_prompts(path)
    assert (first.id, first.category, first.prompt) == ("line-1", "uncategorised", "hi")
    assert (second.id, second.category, second.messages[0]["content"]) == ("7", "chat", "hello")


def test_a_content_of_text_parts_is_read_as_the_server_reads_it(tmp_path):
    """OpenAI's content arrays were refused ("each message needs string 'role' and 'content'")."""
    parts = [{"type": "text", "text": "first"}, {"type": "text", "text": "second"}]
    path = write_lines(tmp_path, [json.dumps({"messages": [{"role": "user", "content": parts}]})])
    [prompt] = load_prompts(path)
    assert prompt.messages == ({"role": "user", "content": "first\nsecond"},)


@pytest.mark.parametrize("line, message", [
    ("{not json", "line 2: not valid JSON"),
    ("[1, 2]", "line 2: expected a JSON object"),
    ('{"id": "x"}', "line 2: give exactly one of 'messages' and 'prompt'"),
    ('{"prompt": "a", "messages": []}', "line 2: give exactly one"),
    ('{"prompt": ""}', "line 2: 'prompt' must be a string with more than white space"),
    ('{"prompt": " \\n"}', "line 2: 'prompt' must be a string with more than white space"),
    ('{"messages": [{"role": "bogus", "content": "hi"}]}', "line 2: a message's role is 'bogus': use one of system"),
    ('{"messages": []}', "line 2: messages must be a non-empty list"),
    ('{"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}',
     "line 2: each message needs a string 'role' and a 'content' of text"),
    ('{"messages": [{"role": "user"}]}', "line 2: each message needs"),
    ('{"messages": [{"role": "user", "content": " "}]}', "line 2: the prompt is empty: every message has empty content"),
    ('{"prompt": "a", "category": 3}', "line 2: 'id' must be"),
    ('{"id": "first", "prompt": "b"}', "line 2: id 'first' is already used on line 1"),
])
def test_bad_lines_name_their_line(tmp_path, line, message):
    path = write_lines(tmp_path, [json.dumps({"id": "first", "prompt": "a"}), line])
    with pytest.raises(TandemError, match=message):
        load_prompts(path)


def test_a_file_opening_with_a_byte_order_mark_is_read(tmp_path):
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps({"id": "a", "prompt": "hi"}).encode() + b"\n")
    assert [p.id for p in load_prompts(path)] == ["a"]


def test_a_run_records_its_prompts_file_so_that_it_is_found_from_any_folder(tmp_path, monkeypatch):
    from tandem.bench.workload import recorded_prompts_file

    monkeypatch.chdir(tmp_path)
    write_lines(tmp_path, [json.dumps({"prompt": "a"})])
    recorded = recorded_prompts_file("prompts.jsonl")
    assert recorded == str(tmp_path / "prompts.jsonl")
    monkeypatch.chdir("/")
    assert load_prompts(recorded)[0].prompt == "a"
    assert recorded_prompts_file("long") == "long"  # a packaged workload keeps its name


def test_missing_and_empty_files(tmp_path):
    with pytest.raises(TandemError, match="no such prompts file"):
        load_prompts(tmp_path / "nope.jsonl")
    with pytest.raises(TandemError, match="holds no prompts"):
        load_prompts(write_lines(tmp_path, ["", "  "]))


def test_select_by_category_then_limit():
    prompts = [BenchPrompt(str(i), cat, prompt="x") for i, cat in enumerate("aaabbc")]
    assert [p.id for p in select_prompts(prompts, per_category=2)] == ["0", "1", "3", "4", "5"]
    assert [p.id for p in select_prompts(prompts, limit=2, per_category=1)] == ["0", "3"]
    assert len(select_prompts(prompts)) == 6
    with pytest.raises(TandemError, match="--limit must be a positive"):
        select_prompts(prompts, limit=0)


def test_format_prompt_uses_template_for_messages_only():
    class FakeTokenizer:
        def encode(self, text):
            return [len(text)]

        def chat_prompt_ids(self, messages):
            return [100, len(messages)]

    assert format_prompt(FakeTokenizer(), BenchPrompt("a", "c", prompt="abc")) == (3,)
    messages = ({"role": "user", "content": "x"},)
    assert format_prompt(FakeTokenizer(), BenchPrompt("b", "c", messages=messages)) == (100, 1)


# --- memory and report ------------------------------------------------------------------------


def test_peak_memory_records_per_label():
    with PeakMemory(interval_s=0.001) as memory:
        with memory.track("a"):
            buffer = bytearray(20 * 2**20)
        del buffer
    assert rss_mb() is None or memory.peak_rss_mb["a"] > 20


def test_report_renders_from_results_alone():
    from tandem.bench.single.matching import match_table as matches
    from tandem.bench.single.report import render_report

    records = {"none": [record([1, 2], 1.0, **engine_stats([], []))],
               "hybrid": [record([1, 2], 0.5, **engine_stats([2], [1]))],
               "llamacpp-plain": [record([1, 3], 0.8)]}
    ms = {label: metrics.ms_per_token(runs) for label, runs in records.items()}
    match = matches(records, ["none", "llamacpp-plain"])
    results = {
        "command": "tandem bench", "machine": {"cpu_count": 2}, "baseline": "none",
        "peers": ["llamacpp-plain"],
        "settings": {"prompts": 1, "prompts_file": "x", "max_tokens": 2, "warmup": 0,
                     "target": "t", "draft": "d"},
        "categories": metrics.category_table(records, ["none", "llamacpp-plain"]),
        "configs": {label: {**metrics.latency(runs), **metrics.acceptance(runs),
                            "speedup": metrics.speedups(ms, label, ["none", "llamacpp-plain"]),
                            "peak_rss_mb": 100.0, "peak_gpu_mb": None,
                            "time_split": metrics.time_split(runs),
                            "acceptance_by_position": metrics.acceptance_by_position(runs),
                            "match": match[label]} for label, runs in records.items()},
    }
    text = render_report(results)
    assert "| hybrid | 250.0 |" in text and "2.00x" in text
    assert "0% (0/1); first diff p@1" in text
    assert "draft `d`" in text and "Interrupted" not in text
    # a Ctrl-C's part says so (it read as the whole run), and a run without a draft model names none
    part = render_report(results | {"interrupted_after_prompts": 1,
                                    "settings": results["settings"] | {"prompts": 30, "draft": None}})
    assert "**Interrupted**: the first 1 of 30 prompts" in part
    assert "no draft model (no configuration uses one)" in part and "draft `" not in part
    assert "bonus token not counted" in text and "left out here" not in text
    # positions past the table's columns are said to be left out (they were cut off without a word)
    deep = [{"accepted": 1, "drafted": 1, "rate": 1.0}] * 19
    deep_results = results | {"configs": results["configs"] | {
        "hybrid": results["configs"]["hybrid"] | {"acceptance_by_position": deep}}}
    assert "Positions 9 to 19 are left out here; results.json holds them." in render_report(deep_results)


def test_bad_k_suffix_names_the_config():
    from tandem.bench.single.models import BenchModels, ModelChoice
    from tandem.bench.single.registry import build_configs
    from tandem.models.backends import RunnerSpec

    models = BenchModels(ModelChoice(RunnerSpec("t", "llamacpp"), RunnerSpec("d", "llamacpp")))
    configs = build_configs(parse_config_names("none,hybrid:k=4,ngram"), models)  # loads nothing
    assert [(c.label, c.k) for c in configs] == [("none", Auto()), ("hybrid:k=4", Fixed(4)), ("ngram", Auto())]
    with pytest.raises(TandemError, match="config 'hybrid:k=99': k must be 'auto' or an integer from 0 to 64"):
        build_configs(parse_config_names("hybrid:k=99"), models)


def test_the_packaged_workloads_load_by_name():
    from tandem.bench.workload import load_prompts

    default, long = load_prompts("default"), load_prompts("long")
    assert len(default) == 100
    assert len(long) == 18 and {p.category for p in long} == {"code_edit", "reformat", "extraction", "agent_loop"}
    assert any(m["role"] == "assistant" for p in long for m in p.messages)  # the agent loops repeat a turn


def test_a_bench_interrupted_keeps_the_prompts_every_config_finished(capsys):
    """Ctrl-C in the third prompt of a long bench: the two prompts both configurations finished
    are kept and the run says it was cut short (an interrupt lost the whole run), its progress
    line too (off a terminal); an interrupt before any prompt finished goes on."""
    import pytest

    from tandem.bench.single.harness import FormattedPrompt, run_benchmark
    from tandem.bench.single.memory import PeakMemory
    from tandem.bench.workload import BenchPrompt

    class Config:
        def __init__(self, label, stop_at):
            self.label, self.stop_at, self.calls = label, stop_at, 0

        def run(self, token_ids, max_tokens):
            self.calls += 1
            if self.calls == self.stop_at:
                raise KeyboardInterrupt
            return [1, 2], {}

    items = [FormattedPrompt(BenchPrompt(f"p{i}", "chat", prompt="hi"), (1,)) for i in range(5)]
    with PeakMemory() as memory:
        records, interrupted = run_benchmark([Config("a", 99), Config("b", 3)], items, 4, memory)
        assert interrupted and {label: [r.prompt_id for r in runs] for label, runs in records.items()} == {
            "a": ["p0", "p1"], "b": ["p0", "p1"]}
        assert "bench: stopped after" in capsys.readouterr().err
        with pytest.raises(KeyboardInterrupt):
            run_benchmark([Config("a", 1), Config("b", 99)], items, 4, memory)


def test_warm_up_prompts_are_in_no_workload():
    """A warm-up on the first timed prompt left its answer in the cross-request drafters, which
    then copied it whole when that prompt was timed (39 of 39 drafts kept)."""
    from tandem.bench.single.session import warmup_prompts
    from tandem.bench.workload import NAMED_WORKLOADS, load_prompts

    warm = warmup_prompts(3)
    assert len(warm) == 3 and {p.category for p in warm} == {"warm-up"}
    timed = [str(p.prompt or p.messages) for path in NAMED_WORKLOADS.values() for p in load_prompts(path)]
    assert not any(w.prompt in text for w in warm for text in timed)


def test_decode_time_is_per_token_decoded_after_the_prefill():
    """Prefill gives each prompt its first token: decode ms/token divides the time after it by
    the tokens after it (it divided by all of them: ~2% low at 50 tokens)."""
    from tandem.bench.single.harness import RunRecord
    from tandem.bench.single.metrics import time_split

    stats = {"draft_s": 0.1, "verify_s": 0.5, "prefill_s": 0.4, "drafted": 0}
    records = [RunRecord("a", "c", tuple(range(11)), 1.4, stats), RunRecord("b", "c", tuple(range(11)), 1.4, stats)]
    assert time_split(records)["decode_ms_per_token"] == pytest.approx((2.8 - 0.8) * 1000 / 20)


def test_a_draft_with_another_tokenizer_is_refused_before_anything_runs(tmp_path):
    """transformers' assisted generation died on it mid-run with a traceback, the output folder
    made; Tandem's model drafting already refused it at setup."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parents[1]))
    from test_chat_prompt import chatml_tokenizer

    from tandem.bench.single.models import ModelChoice
    from tandem.bench.single.session import BenchSettings, run_session
    from tandem.errors import VocabularyMismatchError
    from tandem.models.backends import RunnerSpec

    target, draft = tmp_path / "target", tmp_path / "draft"
    chatml_tokenizer(target)
    chatml_tokenizer(draft, corpus="another vocabulary for another model")
    choice = ModelChoice(RunnerSpec(str(target), "torch"), RunnerSpec(str(draft), "torch"))
    for configs in ("none,hf-assisted", "none,model"):
        out = tmp_path / f"out-{configs}"
        with pytest.raises(VocabularyMismatchError, match="tokenizers differ"):
            run_session(BenchSettings(choice, configs, DEFAULT_WORKLOAD, out))
        assert not out.exists()


def test_a_prompt_longer_than_the_context_is_refused_before_the_models_load(tmp_path):
    """It was refused by the engine, after the models had loaded and been profiled (~100 s)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parents[1]))
    from test_chat_prompt import chatml_tokenizer

    from tandem.bench.single.models import ModelChoice
    from tandem.bench.single.session import BenchSettings, run_session
    from tandem.models.backends import RunnerSpec

    model = tmp_path / "model"
    chatml_tokenizer(model)
    prompts = write_lines(tmp_path, [json.dumps({"id": "short", "prompt": "hi"}),
                                     json.dumps({"id": "huge", "prompt": "hi there " * 80})])
    choice = ModelChoice(RunnerSpec(str(model), "torch", context_length=64), RunnerSpec(str(model), "torch"))
    out = tmp_path / "out"
    with pytest.raises(TandemError, match="prompt 'huge' of .*prompts.jsonl has [0-9]+ tokens but the target's "
                                          "context holds 64"):
        run_session(BenchSettings(choice, "none", prompts, out))
    assert not out.exists()


def test_each_prompts_entry_keeps_what_the_reports_figures_are_summed_from():
    """results.json kept only drafted/accepted/draft_s/verify_s per prompt: the time split's
    prefill, mean accepted and acceptance by position could not be redone from it."""
    from tandem.bench.single.results import _prompt_entry

    stats = engine_stats([4, 3], [3, 1]) | {"prefill_s": 0.25, "target_forwards": 9, "draft_sources": {"ngram3": 4}}
    run = record([1, 2, 3], 2.0, **stats)
    entry = _prompt_entry(run)["stats"]
    assert entry["prefill_s"] == 0.25 and entry["rounds_with_draft"] == 4
    assert (entry["drafted_by_position"], entry["accepted_by_position"]) == ([4, 3], [3, 1])
    redone = record([1, 2, 3], 2.0, **entry)  # the report's figures, from the entry alone
    assert metrics.acceptance([redone]) == metrics.acceptance([run])
    assert metrics.time_split([redone]) == metrics.time_split([run])
    assert metrics.acceptance_by_position([redone]) == metrics.acceptance_by_position([run])
