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

    def prefer(chosen, held, streams):
        lacking = [cpu_like(max(1, tokens - h)) for h in held]
        return prefer_prefix(chosen, held, streams, lacking, [cpu_like, cpu_like], tokens, room)

    # replica 1 holds 576 of 600 prompt tokens; the cost rule chose replica 0 (fewer streams)
    assert prefer(0, [0, 576], [0, 1]) == 1
    # ... but not when replica 1 is so busy that its decode costs more than the prefill saved
    assert prefer(0, [0, 576], [0, 60]) is None
    # under one block nothing is held; a chat template's few tokens draw nothing
    assert prefer(0, [0, BLOCK - 1], [0, 0]) is None
    assert prefer(0, [0, 32], [0, 0]) is None
    assert prefer(0, [560, 576], [0, 0]) is None  # both hold it
    assert prefer(1, [0, 576], [0, 0]) is None


def test_a_stream_moves_only_where_it_finishes_sooner():
    slow = lambda n: 3 * cpu_like(n)  # noqa: E731

    def gain(room, refill_tokens, source_streams, source_cost, target_cost):
        return move_gain_ms(room, target_cost(refill_tokens), source_cost(source_streams), target_cost(1))

    assert gain(room=40, refill_tokens=100, source_streams=4, source_cost=slow, target_cost=cpu_like) > 0
    assert gain(room=2, refill_tokens=2000, source_streams=1, source_cost=slow, target_cost=cpu_like) <= 0
    assert gain(room=40, refill_tokens=100, source_streams=1, source_cost=cpu_like, target_cost=slow) <= 0
    # a history that would be prefilled again keeps a short stream where it is; its KV state moving does not
    assert gain(room=8, refill_tokens=300, source_streams=1, source_cost=slow, target_cost=cpu_like) <= 0
    assert gain(room=8, refill_tokens=1, source_streams=1, source_cost=slow, target_cost=cpu_like) > 0


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
    monkeypatch.setattr(affinity, "PREFIX_MEMORY_TOKENS", 100)  # and by tokens: long histories weigh more
    memory.add("d", range(300, 380))  # 48 + 32 + 80 tokens: "a" goes, then "c"
    assert list(memory.order) == ["d"] and memory.num_tokens == 80 <= affinity.PREFIX_MEMORY_TOKENS


def test_a_replica_with_fewer_streams_takes_one_from_a_slower_replica_holding_more():
    """At a run's tail a fast replica down to one stream takes one of the two a 3x slower one
    holds; between equal counts, or toward the replica holding more, nothing moves."""
    slow_cost = lambda n: 3 * cpu_like(n)  # noqa: E731

    def replica(name, cost, streams):
        return SimpleNamespace(name=name, alive=True, max_slots=8, carries_state=True,
                               sequences={f"{name}{i}" for i in range(streams)},
                               cost=SimpleNamespace(cost=SimpleNamespace(cost_ms=lambda n, context=None: cost(n))))

    def streams_on(r, count):
        return [SimpleNamespace(moving=None, replica=r, room=40, tokens=tuple(range(300)), num_tokens=300,
                                request=SimpleNamespace(cache_salt=None))
                for _ in range(count)]

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
        routed = SimpleNamespace(tokens=tuple(range(length)), affinity_tokens=tuple(range(length)), num_tokens=length,
                                 num_affinity_marks=0, room=100, reason="cost")
        chosen, _ = choose_replica([cpu, gpu], routed, prefixes, [])
        assert chosen.name == expected, length


SHORT_CURVE = {1: 20.0, 2: 30.0, 4: 50.0, 16: 160.0, 64: 600.0}  # ms on 64 cached tokens


def curve_replica(name: str, streams: int, deep_factor: float, slower: float = 1.0, carries_state: bool = False):
    """A replica whose calls cost `deep_factor` times more on 1,024 cached tokens than on 64 (a
    CPU's attention: ~3x), `slower` times a reference device's, its curves as read off a poll."""
    cost = CostModel(dict(SHORT_CURVE), deep_ms={n: ms * deep_factor for n, ms in SHORT_CURVE.items()},
                     base_context=64, deep_context=1024).scaled(slower)
    return SimpleNamespace(name=name, alive=True, max_slots=8, carries_state=carries_state,
                           sequences={f"{name}{i}" for i in range(streams)},
                           cost=CostView(CostModel.from_wire(cost.to_wire())))


def placed(replica, length: int, room: int = 40):
    return SimpleNamespace(moving=None, replica=replica, room=room, tokens=tuple(range(length)),
                           affinity_tokens=tuple(range(length)), num_affinity_marks=0, num_tokens=length,
                           reason="cost", request=SimpleNamespace(cache_salt=None))


def test_a_replica_busy_with_long_conversations_is_priced_at_their_depth():
    """Two replicas alike: the first holds one 2,000-token conversation, the second two short
    chats. A short new request joins the short chats: the first replica's step runs at the
    conversation's depth, three times dearer. Priced at the new request's own length (as
    before), the first replica's step of two looked cheaper than the second's of three."""
    deep, shallow = curve_replica("deep", 1, 3.0), curve_replica("shallow", 2, 3.0)
    streams = [placed(deep, 2000), placed(shallow, 64), placed(shallow, 64)]
    prefixes = {"deep": PrefixMemory(), "shallow": PrefixMemory()}
    chosen, reason = choose_replica([deep, shallow], placed(None, 64), prefixes, streams)
    assert (chosen.name, reason) == ("shallow", "cost")
    # the same replicas with the conversation gone: the one holding fewer streams wins again
    chosen, _ = choose_replica([deep, shallow], placed(None, 64), prefixes, streams[1:])
    assert chosen.name == "deep"


def test_a_stream_does_not_move_where_the_target_holds_a_long_context():
    """A 3x slower replica holds two short streams; the fast one holds one 4,000-token
    conversation. Its step with a short stream added runs at their mean depth, dearer than
    staying: nothing moves. Without the conversation's depth the move looked worth it, and with
    a short stream there instead it is."""
    fast = curve_replica("fast", 1, 3.0, carries_state=True)
    slow = curve_replica("slow", 2, 1.0, slower=3.0, carries_state=True)
    on_slow = [placed(slow, 300), placed(slow, 300)]
    assert choose_moves([fast, slow], [placed(fast, 4000)] + on_slow) == []
    moves = choose_moves([fast, slow], [placed(fast, 300)] + on_slow)
    assert [(m[0] in on_slow, m[1].name) for m in moves] == [(True, "fast")]
