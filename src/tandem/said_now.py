"""Whether a repeated event is said in the log now: the first at once, then at most once each
interval, with how many went unsaid between (a refused accept, a client's malformed request, a
failed disk write: each may come thousands of times a second, and a line each filled the log)."""

import time
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Said:
    events: int  # events since the last line, this one included
    since_s: float | None  # seconds since the last line; None for the first


class SaidNow:
    """Not thread-safe: call `event` from one thread, or under the caller's lock."""

    def __init__(self, interval_s: float, clock=time.monotonic):
        self.interval_s = interval_s
        self.clock = clock
        self.said_at: float | None = None
        self.events = 0

    def event(self) -> Said | None:
        """Count one event; what to say where a line is due now, else None."""
        self.events += 1
        now = self.clock()
        if self.said_at is not None and now - self.said_at < self.interval_s:
            return None
        said = Said(self.events, None if self.said_at is None else now - self.said_at)
        self.said_at, self.events = now, 0
        return said
