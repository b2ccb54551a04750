"""Suffix drafting: the suffix index against brute-force run counts on random token streams (the
growing per-request index and the shared one alike, eviction included), and the drafter: a
repeated span is proposed whole, a branch point ends the proposal, recent requests' outputs are
proposed to a new request, and hybrid offers both copies, of which the planner keeps the source
doing better."""

import random
from collections import Counter

from tandem.speculation.drafters.suffix import SuffixDrafter, suffix_source
from tandem.speculation.suffix_index import MAX_MATCH, MIN_SHARE, GrowingSuffixIndex, Node, SuffixIndex, _add_runs
from tandem.speculation.suffix_index import lookup as trie_lookup

DEPTH = 6


def brute_counts(sequences, depth):
    counts = Counter()
    for tokens in sequences:
        for start in range(len(tokens)):
            for end in range(start + 1, min(len(tokens), start + depth) + 1):
                counts[tuple(tokens[start:end])] += 1
    return counts


def brute_lookup(counts, context, limit, depth):
    """The reference rule on the counts of every run: (match length, tokens, first share), None,
    or (match length, "tie") where two successors are equally frequent (the trie's pick among
    them is its insertion order)."""
    def followers(run):
        return {longer[-1]: c for longer, c in counts.items() if len(longer) == len(run) + 1 and longer[:-1] == run}

    for length in range(min(MAX_MATCH, len(context), depth - 1), 0, -1):
        run = tuple(context[len(context) - length:])
        if not (counts.get(run) and followers(run)):
            continue
        tokens, first_share = [], 0.0
        while len(tokens) < limit and len(run) < depth and (nexts := followers(run)):
            best = max(nexts.values())
            share = best / sum(nexts.values())
            if share < MIN_SHARE:
                break
            tied = [t for t in nexts if nexts[t] == best]
            if len(tied) > 1:
                return length, "tie"
            first_share = first_share or share
            tokens.append(tied[0])
            run += (tied[0],)
        return (length, tuple(tokens), first_share) if tokens else None
    return None


def check(index, sequences, context, limit):
    found = index.lookup(context, limit)
    expected = brute_lookup(brute_counts(sequences, DEPTH), context, limit, DEPTH)
    if expected is not None and expected[1] == "tie":
        assert found is not None and found.match_len == expected[0]
        return
    if expected is None:
        assert found is None
    else:
        assert (found.match_len, found.tokens) == expected[:2] and abs(found.confidence - expected[2]) < 1e-9


def test_shared_index_matches_brute_force_counts_with_eviction():
    rng = random.Random(1)
    for _ in range(40):
        index = SuffixIndex(max_tokens=60, depth=DEPTH)
        held = []
        for _ in range(rng.randint(1, 6)):
            tokens = [rng.randint(0, 3) for _ in range(rng.randint(1, 30))]
            index.add(tokens)
            held.append(tuple(tokens[-60:]))
            while sum(map(len, held)) > 60:
                held.pop(0)
        context = [rng.randint(0, 3) for _ in range(rng.randint(1, 10))]
        # the lookup walks runs of the context; a run longer than depth - 1 cannot have a successor
        check(index, held, context, rng.randint(1, 8))


def test_growing_index_matches_brute_force_counts():
    rng = random.Random(2)
    for _ in range(40):
        tokens = [rng.randint(0, 3) for _ in range(rng.randint(1, 40))]
        index = GrowingSuffixIndex(depth=DEPTH)
        cut = rng.randint(0, len(tokens))
        index.extend(tokens[:cut])
        index.extend(tokens[cut:])
        assert index.length == len(tokens)
        check(index, [tokens], tokens, rng.randint(1, 8))


def test_growing_index_reads_as_the_trie_of_its_runs_ties_included():
    """The per-request index keeps no trie; its lookups equal the trie's (speculation/suffix_index.py's
    `lookup` over every run counted), the follower picked among equally frequent ones included."""
    rng = random.Random(3)
    for _ in range(200):
        depth = rng.choice([2, 6, 16])
        alphabet = rng.randint(2, 6)
        tokens = [rng.randrange(alphabet) for _ in range(rng.randint(1, 120))]
        index = GrowingSuffixIndex(depth=depth)
        root = Node()
        for cut in sorted(rng.sample(range(len(tokens) + 1), min(4, len(tokens) + 1))):
            index.extend(tokens[index.length:cut])
            root = Node()
            _add_runs(root, tokens[:cut], depth, +1)
            for context in (tokens[:cut], [rng.randrange(alphabet) for _ in range(rng.randint(1, 14))]):
                if context:
                    limit = rng.randint(1, 20)
                    assert index.lookup(context, limit) == trie_lookup(root, context, limit)


class Seq:
    def __init__(self, seq_id, prompt, output=(), salt=None):
        self.seq_id = seq_id
        self.tokens = list(prompt) + list(output)
        self.fixed_k = None

        class Request:
            prompt_ids = tuple(prompt)
            cache_salt = salt
        self.request = Request()


def test_a_repeated_span_is_proposed_whole_and_a_branch_ends_it():
    drafter = SuffixDrafter()
    span = [10, 11, 12, 13, 14, 15, 16, 17]
    seq = Seq("a", [1, 2] + span + [3, 4] + span[:3])
    offer = drafter.offer(seq, 16)
    assert list(offer.copy[:5]) == span[3:] and offer.candidate.source == suffix_source(1.0)
    three_ways = Seq("b", [5, 6, 7, 5, 6, 8, 5, 6, 9, 5, 6])  # after 5 6: 7, 8 and 9 once each
    assert drafter.offer(three_ways, 16).candidate.source == "suffix3"  # a low-confidence source
    four_ways = Seq("c", [5, 6, 7, 5, 6, 8, 5, 6, 9, 5, 6, 4, 5, 6])  # a quarter each: under MIN_SHARE
    assert drafter.offer(four_ways, 16).candidate.cap == 0


def test_recent_outputs_are_proposed_to_a_new_request():
    drafter = SuffixDrafter()
    answer = [40, 41, 42, 43, 44, 45, 46, 47, 48]
    done = Seq("done", [1, 2, 3], answer)
    drafter.forget(done)  # it retires: its output joins the shared index
    assert "done" not in drafter.own
    new = Seq("new", [9, 9] + answer[:4])
    assert list(drafter.offer(new, 8).copy) == answer[4:]


def hybrid_without_model():
    """A shared suffix drafter and a hybrid over it whose draft model never offers anything."""
    from tandem.speculation.drafters.base import NO_OFFER
    from tandem.speculation.drafters.hybrid import HybridDrafter
    from tandem.speculation.drafters.ngram import NgramDrafter

    class NoModel:
        def offer(self, seq, limit):
            return NO_OFFER

    suffix = SuffixDrafter()
    return suffix, HybridDrafter(NoModel(), NgramDrafter(3, 8), suffix)


def test_a_salted_request_neither_feeds_nor_reads_the_shared_index():
    """A request with a cache salt drafts from its own prompt and output alone: its answer is not
    proposed to others, nor others' answers to it (their acceptance would tell what they wrote)."""
    answer = [5, 6, 7, 8, 9, 10, 11, 12]
    for salted_writer, salted_reader, shared in ((None, None, True), ("alice", None, False), (None, "bob", False)):
        drafter = SuffixDrafter()
        drafter.forget(Seq("a", [1, 2, 3], answer, salt=salted_writer))
        found = drafter.proposal(Seq("b", [4, 5, 6, 7]), 8) if salted_reader is None else \
            drafter.proposal(Seq("b", [4, 5, 6, 7], salt=salted_reader), 8)
        assert (found is not None) == shared, (salted_writer, salted_reader)


def test_hybrid_takes_the_suffix_copy_where_it_matched_more():
    suffix, hybrid = hybrid_without_model()
    suffix.forget(Seq("old", [1], [20, 21, 22, 23, 24, 25, 26]))
    seq = Seq("s", [7, 20, 21, 22, 23])  # only the shared index has seen 20..23 followed by more
    offer = hybrid.offer(seq, 8)
    assert offer.candidate.source.startswith("suffix") and list(offer.copy) == [24, 25, 26]


def test_hybrid_follows_whichever_copy_has_been_accepted_more():
    from tandem.engine.stages import best_alternative
    from tandem.speculation.batch_depth import BatchDepthPlanner

    suffix, hybrid = hybrid_without_model()
    span = [30, 31, 32, 33, 34, 35]
    seq = Seq("s", [1] + span + [2, 3] + span + [4] + span[:4])  # both copies match 30..33
    offer = hybrid.offer(seq, 8)
    sources = {offer.candidate.source, *(o.candidate.source for o in offer.alternatives)}
    ngram_source, suffix_source_name = sorted(sources)  # "ngram4", "suffix<c>"
    assert ngram_source.startswith("ngram") and suffix_source_name.startswith("suffix")

    planner = BatchDepthPlanner(target=None)
    for _ in range(30):  # the n-gram copies keep failing at their first token, the suffix ones pass
        planner.record(ngram_source, 4, 0)
        planner.record(suffix_source_name, 2, 2)
    assert best_alternative(offer, planner).candidate.source == suffix_source_name
    planner = BatchDepthPlanner(target=None)
    for _ in range(30):
        planner.record(ngram_source, 4, 4)
        planner.record(suffix_source_name, 2, 0)
    chosen = best_alternative(offer, planner)
    assert chosen.candidate.source == ngram_source and chosen.alternatives == ()


def test_the_shared_index_stays_within_its_bytes_per_token():
    """Bounded by tokens, the index is bounded in bytes too: text that never repeats (every run a
    new branch, the most nodes a token can add) stays within MAX_BYTES_PER_TOKEN a token held."""
    import tracemalloc

    from tandem.speculation.suffix_index import DEFAULT_DEPTH, MAX_BYTES_PER_TOKEN

    rng = random.Random(0)
    index = SuffixIndex(max_tokens=4096, depth=DEFAULT_DEPTH)
    tracemalloc.start()
    try:
        for _ in range(12):
            index.add([rng.randrange(150_000) for _ in range(500)])
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert index.tokens <= 4096
    assert held <= MAX_BYTES_PER_TOKEN * index.tokens, held / index.tokens
