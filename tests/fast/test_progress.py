"""Progress bars (progress.py): where stderr is not a terminal (a log, a service) a bar says one
line when it starts, one every PLAIN_EVERY_SECONDS with how far it is, and one when it ends
("done", or "stopped" after an exception), not an endless line of in-place updates; disabled,
nothing; the items pass through either way."""

import os
import io

import pytest

from tandem import progress
from tandem.progress import ProgressBar


def test_off_a_terminal_a_bar_is_two_plain_lines():
    log = io.StringIO()
    with ProgressBar(total=500, desc="profiling x", file=log) as bar:
        for _ in range(500):
            bar.update()
    lines = log.getvalue().splitlines()
    assert lines[0] == "profiling x ..." and lines[1].startswith("profiling x: done in ")
    assert len(lines) == 2 and "\r" not in log.getvalue()


def test_a_bar_left_by_an_exception_says_it_stopped_and_a_disabled_one_is_silent():
    log = io.StringIO()
    with pytest.raises(KeyboardInterrupt), ProgressBar(range(3), desc="bench", file=log) as items:
        for _ in items:
            raise KeyboardInterrupt
    assert log.getvalue().splitlines()[1].startswith("bench: stopped after ")
    quiet = io.StringIO()
    with ProgressBar(range(3), desc="warm-up", file=quiet, disable=True) as items:
        assert list(items) == [0, 1, 2]
    assert quiet.getvalue() == ""


@pytest.mark.parametrize("iterated", [False, True])
def test_off_a_terminal_long_work_says_how_far_it_is(monkeypatch, iterated):
    """`tandem bench 2>log` was silent between its first and last line for the whole run."""
    clock = iter(range(0, 10_000, 10))  # every read 10 s later
    monkeypatch.setattr(progress.time, "monotonic", lambda: float(next(clock)))
    log = io.StringIO()
    if iterated:
        with ProgressBar(range(8), desc="bench", file=log) as items:
            assert list(items) == list(range(8))
    else:
        with ProgressBar(total=8, desc="bench", file=log) as bar:
            for _ in range(8):
                bar.update()
    lines = log.getvalue().splitlines()
    middle = lines[1:-1]
    assert lines[0] == "bench ..." and lines[-1].startswith("bench: done in ")
    assert middle and all(line.startswith("bench: ") and "/8 after " in line for line in middle)
    assert "s left" in middle[0]
    assert len(middle) < 8  # not a line per update


def test_off_a_terminal_one_long_item_is_not_silence(monkeypatch):
    """bench-step's fill of its slots is one item of minutes: nothing was said between its first
    and last line, as lines came only with updates."""
    import time

    monkeypatch.setattr(progress, "PLAIN_EVERY_SECONDS", 0.15)
    log = io.StringIO()
    with ProgressBar(total=1, desc="filling", file=log) as bar:
        time.sleep(0.6)
        bar.update()
    time.sleep(0.2)  # nothing more once it ended
    lines = log.getvalue().splitlines()
    assert any(line.startswith("filling: 0/1 after ") for line in lines[1:-1]), lines
    assert lines[-1].startswith("filling: done in ")


def test_libraries_bars_are_silent_in_a_log_and_tandems_say_plain_lines():
    """`tandem ... 2>log`: transformers' own tqdm bars (converting a GGUF, loading weights) wrote
    carriage-return redraws into the log; the CLI silences them there, not Tandem's plain lines."""
    import subprocess
    import sys

    script = ("import tandem.cli.main\n"
              "from tqdm.auto import tqdm\n"
              "from tandem.progress import ProgressBar\n"
              "for _ in tqdm(range(3), desc='a library bar'): pass\n"
              "with ProgressBar(range(3), desc='a tandem bar') as bar:\n"
              "    for _ in bar: pass\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                          env={k: v for k, v in os.environ.items() if k != "TQDM_DISABLE"})
    assert done.returncode == 0, done.stderr
    assert "a library bar" not in done.stderr and "\r" not in done.stderr, done.stderr
    assert "a tandem bar ..." in done.stderr, done.stderr
