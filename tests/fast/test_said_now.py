"""SaidNow: the first event is said at once, then one line per interval with the count."""

from tandem.said_now import SaidNow


def test_one_line_an_interval_with_the_events_between():
    clock = [0.0]
    said_now = SaidNow(10.0, clock=lambda: clock[0])
    first = said_now.event()
    assert (first.events, first.since_s) == (1, None)
    assert [said_now.event() for _ in range(5)] == [None] * 5
    clock[0] = 12.0
    again = said_now.event()
    assert (again.events, again.since_s) == (6, 12.0)
