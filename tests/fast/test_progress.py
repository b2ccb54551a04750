"""Progress bars (progress.py): where stderr is not a terminal (a log, a service) a bar says one
line when it starts and one when it ends, not an endless line of in-place updates; disabled,
nothing; the items pass through either way."""

import io

from tandem.progress import ProgressBar


def test_off_a_terminal_a_bar_is_two_plain_lines():
    log = io.StringIO()
    with ProgressBar(total=500, desc="profiling x", file=log) as bar:
        for _ in range(500):
            bar.update()
    assert log.getvalue().splitlines()[0] == "profiling x ..."
    assert log.getvalue().splitlines()[1].startswith("profiling x: done in ")
    assert len(log.getvalue().splitlines()) == 2 and "\r" not in log.getvalue()


def test_a_disabled_bar_is_silent_and_items_pass_through():
    log = io.StringIO()
    assert list(ProgressBar(range(3), desc="warm-up", file=log, disable=True)) == [0, 1, 2]
    assert list(ProgressBar(range(3), desc="bench", file=log)) == [0, 1, 2]
    assert log.getvalue().splitlines() == ["bench ...", "bench: done in 0 s"]
