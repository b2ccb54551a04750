"""`tandem plan` at the terminal: the explanation, JSON, overrides and one-line errors."""

import json
from pathlib import Path

from tandem.cli.main import main

HETERO = str(Path(__file__).parents[3] / "examples" / "clusters" / "hetero-64.yaml")


def test_plan_explains_the_choice(capsys):
    assert main(["plan", "--cluster", HETERO]) == 0
    out = capsys.readouterr().out
    for part in ("Chosen: drafter", "Runners-up", "Naive article rule", "naive (model, k=5)", "ours / naive"):
        assert part in out


def test_plan_json_and_overrides(capsys):
    assert main(["plan", "--cluster", HETERO, "--json", "--drafter", "model", "--k", "2",
                 "--latency-target-ms", "50", "--acceptance", "model=0.8"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert (data["chosen"]["drafter"], data["chosen"]["k"]) == ("model", 2)
    assert data["latency_target_ms"] == 50 and data["acceptance"]["model"] == 0.8
    assert data["chosen"]["latency_ms"] <= 50
    assert {"scores", "article", "tuned"} <= set(data["naive"])


def test_plan_errors_are_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("workers:\n  - name: v\n    role: verfy\n    model: m\n")
    assert main(["plan", "--cluster", str(bad)]) == 2
    assert capsys.readouterr().err.strip() == (
        f"error: {bad}:3: workers[0].role: must be one of draft, verify, both (got 'verfy') (did you mean 'verify'?)")
    assert main(["plan", "--cluster", HETERO, "--acceptance", "modle=0.5"]) == 2
    assert "--acceptance knows ngram, suffix, model, hybrid (got modle)" in capsys.readouterr().err


def test_the_naive_row_says_plain_decoding_where_no_worker_can_draft_with_the_model(capsys):
    """With no draft worker the article's model k=5 falls back to plain decoding on every replica,
    yet the row read "model k=5" (its JSON said none)."""
    h200 = str(Path(__file__).parents[3] / "examples" / "clusters" / "h200-measured.yaml")
    assert main(["plan", "--cluster", h200]) == 0
    naive_row = next(line for line in capsys.readouterr().out.splitlines() if "naive (model, k=5)" in line)
    assert "none (model k=5 fell back)" in naive_row


def test_a_copy_drafters_assignments_say_it_drafts_in_the_replica_not_ngram(capsys):
    """A suffix plan's assignments said "drafter": "ngram" (the planner's marker for copies)."""
    assert main(["plan", "--cluster", HETERO, "--drafter", "suffix", "--json"]) == 0
    chosen = json.loads(capsys.readouterr().out)["chosen"]
    assert chosen["drafter"] == "suffix" and {a["drafter"] for a in chosen["assignments"]} == {"in-replica"}
