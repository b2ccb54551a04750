"""The event loop: a heap of (time in ms, order pushed, action), and a join for parallel calls.

Actions run in time order; actions due at the same time run in the order they were pushed, so a
run is a pure function of its inputs and seed. Time never runs backwards: pushing an action
before `now` is an error.
"""

import heapq
import itertools
from collections.abc import Callable

Action = Callable[[float], None]  # called with the current time in ms


class EventQueue:
    def __init__(self):
        self._heap: list[tuple[float, int, Action]] = []
        self._order = itertools.count()
        self.now = 0.0
        self.processed = 0

    def push(self, time_ms: float, action: Action) -> None:
        if time_ms < self.now:
            raise ValueError(f"event at {time_ms} ms is before the current time {self.now} ms")
        heapq.heappush(self._heap, (time_ms, next(self._order), action))

    def __len__(self) -> int:
        return len(self._heap)

    def run(self) -> float:
        """Run every action, including those pushed while running; return the last time."""
        while self._heap:
            self.now, _, action = heapq.heappop(self._heap)
            self.processed += 1
            action(self.now)
        return self.now

