"""Progress bars for long work, on stderr.

On a terminal a tqdm bar. Where stderr is not one (a log file, a service, `2>log`), a bar
rewritten in place would write every update into one endless line, so there it says one line
when the work starts and one when it ends. `disable=True` is silence either way.
"""

import sys
import time

from tqdm import tqdm


class ProgressBar(tqdm):
    def __init__(self, *args, disable: bool = False, **kwargs):
        kwargs.setdefault("file", sys.stderr)
        self._plain: tuple[str, float] | None = None
        self._plain_file = kwargs["file"]
        super().__init__(*args, disable=True if disable else None, **kwargs)
        if self.disable and not disable:  # not a terminal: plain lines instead
            self._plain = (kwargs.get("desc") or "working", time.monotonic())
            print(f"{self._plain[0]} ...", file=self._plain_file, flush=True)

    def close(self) -> None:
        plain = getattr(self, "_plain", None)
        if plain is not None:
            self._plain = None
            print(f"{plain[0]}: done in {time.monotonic() - plain[1]:.0f} s", file=self._plain_file, flush=True)
        super().close()
