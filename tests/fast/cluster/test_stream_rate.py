"""Where a new stream goes: the replica it adds the most requests per second to."""

import pytest

from tandem.cluster.planning.stream_rate import Option, added_rate, option, pick, stream_rate
from tandem.models.cost import CostModel

# smollm2 in llama.cpp on one thread, as profiled (compute-bound: cost grows with the tokens)
CPU = CostModel({1: 18.75, 2: 34.4, 3: 52.0, 4: 54.5, 6: 72.6, 8: 91.8, 12: 125.9, 16: 169.7, 64: 654.5})
FLAT = CostModel({1: 20.0, 16: 24.0, 64: 40.0})  # an accelerator: more tokens cost little more


def scaled(cost: CostModel, factor: float):
    return lambda n: factor * cost.cost_ms(n)


def place(replicas: list[tuple], streams: int, prompt=150, output=50) -> list[int]:
    """Place `streams` new streams one by one; how many each replica ends with."""
    held = [0] * len(replicas)
    for _ in range(streams):
        options = [option(step(prompt), step, held[i], output) for i, (step, slots) in enumerate(replicas)
                   if held[i] < slots]
        free = [i for i, (_, slots) in enumerate(replicas) if held[i] < slots]
        held[free[pick(options)]] += 1
    return held


def test_a_stream_alone_runs_at_its_prefill_and_decode_rate():
    step = scaled(CPU, 1.0)
    assert stream_rate(step(150), step, 0, 50) == 0.0
    assert stream_rate(step(150), step, 1, 50) == pytest.approx(1000 / (step(150) + 50 * step(1)))
    assert added_rate(step(150), step, 0, 50) == stream_rate(step(150), step, 1, 50)


def test_on_cpu_curves_the_slow_replica_takes_a_stream_at_four_streams():
    """The case that decided whether the slow replica worked at all: a fast step of four streams
    (54.5 ms) against a slow step of one (56.3 ms). What a fourth stream adds on the busy fast
    replica is small next to a whole stream on the idle slow one."""
    fast, slow = scaled(CPU, 1.0), scaled(CPU, 3.0)
    assert place([(fast, 8), (slow, 8)], 4) == [3, 1]
    assert place([(slow, 8), (fast, 8)], 4) == [1, 3]  # not the order listed
    assert place([(fast, 8), (slow, 8)], 8)[1] in (1, 2)


def test_on_flat_curves_the_fast_replica_fills_first():
    fast, slow = scaled(FLAT, 1.0), scaled(FLAT, 3.0)
    assert place([(fast, 8), (slow, 8)], 8) == [8, 0]
    assert place([(fast, 8), (slow, 8)], 10) == [8, 2]  # the slow one once the fast one is full


def test_near_ties_go_to_the_cheapest_step():
    """On a perfectly linear curve one more stream adds nothing to a busy replica, fast or slow:
    the fast replica's cheaper step takes it."""
    linear = CostModel({1: 10.0, 64: 640.0})
    fast, slow = scaled(linear, 1.0), scaled(linear, 3.0)
    assert place([(slow, 8), (fast, 8)], 4) == [1, 3]


def test_pick_without_options_is_none_and_ties_keep_the_listed_order():
    assert pick([]) is None
    assert pick([Option(0.1, 1.0, 5.0), Option(0.1, 1.0, 5.0)]) == 0
