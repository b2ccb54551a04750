"""A device's time, and a call over the network.

A device runs one call at a time, first come first served.

Devices on one host (several CPU workers of one machine) share its cores: a call that starts
while others run there is stretched by (threads asking) / cores when that exceeds 1. The
stretch is fixed when the work starts (calls already running keep theirs), an approximation of
processor sharing that conserves the host's total work well when calls overlap for most of
their length.

`remote_call` sends a request that pays half a round trip each way; the device is reserved when
the request *arrives*, so calls from near and far replicas queue in arrival order.
"""

from dataclasses import dataclass, field

from tandem.cluster.sim.events import Action, EventQueue


@dataclass(slots=True, eq=False)
class Host:
    """One machine's cores, shared by the timelines of the devices on it."""

    name: str
    cores: int
    members: list["Timeline"] = field(default_factory=list)

    def stretch(self, timeline: "Timeline", start: float) -> float:
        asking = timeline.threads + sum(t.threads for t in self.members if t is not timeline and t.busy_at(start))
        return max(1.0, asking / self.cores)


@dataclass(slots=True, eq=False)
class Timeline:
    name: str
    free_at: float = 0.0  # end of the last call
    busy_ms: float = 0.0
    threads: int = 1
    host: Host | None = None  # None: the device has its cores to itself

    def __post_init__(self):
        if self.host is not None:
            self.host.members.append(self)

    def busy_at(self, moment: float) -> bool:
        return self.free_at > moment

    def _stretched(self, start: float, duration_ms: float) -> float:
        return duration_ms if self.host is None else duration_ms * self.host.stretch(self, start)

    def reserve(self, earliest: float, duration_ms: float) -> float:
        """Occupy the device for `duration_ms` (stretched if its host is crowded) from when it
        is free; return the end time."""
        if duration_ms < 0:
            raise ValueError(f"{self.name}: a call cannot take {duration_ms} ms")
        start = max(earliest, self.free_at)
        duration_ms = self._stretched(start, duration_ms)
        self.free_at = start + duration_ms
        self.busy_ms += duration_ms
        return self.free_at

    def utilisation(self, end_ms: float) -> float:
        """Busy share of [0, end_ms]; work past the end is not counted."""
        if end_ms <= 0:
            return 0.0
        past_end = max(0.0, self.free_at - end_ms)
        return min(1.0, max(0.0, (self.busy_ms - past_end) / end_ms))


def remote_call(events: EventQueue, sent_ms: float, rtt_ms: float, device: Timeline,
                duration_ms: float, then: Action) -> None:
    """Request at `sent_ms` + rtt/2; runs `duration_ms` on `device` when it is free; the reply
    reaches the caller rtt/2 after the device finishes, and `then(reply_time)` runs."""
    half = rtt_ms / 2

    def arrive(now: float) -> None:
        events.push(device.reserve(now, duration_ms) + half, then)

    events.push(sent_ms + half, arrive)
