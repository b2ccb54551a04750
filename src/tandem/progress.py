"""Progress bars for long work, on stderr.

On a terminal a tqdm bar. Where stderr is not one (a log file, a service, `2>log`), a bar
rewritten in place would write every update into one endless line, so there it says one line
when the work starts and one when it ends ("done", or "stopped" when an exception left the
`with` block). `disable=True` is silence either way. Use it as a context manager, so that the
end line comes when the work ends.
"""

import sys
import time

from tqdm import tqdm


class ProgressBar(tqdm):
    def __init__(self, *args, disable: bool = False, **kwargs):
        kwargs.setdefault("file", sys.stderr)
        self.plain_desc: str | None = None  # set where the bar is plain lines, until the end line
        self.plain_file = kwargs["file"]
        self.plain_started = time.monotonic()
        super().__init__(*args, disable=True if disable else None, **kwargs)
        if self.disable and not disable:  # not a terminal: plain lines instead
            self.plain_desc = kwargs.get("desc") or "working"
            print(f"{self.plain_desc} ...", file=self.plain_file, flush=True)

    def __exit__(self, exc_type, exc_value, traceback):
        self._end_line("stopped after" if exc_type is not None else "done in")
        return super().__exit__(exc_type, exc_value, traceback)

    def close(self) -> None:
        self._end_line("done in")
        super().close()

    def _end_line(self, how: str) -> None:
        desc = getattr(self, "plain_desc", None)
        if desc is not None:
            self.plain_desc = None
            print(f"{desc}: {how} {time.monotonic() - self.plain_started:.0f} s", file=self.plain_file, flush=True)
