"""The cluster simulator (cluster/sim): event loop, the one-sequence closed form, and the
directions a cluster planner relies on (replicas, round trips), all in well under a second
each."""

import dataclasses

import numpy as np
import pytest

from tandem.cluster.sim import (
    Device,
    FixedLength,
    GeometricAcceptance,
    Network,
    SimDepth,
    SimDrafter,
    Simulation,
    Verifier,
    Workload,
    simulate,
)
from tandem.cluster.sim.events import EventQueue
from tandem.cluster.sim.lengths import RecordedLengths
from tandem.cluster.sim.planning import make_planner
from tandem.cluster.sim.reference import OneSequenceCase, closed_form_tokens_per_s, reference_tokens_per_s
from tandem.cluster.sim.timeline import Host, Timeline
from tandem.cluster.sim.validation import MeasuredRun, compare_with_measurement
from tandem.models.cost import CostModel
from tandem.speculation.batch_depth import DraftCandidate

TARGET = CostModel({1: 20.0, 2: 21.0, 4: 23.0, 8: 27.0, 64: 60.0, 512: 300.0})  # a slow-ish fused device
DRAFT = CostModel({1: 3.0, 8: 4.0, 64: 10.0, 512: 40.0})


def one_sequence(alpha=0.7, k=4, rtt=10.0, requests=10, output=400, seed=1) -> Simulation:
    return Simulation(
        verifiers=(Verifier(Device("v", TARGET, group="a"), "m", max_batch=1),),
        drafters=(SimDrafter("m", GeometricAcceptance(alpha), Device("d", DRAFT, group="b")),),
        workload=Workload(requests, FixedLength(16), FixedLength(output), concurrency=1),
        network=Network(default_ms=rtt), depth=SimDepth(fixed_k=k), seed=seed)


def cluster(replicas=1, concurrency=32, requests=64, rtt=0.0, k=None, output=64, seed=0, **kw) -> Simulation:
    verifiers = tuple(Verifier(Device(f"v{i}", TARGET, group="a"), "m", max_batch=16) for i in range(replicas))
    drafters = (SimDrafter("m", GeometricAcceptance(0.7), Device("d", DRAFT, group="b")),)
    return Simulation(verifiers, Workload(requests, FixedLength(4), FixedLength(output), concurrency=concurrency),
                      drafters, Network(default_ms=rtt), SimDepth(fixed_k=k), seed=seed, **kw)


# -- prompt pricing ------------------------------------------------------------------------------


def test_a_prompt_curve_prices_prefill_and_catch_up_and_one_token_steps_stay_on_the_curve():
    prompts = CostModel({1: 20.0, 64: 40.0, 512: 150.0})  # logits at the last token only
    fused = Device("v", TARGET, prompt_cost=prompts)
    assert fused.prompt_ms([512]) == pytest.approx(TARGET.cost_ms(1) + 150.0 - 20.0)
    assert fused.prompt_ms([1, 1, 1]) == fused.forward_ms([1, 1, 1])  # a draft step: a logits row each
    assert fused.prompt_ms([512]) < fused.forward_ms([512])
    assert Device("v", TARGET).prompt_ms([512]) == Device("v", TARGET).forward_ms([512])  # no prompt curve
    serial = Device("s", TARGET, fused=False, prompt_cost=prompts)
    assert serial.prompt_ms([64, 64]) == pytest.approx(2 * (TARGET.cost_ms(1) + 40.0 - 20.0))


def test_prompt_tokens_beside_rounds_cost_the_whole_call_less_the_logits_rows_they_do_not_ask():
    from tandem.cluster.sim.planning import verify_ms

    prompts = CostModel({1: 20.0, 64: 40.0, 512: 150.0})
    fused = Device("v", TARGET, per_sequence_ms=2.0, prompt_cost=prompts, logits_row_ms=0.25)
    assert verify_ms(fused, [0, 3], [16]) == pytest.approx(fused.forward_ms([1, 4, 16]) - 16 * 0.25)  # one forward
    assert verify_ms(fused, [0, 3], [16, 4]) == pytest.approx(fused.forward_ms([1, 4, 16, 4]) - 20 * 0.25)
    rows_priced = dataclasses.replace(fused, logits_row_ms=0.0)  # a device without the figure: every row paid
    assert verify_ms(rows_priced, [0, 3], [16]) == pytest.approx(fused.forward_ms([1, 4, 16]))
    assert verify_ms(fused, [], [16, 40]) == pytest.approx(fused.prompt_ms([16, 40]))  # prompts alone
    assert verify_ms(fused, [2], []) == fused.forward_ms([3])
    serial = Device("s", TARGET, fused=False, prompt_cost=prompts)
    assert verify_ms(serial, [0], [16]) == pytest.approx(serial.forward_ms([1]) + serial.prompt_ms([16]))


def test_a_cheaper_prompt_curve_brings_first_tokens_sooner():
    base = one_sequence(requests=4, output=32)
    cheap = CostModel({1: 20.0, 16: 21.0})
    verifier = dataclasses.replace(base.verifiers[0], device=dataclasses.replace(base.verifiers[0].device,
                                                                                   prompt_cost=cheap))
    drafter = dataclasses.replace(base.drafters[0], device=dataclasses.replace(base.drafters[0].device,
                                                                                 prompt_cost=CostModel({1: 3.0, 16: 3.1})))
    faster = dataclasses.replace(base, verifiers=(verifier,), drafters=(drafter,))
    assert simulate(faster).ttft_ms["p50"] < simulate(base).ttft_ms["p50"]


# -- the event loop ------------------------------------------------------------------------------

def test_events_run_in_time_order_and_ties_in_push_order():
    events, seen = EventQueue(), []
    for t, name in [(5.0, "c"), (1.0, "a"), (5.0, "d"), (3.0, "b")]:
        events.push(t, lambda now, name=name: seen.append((now, name)))
    events.push(0.0, lambda now: events.push(now + 4.0, lambda later: seen.append((later, "pushed"))))
    assert events.run() == 5.0
    assert seen == [(1.0, "a"), (3.0, "b"), (4.0, "pushed"), (5.0, "c"), (5.0, "d")]
    with pytest.raises(ValueError):
        events.push(4.0, lambda now: None)


def test_timeline_queues_calls():
    device = Timeline("d")
    assert device.reserve(0.0, 10.0) == 10.0
    assert device.reserve(5.0, 10.0) == 20.0  # queued behind the first call
    assert device.reserve(25.0, 5.0) == 30.0  # starts when it arrives: the device was free
    assert device.busy_ms == pytest.approx(10 + 10 + 5)
    assert device.utilisation(30.0) == pytest.approx(25 / 30)


def test_calls_that_overlap_on_a_crowded_host_stretch():
    host = Host("cpu", cores=2)
    a, b, c = (Timeline(name, threads=1, host=host) for name in "abc")
    alone = Timeline("elsewhere")
    assert a.reserve(0.0, 10.0) == 10.0  # alone on the host
    assert b.reserve(0.0, 10.0) == 10.0  # two threads, two cores
    assert c.reserve(5.0, 10.0) == pytest.approx(20.0)  # three threads on two cores: 1.5x
    assert alone.reserve(5.0, 10.0) == 15.0  # a device on no host is never slowed
    assert a.reserve(30.0, 10.0) == 40.0  # the host is quiet again


def test_a_shared_host_slows_replicas_that_would_run_side_by_side():
    def two_replicas(**kw):
        verifiers = tuple(Verifier(Device(f"v{i}", TARGET, group="a", host="cpu"), None, max_batch=4) for i in range(2))
        return Simulation(verifiers, Workload(32, FixedLength(4), FixedLength(32), concurrency=8), **kw)

    own_cores = simulate(two_replicas()).throughput_tok_s
    one_core = simulate(two_replicas(host_cores=(("cpu", 1),))).throughput_tok_s
    assert simulate(two_replicas(host_cores=(("cpu", 2),))).throughput_tok_s == pytest.approx(own_cores)
    assert one_core == pytest.approx(own_cores / 2, rel=0.1)
    with pytest.raises(ValueError):
        two_replicas(host_cores=(("cpu", 0),))


# -- against the slow reference and the closed form ----------------------------------------------

def test_one_sequence_matches_the_reference_and_the_closed_form():
    case = OneSequenceCase(TARGET, DRAFT, k=4, alpha=0.7, rtt_ms=10.0, overhead_ms=1.0)
    closed = closed_form_tokens_per_s(case)
    simulated = [simulate(one_sequence(seed=s)).throughput_tok_s for s in range(3)]
    referenced = [reference_tokens_per_s(case, [16] * 10, [400] * 10, seed=s) for s in range(3)]
    assert np.mean(simulated) == pytest.approx(closed, rel=0.03)
    assert np.mean(referenced) == pytest.approx(closed, rel=0.03)


def test_one_sequence_without_acceptance_is_exact():
    case = OneSequenceCase(TARGET, DRAFT, k=4, alpha=0.0, rtt_ms=10.0, overhead_ms=1.0)
    result = simulate(one_sequence(alpha=0.0))
    assert result.throughput_tok_s == pytest.approx(closed_form_tokens_per_s(case), rel=0.005)
    assert result.throughput_tok_s == pytest.approx(reference_tokens_per_s(case, [16] * 10, [400] * 10), rel=0.002)
    assert result.acceptance == 0.0 and result.mean_k == pytest.approx(4.0, abs=0.05)


def test_the_memoised_planner_plans_like_the_engines():
    device, drafter = Device("v", TARGET), SimDrafter("m", GeometricAcceptance(0.7), Device("d", DRAFT))
    memo = make_planner(device, drafter, SimDepth(), overhead_ms=6.0)
    engine = make_planner(device, drafter, SimDepth(), overhead_ms=6.0, memo=False)
    rng = np.random.default_rng(0)
    for _ in range(40):
        batch = [DraftCandidate("model", int(rng.integers(0, 17)), True, float(rng.choice([0.0, 2.0])))
                 for _ in range(int(rng.integers(1, 12)))]
        assert memo.plan(batch) == engine.plan(batch)
        accepted = int(rng.integers(0, 5))
        for planner in (memo, engine):
            planner.record("model", 4, accepted)


# -- directions ----------------------------------------------------------------------------------

def test_more_verifier_replicas_give_more_throughput_under_load():
    one, four = simulate(cluster(replicas=1)), simulate(cluster(replicas=4))
    assert four.throughput_tok_s > 2.0 * one.throughput_tok_s
    assert four.latency_ms["p50"] < one.latency_ms["p50"]


def test_a_far_drafter_adds_latency_and_the_planner_drafts_less():
    """Each model draft call pays the round trip between replica and drafter: at a fixed k every
    round is slower; with auto k the planner drafts only where that still pays."""
    near, far = simulate(cluster(k=3)), simulate(cluster(k=3, rtt=40.0))
    assert far.latency_ms["p50"] > near.latency_ms["p50"] + 40.0
    auto_near, auto_far = simulate(cluster(concurrency=4)), simulate(cluster(concurrency=4, rtt=40.0))
    assert auto_far.mean_k < auto_near.mean_k
    fixed = [simulate(cluster(concurrency=4, k=k, rtt=40.0)).throughput_tok_s for k in (0, 1, 3, 5)]
    assert auto_far.throughput_tok_s >= 0.99 * max(fixed)  # it found what pays across the trip


def test_a_far_router_delays_tokens_but_not_the_replicas_steps():
    """The router relays: its round trip to a replica is paid once per request and once per
    streamed round, never inside the replica's step."""
    near = cluster(k=2, concurrency=4, requests=8)
    far = dataclasses.replace(near, network=Network(links=(("edge", "a", 100.0),)), router_group="edge")
    near_run, far_run = simulate(near), simulate(far)
    assert far_run.ttft_ms["p50"] == pytest.approx(near_run.ttft_ms["p50"] + 100.0, abs=15.0)
    assert far_run.itl_ms["p50"] == pytest.approx(near_run.itl_ms["p50"], rel=0.05)


def test_new_sequences_go_where_they_finish_first():
    slow = Verifier(Device("slow", CostModel({n: 3 * ms for n, ms in TARGET.latency_ms.items()}), group="a"), "m", 16)
    base = cluster(replicas=1, concurrency=8, k=2)
    light = dataclasses.replace(base, verifiers=(slow,) + base.verifiers)
    assert simulate(light).utilisation["slow"] == 0.0  # the fast replica's batch has room for all
    heavy = dataclasses.replace(light, workload=Workload(64, FixedLength(4), FixedLength(64), concurrency=24))
    assert simulate(heavy).utilisation["slow"] > 0.2  # once it is full, the slow one helps


def test_steady_throughput_leaves_out_the_tail():
    slow = Verifier(Device("slow", CostModel({n: 8 * ms for n, ms in TARGET.latency_ms.items()}), group="a"), "m", 16)
    base = cluster(replicas=1, concurrency=24, requests=48, k=2)
    result = simulate(dataclasses.replace(base, verifiers=base.verifiers + (slow,)))
    assert result.steady_tok_s > 1.1 * result.throughput_tok_s  # the slow replica finishes last (moves shorten it)
    assert simulate(cluster(concurrency=8, requests=8)).steady_tok_s is None  # one wave: no full-load span


def slow_and_fast(concurrency=8, requests=8, output=64) -> Simulation:
    slow = Verifier(Device("slow", CostModel({n: 3 * ms for n, ms in TARGET.latency_ms.items()}), group="a"), None, 4)
    fast = Verifier(Device("fast", TARGET, group="a"), None, 4)
    return Simulation((fast, slow), Workload(requests, FixedLength(4), FixedLength(output), concurrency=concurrency))


def test_at_a_runs_tail_the_router_moves_the_slow_replicas_streams_to_the_idle_fast_one(monkeypatch):
    import tandem.cluster.sim.simulator as simulator

    sim = slow_and_fast()
    moved = simulate(sim)
    assert moved.moves > 0
    assert moved.output_tokens == 8 * 64  # a moved stream neither loses nor repeats a token
    monkeypatch.setattr(simulator, "choose_moves", lambda replicas: [])
    stayed = simulate(sim)
    assert stayed.moves == 0
    assert moved.duration_s < 0.9 * stayed.duration_s  # the slow replica's last streams no longer end the run


def test_moves_follow_the_routers_rule():
    from tandem.cluster.sim.moves import choose_moves
    from tandem.cluster.sim.planning import make_planner
    from tandem.cluster.sim.state import Replica, SimSequence
    from tandem.cluster.sim.timeline import Timeline

    sim = slow_and_fast()
    fast, slow = (Replica(i, v, Timeline(v.device.name), make_planner(v.device, None, SimDepth(), 1.0))
                  for i, v in enumerate(sim.verifiers))

    def stream(i, remaining, unprefilled=0):
        seq = SimSequence(i, 0.0, 4, 64, emitted=64 - remaining)
        seq.unprefilled = unprefilled
        return seq

    slow.running = [stream(0, 40), stream(1, 50), stream(2, 1), stream(3, 60, unprefilled=3)]
    [(seq, target)] = choose_moves([fast, slow])
    assert (seq.request_id, target) == (1, fast)  # the longest way to go among those decoding
    seq.moving_to = fast
    fast.incoming.append(seq)
    assert [s.request_id for s, _ in choose_moves([fast, slow])] == [0]  # slow still holds 4 against 1
    slow.running = [stream(2, 1), stream(3, 60, unprefilled=3)]
    fast.incoming = []
    assert choose_moves([fast, slow]) == []  # one token to go, or still prefilling: they stay
    fast.running, slow.running = [stream(9, 60)], [stream(0, 40)]
    assert choose_moves([fast, slow]) == []  # never from a replica holding as few


def test_one_sequences_short_catch_up_is_priced_a_token_per_call_where_that_is_cheaper():
    from tandem.cluster.sim.planning import draft_call_ms

    tiled = Device("d", CostModel({1: 10.0, 2: 35.0, 4: 45.0, 8: 60.0}))  # lockstep.py feeds 2 or 4 singly
    assert draft_call_ms(tiled, [2], [1]) == pytest.approx(2 * 10.0)
    assert draft_call_ms(tiled, [8], [1]) == pytest.approx(60.0)
    assert draft_call_ms(tiled, [2, 2], [1, 1]) == pytest.approx(tiled.prompt_ms([2, 2]))  # a batch: one call


def test_a_finished_streams_client_sends_its_next_request_before_the_router_looks_for_moves():
    """bench-cluster's driver adds a closed-loop client's next request before the router's next
    step, which places what waits and only then looks for moves: a replica whose last stream
    just ended is not empty to it. (Moving into that instant's gap took the slow replica's
    stream and left the slow one idle: 20 moves in a replay of a run that made 1.)"""
    from collections import deque

    from tandem.cluster.sim.simulator import Simulator
    from tandem.cluster.sim.state import SimSequence

    simulator = Simulator(slow_and_fast(concurrency=2, requests=4))
    fast, slow = simulator.replicas
    decoding = SimSequence(1, 0.0, 4, 64, emitted=10)
    slow.running = [decoding]
    simulator.in_flight, simulator.openers = 2, deque([2, 3])
    simulator._finished(SimSequence(0, 0.0, 4, 64, emitted=64), 0.0)  # it ended on fast, now empty
    assert decoding.moving_to is None and not fast.incoming
    assert [s.request_id for s in fast.sequences] == [2]  # the client's next request took it


def test_the_router_looks_for_moves_every_step_not_only_when_requests_come_and_go():
    """At a run's tail the fast replica's last stream ends while the slow one still scores its
    last prompt; nothing arrives after. Once that prompt is in, the router (which looks every
    step) moves the stream to the idle fast replica."""
    slow = Verifier(Device("slow", CostModel({n: 3 * ms for n, ms in TARGET.latency_ms.items()}), group="a"), None, 4)
    fast = Verifier(Device("fast", TARGET, group="a"), None, 1)  # one slot: the second request goes slow
    sim = Simulation((fast, slow), Workload(2, FixedLength(512), FixedLength(8), concurrency=2))
    result = simulate(sim)
    assert result.moves == 1
    assert result.output_tokens == 2 * 8


def test_the_router_knows_a_requests_cap_not_where_its_answer_stops():
    """A stream whose answer stops after one more token, on a request that may take 60 more:
    the router (Routed.room) and the engine's planner see the 60, so the simulator does too."""
    from tandem.cluster.sim.moves import choose_moves
    from tandem.cluster.sim.planning import candidate, make_planner
    from tandem.cluster.sim.state import Replica, SimSequence
    from tandem.cluster.sim.timeline import Timeline

    sim = slow_and_fast()
    fast, slow = (Replica(i, v, Timeline(v.device.name), make_planner(v.device, None, SimDepth(), 1.0))
                  for i, v in enumerate(sim.verifiers))
    stops_soon = SimSequence(0, 0.0, 4, 5, emitted=4, requested=64)
    assert (stops_soon.remaining, stops_soon.room) == (1, 60)
    slow.running = [stops_soon, SimSequence(1, 0.0, 4, 64, emitted=54)]
    [(seq, target)] = choose_moves([fast, slow])
    assert (seq.request_id, target) == (0, fast)  # 60 to go as the router sees it, against 10
    assert candidate(stops_soon, SimDrafter("ngram", GeometricAcceptance(0.5)), SimDepth()).cap == SimDepth().k_max
    ends = simulate(dataclasses.replace(sim, workload=Workload(8, FixedLength(4), FixedLength(20), concurrency=8,
                                                               requested_tokens=64)))
    assert ends.output_tokens == 8 * 20  # answers still stop where they stop


def test_utilisation_is_a_share_of_the_run():
    result = simulate(cluster(replicas=3, concurrency=24, rtt=20.0))
    assert set(result.utilisation) == {"v0", "v1", "v2", "d"}
    assert all(0.0 <= u <= 1.0 for u in result.utilisation.values())
    assert max(result.utilisation.values()) > 0.2


def test_same_seed_same_run_other_seed_other_run():
    runs = [simulate(dataclasses.replace(cluster(replicas=2), seed=s)) for s in (5, 5, 6)]
    assert runs[0] == runs[1]
    assert runs[0] != runs[2]


def test_poisson_arrivals_at_low_load_are_served_at_their_rate():
    poisson = Workload(60, FixedLength(8), FixedLength(32), rate_per_s=2.0)
    sim = dataclasses.replace(cluster(replicas=2), workload=poisson)
    result = simulate(sim)
    assert result.requests == 60
    assert result.requests_per_s == pytest.approx(2.0, rel=0.35)


# -- configuration and validation ------------------------------------------------------------------

def test_a_verifier_must_name_a_defined_drafter():
    with pytest.raises(ValueError, match="not defined"):
        Simulation((Verifier(Device("v", TARGET), "missing"),),
                   Workload(1, FixedLength(4), FixedLength(4), concurrency=1))
    with pytest.raises(ValueError, match="exactly one"):
        Workload(1, FixedLength(4), FixedLength(4), rate_per_s=1.0, concurrency=1)


def test_compare_with_measurement_gives_relative_errors():
    result = simulate(one_sequence(requests=2, output=50))
    measured = {"throughput_tok_s": result.throughput_tok_s * 1.1, "e2e_s_p50": result.latency_ms["p50"] / 1000}
    report = compare_with_measurement(result, measured)
    assert report["figures"]["throughput_tok_s"]["relative_error"] == pytest.approx(1 / 1.1 - 1, abs=1e-3)
    assert report["figures"]["latency_ms_p50"]["relative_error"] == pytest.approx(0.0, abs=1e-6)
    assert report["within_tolerance"]
    far = MeasuredRun(result.throughput_tok_s * 2, result.latency_ms["p50"])
    assert not compare_with_measurement(result, far)["within_tolerance"]


def test_recorded_prompt_lengths_replay_a_measured_run_in_order():
    from tandem.cluster.sim.simulator import draw_requests

    workload = Workload(5, RecordedLengths((100, 7, 300)), FixedLength(20), concurrency=2)
    assert [prompt for _, prompt, _ in draw_requests(workload, seed=3)] == [100, 7, 300, 100, 7]
    with pytest.raises(ValueError):
        RecordedLengths(())


# -- prompt caches and chunks --------------------------------------------------------------------


def prefix_cluster(replicas=1, prefixes=((0, 40),), requests=6, concurrency=1, relay_ms=0.0) -> Simulation:
    verifiers = tuple(Verifier(Device(f"v{i}", TARGET), max_batch=4) for i in range(replicas))
    return Simulation(verifiers, Workload(requests, FixedLength(100), FixedLength(8), concurrency=concurrency,
                                          prompt_prefixes=prefixes), network=Network(same_group_ms=2 * relay_ms))


def test_a_shared_opening_is_scored_once_per_replica_then_reused():
    alone = simulate(prefix_cluster(prefixes=()))
    shared = simulate(prefix_cluster())
    assert alone.reused_tokens == 0
    assert shared.reused_tokens == 5 * 40  # all but the first request find it
    assert shared.scored_tokens == alone.scored_tokens - 5 * 40
    assert shared.ttft_ms["p50"] < alone.ttft_ms["p50"]
    two = simulate(prefix_cluster(replicas=2, concurrency=2))
    assert two.reused_tokens == 4 * 40  # each replica scores it once
    # one opening per group: two alternating groups, each scored once
    assert simulate(prefix_cluster(prefixes=((0, 40), (1, 40)))).reused_tokens == 4 * 40
    # a prompt's own opening shared with none (None), or shorter than the engine would reuse
    assert simulate(prefix_cluster(prefixes=((0, 40), None))).reused_tokens == 2 * 40
    assert simulate(prefix_cluster(prefixes=((0, 10),))).reused_tokens == 0
    with pytest.raises(ValueError, match="prefix"):
        Workload(1, FixedLength(4), FixedLength(4), concurrency=1, prompt_prefixes=((0, -1),))
    # an opening as long as the prompt (or longer) is all of it but the last token, as the engine
    # scores a prompt's last token always: it reused nothing and ran slower than no sharing
    for tokens in (100, 10_000):
        assert simulate(prefix_cluster(prefixes=((0, tokens),))).reused_tokens == 5 * 99


def test_prompts_arriving_together_wait_for_the_one_prefilling_their_opening():
    """As the engine's admission: users arriving together behind one system prompt prefill it
    once; one whose opening nobody is prefilling goes ahead."""
    sim = prefix_cluster(prefixes=((0, 60), (0, 60), (1, 60)), requests=3, concurrency=3, relay_ms=5.0)
    result = simulate(sim)  # all three reach the replica at once, 5 ms after they are sent
    assert result.reused_tokens == 60  # the second request waited and reused; the third had its own


def test_the_devices_floor_chunk_sizes_prompt_chunks_beside_streams():
    """The engine holds a step's prompt chunks beside decoding streams down to its floor chunk;
    a simulated device with a larger floor scores larger chunks there: longer gaps."""
    curve = CostModel({n: 10.0 * n for n in (1, 2, 4, 8, 16, 32, 64, 512)})  # CPU-like: proportional

    outputs = RecordedLengths((200,) * 7 + (10,))  # one client's short answers join seven long streams

    def run(floor):
        device = Device("v", curve, prefill_floor=floor)
        return simulate(Simulation((Verifier(device, max_batch=8),),
                                   Workload(24, FixedLength(300), outputs, concurrency=8)))

    small, large = run(8), run(64)
    assert large.itl_ms["p99"] > 1.5 * small.itl_ms["p99"]  # the streams wait on larger chunks
    assert large.ttft_ms["p50"] < small.ttft_ms["p50"]  # and prompts go in sooner
    assert large.scored_tokens == small.scored_tokens  # the same work, chunked differently
    with pytest.raises(ValueError, match="prefill_floor"):
        Device("v", curve, prefill_floor=0)


# -- conversations -------------------------------------------------------------------------------


def chat_cluster(replicas=2, conversations=((300, 20, 20),) * 4, concurrency=2, output=16) -> Simulation:
    verifiers = tuple(Verifier(Device(f"v{i}", TARGET), max_batch=4) for i in range(replicas))
    turns = sum(len(c) for c in conversations)
    return Simulation(verifiers, Workload(turns, FixedLength(1), FixedLength(output), concurrency=concurrency,
                                          conversations=conversations))


def test_a_conversations_turns_resend_its_history_and_follow_one_another():
    from tandem.cluster.sim.simulator import draw_requests, turn_of

    workload = chat_cluster(conversations=((300, 20, 20), (100, 5))).workload
    assert [prompt for _, prompt, _ in draw_requests(workload, seed=0)] == [300, 336, 372, 100, 121]
    assert turn_of(workload) == [(0, 1), (0, 2), (0, 3), (1, 1), (1, 2)]
    for bad in (dict(conversations=((3,),)), dict(conversations=((0,),), num=1), dict(conversations=((),), num=0)):
        with pytest.raises(ValueError):
            Workload(bad.get("num", 2), FixedLength(1), FixedLength(4), concurrency=1, conversations=bad["conversations"])
    with pytest.raises(ValueError, match="closed-loop"):
        Workload(1, FixedLength(1), FixedLength(4), rate_per_s=1.0, conversations=((3,),))


def test_later_turns_find_their_history_on_the_replica_that_served_the_turn_before():
    """Prefix affinity and the prompt cache: each later turn goes back to its conversation's
    replica and scores only its new tokens, so its first token comes far sooner than the first
    turn's; placed by cost alone and with the caches forgetting, later turns pay for the whole
    history again."""
    result = simulate(chat_cluster())
    by_turn = result.ttft_ms_p50_by_turn
    assert set(by_turn) == {"1", "2", "3"}
    assert by_turn["2"] < by_turn["1"] / 3 and by_turn["3"] < by_turn["1"] / 3
    assert result.placements == {"cost": 4, "prefix": 8}  # every later turn, to the replica holding it
    # all but each turn's last token of the history, reused: (300 + 16 - 1) then (336 + 16 - 1), per conversation
    assert result.reused_tokens == 4 * (315 + 351)
    one = simulate(chat_cluster(replicas=1))
    assert one.placements == {"cost": 4, "prefix": 8} and one.reused_tokens == result.reused_tokens


def test_the_router_sends_a_turn_to_the_replica_holding_its_history():
    """Two idle replicas: the cost rule takes the first listed; a turn whose conversation the
    second holds goes there (reason prefix), as does one whose long shared opening it holds;
    a history or opening under AFFINITY_SHARE of the prompt does not draw it."""
    from tandem.cluster.sim.routing import route
    from tandem.cluster.sim.simulator import Simulator
    from tandem.cluster.sim.state import SimSequence

    replicas = Simulator(chat_cluster()).replicas
    turn = SimSequence(0, 0.0, 350, 16, conversation=7, turn=2)
    assert route(replicas, turn) == (replicas[0], "cost")
    replicas[1].histories[7] = 330
    assert route(replicas, turn) == (replicas[1], "prefix")
    replicas[1].histories[7] = 100  # under half the prompt
    assert route(replicas, turn) == (replicas[0], "cost")
    opening = SimSequence(1, 0.0, 350, 16, prefix=(3, 300))
    replicas[1].prefixes_held.add(3)
    assert route(replicas, opening) == (replicas[1], "prefix")


def test_the_routers_cap_on_requests_in_flight_holds_the_rest_back():
    """`tandem serve --max-running 1` over two replicas: one request in flight at a time, so the
    second replica never works and the clients' second requests wait."""
    capped = simulate(dataclasses.replace(chat_cluster(conversations=((300,),) * 4), max_running=1))
    free = simulate(chat_cluster(conversations=((300,),) * 4))
    assert capped.utilisation["v1"] == 0 < free.utilisation["v1"]
    assert capped.ttft_ms["p50"] > free.ttft_ms["p50"]
    with pytest.raises(ValueError, match="max_running"):
        dataclasses.replace(chat_cluster(), max_running=0)


def test_a_fixed_k_changes_nothing_on_a_replica_that_does_not_draft():
    """`simulate --k 8` on a plain cluster said "mean k 0.00" yet ran 14% faster: the held-back
    prompt budget priced each decoding stream at 1 + k tokens though none drafted."""
    def plain(k):
        verifiers = (Verifier(Device("v", TARGET, group="a"), None, max_batch=8),)
        workload = Workload(32, FixedLength(200), FixedLength(32), concurrency=8)
        return simulate(Simulation(verifiers, workload, (), Network(), SimDepth(fixed_k=k), seed=0))

    base = plain(None)
    for k in (2, 8):
        result = plain(k)
        assert result.throughput_tok_s == base.throughput_tok_s and result.ttft_ms == base.ttft_ms


def test_the_replay_verdict_names_only_the_figure_outside_the_tolerance():
    """A replay 11% off in throughput and 16% long in latency read "throughput and p50 latency
    NOT within 15%"; a steady rate that rounded to 0.0 read "every request arrived at once"."""
    from tandem.cluster.sim.summary import comparison_lines, summary_lines

    def comparison(throughput, latency):
        figures = {"throughput_tok_s": {"predicted": 1, "measured": 1, "relative_error": throughput},
                   "latency_ms_p50": {"predicted": 1, "measured": 1, "relative_error": latency}}
        return {"figures": figures, "tolerance": 0.15,
                "within_tolerance": abs(throughput) <= 0.15 and abs(latency) <= 0.15}

    assert comparison_lines(comparison(-0.113, 0.161))[-1] == "  p50 latency NOT within 15% (throughput within)"
    assert comparison_lines(comparison(-0.2, 0.3))[-1] == "  throughput and p50 latency NOT within 15%"
    assert comparison_lines(comparison(0.02, 0.05))[-1] == "  throughput and p50 latency within 15%"
    slow = dataclasses.replace(simulate(cluster(requests=8, concurrency=2)), steady_tok_s=0.04)
    assert "0.040 tok/s until the last request arrived" in "\n".join(summary_lines(slow, "x"))
