"""The copy ceiling (bench/ceiling/oracle.py) against brute force: the oracle's run is the longest one
any start in the source gives, rounds cover the answer exactly, and the prices follow the curve;
the report (bench/ceiling/report.py) sets each config's decode rate against its category's."""

import random

import pytest

from tandem.bench.ceiling.oracle import (ContextCurves, Round, _Source, long_run_ms, longest_copy_run, oracle_ms, oracle_rounds,
                                         plain_ms, rounds_ms, suffix_rounds)
from tandem.speculation.drafters.ngram import find_ngram_match
from ceiling_support import CharTokenizer, _results


def brute_longest(source, wanted, limit):
    best = 0
    for start in range(len(source)):
        length = 0
        while length < min(limit, len(wanted)) and start + length < len(source) and source[start + length] == wanted[length]:
            length += 1
        best = max(best, length)
    return best


def test_the_longest_copy_run_equals_a_brute_force_scan():
    rng = random.Random(3)
    for _ in range(300):
        source = _Source([rng.randrange(6) for _ in range(rng.randint(0, 60))])
        wanted = [rng.randrange(6) for _ in range(rng.randint(0, 20))]
        limit = rng.randint(0, 25)
        assert longest_copy_run(source.tokens, source.positions, wanted, limit) == brute_longest(source.tokens, wanted, limit)


def test_an_answer_that_copies_its_prompt_is_drafted_in_max_draft_runs():
    prompt = list(range(100, 300))  # 200 distinct tokens
    answer = [7] + prompt  # one token of its own, then the whole prompt
    rounds = oracle_rounds(prompt, answer, max_draft=64)
    assert sum(r.emitted for r in rounds) == len(answer) - 1  # the first token is the prefill's
    assert all(r.accepted == r.drafted for r in rounds)
    assert [r.drafted for r in rounds] == [64, 64, 64, 4]  # 3 x 65 emitted, then the last 5
    assert [r.context for r in rounds] == [201, 266, 331, 396]  # the prompt and the answer so far
    assert rounds_ms(rounds, lambda n, c: 10.0 + n) == sum(10.0 + r.drafted + 1 for r in rounds)
    assert rounds_ms(rounds, lambda n, c: c) == 201 + 266 + 331 + 396
    assert plain_ms(len(prompt), len(answer), lambda n, c: 10.0 + n) == 200 * 11.0
    assert plain_ms(len(prompt), len(answer), lambda n, c: c) == sum(range(201, 401))


def test_an_answer_sharing_nothing_decodes_one_token_a_round():
    rounds = oracle_rounds([1, 2, 3], [50, 51, 52, 53])
    assert rounds == [Round(0, 0, 4), Round(0, 0, 5), Round(0, 0, 6)]


def test_the_suffix_matcher_follows_the_last_occurrence_of_its_key():
    source = [1, 2, 3, 9, 9, 1, 2, 3, 5, 6, 1, 2, 3]
    assert find_ngram_match(source, 4, 3, 3).continuation == [5, 6, 1, 2]  # the later of two occurrences
    rounds = suffix_rounds([1, 2, 3, 4, 5, 6], [0, 1, 2, 3, 4, 5, 8])
    assert sum(r.emitted for r in rounds) == 6
    assert any(r.accepted > 0 for r in rounds) and all(r.accepted <= r.drafted for r in rounds)


def test_the_report_sets_each_config_against_its_categorys_ceiling(tmp_path):
    from tandem.bench.ceiling.report import ceilings, render

    results, level = _results(tmp_path, "def f(x): return x + 1", "fine")
    label, table = ceilings(results, level, CharTokenizer(), lambda n, c: 10.0 + n, None)
    assert label == "tandem-spec" and set(table) == {"edit", "chat"}
    edit = table["edit"]
    assert edit.requests == 1 and edit.tokens == len("def f(x): return x + 1") - 1
    assert edit.oracle_ms < edit.suffix_ms < edit.plain_ms  # a pure copy: the oracle drafts it all
    tokens, seconds = edit.measured["tandem-spec"]  # completion tokens after the first, over e2e - TTFT
    assert tokens == 21 and abs(seconds - 0.22) < 1e-9
    lines = render(table, ["tandem-spec", "llama-server"])
    assert lines[0].count("/ ceiling") == 2 and lines[-1].startswith("| all | 2 |")


def test_results_without_answer_texts_are_a_clear_error(tmp_path):
    from tandem.bench.ceiling.report import ceilings
    from tandem.errors import TandemError

    results, level = _results(tmp_path, "", "")
    with pytest.raises(TandemError, match="no answer texts"):
        ceilings(results, level, CharTokenizer(), lambda n, c: 1.0, None)
    for record in level["configs"]["tandem-spec"]["request_records"]:  # every request failed: said so
        record.update(ok=False, error="HTTP 400: bad role")
    with pytest.raises(TandemError, match="all 3 requests of tandem-spec failed in this level .*HTTP 400: bad role"):
        ceilings(results, level, CharTokenizer(), lambda n, c: 1.0, None)


def test_an_edited_answer_or_a_prompt_gone_from_the_file_is_said(tmp_path, capsys):
    """A text that was no string ended in transformers' ValueError; an answer whose prompt the
    file no longer has was left out of the table's counts without a word."""
    from tandem.bench.ceiling.report import ceilings
    from tandem.errors import TandemError

    results, level = _results(tmp_path, "def f(x): return x + 1", "fine")
    level["configs"]["tandem-spec"]["request_records"][1]["id"] = "gone"
    ceilings(results, level, CharTokenizer(), lambda n, c: 1.0, None)
    assert "note: 1 of the run's 2 answers are left out: their prompts are no longer in" in capsys.readouterr().err
    level["configs"]["tandem-spec"]["request_records"][0]["text"] = 5
    with pytest.raises(TandemError, match="the answer of request 'a' \\(tandem-spec\\) is not a string"):
        ceilings(results, level, CharTokenizer(), lambda n, c: 1.0, None)


def test_the_long_run_ceiling_decodes_short_runs_plainly():
    rounds = [Round(3, 3), Round(10, 10), Round(0, 0)]
    cost = lambda n, c: 10.0 + n  # noqa: E731
    assert long_run_ms(rounds, cost, min_run=8) == 4 * 11.0 + 21.0 + 11.0
    assert long_run_ms(rounds, cost, min_run=1) == rounds_ms(rounds, cost)


def test_the_oracle_never_drafts_at_a_loss_so_its_ceiling_is_never_below_plain_decoding():
    """A bench-serve run priced its category's ceiling at 0.96x plain decoding: on a compute-bound
    curve a call of two tokens cost more than two one-token calls, and the oracle drafted anyway."""
    random.seed(3)
    dear_short = lambda n, c: 10.0 if n == 1 else 40.0 + n  # noqa: E731  up to 4 tokens cost more than 4 x 10
    for _ in range(50):
        prompt = [random.randrange(6) for _ in range(40)]
        answer = [random.randrange(6) for _ in range(30)]
        rounds = oracle_rounds(prompt, answer)
        assert oracle_ms(rounds, dear_short) <= plain_ms(len(prompt), len(answer), dear_short)
        assert oracle_ms(rounds, dear_short) <= rounds_ms(rounds, dear_short)
        assert long_run_ms(rounds, dear_short) <= plain_ms(len(prompt), len(answer), dear_short)
    copy = oracle_rounds(list(range(40)), list(range(30)))  # one long copy: drafted, where it pays
    assert oracle_ms(copy, dear_short) == rounds_ms(copy, dear_short) < plain_ms(40, 30, dear_short)


def test_a_round_is_priced_between_the_curves_of_the_contexts_around_it():
    curves = ContextCurves({1000: lambda n: 100.0 + n, 2000: lambda n: 200.0 + 2 * n})
    assert curves.cost_ms(64, 1000) == 164.0 and curves.cost_ms(64, 2000) == 328.0
    assert curves.cost_ms(64, 1500) == 246.0  # halfway
    assert curves.cost_ms(64, 3000) == 492.0  # on the line through the last two
    assert curves.cost_ms(64, 500) == 82.0
    assert ContextCurves({1024: lambda n: 7.0}).cost_ms(64, 4096) == 7.0  # one curve: one price


def test_bench_ceiling_reads_its_contexts_and_refuses_nonsense():
    import argparse

    from tandem.cli.bench_ceiling_cmd import _contexts

    assert _contexts("2048, 512,1024") == (512, 1024, 2048) and _contexts("1024") == (1024,)
    for bad in ("", "a,b", "0", "-5"):
        with pytest.raises(argparse.ArgumentTypeError):
            _contexts(bad)


def test_curves_printed_by_one_run_are_read_back_by_another():
    from tandem.bench.ceiling.report import curve_lines, read_curves
    from tandem.models.cost import CostModel

    curves = {1024: CostModel({1: 87.0, 4: 156.0, 64: 640.0}), 512: CostModel({1: 81.0, 64: 573.0})}
    text = "$ tandem bench-ceiling ...\n" + "\n".join(curve_lines(curves)) + "\n| category | ... |\n"
    assert text.index("at 512") < text.index("at 1024")  # printed by context
    back = read_curves(text)
    assert sorted(back) == [512, 1024]
    assert back[1024].cost_ms(4) == 156.0 and back[512].cost_ms(64) == 573.0 and back[512].cost_ms(32) > 81.0


@pytest.mark.parametrize("text, message", [
    ("no curves here", "no 'verify curve"),
    ("verify curve at 512 cached tokens (ms): 1: x, 2: 3", "must read 'N: MS"),
    ("verify curve at 512 cached tokens (ms): 0: 5, 2: 3", "sizes >= 1"),
    ("verify curve at 512 cached tokens (ms): 1: -5", "positive times"),
])
def test_unreadable_curves_are_a_clear_error(text, message):
    from tandem.bench.ceiling.report import read_curves
    from tandem.errors import TandemError

    with pytest.raises(TandemError, match=message):
        read_curves(text)
