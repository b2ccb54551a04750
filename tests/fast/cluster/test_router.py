"""The router over in-process replicas (no Ray; each worker on its own threads, as an actor):
each replica runs the batching engine, greedy output equals target-only output, a replica or
drafter dying mid-generation loses and duplicates nothing, streams move to an idle replica,
conversations return to the replica holding their prefix, and the health monitor finds idle
dead workers."""

import logging
from collections import defaultdict
from dataclasses import dataclass

import pytest

from tandem.cluster.runtime.drafter_worker import DrafterWorker
from tandem.cluster.runtime.emulation import Emulation
from tandem.cluster.runtime.endpoints import LocalEndpoint
from tandem.cluster.runtime.pool import Worker
from tandem.cluster.runtime.replica import ReplicaEngine
from tandem.cluster.runtime.router import NO_VERIFIER, ClusterRouter
from tandem.engine.request import GenerationRequest
from tandem.engine.host_cache import HostPromptCache
from engine_support import CHEAP_VERIFY, MAX_TOKENS, PROMPTS, fused_runner, naive_greedy, serial_runner  # noqa: F401

ROUTERS = []  # closed after each test: their health monitors stop
REPLICA_THREADS = 4  # a replica's actor serves calls concurrently (a poll waits while adds come in)


@pytest.fixture(autouse=True)
def close_routers():
    yield
    while ROUTERS:
        router = ROUTERS.pop()
        router.close()
        for worker in router.verifiers:
            worker.endpoint.kill()  # stops the replica's engine thread


def make_cluster(tiny_target, tiny_draft, verifiers=2, drafters=1, slots=3, emulations=(), verify_cost=CHEAP_VERIFY,
                 runner="serial", ngram_store=None, host_keys=(), **kwargs):
    endpoints = []

    def starter(name, make_worker, threads):
        def start():
            endpoint = LocalEndpoint(name, make_worker(), threads)
            endpoints.append(endpoint)
            return endpoint
        return start

    def worker(name, role, make, threads=1):
        w = Worker(name, role, starter(name, make, threads))
        w.launch()
        assert w.wait_ready()
        return w

    def replica(i):
        emulation = emulations[i] if i < len(emulations) else Emulation()
        if runner == "fused":  # saves slot states: a host tier, and moves that carry the KV state
            def make():
                target = fused_runner(tiny_target, slots, verify_cost)
                key = host_keys[i] if i < len(host_keys) else target.name  # the model, as its host tier knows it
                return ReplicaEngine(target, emulation, max_running=slots, host_cache=HostPromptCache(64 << 20, key))
            return make
        return lambda: ReplicaEngine(serial_runner(tiny_target, slots, verify_cost), emulation, max_running=slots,
                                     ngram_store=ngram_store)

    vs = [worker(f"verify-{i}", "verify", replica(i), REPLICA_THREADS) for i in range(verifiers)]
    ds = [worker(f"draft-{i}", "draft", lambda: DrafterWorker(serial_runner(tiny_draft, 8, CHEAP_VERIFY)))
          for i in range(drafters)]
    kwargs["depth"] = kwargs.pop("k", "auto")
    router = ClusterRouter(vs, ds, **kwargs)
    ROUTERS.append(router)
    return router, endpoints


def run(router, prompts, on_step=None, max_tokens=MAX_TOKENS, **request):
    outputs, reasons = defaultdict(list), {}
    for i, prompt in enumerate(prompts):
        router.add(f"r{i}", GenerationRequest(prompt, max_tokens=max_tokens, **request))
    step = 0
    while router.has_work:
        if on_step:
            on_step(step)
        updates, _ = router.step()
        for u in updates:
            assert u.seq_id not in reasons, f"an update after {u.seq_id} finished"
            outputs[u.seq_id] += u.token_ids
            if u.finished:
                reasons[u.seq_id] = (u.finish_reason, u.error)
        step += 1
    return [outputs[f"r{i}"] for i in range(len(prompts))], reasons


@pytest.mark.parametrize("drafter,k", [("hybrid", "auto"), ("model", 3), ("none", 0)])
def test_cluster_greedy_equals_target_only(tiny_target, tiny_draft, references, drafter, k):
    router, _ = make_cluster(tiny_target, tiny_draft, drafter=drafter, k=k)
    outputs, reasons = run(router, PROMPTS)
    assert outputs == [references[p] for p in PROMPTS]
    assert all(reason[0] in ("stop", "length") for reason in reasons.values())
    assert all(len(v.sequences) == 0 for v in router.verifiers)


def test_model_drafts_come_from_the_drafter_worker(tiny_target, tiny_draft, references):
    router, endpoints = make_cluster(tiny_target, tiny_draft, verifiers=1, drafter="model", k=3)
    drafted = []
    router.add("a", GenerationRequest(PROMPTS[0], max_tokens=MAX_TOKENS))
    while router.has_work:
        drafted += [u.drafted for u in router.step()[0]]
    assert sum(drafted) > 0
    drafter = next(e for e in endpoints if e.name == "draft-0")
    drafter.call("ping").result()  # the drafter takes calls in order: the forget sent before is done
    assert not drafter.worker._seqs  # the finished sequence's draft cache was freed there


def test_replicas_over_one_ngram_store_draft_from_each_others_outputs(tiny_target, tiny_draft, references):
    """Two clusters' replicas over one n-gram store (as over one Redis): what the first served is
    drafting material for the second, whose replicas never saw it, and output is unchanged."""
    from tandem.speculation.shared_store.store import InProcessNgramStore

    def accepted_on_a_fresh_cluster(store) -> tuple[list[int], int, int]:
        router, _ = make_cluster(tiny_target, tiny_draft, drafters=0, ngram_store=store, drafter="ngram", k=4)
        router.add("a", GenerationRequest(PROMPTS[0], max_tokens=MAX_TOKENS))
        output, drafted, accepted = [], 0, 0
        while router.has_work:
            for u in router.step()[0]:
                output += u.token_ids
                drafted, accepted = drafted + u.drafted, accepted + u.accepted
        return output, drafted, accepted

    store = InProcessNgramStore()
    first, _, accepted_first = accepted_on_a_fresh_cluster(store)
    second, drafted, accepted_second = accepted_on_a_fresh_cluster(store)
    assert first == second == references[PROMPTS[0]]
    # k = 4: a round accepts at most 4 and adds a bonus token, so a draft followed all the way
    # accepts 4 of every 5 tokens after the first; allow one round short of that
    assert accepted_second > accepted_first and accepted_second >= 4 * (len(second) - 1) // 5 - 4


def test_sequences_spread_over_replicas(tiny_target, tiny_draft):
    router, _ = make_cluster(tiny_target, tiny_draft, verifiers=2, drafter="model", k=2)
    for i, prompt in enumerate(PROMPTS[:4]):
        router.add(f"r{i}", GenerationRequest(prompt, max_tokens=MAX_TOKENS))
    router.step()
    assert sorted(len(v.sequences) for v in router.verifiers) == [2, 2]


def test_a_closed_router_leaves_its_replicas_to_the_next(tiny_target, tiny_draft, references):
    """bench-cluster's solo runs: a second router over the same workers gets all their news."""
    first, _ = make_cluster(tiny_target, tiny_draft, verifiers=1, slots=3, drafter="none", k=0)
    run(first, PROMPTS[:3])
    first.close()
    second = ClusterRouter(first.verifiers, first.drafter_workers, "none", 0)
    ROUTERS.append(second)
    outputs, reasons = run(second, PROMPTS[:3])
    assert outputs == [references[p] for p in PROMPTS[:3]]
    assert all(reason[0] in ("stop", "length") for reason in reasons.values())


def test_new_sequences_go_where_their_steps_cost_least(tiny_target, tiny_draft):
    """A replica emulating a 3x slower device reports its slower curve; on these flat curves the
    fast replica takes sequences until its batch is full."""
    router, _ = make_cluster(tiny_target, tiny_draft, verifiers=2, slots=3, drafter="none", k=0,
                             emulations=(Emulation(slowdown=3.0), Emulation()))
    slow, fast = router.verifiers
    assert slow.cost.cost.cost_ms(1) == pytest.approx(3 * fast.cost.cost.cost_ms(1))
    for i, prompt in enumerate(PROMPTS[:4]):
        router.add(f"r{i}", GenerationRequest(prompt, max_tokens=MAX_TOKENS))
    router.step()
    assert (len(fast.sequences), len(slow.sequences)) == (3, 1)  # the fourth only when the fast one is full


def test_an_idle_slow_replica_gets_a_stream_where_the_fast_ones_step_is_still_cheaper(tiny_target, tiny_draft):
    """On a CPU-like curve (a fixed part, then each token its share) the fast replica's step of
    four still costs less than the slow one's step of one, but a fourth stream adds little there
    while one stream on the idle slow replica serves a third of a fast stream's requests."""
    cpu_like = {1: 10.0, 16: 100.0, 64: 400.0}
    router, _ = make_cluster(tiny_target, tiny_draft, verifiers=2, slots=4, drafter="none", k=0,
                             emulations=(Emulation(slowdown=3.0), Emulation()), verify_cost=cpu_like)
    slow, fast = router.verifiers
    assert fast.cost.cost.cost_ms(4) < slow.cost.cost.cost_ms(1)
    for i, prompt in enumerate(PROMPTS[:4]):
        router.add(f"r{i}", GenerationRequest(prompt, max_tokens=MAX_TOKENS))
    router.step()
    assert (len(fast.sequences), len(slow.sequences)) == (3, 1)


def test_a_conversations_next_turn_goes_to_the_replica_holding_its_prefix(tiny_target, tiny_draft):
    """Turn 2 resends turn 1 and its answer: it goes where turn 1 ran, though the cost rule
    alone may pick the other (idle) replica, and its prompt is found in that replica's cache. On a
    CPU-like curve the prefill of the whole history elsewhere costs more than anything else."""
    cpu_like = {1: 10.0, 16: 100.0, 64: 400.0}
    router, _ = make_cluster(tiny_target, tiny_draft, verifiers=2, slots=2, drafter="none", k=0, verify_cost=cpu_like)
    history = tuple(range(3, 43))  # 40 tokens: two blocks of the prefix index
    first, _ = run(router, [history], max_tokens=8)
    served = [v for v in router.verifiers if router.decisions[(v.name, "cost")]]
    assert len(served) == 1
    turn_two = history + tuple(first[0]) + (7, 8, 9)
    router.add("t2", GenerationRequest(turn_two, max_tokens=8))
    cached = 0
    while router.has_work:
        cached = max([cached] + [u.cached_tokens for u in router.step()[0]])
    assert router.decisions[(served[0].name, "prefix")] == 1
    assert cached >= len(history)
    assert any(state["routed"].get("prefix") for state in router.worker_states())


def test_a_router_sends_a_salted_turn_by_its_own_salts_history_alone(tiny_target, tiny_draft):
    """Bob's request sharing Alice's history is placed by cost and finds nothing cached; Alice's
    next turn goes where her history is, as a "prefix" decision."""
    cpu_like = {1: 10.0, 16: 100.0, 64: 400.0}
    router, _ = make_cluster(tiny_target, tiny_draft, verifiers=2, slots=2, drafter="none", k=0, verify_cost=cpu_like)
    history = tuple(range(3, 43))
    router.add("alice-1", GenerationRequest(history, max_tokens=8, cache_salt="alice"))
    first = []
    while router.has_work:
        first += [t for u in router.step()[0] for t in u.token_ids]
    turn_two = history + tuple(first) + (7, 8, 9)

    def placed(seq_id, salt):
        router.add(seq_id, GenerationRequest(turn_two, max_tokens=8, cache_salt=salt))
        cached = 0
        while router.has_work:
            cached = max([cached] + [u.cached_tokens for u in router.step()[0]])
        return cached, sum(n for (_, reason), n in router.decisions.items() if reason == "prefix")

    assert placed("bob-1", "bob") == (0, 0)
    cached, prefix_decisions = placed("alice-2", "alice")
    assert cached >= len(history) and prefix_decisions == 1


def test_a_salted_turn_goes_by_its_own_salts_prefixes_alone():
    """The router's prefix memory sent a salted request to the replica holding another user's
    prompt, and counted it as a "prefix" decision on /metrics: a client could learn that someone
    had sent its prompt."""
    from tandem.cluster.planning.affinity import PrefixMemory
    from tandem.cluster.runtime.routed import Routed
    from tandem.engine.events import SpeculationOptions

    history = tuple(range(3, 43))
    memory = PrefixMemory()
    memory.add("alice-turn-1", Routed("a", GenerationRequest(history, 8, cache_salt="alice"),
                                      SpeculationOptions()).affinity_tokens)

    def held(salt):
        request = GenerationRequest(history + (7, 8), 8, cache_salt=salt)
        return memory.longest(Routed("x", request, SpeculationOptions()).affinity_tokens)

    assert held("alice") >= len(history) and held("bob") == 0 and held(None) == 0


@pytest.mark.parametrize("runner,host_keys", [("serial", ()), ("fused", ()), ("fused", ("model/bf16", "model/fp16"))],
                         ids=["serial", "fused", "fused-other-precision"])
def test_a_stream_moves_to_a_replica_that_idles(tiny_target, tiny_draft, references, runner, host_keys):
    """Both streams start on a 3x slower replica (the fast one is down then); once it is back,
    one moves there with the tokens it has (and, on a runner that saves slot states, its KV
    state, restored instead of prefilled), and the output is unchanged. Between replicas of
    different models or precisions (bf16 and fp16 rows are the same size) the state is refused
    and the history prefilled: it once went in under the receiver's own key."""
    router, _ = make_cluster(tiny_target, tiny_draft, verifiers=2, slots=3, drafter="none", k=0,
                             emulations=(Emulation(slowdown=3.0), Emulation()), runner=runner, host_keys=host_keys)
    slow, fast = router.verifiers
    fast.alive = False

    def fast_back(step):
        if step == 1:
            fast.alive = True

    prompts = [PROMPTS[0] * 5, PROMPTS[1] * 3]  # 30 tokens each: a state worth carrying (two blocks)
    outputs, _ = run(router, prompts, fast_back, max_tokens=MAX_TOKENS)
    assert outputs == [naive_greedy(tiny_target, p, MAX_TOKENS) for p in prompts]
    assert any(e.startswith("moved ") for e in router.events)
    assert router.decisions[(fast.name, "move")] >= 1
    restored = fast.endpoint.worker.engine.prompt_cache.host_restores
    assert restored >= 1 if runner == "fused" and not host_keys else restored == 0


@dataclass(frozen=True)
class StopAfter:
    """A stop condition (as stop strings are): stop once the output holds `n` tokens."""

    n: int

    def tokens_to_keep(self, output_ids):
        return self.n if len(output_ids) >= self.n else None


def test_a_stop_condition_is_applied_at_the_router(tiny_target, tiny_draft, references):
    router, _ = make_cluster(tiny_target, tiny_draft, verifiers=1, drafter="none", k=0)
    outputs, reasons = run(router, PROMPTS[:2], stop_condition=StopAfter(5))
    assert outputs == [references[p][:5] for p in PROMPTS[:2]]
    assert all(reason[0] == "stop" for reason in reasons.values())
    assert not router.verifiers[0].sequences


def test_verifier_killed_mid_generation_loses_nothing(tiny_target, tiny_draft, references):
    router, _ = make_cluster(tiny_target, tiny_draft, verifiers=2, drafter="model", k=3)
    relayed = {}

    def kill_first_verifier(step):
        if step == 3:
            relayed.update({r.seq_id: len(r.output) for r in router.routed.values()})
            router.verifiers[0].endpoint.kill()

    outputs, _ = run(router, PROMPTS, kill_first_verifier)
    assert outputs == [references[p] for p in PROMPTS]
    assert any("verify-0 died" in e for e in router.events)
    assert router.verifiers[0].restarts == 1
    assert sum(n for (_, reason), n in router.decisions.items() if reason == "failover") >= 1


def test_drafter_killed_generation_goes_on(tiny_target, tiny_draft, references):
    router, _ = make_cluster(tiny_target, tiny_draft, verifiers=1, drafters=1, drafter="model", k=3)

    def kill_drafter(step):
        if step == 2:
            router.drafter_workers[0].endpoint.kill()

    outputs, reasons = run(router, PROMPTS[:3], kill_drafter)
    assert outputs == [references[p] for p in PROMPTS[:3]]
    assert all(reason[0] in ("stop", "length") for reason in reasons.values())


def test_no_verifier_left_fails_requests_clearly(tiny_target, tiny_draft):
    router, _ = make_cluster(tiny_target, tiny_draft, verifiers=1, drafter="none", k=0)
    for v in router.verifiers:
        v.restarts = 99  # no restarts left
        v.endpoint.kill()
    _, reasons = run(router, PROMPTS[:2])
    assert all(reason == ("unavailable", NO_VERIFIER) for reason in reasons.values())  # a 503, not a 500
    assert router.unavailable_reason == NO_VERIFIER


def test_drafts_made_ahead_keep_greedy_output_and_get_used(tiny_target, references):
    """The target drafting for itself: every guess of the bonus token is right, so drafts made
    while a round verifies are used for the next one; output unchanged."""
    router, _ = make_cluster(tiny_target, tiny_target, verifiers=1, drafter="model", k=3, draft_ahead=True)
    outputs, _ = run(router, PROMPTS)
    assert outputs == [references[p] for p in PROMPTS]
    remote = router.verifiers[0].endpoint.worker.remote
    assert remote.draft_ahead and remote.ahead_hits > 0
    assert not remote.ready  # nothing left behind for finished sequences


def test_sampling_through_the_cluster_is_seeded_and_complete(tiny_target, tiny_draft):
    from tandem.speculation.sampling import SamplingParams

    def sampled():
        router, _ = make_cluster(tiny_target, tiny_draft, verifiers=1, drafter="model", k=2)
        router.add("s", GenerationRequest(PROMPTS[0], MAX_TOKENS, SamplingParams(0.8, seed=3)))
        tokens = []
        while router.has_work:
            tokens += [t for u in router.step()[0] for t in u.token_ids]
        return tokens

    first = sampled()
    assert first == sampled() and len(first) == MAX_TOKENS


def test_round_trips_are_measured_and_a_drafters_feeds_the_replicas_depth_planner(tiny_target, tiny_draft):
    far = Worker("verify-far", "verify", lambda: LocalEndpoint(
        "verify-far", ReplicaEngine(serial_runner(tiny_target, 2), Emulation(rtt_ms=30.0)), REPLICA_THREADS),
        group="central")
    far.launch()
    assert far.wait_ready()
    assert 30.0 <= far.rtt_ms < 60.0  # measured, not taken from a file (this worker was given none)
    drafter = Worker("draft-edge", "draft", lambda: LocalEndpoint(
        "draft-edge", DrafterWorker(serial_runner(tiny_draft, 2))), group="edge")
    drafter.launch()
    assert drafter.wait_ready()
    router = ClusterRouter([far], [drafter], "model", "auto", rtt_between=lambda a, b: 0.0 if a == b else 12.0)
    ROUTERS.append(router)
    run(router, PROMPTS[:1], max_tokens=4)
    planner = far.endpoint.worker.engine.planner
    assert planner.draft_call_ms == 12.0 and planner.draft is not None


def test_health_monitor_restarts_an_idle_dead_drafter_and_tells_listeners(tiny_target, tiny_draft, references,
                                                                          caplog):
    router, _ = make_cluster(tiny_target, tiny_draft, verifiers=1, drafter="model", k=2)
    caplog.set_level(logging.WARNING, logger="tandem.cluster.runtime.health")
    seen = []
    router.health.listeners.append(seen.append)
    drafter = router.drafter_workers[0]
    drafter.endpoint.kill()  # idle: no sequence would ever call it
    router.health.check()  # pings it, finds it dead, starts a replacement
    assert drafter.restarts == 1
    assert [s["alive"] for s in seen[-1] if s["name"] == "draft-0"] == [False]
    router.health.check()  # the replacement answered
    assert drafter.alive and [s["alive"] for s in seen[-1] if s["name"] == "draft-0"] == [True]
    router.health.check()
    assert sum("draft-0 is down" in e for e in router.events) == 1  # each transition once
    # the recovery shows at the default level (warnings), as the loss did: it was logged at INFO
    assert [r.getMessage() for r in caplog.records] == [
        "cluster worker draft-0 is down; restarting it (restart 1 of 5)",
        f"cluster worker draft-0 is up again (pid {drafter.pid}, restart 1 of 5)"]
    outputs, _ = run(router, PROMPTS[:2])
    assert outputs == [references[p] for p in PROMPTS[:2]]
    replica = router.verifiers[0].endpoint.worker
    assert [d.restarts for d in replica.remote.drafters] == [1]  # the replica was told of the new one


def test_an_idle_dead_verifier_gets_no_sequence_until_it_is_back(tiny_target, tiny_draft, references, caplog):
    router, _ = make_cluster(tiny_target, tiny_draft, verifiers=2, drafter="none", k=0)
    victim = router.verifiers[0]
    victim.restarts = 99  # no restart left: it stays down
    victim.endpoint.kill()
    with caplog.at_level(logging.WARNING, logger="tandem.cluster.runtime.health"):
        router.health.check()
    assert not victim.alive and not victim.restarting
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.ERROR, "cluster worker verify-0 is down and will not be restarted: all 5 restarts are used")]
    outputs, reasons = run(router, PROMPTS[:4])
    assert outputs == [references[p] for p in PROMPTS[:4]]
    assert all(reason[0] in ("stop", "length") for reason in reasons.values())


def test_a_placement_counts_the_output_it_resumes_from():
    """A stream moved or failed over twice: each placement's request says how many of its
    prompt's tokens are output, so a seed's positions go on where they were."""
    from tandem.cluster.runtime.routed import Routed
    from tandem.engine.events import SpeculationOptions
    from tandem.engine.request import GenerationRequest
    from tandem.speculation.sampling import SamplingParams

    routed = Routed("s", GenerationRequest((1, 2, 3), 10, SamplingParams(temperature=1.0, seed=3)),
                    SpeculationOptions())
    assert routed.placement_request().output_offset == 0
    routed.output += [7, 8]
    first = routed.placement_request()
    assert (first.prompt_ids, first.max_tokens, first.output_offset) == ((1, 2, 3, 7, 8), 8, 2)
    again = Routed("s", first, SpeculationOptions(), output=[9])
    assert again.placement_request().output_offset == 3


def test_a_remote_failure_reaches_the_client_as_one_clean_line():
    """A replica's failed step told clients Ray's whole error text: terminal colour codes, actor
    ids and a remote traceback. The client gets where and what; the log keeps the rest."""
    from tandem.errors import client_message

    ray_text = ("\x1b[36mray::DrafterHost.propose()\x1b[39m (pid=12, actor_id=ab)\n"
                "  File \"/x/drafter_worker.py\", line 3, in propose\nIndexError: index out of range")
    assert client_message(RuntimeError(ray_text)) == ("ray::DrafterHost.propose() (pid=12, actor_id=ab): "
                                                      "IndexError: index out of range")
    assert client_message(ValueError("bad value")) == "bad value"
    assert client_message(ValueError("")) == "ValueError"
    assert len(client_message(RuntimeError("x" * 500))) == 200
    # out of file handles, a failed import told the client the install's path
    no_files = OSError(24, "Too many open files", "/work/main/.venv/lib/python3.11/site-packages/numpy/x.py")
    assert client_message(no_files) == "OSError: Too many open files"


def test_a_drafter_that_first_sees_a_sequence_mid_output_drafts_at_its_true_positions(tiny_draft):
    """Seeded drafts are coupled to the target by output position. A drafter that joins late (a
    restart, a failover, an eviction) gets prompt and output in one delta; it counted positions
    from that delta's end, so its drafts no longer matched the target's uniforms."""
    from tandem.cluster.runtime.messages import DraftItem, DraftReply
    from tandem.speculation.sampling import SamplingParams

    sampling = SamplingParams(temperature=1.0, seed=11)
    prompt, output = (5, 9, 2, 7, 3, 8), (4, 6, 1)
    step_by_step = DrafterWorker(serial_runner(tiny_draft, 2))
    assert step_by_step.propose([DraftItem("s", 0, prompt, 0, sampling, 1, len(prompt))]) == [DraftReply("s", ())]
    expected = step_by_step.propose([DraftItem("s", len(prompt), output, 8, sampling, 2, len(prompt))])[0]
    late = DrafterWorker(serial_runner(tiny_draft, 2))
    joined = late.propose([DraftItem("s", 0, prompt + output, 8, sampling, 2, len(prompt))])[0]
    assert late._seqs["s"].output_position == len(output) == step_by_step._seqs["s"].output_position
    assert joined.token_ids == expected.token_ids and len(expected.token_ids) == 8


def test_clearing_the_cluster_forgets_earlier_answers_too(tiny_target, tiny_draft):
    """bench-cluster runs its configurations on the same replicas: without this a later run's
    copy drafters copied an earlier run's answers to the same prompts."""
    from tandem.speculation.shared_store.store import InProcessNgramStore

    store = InProcessNgramStore()
    router, endpoints = make_cluster(tiny_target, tiny_draft, verifiers=1, drafters=0, ngram_store=store,
                                     drafter="ngram")
    run(router, PROMPTS[:2])
    assert len(store) > 0
    router.clear_caches()
    assert len(store) == 0
    assert endpoints[0].worker.engine.drafters["suffix"].shared.tokens == 0


def test_a_request_moved_before_its_first_token_reports_what_its_prompt_found_cached():
    """usage.prompt_tokens_details.cached_tokens was 0 for a request moved or failed over before
    its first token (only the first placement's hit was kept); a later placement, whose prompt
    holds output too, says nothing of the client's prompt."""
    from tandem.cluster.runtime.routed import Routed
    from tandem.engine.events import SequenceUpdate, SpeculationOptions

    routed = Routed("s", GenerationRequest(tuple(range(100)), 10), SpeculationOptions())
    routed.next_placement(None)
    routed.next_placement(None)  # moved before any update
    assert routed.take(SequenceUpdate("s@2", (7,), cached_tokens=96)).cached_tokens == 96
    routed.next_placement(None)  # failed over with output: its prompt is the prompt and the output
    assert routed.take(SequenceUpdate("s@3", (8,), cached_tokens=101)).cached_tokens == 96


def test_a_failing_stop_condition_ends_its_stream_alone_with_an_error():
    """The router checks a stream's stop condition itself: one that raised there raised out of the
    router's poll, failing every stream of the cluster."""
    from tandem.cluster.runtime.routed import Routed
    from tandem.engine.events import SequenceUpdate, SpeculationOptions
    from tandem.engine.request import GenerationRequest

    class Raising:
        def tokens_to_keep(self, output_ids):
            raise ValueError("bad marker")

    routed = Routed("s", GenerationRequest((1, 2), 10, stop_condition=Raising()), SpeculationOptions())
    routed.next_placement(None)
    update = routed.take(SequenceUpdate("s@1", (7, 8)))
    assert (update.token_ids, update.finished, update.finish_reason) == ((), True, "error")
    assert "raised ValueError: bad marker" in update.error and routed.output == []
