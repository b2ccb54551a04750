"""The placement rule shared by the cluster coordinator and the simulator."""

import pytest

from tandem.cluster.planning.stream_placement import Candidate, added_rate, choose, stream_rate


def linear(fixed: float, per_token: float):
    return lambda n: fixed + per_token * n


def test_a_replica_with_no_streams_serves_no_requests():
    assert stream_rate(Candidate(0, 5.0, linear(10, 1)), 0, 50) == 0.0


def test_stream_rate_counts_each_prompt_alone_and_shares_the_decode_steps():
    c = Candidate(0, prefill_ms=100.0, step_ms=linear(10, 10))
    # two streams: two prefills (200 ms) and 50 steps of two (30 ms each) per two requests
    assert stream_rate(c, 2, 50) == pytest.approx(1000 * 2 / (200 + 50 * 30))
    assert added_rate(Candidate(1, 100.0, linear(10, 10)), 50) == pytest.approx(
        stream_rate(c, 2, 50) - stream_rate(c, 1, 50))


def test_the_cheapest_step_wins_when_no_replica_idles():
    fast, slow = Candidate(2, 10.0, linear(10, 1)), Candidate(1, 30.0, linear(30, 3))
    assert choose([slow, fast], 50) == 1
    assert choose([Candidate(5, 30.0, linear(30, 3)), Candidate(1, 10.0, linear(10, 1))], 50) == 1


def test_on_a_flat_curve_the_fast_replica_fills_before_an_idle_slow_one_gets_anything():
    flat = lambda n: 10.0 + 0.01 * n  # noqa: E731
    slow = Candidate(0, 30.0, lambda n: 3 * flat(n))
    assert choose([slow, Candidate(7, 10.0, flat)], 50) == 1


def test_an_idle_replica_takes_the_stream_when_one_more_adds_less_to_the_cheapest():
    """The knife edge: the fast step of four costs less than the slow step of one."""
    fast_curve = linear(4, 6)  # step(4) = 28
    slow_curve = lambda n: 3 * fast_curve(n)  # noqa: E731 step(1) = 30
    fast, slow = Candidate(3, 50.0, fast_curve), Candidate(0, 150.0, slow_curve)
    assert fast.step_ms(4) < slow.step_ms(1)
    assert stream_rate(slow, 1, 50) > added_rate(fast, 50)
    assert choose([fast, slow], 50) == 1


def test_ties_go_to_the_first_listed_and_no_candidate_gives_none():
    same = linear(10, 1)
    assert choose([Candidate(0, 5.0, same), Candidate(0, 5.0, same)], 50) == 0
    assert choose([Candidate(1, 5.0, same), Candidate(0, 5.0, same), Candidate(0, 5.0, same)], 50) == 1
    assert choose([], 50) is None
