"""Progress bars for long work, on stderr.

On a terminal a tqdm bar. Where stderr is not one (a log file, a service, `2>log`), a bar
rewritten in place would write every update into one endless line, so there it says one line
when the work starts, one every PLAIN_EVERY_SECONDS with the count so far and the time left (from
a timer thread, so that one long item is not silence), and one when it ends ("done", or "stopped" when an exception left the `with` block).
`disable=True` is silence either way. Use it as a context manager, so that the end line comes
when the work ends.
"""

import sys
import threading
import time

from tqdm import tqdm

PLAIN_EVERY_SECONDS = 30.0  # plain lines: how often one says how far the work is


class ProgressBar(tqdm):
    def __init__(self, *args, disable: bool = False, **kwargs):
        kwargs.setdefault("file", sys.stderr)
        self.plain_desc: str | None = None  # set where the bar is plain lines, until the end line
        self.plain_file = kwargs["file"]
        self.plain_bytes = kwargs.get("unit") == "B"  # counts bytes: said in MiB
        self.plain_started = self.plain_said = time.monotonic()
        super().__init__(*args, disable=True if disable else None, **kwargs)
        self._plain_stop = threading.Event()
        if self.disable and not disable:  # not a terminal: plain lines instead
            self.plain_desc = kwargs.get("desc") or "working"
            print(f"{self.plain_desc} ...", file=self.plain_file, flush=True)
            threading.Thread(target=self._every_period, name="tandem-progress", daemon=True).start()

    def _every_period(self) -> None:
        while not self._plain_stop.wait(PLAIN_EVERY_SECONDS / 3):
            self._say_how_far()

    def update(self, n: float = 1):
        if self.plain_desc is not None:
            self.n += n  # a disabled tqdm counts nothing itself
            self._say_how_far()
        return super().update(n)

    def __iter__(self):
        if self.plain_desc is None:
            yield from super().__iter__()
            return
        for item in self.iterable:
            yield item
            self.n += 1
            self._say_how_far()

    def __exit__(self, exc_type, exc_value, traceback):
        self._end_line("stopped after" if exc_type is not None else "done in")
        return super().__exit__(exc_type, exc_value, traceback)

    def close(self) -> None:
        self._end_line("done in")
        super().close()

    def _say_how_far(self) -> None:
        now = time.monotonic()
        if self.plain_desc is None or now - self.plain_said < PLAIN_EVERY_SECONDS:
            return
        self.plain_said = now
        elapsed = now - self.plain_started
        line = f"{self.plain_desc}: {self._amount(self.n)}" + (f"/{self._amount(self.total)}" if self.total else "")
        line += f" after {elapsed:.0f} s"
        if self.total and 0 < self.n < self.total:
            line += f", ~{elapsed * (self.total - self.n) / self.n:.0f} s left"
        print(line, file=self.plain_file, flush=True)

    def _amount(self, count: float) -> str:
        return f"{count / 2**20:.0f} MiB" if self.plain_bytes else f"{count:.0f}"

    def _end_line(self, how: str) -> None:
        if hasattr(self, "_plain_stop"):
            self._plain_stop.set()
        desc = getattr(self, "plain_desc", None)
        if desc is not None:
            self.plain_desc = None
            print(f"{desc}: {how} {time.monotonic() - self.plain_started:.0f} s", file=self.plain_file, flush=True)
