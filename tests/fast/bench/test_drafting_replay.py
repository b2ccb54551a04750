"""Tandem's copy drafting replayed on a recorded answer (bench/ceiling/drafting_replay.py): the engine
emits the answer exactly (every replay checks it), copies where the answer repeats its prompt
(priced between the oracle and plain decoding), drafts nothing where it shares nothing, carries
what it learned from one answer to the next, and neither the planner's curve nor its step
overhead is taught by the double's microsecond calls or the clock; the report gains its columns."""

import pytest

from tandem.bench.ceiling.oracle import oracle_rounds, plain_ms, rounds_ms
from tandem.bench.ceiling.drafting_replay import AnswerTarget, DraftingReplay, planner_curve
from tandem.models.batch_runner import BatchItem

CHEAP = lambda n, c: 10.0 + 0.5 * n  # noqa: E731  verification nearly free: a 64-token round ~4 decodes
SIZES = (1, 2, 4, 8, 16, 32, 64)


def test_the_double_emits_the_answer_where_the_cache_agrees_with_it():
    target = AnswerTarget(planner_curve(CHEAP, SIZES, 64, 1024), 20, 64, expected=[1, 2, 3, 4, 5, 6])
    first = target.forward_batch([BatchItem(0, (1, 2, 3), 1)])[0]  # [1, vocab]
    assert first.shape == (1, 20) and first[0].argmax() == 4
    rows = target.forward_batch([BatchItem(0, (4, 9, 6), 3)])[0]  # a wrong draft at 9
    assert [int(r.argmax()) for r in rows[:2]] == [5, 0]  # after 4: 5; after the wrong 9: nothing known
    target.rollback(0, 4)
    assert target.calls == [(3, 0), (3, 3)] and target.num_cached_tokens(0) == 4


def test_an_answer_copying_its_prompt_is_drafted_and_priced_between_the_oracle_and_plain():
    prompt = list(range(100, 400))  # 300 distinct tokens
    answer = [7, 8] + prompt[:250] + [9]  # two tokens of its own, most of the prompt, one more
    curve = planner_curve(CHEAP, SIZES, 64, 1024)
    replayed = DraftingReplay(CHEAP, curve).replay_ms(prompt, answer)
    oracle = rounds_ms(oracle_rounds(prompt, answer), CHEAP)
    plain = plain_ms(len(prompt), len(answer), CHEAP)
    assert oracle <= replayed < plain / 3  # copying pays on a cheap curve, never beats the oracle
    assert curve.ratio == {}  # the double's calls taught the planner's curve nothing


def test_an_answer_sharing_nothing_with_its_prompt_decodes_plainly():
    prompt = list(range(100, 160))
    answer = list(range(500, 540))  # nothing to copy, nothing repeated
    replay = DraftingReplay(CHEAP, planner_curve(CHEAP, SIZES, 64, 1024))
    assert replay.replay_ms(prompt, answer) == pytest.approx(plain_ms(len(prompt), len(answer), CHEAP))


def test_one_replay_carries_what_it_learned_from_answer_to_answer():
    """The server's engine meets a run's answers in order: a second answer repeating the first
    is copied from the shared suffix index of recent outputs, so it costs less than the first."""
    prompt = list(range(100, 130))
    answer = list(range(500, 620))  # nothing from the prompt
    replay = DraftingReplay(CHEAP, planner_curve(CHEAP, SIZES, 64, 1024))
    first = replay.replay_ms(prompt, answer)
    assert first == pytest.approx(plain_ms(len(prompt), len(answer), CHEAP))
    assert replay.replay_ms(prompt, answer) < first / 2  # the same answer again: drafted from the first


class _SlowClock:
    """perf_counter and time advancing 50 ms a read: every step looks dominated by bookkeeping."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self) -> float:
        self.now += 0.05
        return self.now

    time = perf_counter


def test_a_replay_does_not_depend_on_the_clock(monkeypatch):
    """The planner learns a step's bookkeeping from the clock in a real engine; a replay keeps
    the default, so the same answers price the same on any machine and under any load."""
    from tandem.engine import batch_engine
    from tandem.speculation.batch_depth import STEP_OVERHEAD_MS

    prompt = list(range(100, 400))
    answer = [7, 8] + prompt[:120] + [9, 10, 11] + prompt[130:250] + [12]

    def replayed() -> tuple[float, float]:
        replay = DraftingReplay(CHEAP, planner_curve(CHEAP, SIZES, 64, 1024))
        return replay.replay_ms(prompt, answer), replay.engine.planner.overhead_ms

    real = replayed()
    monkeypatch.setattr(batch_engine, "time", _SlowClock())
    assert replayed() == real and real[1] == STEP_OVERHEAD_MS


def test_a_replay_that_would_not_fit_its_context_is_a_clear_error():
    from tandem.errors import TandemError

    replay = DraftingReplay(CHEAP, planner_curve(CHEAP, SIZES, 64, 1024), context_length=100)
    with pytest.raises(TandemError, match="past the replay's context"):
        replay.replay_ms(list(range(100, 160)), list(range(200, 250)))


def test_the_report_adds_the_replayed_rate_against_the_ceiling(tmp_path):
    from tandem.bench.ceiling.report import ceilings, render

    from ceiling_support import CharTokenizer, _results

    results, level = _results(tmp_path, "def f(x): return x + 1", "fine")
    calls = []

    def replay(prompt, answer):
        calls.append(len(answer))
        return 50.0

    _, table = ceilings(results, level, CharTokenizer(), CHEAP, None, replay=replay)
    assert sorted(calls) == [4, 22] and table["edit"].replay_ms == 50.0
    lines = render(table, ["tandem-spec"])
    assert "drafting replayed tok/s" in lines[0] and lines[0].count("/ ceiling") == 2
    edit = next(line for line in lines if line.startswith("| edit |"))
    assert f"| {21 / 0.05:.1f} |" in edit  # 21 decode tokens in 50 ms
    _, plain_table = ceilings(results, level, CharTokenizer(), CHEAP, None)
    assert "replayed" not in render(plain_table, ["tandem-spec"])[0]  # no replay: no column
