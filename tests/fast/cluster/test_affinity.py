"""The router's two rules beside the cost rule (cluster/planning/affinity.py): a prompt goes
where its prefix is held unless that costs more, and a stream moves only where it finishes
sooner; the prefix memory is bounded and finds the longest remembered prefix; a stream is priced
at its own context on each replica's curves."""

from types import SimpleNamespace

from tandem.cluster.planning import affinity
from tandem.cluster.planning.affinity import PrefixMemory, move_gain_ms, prefer_prefix
from tandem.cluster.runtime.replica_choice import choose_moves, choose_replica
from tandem.models.cost import CostModel, CostView
from tandem.engine.prefix_index import BLOCK


def cpu_like(n: int) -> float:
    return 10.0 + 5.0 * n  # a fixed part, then each token its share


def test_the_replica_holding_the_prefix_wins_unless_it_is_dearer():
    tokens, room = 600, 50
    # replica 1 holds 576 of 600 prompt tokens; the cost rule chose replica 0 (fewer streams)
    assert prefer_prefix(0, [0, 576], [0, 1], [cpu_like, cpu_like], tokens, room) == 1
    # ... but not when replica 1 is so busy that its decode costs more than the prefill saved
    assert prefer_prefix(0, [0, 576], [0, 60], [cpu_like, cpu_like], tokens, room) is None
    # under one block nothing is held; a chat template's few tokens draw nothing
    assert prefer_prefix(0, [0, BLOCK - 1], [0, 0], [cpu_like, cpu_like], tokens, room) is None
    assert prefer_prefix(0, [0, 32], [0, 0], [cpu_like, cpu_like], tokens, room) is None
    assert prefer_prefix(0, [560, 576], [0, 0], [cpu_like, cpu_like], tokens, room) is None  # both hold it
    assert prefer_prefix(1, [0, 576], [0, 0], [cpu_like, cpu_like], tokens, room) is None


def test_a_stream_moves_only_where_it_finishes_sooner():
    slow = lambda n: 3 * cpu_like(n)  # noqa: E731
    assert move_gain_ms(room=40, refill_tokens=100, source_streams=4, source_cost=slow, target_cost=cpu_like) > 0
    assert move_gain_ms(room=2, refill_tokens=2000, source_streams=1, source_cost=slow, target_cost=cpu_like) <= 0
    assert move_gain_ms(room=40, refill_tokens=100, source_streams=1, source_cost=cpu_like, target_cost=slow) <= 0
    # a history that would be prefilled again keeps a short stream where it is; its KV state moving does not
    assert move_gain_ms(room=8, refill_tokens=300, source_streams=1, source_cost=slow, target_cost=cpu_like) <= 0
    assert move_gain_ms(room=8, refill_tokens=1, source_streams=1, source_cost=slow, target_cost=cpu_like) > 0


def test_the_prefix_memory_finds_the_longest_and_forgets_the_oldest(monkeypatch):
    monkeypatch.setattr(affinity, "PREFIX_MEMORY", 2)
    memory = PrefixMemory()
    memory.add("a", range(40))
    memory.add("b", range(100, 164))
    assert memory.longest(tuple(range(40)) + (7, 7)) == 40
    memory.add("a", range(48))  # re-added: now the newest, with its longer tokens
    assert memory.longest(range(50)) == 48
    memory.add("c", range(200, 232))  # a third: "b", now the oldest, is forgotten
    assert memory.longest(range(100, 164)) == 0 and len(memory.order) == 2


def test_a_replica_with_fewer_streams_takes_one_from_a_slower_replica_holding_more():
    """At a run's tail a fast replica down to one stream takes one of the two a 3x slower one
    holds; between equal counts, or toward the replica holding more, nothing moves."""
    slow_cost = lambda n: 3 * cpu_like(n)  # noqa: E731

    def replica(name, cost, streams):
        return SimpleNamespace(name=name, alive=True, max_slots=8, carries_state=True,
                               sequences={f"{name}{i}" for i in range(streams)},
                               cost=SimpleNamespace(cost=SimpleNamespace(cost_ms=lambda n, context=None: cost(n))))

    def streams_on(r, count):
        return [SimpleNamespace(moving=None, replica=r, room=40, tokens=tuple(range(300))) for _ in range(count)]

    fast, slow = replica("fast", cpu_like, 1), replica("slow", slow_cost, 2)
    on_slow = streams_on(slow, 2)
    moves = choose_moves([fast, slow], streams_on(fast, 1) + on_slow)
    assert [(m[0] in on_slow, m[1].name) for m in moves] == [(True, "fast")]
    fast, slow = replica("fast", cpu_like, 2), replica("slow", slow_cost, 2)
    assert choose_moves([fast, slow], streams_on(fast, 2) + streams_on(slow, 2)) == []
    fast, slow = replica("fast", cpu_like, 3), replica("slow", slow_cost, 1)
    assert choose_moves([fast, slow], streams_on(fast, 3) + streams_on(slow, 1)) == []


def test_a_long_conversation_goes_where_its_context_costs_least():
    """Two replicas alike on a short cache; on 1,024 cached tokens one's calls cost 3x (a CPU's
    attention), the other's barely more (a GPU's). The curves travel with each replica's news
    (CostModel.to_wire), and a stream is priced at its own length: a prompt as long as the short
    curve's cache goes to the first listed (a tie), a long one where its steps are cheap at that depth."""
    short = {1: 20.0, 4: 50.0, 16: 160.0, 64: 600.0}

    def replica(name, deep_factor):
        cost = CostModel(dict(short), deep_ms={n: ms * deep_factor for n, ms in short.items()},
                         base_context=64, deep_context=1024)
        wired = CostModel.from_wire(cost.to_wire())  # as the router reads it off a poll
        return SimpleNamespace(name=name, alive=True, max_slots=8, sequences=set(), cost=CostView(wired))

    cpu, gpu = replica("cpu", 3.0), replica("gpu", 1.1)
    prefixes = {"cpu": PrefixMemory(), "gpu": PrefixMemory()}
    for length, expected in ((64, "cpu"), (2000, "gpu")):
        routed = SimpleNamespace(tokens=tuple(range(length)), room=100, reason="cost")
        chosen, _ = choose_replica([cpu, gpu], routed, prefixes)
        assert chosen.name == expected, length
