"""scripts/depth_bounds.py's depth rules on a replay: in hindsight no round drafts a token the
target rejects and the answer costs no more than Tandem's own rule; per source, a source whose
copies were all rejected is not drafted, while one whose copies held is; a draft model that
writes the answer decides as hindsight does, one that never agrees cuts every draft; by token
history, a round stops before a token the target kept rejecting in this answer."""

import importlib.util
from pathlib import Path

from tandem.bench.ceiling.drafting_replay import DraftingReplay, planner_curve
from tandem.bench.ceiling.oracle import oracle_rounds, rounds_ms

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "depth_bounds.py"
spec = importlib.util.spec_from_file_location("depth_bounds", SCRIPT)
depth_bounds = importlib.util.module_from_spec(spec)
spec.loader.exec_module(depth_bounds)

CHEAP = lambda n, c: 10.0 + 0.5 * n  # noqa: E731  verification nearly free
SIZES = (1, 2, 4, 8, 16, 32, 64)
PROMPT = list(range(100, 400))
# copies of the prompt broken by tokens of its own: each break rejects whatever was drafted past it
ANSWER = [7, 8] + PROMPT[:60] + [9, 10, 11] + PROMPT[70:130] + [12] + PROMPT[140:200] + [13]


def replayed(rule: str, by_source: dict) -> tuple[float, list[tuple[int, int]]]:
    replay = DraftingReplay(CHEAP, planner_curve(CHEAP, SIZES, 64, 1024))
    depth_bounds.DepthRule(replay, rule, by_source)
    rounds = []
    spent = replay.replay_ms(PROMPT, ANSWER, on_step=lambda _, report: rounds.extend(
        (r.k, r.accepted) for r in (report.rounds if report else ())))
    return spent, rounds


def test_hindsight_drafts_only_what_is_accepted_and_costs_no_more():
    by_source: dict = {}
    tandem, tandem_rounds = replayed("replayed", by_source)
    hindsight, rounds = replayed("hindsight", {})
    assert any(k > accepted for k, accepted in tandem_rounds)  # Tandem's own rule drafted past a break
    assert all(k == accepted for k, accepted in rounds) and any(k for k, _ in rounds)
    assert rounds_ms(oracle_rounds(PROMPT, ANSWER), CHEAP) <= hindsight <= tandem
    assert by_source and all(isinstance(n, int) for counts in by_source.values() for n in counts)


def test_per_source_drafts_the_sources_that_held_and_not_the_others():
    replay = DraftingReplay(CHEAP, planner_curve(CHEAP, SIZES, 64, 1024))
    rule = depth_bounds.DepthRule(replay, "per source", {"good": [40] * 10, "bad": [0] * 10})
    assert rule._best_for_source("bad", 63) == 0
    assert rule._best_for_source("good", 63) == 40  # deeper would only pay for rejected tokens
    assert rule._best_for_source("never seen", 63) == 0


def test_a_draft_model_that_writes_the_answer_decides_as_hindsight_and_one_that_never_agrees_cuts_every_draft():
    expected = PROMPT + ANSWER
    perfect = expected[1:] + [0]  # after expected[:i + 1]: expected[i + 1]
    replay = DraftingReplay(CHEAP, planner_curve(CHEAP, SIZES, 64, 1024))
    rule = depth_bounds.DepthRule(replay, "draft decides", {})
    rule.draft_next = perfect
    rounds = []
    decided = replay.replay_ms(PROMPT, ANSWER, on_step=lambda _, report: rounds.extend(
        (r.k, r.accepted) for r in (report.rounds if report else ())))
    assert all(k == accepted for k, accepted in rounds) and rule.check_ms > 0
    assert decided == replayed("hindsight", {})[0]

    replay = DraftingReplay(CHEAP, planner_curve(CHEAP, SIZES, 64, 1024))
    rule = depth_bounds.DepthRule(replay, "draft checks", {})
    rule.draft_next = [-1] * len(expected)  # never a token of the answer
    rounds = []
    replay.replay_ms(PROMPT, ANSWER, on_step=lambda _, report: rounds.extend(
        r.k for r in (report.rounds if report else ())))
    assert not any(rounds) and rule.check_ms > 0  # the planner drafted, the checks cut it to nothing


def test_token_history_stops_before_a_token_the_target_keeps_rejecting():
    replay = DraftingReplay(CHEAP, planner_curve(CHEAP, SIZES, 64, 1024))
    rule = depth_bounds.DepthRule(replay, "token history", {})
    copy = tuple(range(1000, 1040))
    assert rule._by_token_history(copy, 39, 0.9) > 3  # nothing known: as deep as the source's rate pays
    for _ in range(20):
        rule._record_tokens(copy[:6], 3)  # drafted six, the fourth (1003) rejected each time
    assert rule.token_record[1003] == [0, 20] and rule.token_record[1000] == [20, 20]
    assert rule.token_record[1004] == [0, 0]  # never reached: nothing learned
    assert rule._by_token_history(copy, 39, 0.9) == 3
    rule.new_answer([])
    assert rule._by_token_history(copy, 39, 0.9) > 3  # another answer starts from its source again


def test_token_history_replays_the_answer():
    spent, rounds = replayed("token history", {})
    assert spent > 0 and any(k for k, _ in rounds)
