"""One drafter worker's calls, batched: draft requests that arrive while the drafter is busy are
sent together in its next call.

Replicas (cluster/runtime/replica.py) ask a drafter for drafts on their own clocks. `submit` returns a ticket at once: the request goes out now if the drafter is idle, or
joins the queue that goes out, whole, as one `propose` call when the call in flight returns.
`wait(ticket)` blocks until the ticket's replies are in (in the order of its items), or raises
WorkerDiedError when the call carrying it failed. Every waiting thread waits on the call in
flight; the first to see it finish hands out the replies and sends the queue.
"""

import threading

from tandem.cluster.runtime.endpoints import Pending, WorkerDiedError
from tandem.cluster.runtime.messages import DraftItem, DraftReply
from tandem.cluster.runtime.pool import Worker


class DraftTicket:
    __slots__ = ("items", "replies", "error", "done")

    def __init__(self, items: list[DraftItem]):
        self.items = items
        self.replies: list[DraftReply] = []
        self.error: WorkerDiedError | None = None
        self.done = False


class DraftBatcher:
    def __init__(self, drafter: Worker):
        self.drafter = drafter
        self._lock = threading.Lock()
        self._queued: list[DraftTicket] = []
        self._in_flight: tuple[list[DraftTicket], Pending] | None = None
        self.calls = 0  # propose calls sent
        self.requests = 0  # tickets they carried

    def submit(self, items: list[DraftItem]) -> DraftTicket:
        ticket = DraftTicket(items)
        with self._lock:
            self._queued.append(ticket)
            if self._in_flight is None:
                self._send()
        return ticket

    def wait(self, ticket: DraftTicket) -> list[DraftReply]:
        while True:
            with self._lock:  # a ticket not done is queued or carried by the call in flight
                if ticket.done:
                    if ticket.error is not None:
                        raise ticket.error
                    return ticket.replies
                carried, pending = self._in_flight
            # Wait for the call in flight, ours or the one before ours: whoever sees it finish sends
            # the queue, so a queued ticket never waits on a thread busy elsewhere.
            try:  # outside the lock: other loops may queue meanwhile
                replies, error = pending.result(), None
            except WorkerDiedError as died:
                replies, error = None, died
            with self._lock:
                if self._in_flight is not None and self._in_flight[1] is pending:
                    self._hand_out(carried, replies, error)
                    self._in_flight = None
                    if self._queued:
                        self._send()

    def _send(self) -> None:
        """With the lock held: one call for everything queued."""
        carried, self._queued = self._queued, []
        items = [item for ticket in carried for item in ticket.items]
        self.calls += 1
        self.requests += len(carried)
        self._in_flight = (carried, self.drafter.endpoint.call("propose", items))

    @staticmethod
    def _hand_out(carried: list[DraftTicket], replies: list[DraftReply] | None, error) -> None:
        start = 0
        for ticket in carried:
            if error is None:
                ticket.replies = replies[start:start + len(ticket.items)]
                start += len(ticket.items)
            ticket.error = error
            ticket.done = True
