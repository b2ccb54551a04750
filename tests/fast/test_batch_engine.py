"""The batching engine against naive target-only decoding (the slow reference): greedy outputs of
concurrent requests equal their target-only outputs alone, whatever the drafter, k, arrival
time, slot reuse or cancellation (fp32 torch, exact)."""

import pytest

from engine_support import MAX_TOKENS, PROMPTS, make_engine, naive_greedy, run_all
from tandem.engine.events import SpeculationOptions
from tandem.engine.request import GenerationRequest
from tandem.errors import TandemError
from tandem.speculation.sampling import SamplingParams


@pytest.mark.parametrize("drafter,k", [("hybrid", "auto"), ("model", 3), ("ngram", "auto"), ("none", 0), ("model", "auto")])
def test_concurrent_greedy_equals_target_only_alone(tiny_target, tiny_draft, references, drafter, k):
    engine = make_engine(tiny_target, tiny_draft, drafter, k, slots=3)
    arrivals = {0: [], 2: [], 5: []}
    for i, prompt in enumerate(PROMPTS):  # more requests than slots, joining at different steps
        arrivals[[0, 2, 5][i % 3]].append((f"r{i}", prompt, SpeculationOptions()))
    outputs, reasons = run_all(engine, arrivals)
    for i, prompt in enumerate(PROMPTS):
        assert outputs[f"r{i}"] == references[prompt], (drafter, k, i)
        assert reasons[f"r{i}"] in ("stop", "length")
    assert not engine.running and engine.slots.num_free == 3


def test_per_request_options_mix_in_one_batch(tiny_target, tiny_draft, references):
    engine = make_engine(tiny_target, tiny_draft, slots=4)
    options = [SpeculationOptions("ngram", "auto"), SpeculationOptions("model", 4),
               SpeculationOptions("none"), SpeculationOptions(None, 2), SpeculationOptions()]
    arrivals = {0: [(f"r{i}", p, o) for i, (p, o) in enumerate(zip(PROMPTS, options))]}
    outputs, _ = run_all(engine, arrivals)
    for i, prompt in enumerate(PROMPTS):
        assert outputs[f"r{i}"] == references[prompt]


@pytest.mark.parametrize("k", [3, "auto"])
def test_a_shared_store_of_right_and_wrong_continuations_leaves_greedy_outputs_alone(
        tiny_target, tiny_draft, references, k):
    """The shared n-gram store is a cache of other requests' outputs: a hit changes only what is
    drafted. Filled with each prompt's right answer and a wrong one after the same prefix (the
    newer, so the store offers it first), the outputs still equal target-only decoding, with
    store drafts both accepted and rejected on the way."""
    import random

    from tandem.speculation.shared_store.store import InProcessNgramStore

    store, rng = InProcessNgramStore(), random.Random(3)
    for prompt in PROMPTS:
        right = list(prompt) + references[prompt]
        cut = rng.randrange(len(prompt), len(right))
        store.add(right)
        store.add(right[:cut] + [rng.randrange(97) for _ in range(12)])  # diverges after a shared prefix
    engine = make_engine(tiny_target, tiny_draft, "ngram", k, slots=3, ngram_store=store)
    outputs, rounds = {}, []
    for i, prompt in enumerate(PROMPTS):
        engine.add(f"r{i}", GenerationRequest(prompt, max_tokens=MAX_TOKENS))
        outputs[f"r{i}"] = []
    while engine.has_work:
        updates, report = engine.step()
        rounds += report.rounds
        for update in updates:
            outputs[update.seq_id] += update.token_ids
    for i, prompt in enumerate(PROMPTS):
        assert outputs[f"r{i}"] == references[prompt], i
    shared = [r for r in rounds if r.source.startswith("shared") and r.k]
    assert any(r.accepted for r in shared) and any(r.accepted < r.k for r in shared), shared


def test_drafts_of_ids_no_model_scores_are_cut_not_verified(tiny_target, tiny_draft, references):
    """A shared store holds what any writer put there (in Redis, another app's keys under the same
    names): a continuation of ids past the vocabulary made llama.cpp fail, the failure read as a
    full KV pool, and the next step drafted the same ids again, for ever. The draft is cut before
    the first such id; greedy outputs stay target-only decoding's."""
    from tandem.speculation.shared_store.store import InProcessNgramStore

    store = InProcessNgramStore()
    for prompt in PROMPTS:
        right = list(prompt) + references[prompt]
        store.add(right[:len(prompt) + 2] + [2**31 - 1] * 12)  # right for two tokens, then garbage
    engine = make_engine(tiny_target, tiny_draft, "ngram", 4, slots=3, ngram_store=store)
    outputs, rounds = run_all(engine, {0: [(f"r{i}", p, SpeculationOptions()) for i, p in enumerate(PROMPTS)]})
    assert all(outputs[f"r{i}"] == references[p] for i, p in enumerate(PROMPTS))
    assert engine.vocabulary < 2**31 - 1


def test_drafting_happens_when_verification_is_cheap(tiny_target, tiny_draft):
    engine = make_engine(tiny_target, tiny_draft, "model", 4, slots=2)
    engine.add("a", GenerationRequest(PROMPTS[0], max_tokens=MAX_TOKENS))
    _, report = engine.step()
    assert report.rounds[0].k == 4 and report.rounds[0].source == "model"


def test_cancel_frees_the_slot_within_one_step(tiny_target, tiny_draft):
    engine = make_engine(tiny_target, tiny_draft, slots=2)
    engine.add("a", GenerationRequest(PROMPTS[0], max_tokens=MAX_TOKENS))
    engine.add("b", GenerationRequest(PROMPTS[1], max_tokens=MAX_TOKENS))
    engine.add("c", GenerationRequest(PROMPTS[2], max_tokens=MAX_TOKENS))
    engine.step()
    assert engine.num_running == 2 and engine.num_waiting == 1
    update = engine.cancel("a")
    assert update.finished and update.finish_reason == "cancelled"
    assert engine.num_running == 1 and engine.slots.num_free == 1
    assert engine.cancel("c").finish_reason == "cancelled" and engine.num_waiting == 0
    assert engine.cancel("nope") is None


SHARED = tuple(range(30, 50))  # a prompt prefix long enough to be worth a copy (MIN_COPY_TOKENS)


def _first_call_tokens(engine, seq_id, prompt):
    """Run one request; the tokens its first target call scored for it, and its output."""
    calls = []
    forward = engine.target.forward_batch
    engine.target.forward_batch = lambda items, views=False: calls.append(list(items)) or forward(items, views)
    outputs, _ = run_all(engine, {0: [(seq_id, prompt, SpeculationOptions())]})
    engine.target.forward_batch = forward
    return calls[0][0].token_ids, outputs[seq_id]


def test_repeated_prefix_reuses_the_cached_prompt(tiny_target, tiny_draft):
    """A new prompt sharing a cached prefix scores only its own tokens: the prefix is copied from
    the finished sequence's slot, which keeps its cache."""
    engine = make_engine(tiny_target, tiny_draft, "none", 0, slots=2)
    run_all(engine, {0: [("first", SHARED + (1, 2), SpeculationOptions())]})
    scored, output = _first_call_tokens(engine, "again", SHARED + (7, 7))
    assert scored == (7, 7)  # prefill of the uncached prompt tokens + the first round, in one call
    assert output == naive_greedy(tiny_target, SHARED + (7, 7), MAX_TOKENS)
    assert engine.slots.cached[0][: len(SHARED) + 2] == list(SHARED + (1, 2))  # the donor kept its cache


def test_a_cache_salt_shares_cached_prompts_only_with_its_own_salt(tiny_target, tiny_draft):
    """A user could tell that another sent a prompt (its cached_tokens, its time to first token).
    With a salt, a request reuses only prefixes cached under the same salt, and its own cache
    never reaches the shared n-gram store; its output is the target's greedy one either way."""
    from tandem.speculation.shared_store.store import InProcessNgramStore

    def cached_tokens(engine, seq_id, prompt, salt):
        engine.add(seq_id, GenerationRequest(prompt, MAX_TOKENS, cache_salt=salt))
        found, output = None, []
        while engine.has_work:
            for update in engine.step()[0]:
                found = update.cached_tokens if found is None else found
                output += update.token_ids
        assert output == naive_greedy(tiny_target, prompt, MAX_TOKENS)
        return found

    store = InProcessNgramStore()
    engine = make_engine(tiny_target, tiny_draft, "none", 0, slots=3, ngram_store=store)
    assert cached_tokens(engine, "alice", SHARED + (1, 2), "alice") == 0
    assert len(store) == 0  # a salted answer feeds no shared drafting memory
    assert cached_tokens(engine, "bob", SHARED + (7, 7), "bob") == 0  # another salt: nothing shared
    assert cached_tokens(engine, "anyone", SHARED + (5, 5), None) == 0  # nor the unsalted
    assert cached_tokens(engine, "alice-again", SHARED + (3, 3), "alice") >= len(SHARED)  # its own salt: shared
    assert cached_tokens(engine, "anyone-again", SHARED + (4, 4), None) >= len(SHARED)
    with pytest.raises(TandemError, match="cache salt"):
        GenerationRequest(SHARED, 4, cache_salt="")


def test_a_conversation_extends_its_own_slot(tiny_target, tiny_draft):
    """A prompt that is a finished sequence's whole prompt and output (the next chat turn) takes
    that slot as it is, however short: only the turn's new tokens are scored."""
    engine = make_engine(tiny_target, tiny_draft, "none", 0, slots=2)
    first, _ = run_all(engine, {0: [("turn1", PROMPTS[0], SpeculationOptions())]})
    history = PROMPTS[0] + tuple(first["turn1"]) + (7, 7)
    scored, output = _first_call_tokens(engine, "turn2", history)
    assert len(scored) == 3  # the last output token (never cached) and the two new ones
    assert output == naive_greedy(tiny_target, history, MAX_TOKENS)


def test_seeded_sampling_is_reproducible_and_batch_independent(tiny_target, tiny_draft):
    def sampled(engine, prompts):
        arrivals = {0: [(f"s{i}", p, SpeculationOptions()) for i, p in enumerate(prompts)]}
        for seq_id, prompt, options in arrivals[0]:
            engine.add(seq_id, GenerationRequest(prompt, MAX_TOKENS, SamplingParams(0.9, seed=7)), options)
        outputs, _ = run_all(engine, {})
        return outputs

    alone = sampled(make_engine(tiny_target, tiny_draft, "model", 3), PROMPTS[:1])
    together = sampled(make_engine(tiny_target, tiny_draft, "model", 3), PROMPTS[:3])
    assert alone["s0"] == together["s0"] and len(alone["s0"]) > 0


def test_a_prompt_beyond_the_context_is_refused(tiny_target, tiny_draft):
    engine = make_engine(tiny_target, tiny_draft, "none", 0, slots=1)
    with pytest.raises(Exception, match="context"):
        engine.add("big", GenerationRequest(tuple([1] * (engine.context_length + 1)), 4))


@pytest.mark.parametrize("runner", ["serial", "fused"])
def test_prompts_arriving_together_prefill_their_shared_prefix_once(tiny_target, tiny_draft, runner):
    """Three prompts behind one long shared prefix, added at once: the first prefills it, the
    others wait for that prefill, then copy it and score only their own tokens; every output is
    still the target's greedy one."""
    shared = tuple(range(1, 90)) * 2  # 178 tokens
    prompts = {"a": shared + (5,), "b": shared + (6, 7), "c": shared + (8,)}
    engine = make_engine(tiny_target, tiny_draft, "none", 0, slots=3, runner=runner, step_token_budget=64)
    scored = []
    forward = engine.target.forward_batch
    engine.target.forward_batch = lambda items, views=False: (scored.append(sum(len(i.token_ids) for i in items))
                                                        or forward(items, views))
    outputs, _ = run_all(engine, {0: [(name, prompt, SpeculationOptions()) for name, prompt in prompts.items()]})
    decoding = len(prompts) * MAX_TOKENS
    assert sum(scored) <= len(shared) + 4 * len(prompts) + decoding  # not 3 x 178 prompt tokens
    for name, prompt in prompts.items():
        assert outputs[name] == naive_greedy(tiny_target, prompt, MAX_TOKENS)


def test_forget_answers_empties_the_cross_request_drafting_memory(tiny_target, tiny_draft):
    """A benchmark's runs on one engine start cold: after forget_answers no drafter can copy an
    earlier run's answer (the suffix index and the in-process n-gram store held them)."""
    from tandem.speculation.shared_store.store import InProcessNgramStore

    store = InProcessNgramStore()
    engine = make_engine(tiny_target, tiny_draft, "suffix", slots=2, ngram_store=store)
    engine.add("a", GenerationRequest(PROMPTS[0], max_tokens=MAX_TOKENS))
    while engine.has_work:
        engine.step()
    index = engine.drafters["suffix"].shared
    assert index.tokens > 0 and len(store) > 0
    assert engine.answers_bytes == index.charged_bytes + store.nbytes > store.nbytes  # what /metrics reports
    engine.forget_answers()
    assert index.tokens == 0 and len(store) == 0 and store.nbytes == 0 and engine.answers_bytes == 0
    assert index.lookup(list(PROMPTS[0]), 8) is None
