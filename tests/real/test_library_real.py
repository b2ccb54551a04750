"""The engine from Python on a real model: the example in docs/library.md runs as written."""

import subprocess
import sys
from pathlib import Path

SMALL = "smollm2-135m-instruct"

EXAMPLE = Path(__file__).parents[2] / "examples" / "python" / "generate_from_python.py"


def test_the_library_example_runs_and_its_streamed_answer_equals_its_whole_one():
    result = subprocess.run([sys.executable, str(EXAMPLE), "--target", SMALL, "--drafter", "ngram",
                             "--max-tokens", "12", "--threads", "2"], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]  # its own assert compares streamed and whole answers
    lines = result.stdout.splitlines()
    assert lines[0].startswith("greedy: ") and "12 tokens" in lines[0]
    assert lines[1].startswith("up to the first comma: ") and "," not in lines[1].split(": ", 1)[1]
    assert [line.split(":")[0] for line in lines[2:]] == ["seed 1", "seed 2", "seed 3"]
