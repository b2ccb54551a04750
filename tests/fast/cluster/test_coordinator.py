"""The coordinator over in-process workers (no Ray; each worker on its own thread, as an actor):
greedy output equals target-only output in both loops, replicas step on their own clocks in
the independent loop, a verifier or drafter dying mid-generation loses and duplicates nothing,
and the health monitor finds idle dead workers."""

import time
from collections import defaultdict

import pytest

from tandem.cluster.runtime.coordinator import NO_VERIFIER, ClusterEngine
from tandem.cluster.runtime.drafter_worker import DrafterWorker
from tandem.cluster.runtime.emulation import Emulation
from tandem.cluster.runtime.endpoints import LocalEndpoint
from tandem.cluster.runtime.pool import Worker
from tandem.cluster.runtime.verifier_worker import VerifierWorker
from tandem.engine.request import GenerationRequest
from engine_support import CHEAP_VERIFY, MAX_TOKENS, PROMPTS, serial_runner  # noqa: F401


LOOPS = ("independent", "lockstep")
ENGINES = []  # closed after each test: their replica loops and health monitors stop


@pytest.fixture(autouse=True)
def close_engines():
    yield
    while ENGINES:
        ENGINES.pop().close()


def make_cluster(tiny_target, tiny_draft, verifiers=2, drafters=1, slots=3, emulations=(), verify_cost=CHEAP_VERIFY,
                 **kwargs):
    endpoints = []

    def starter(name, make_worker):
        def start():
            endpoint = LocalEndpoint(name, make_worker())
            endpoints.append(endpoint)
            return endpoint
        return start

    def worker(name, role, make):
        w = Worker(name, role, starter(name, make))
        w.launch()
        assert w.wait_ready()
        return w

    def verifier(i):
        emulation = emulations[i] if i < len(emulations) else Emulation()
        return lambda: VerifierWorker(serial_runner(tiny_target, slots, verify_cost), emulation)

    vs = [worker(f"verify-{i}", "verify", verifier(i)) for i in range(verifiers)]
    ds = [worker(f"draft-{i}", "draft", lambda: DrafterWorker(serial_runner(tiny_draft, 8, CHEAP_VERIFY)))
          for i in range(drafters)]
    kwargs["depth"] = kwargs.pop("k", "auto")
    engine = ClusterEngine(vs, ds, **kwargs)
    ENGINES.append(engine)
    return engine, endpoints


def run(engine, prompts, on_step=None):
    outputs, reasons = defaultdict(list), {}
    for i, prompt in enumerate(prompts):
        engine.add(f"r{i}", GenerationRequest(prompt, max_tokens=MAX_TOKENS))
    step = 0
    while engine.has_work:
        if on_step:
            on_step(step)
        updates, _ = engine.step()
        for u in updates:
            outputs[u.seq_id] += u.token_ids
            if u.finished:
                reasons[u.seq_id] = (u.finish_reason, u.error)
        step += 1
    return [outputs[f"r{i}"] for i in range(len(prompts))], reasons


@pytest.mark.parametrize("loop", LOOPS)
@pytest.mark.parametrize("drafter,k", [("hybrid", "auto"), ("model", 3), ("none", 0)])
def test_cluster_greedy_equals_target_only(tiny_target, tiny_draft, references, drafter, k, loop):
    engine, _ = make_cluster(tiny_target, tiny_draft, drafter=drafter, k=k, loop=loop)
    outputs, _ = run(engine, PROMPTS)
    assert outputs == [references[p] for p in PROMPTS]
    assert all(len(v.sequences) == 0 for v in engine.verifiers)


def test_sequences_spread_over_replicas(tiny_target, tiny_draft):
    engine, _ = make_cluster(tiny_target, tiny_draft, verifiers=2, drafter="model", k=2)
    for i, prompt in enumerate(PROMPTS[:4]):
        engine.add(f"r{i}", GenerationRequest(prompt, max_tokens=MAX_TOKENS))
    engine.step()
    assert sorted(len(v.sequences) for v in engine.verifiers) == [2, 2]


@pytest.mark.parametrize("loop", LOOPS)
def test_a_closed_coordinator_leaves_its_workers_slots_free(tiny_target, tiny_draft, references, loop):
    """Sequences that finish in the last round free their slots when the coordinator closes, so
    another coordinator can use every slot of the same workers (bench-cluster's solo runs)."""
    first, _ = make_cluster(tiny_target, tiny_draft, verifiers=1, slots=3, drafter="none", k=0, loop=loop)
    run(first, PROMPTS[:3])
    first.close()
    second = ClusterEngine(first.verifiers, first.drafter_workers, "none", 0, loop=loop)
    ENGINES.append(second)
    for i, prompt in enumerate(PROMPTS[:3]):  # new ids: the verifier cannot reuse the old slots by name
        second.add(f"again-{i}", GenerationRequest(prompt, max_tokens=MAX_TOKENS))
    outputs = {}
    while second.has_work:
        for update in second.step()[0]:
            outputs.setdefault(update.seq_id, []).extend(update.token_ids)
            assert update.finish_reason in (None, "stop", "length"), update
    assert [outputs[f"again-{i}"] for i in range(3)] == [references[p] for p in PROMPTS[:3]]


def test_finished_sequences_leave_no_cache_behind_on_verifiers_or_drafters(tiny_target, tiny_draft):
    """A slot's cache is freed when its sequence leaves, not when the slot is next opened: in a
    shared KV pool (llama.cpp's unified cache) stale cells spread the pool, and every later call
    attends over the spread (mixed-replica runs lost 10-20% to it)."""
    engine, endpoints = make_cluster(tiny_target, tiny_draft, verifiers=2, drafters=1, drafter="model", k=2)
    run(engine, PROMPTS)
    engine.close()
    for endpoint in endpoints:
        endpoint.call("ping").result()  # each worker takes calls in order: the forgets sent before are done
        runner = endpoint.worker.runner
        assert [runner.num_cached_tokens(slot) for slot in range(runner.max_slots)] == [0] * runner.max_slots, endpoint


def test_new_sequences_go_where_their_steps_cost_least(tiny_target, tiny_draft):
    """A replica emulating a 3x slower device reports its slower curve; on these flat curves the
    fast replica takes sequences until its batch is full."""
    engine, _ = make_cluster(tiny_target, tiny_draft, verifiers=2, slots=3, drafter="none", k=0,
                             emulations=(Emulation(slowdown=3.0), Emulation()))
    slow, fast = engine.verifiers
    assert slow.cost.cost.cost_ms(1) == pytest.approx(3 * fast.cost.cost.cost_ms(1))
    for i, prompt in enumerate(PROMPTS[:4]):
        engine.add(f"r{i}", GenerationRequest(prompt, max_tokens=MAX_TOKENS))
    engine.step()
    assert (len(fast.sequences), len(slow.sequences)) == (3, 1)  # the fourth only when the fast one is full


def test_an_idle_slow_replica_gets_a_stream_where_the_fast_ones_step_is_still_cheaper(tiny_target, tiny_draft):
    """On a CPU-like curve (a fixed part, then each token its share) the fast replica's step of
    four still costs less than the slow one's step of one, but a fourth stream adds little there
    while one stream on the idle slow replica serves a third of a fast stream's requests."""
    cpu_like = {1: 10.0, 16: 100.0, 64: 400.0}
    engine, _ = make_cluster(tiny_target, tiny_draft, verifiers=2, slots=4, drafter="none", k=0,
                             emulations=(Emulation(slowdown=3.0), Emulation()), verify_cost=cpu_like)
    slow, fast = engine.verifiers
    assert fast.cost.cost.cost_ms(4) < slow.cost.cost.cost_ms(1)
    for i, prompt in enumerate(PROMPTS[:4]):
        engine.add(f"r{i}", GenerationRequest(prompt, max_tokens=MAX_TOKENS))
    engine.step()
    assert (len(fast.sequences), len(slow.sequences)) == (3, 1)


@pytest.mark.parametrize("loop", LOOPS)
def test_verifier_killed_mid_generation_loses_nothing(tiny_target, tiny_draft, references, loop):
    engine, endpoints = make_cluster(tiny_target, tiny_draft, verifiers=2, drafter="model", k=3, loop=loop)

    def kill_first_verifier(step):
        if step == 3:
            engine.verifiers[0].endpoint.kill()

    outputs, _ = run(engine, PROMPTS, kill_first_verifier)
    assert outputs == [references[p] for p in PROMPTS]
    assert any("verify-0 died" in e for e in engine.events)
    assert engine.verifiers[0].restarts == 1


@pytest.mark.parametrize("loop", LOOPS)
def test_drafter_killed_generation_goes_on(tiny_target, tiny_draft, references, loop):
    engine, _ = make_cluster(tiny_target, tiny_draft, verifiers=1, drafters=1, drafter="model", k=3, loop=loop)

    def kill_drafter(step):
        if step == 2:
            engine.drafter_workers[0].endpoint.kill()

    outputs, reasons = run(engine, PROMPTS[:3], kill_drafter)
    assert outputs == [references[p] for p in PROMPTS[:3]]
    assert all(reason[0] in ("stop", "length") for reason in reasons.values())


def test_no_verifier_left_fails_requests_clearly(tiny_target, tiny_draft):
    engine, _ = make_cluster(tiny_target, tiny_draft, verifiers=1, drafter="none", k=0)
    for v in engine.verifiers:
        v.restarts = 99  # no restarts left
        v.endpoint.kill()
    _, reasons = run(engine, PROMPTS[:2])
    assert all(reason == ("error", NO_VERIFIER) for reason in reasons.values())
    assert engine.unavailable_reason == NO_VERIFIER


@pytest.mark.parametrize("loop", LOOPS)
def test_drafts_made_ahead_keep_greedy_output_and_get_used(tiny_target, references, loop):
    engine, _ = make_cluster(tiny_target, tiny_target, verifiers=1, drafter="model", k=3, draft_ahead=True, loop=loop)
    outputs, _ = run(engine, PROMPTS)
    assert outputs == [references[p] for p in PROMPTS]
    assert engine.remote.ahead_hits > 0  # the target drafting for itself: the guesses are right


def test_sampling_with_drafts_made_ahead_is_seeded_and_complete(tiny_target, tiny_draft):
    from tandem.speculation.sampling import SamplingParams

    def sampled():
        engine, _ = make_cluster(tiny_target, tiny_draft, verifiers=1, drafter="model", k=2, draft_ahead=True)
        engine.add("s", GenerationRequest(PROMPTS[0], MAX_TOKENS, SamplingParams(0.8, seed=3)))
        tokens = []
        while engine.has_work:
            tokens += [t for u in engine.step()[0] for t in u.token_ids]
        return tokens

    first = sampled()
    assert first == sampled() and len(first) == MAX_TOKENS


def test_a_workers_round_trip_is_measured_when_it_comes_up_and_feeds_the_depth_planner(tiny_target, tiny_draft):
    from tandem.cluster.runtime.emulation import Emulation

    far = Worker("verify-far", "verify", lambda: LocalEndpoint(
        "verify-far", VerifierWorker(serial_runner(tiny_target, 2, CHEAP_VERIFY), Emulation(rtt_ms=30.0))))
    far.launch()
    assert far.wait_ready()
    assert 30.0 <= far.rtt_ms < 60.0  # measured, not taken from a file (this worker was given none)
    engine = ClusterEngine([far], [], "ngram", "auto")
    engine.add("s", GenerationRequest(PROMPTS[0], 4))
    while engine.has_work:
        engine.step()
    assert min(planner.overhead_ms for planner in engine.planners.values()) >= 30.0


def time_verify_calls(worker) -> list[float]:
    """Record when each verify call on an in-process verifier starts."""
    times, verify = [], worker.verify

    def timed(items):
        times.append(time.perf_counter())
        return verify(items)

    worker.verify = timed
    return times


@pytest.mark.parametrize("loop", LOOPS)
def test_a_slow_replica_does_not_hold_back_a_fast_one(tiny_target, tiny_draft, references, loop):
    """One replica pays 40 ms a call. In the independent loop the fast one runs its rounds on its
    own clock, milliseconds apart; in lock-step every round waits for the slow one."""
    engine, _ = make_cluster(tiny_target, tiny_draft, verifiers=2, drafter="none", k=0,
                             emulations=(Emulation(), Emulation(rtt_ms=40.0)), loop=loop)
    fast_rounds = time_verify_calls(engine.verifiers[0].endpoint.worker)
    outputs, _ = run(engine, PROMPTS)
    assert outputs == [references[p] for p in PROMPTS]
    gaps = sorted(b - a for a, b in zip(fast_rounds, fast_rounds[1:]))
    median_gap_ms = 1000 * gaps[len(gaps) // 2]
    if loop == "independent":
        assert median_gap_ms < 20
    else:
        assert median_gap_ms >= 35


def test_draft_requests_from_several_replicas_share_a_drafter_call(tiny_target, tiny_draft, references):
    engine, _ = make_cluster(tiny_target, tiny_draft, verifiers=3, drafter="model", k=2, slots=2)
    outputs, _ = run(engine, PROMPTS)
    assert outputs == [references[p] for p in PROMPTS]
    batcher = engine.remote.batchers["draft-0"]
    assert batcher.requests > batcher.calls  # some calls carried several replicas' requests


def test_health_monitor_restarts_an_idle_dead_drafter_and_tells_listeners(tiny_target, tiny_draft, references):
    engine, _ = make_cluster(tiny_target, tiny_draft, verifiers=1, drafter="model", k=2)
    seen = []
    engine.health.listeners.append(seen.append)
    drafter = engine.drafter_workers[0]
    drafter.endpoint.kill()  # idle: no sequence would ever call it
    engine.health.check()  # pings it, finds it dead, starts a replacement
    assert drafter.restarts == 1
    assert [s["alive"] for s in seen[-1] if s["name"] == "draft-0"] == [False]
    engine.health.check()  # the replacement answered
    assert drafter.alive and [s["alive"] for s in seen[-1] if s["name"] == "draft-0"] == [True]
    engine.health.check()
    assert sum("draft-0 is down" in e for e in engine.events) == 1  # each transition once
    outputs, _ = run(engine, PROMPTS[:2])
    assert outputs == [references[p] for p in PROMPTS[:2]]


def test_an_idle_dead_verifier_gets_no_sequence_until_it_is_back(tiny_target, tiny_draft, references):
    engine, _ = make_cluster(tiny_target, tiny_draft, verifiers=2, drafter="none", k=0)
    victim = engine.verifiers[0]
    victim.restarts = 99  # no restart left: it stays down
    victim.endpoint.kill()
    engine.health.check()
    assert not victim.alive and not victim.restarting
    outputs, reasons = run(engine, PROMPTS[:4])
    assert outputs == [references[p] for p in PROMPTS[:4]]
    assert all(reason[0] in ("stop", "length") for reason in reasons.values())
