"""The batching engine, one sequence at a time (what `tandem generate` runs), against a fast numpy
double of a model runner: stops, limits, stats, and lossless greedy output against a naive decode
that recomputes every token from scratch.

`HashRunner` keeps a real KV cache of token ids; the logits at a position are a pure function of
the cached prefix (a table lookup on the last two tokens, optionally plus an induction-style
bonus for copying), so a wrong rollback changes what the model says next. The naive reference
calls the same pure function on the whole committed sequence, with no cache at all (both in
hash_doubles.py). The engine sees it through `SerialBatchRunner` with one slot, so the slot's
cache is the double's cache.
"""

import math

import pytest

from hash_doubles import HashRunner, LeakyRollbackRunner, OracleDrafter, StopAfter, StopBeforeSequence, naive_greedy
from tandem.engine.batch_engine import BatchEngine
from tandem.engine.request import GenerationRequest
from tandem.engine.run_request import generate as run_request
from tandem.engine.run_request import stream_tokens
from tandem.engine.stats import GenerationStats
from tandem.errors import TandemError
from tandem.models.batch_runner import SerialBatchRunner
from tandem.speculation.depth import Auto, Fixed
from tandem.speculation.drafters.registry import build_drafters
from tandem.speculation.sampling import SamplingParams

PROMPT = (5, 17, 3, 28, 9)


def one_slot(runner: HashRunner) -> SerialBatchRunner:
    return SerialBatchRunner(lambda: runner, 1)


def make_engine(target: HashRunner, drafter="none", depth=Fixed(4), draft: HashRunner | None = None) -> BatchEngine:
    """`drafter`: a registry name ("none", "ngram", "model" with `draft`), or a test drafter
    object, plugged in beside the registry's under its own name."""
    drafters = None
    if not isinstance(drafter, str):
        drafters = {**build_drafters(None), drafter.name: drafter}
        drafter = drafter.name
    return BatchEngine(one_slot(target), one_slot(draft) if draft is not None else None, drafter, depth, drafters=drafters)


def generate(target, drafter="none", depth=Fixed(4), draft=None, **request):
    request.setdefault("prompt_ids", PROMPT)
    return run_request(make_engine(target, drafter, depth, draft), GenerationRequest(**request))


def stream(target, drafter, depth, request) -> tuple[list[list[int]], GenerationStats]:
    stats = GenerationStats()
    chunks = list(stream_tokens(make_engine(target, drafter, depth), request, stats))
    return chunks, stats


def assert_cache_invariant(target: HashRunner, prompt, output) -> None:
    """The target's KV cache holds every committed token but the last."""
    committed = list(prompt) + list(output)
    assert target.cache == committed[:-1], (len(target.cache), len(committed))


def every_third_round_rejects(round_index):
    return {0: None, 1: 0, 2: 2}[round_index % 3]


# --- the baseline and lossless greedy ---------------------------------------------------------


@pytest.mark.parametrize("prompt", [PROMPT, (7,)])
def test_target_only_matches_naive_decode(prompt):
    target = HashRunner()
    output, stats = generate(target, "none", prompt_ids=prompt, max_tokens=30)
    assert output == naive_greedy(target, prompt, 30)
    assert_cache_invariant(target, prompt, output)
    assert stats.target_forwards == 30  # the prompt rides in the first round's forward
    assert stats.drafted == 0 and stats.chosen_k == [0] * 30
    summary = stats.summary()  # what `generate --json` reports
    assert summary["finish_reason"] == "length"
    # no drafts: no acceptance, as bench reports it (it said 0.0, as if every draft had failed)
    assert summary["acceptance_rate"] is None and summary["mean_accepted_len"] is None


def test_drafting_own_greedy_continuation_accepts_everything():
    target, draft = HashRunner(), HashRunner()  # the same model as a draft model
    engine = make_engine(target, "model", Fixed(4), draft)
    reference = naive_greedy(target, PROMPT, 30)
    output, stats = run_request(engine, GenerationRequest(PROMPT, max_tokens=30))
    assert output == reference
    assert_cache_invariant(target, PROMPT, output)
    assert stats.accepted == stats.drafted == sum(stats.chosen_k) > 0
    assert stats.summary()["acceptance_by_position"] == [1.0] * 4
    assert stats.target_forwards == math.ceil(30 / 5)  # rounds of 4 drafts + bonus, prefill included
    # the draft slot keeps its cache across requests: a second prompt, then the first again
    other = (1, 2, 3)
    assert run_request(engine, GenerationRequest(other, max_tokens=12))[0] == naive_greedy(target, other, 12)
    output, stats = run_request(engine, GenerationRequest(PROMPT, max_tokens=30))
    assert output == reference and stats.accepted == stats.drafted


def test_self_drafting_with_sampling_accepts_everything():
    sampling = SamplingParams(temperature=0.9, top_k=10, seed=5)
    output, stats = generate(HashRunner(), "model", draft=HashRunner(), max_tokens=25, sampling=sampling)
    assert len(output) == 25
    assert stats.accepted == stats.drafted > 0  # q_draft == p_target, so min(1, p / q) = 1


def test_partial_acceptance_is_lossless_and_stats_are_consistent():
    target = HashRunner()
    drafter = OracleDrafter(HashRunner(), corrupt=every_third_round_rejects)
    output, stats = generate(target, drafter, Fixed(4), max_tokens=40)
    assert output == naive_greedy(target, PROMPT, 40)
    assert_cache_invariant(target, PROMPT, output)
    expected_accepted = [
        k if every_third_round_rejects(r) is None else min(k, every_third_round_rejects(r))
        for r, k in enumerate(stats.chosen_k)
    ]
    assert stats.accepted == sum(expected_accepted)
    assert stats.drafted == sum(stats.chosen_k)
    assert stats.new_tokens == len(output) == stats.accepted + len(stats.chosen_k)
    assert stats.target_forwards == len(stats.chosen_k)
    assert stats.rounds_with_draft == stats.drafted_by_position[0] == stats.sources["oracle"]
    assert sum(stats.accepted_by_position) == stats.accepted
    assert sum(stats.drafted_by_position) == stats.drafted
    assert stats.accepted_by_position == sorted(stats.accepted_by_position, reverse=True)
    by_position = stats.summary()["acceptance_by_position"]
    assert by_position[0] == pytest.approx(2 / 3, abs=0.1) and by_position[3] < by_position[0]


def test_a_wrong_rollback_changes_the_output():
    """The double is sensitive: keeping one rejected draft in the cache breaks losslessness."""
    target = LeakyRollbackRunner()
    drafter = OracleDrafter(HashRunner(), corrupt=every_third_round_rejects)
    output, _ = generate(target, drafter, Fixed(4), max_tokens=40)
    assert output != naive_greedy(target, PROMPT, 40)


# --- stops ------------------------------------------------------------------------------------


def first_new_token_index(reference, start=1):
    """An index j >= start whose token does not occur earlier in reference."""
    return next(j for j in range(start, len(reference)) if reference[j] not in reference[:j])


def test_eos_inside_an_accepted_round_cuts_the_output_there():
    target = HashRunner()
    reference = naive_greedy(target, PROMPT, 30)
    j = first_new_token_index(reference)
    assert j < 6  # inside the first round, which accepts 6 drafts
    request = GenerationRequest(PROMPT, max_tokens=30, stop_token_ids=frozenset({reference[j]}))
    chunks, stats = stream(target, OracleDrafter(HashRunner()), Fixed(6), request)
    assert chunks == [reference[:j]]
    assert stats.chosen_k == [6] and stats.accepted == 6 and stats.new_tokens == j
    assert stats.finish_reason == "stop"


def test_eos_as_the_first_token_emits_nothing():
    target = HashRunner()
    eos = naive_greedy(target, PROMPT, 1)[0]
    request = GenerationRequest(PROMPT, max_tokens=30, stop_token_ids=frozenset({eos}))
    chunks, stats = stream(target, OracleDrafter(HashRunner()), Fixed(6), request)
    assert chunks == [] and stats.new_tokens == 0 and stats.finish_reason == "stop"


def test_an_eos_token_in_the_prompt_does_not_stop():
    target = HashRunner()
    reference = naive_greedy(target, PROMPT, 12)
    eos = next(t for t in PROMPT if t not in reference)
    output, _ = generate(target, "ngram", max_tokens=12, stop_token_ids=frozenset({eos}))
    assert output == reference


@pytest.mark.parametrize("max_tokens", [1, 2, 5, 7, 11])
def test_max_tokens_is_exact(max_tokens):
    target = HashRunner()
    drafter = OracleDrafter(HashRunner())
    output, _ = generate(target, drafter, Fixed(8), max_tokens=max_tokens)
    assert output == naive_greedy(target, PROMPT, max_tokens)
    # the drafter is offered room for the round's own target token (none at all for 1 token)
    assert drafter.limits[:1] == ([max_tokens - 1] if max_tokens > 1 else [])
    assert_cache_invariant(target, PROMPT, output)


def test_max_tokens_is_exact_when_a_drafter_ignores_the_limit():
    target = HashRunner()
    drafter = OracleDrafter(HashRunner(), ignore_limit=True)
    output, stats = generate(target, drafter, Fixed(8), max_tokens=5)
    assert output == naive_greedy(target, PROMPT, 5)
    assert stats.accepted == 8 and stats.new_tokens == 5  # the round accepted 9, 5 were kept


def test_max_tokens_is_exact_when_an_eos_follows_the_cap_in_an_over_long_round():
    target = HashRunner()
    reference = naive_greedy(target, PROMPT, 30)
    j = first_new_token_index(reference, start=3)
    assert j < 8  # the EOS lies inside the 9 tokens the first round emits, past max_tokens = 2
    drafter = OracleDrafter(HashRunner(), ignore_limit=True)
    eos = frozenset({reference[j]})
    output, _ = generate(target, drafter, Fixed(8), max_tokens=2, stop_token_ids=eos)
    assert output == reference[:2]


@pytest.mark.parametrize("keep", [1, 4, 6])
def test_stop_condition_cuts_mid_round(keep):
    target = HashRunner()
    reference = naive_greedy(target, PROMPT, 30)
    request = GenerationRequest(PROMPT, max_tokens=30, stop_condition=StopAfter(keep))
    chunks, stats = stream(target, OracleDrafter(HashRunner()), Fixed(6), request)
    assert chunks == [reference[:keep]] and stats.chosen_k == [6]


def test_stop_sequence_spanning_rounds_is_not_emitted():
    target = HashRunner()
    reference = naive_greedy(target, PROMPT, 30)
    start = next(j for j in range(4, 20) if reference[j : j + 2] not in
                 [reference[i : i + 2] for i in range(j)])
    request = GenerationRequest(
        PROMPT, max_tokens=30, stop_condition=StopBeforeSequence(reference[start : start + 2])
    )
    chunks, _ = stream(target, OracleDrafter(HashRunner()), Fixed(2), request)
    assert sum(chunks, []) == reference[:start]


@pytest.mark.parametrize("stop", ["eos", "condition"])
def test_cache_invariant_holds_after_a_stop_mid_round(stop):
    """After any generation the target's cache is the committed tokens but the last, so the
    next request (or a continuation) could reuse it."""
    target = HashRunner()
    reference = naive_greedy(target, PROMPT, 30)
    j = first_new_token_index(reference, start=2)
    if stop == "eos":
        request = GenerationRequest(PROMPT, max_tokens=30, stop_token_ids=frozenset({reference[j]}))
    else:
        request = GenerationRequest(PROMPT, max_tokens=30, stop_condition=StopAfter(j))
    output, _ = run_request(make_engine(target, OracleDrafter(HashRunner()), Fixed(6)), request)
    assert output == reference[:j]
    assert_cache_invariant(target, PROMPT, output)


# --- context length ---------------------------------------------------------------------------


@pytest.mark.parametrize("prompt_len", [16, 20])
def test_prompt_that_fills_the_context_is_refused(prompt_len):
    target = HashRunner(context_length=16)
    with pytest.raises(TandemError, match="context"):
        generate(target, "none", prompt_ids=tuple(range(prompt_len)), max_tokens=4)


def test_prompt_one_short_of_the_context_gets_one_token():
    target = HashRunner(context_length=16)
    prompt = tuple(range(15))
    output, _ = generate(target, "ngram", prompt_ids=prompt, max_tokens=1)
    assert output == naive_greedy(target, prompt, 1)


@pytest.mark.parametrize("drafter", ["none", "oracle"])
def test_generation_stops_at_the_context_length(drafter):
    """max_tokens beyond the context: the output ends when the context is full, and the target
    is never asked to cache more positions than its context holds."""
    target = HashRunner(context_length=24)
    proposer = "none" if drafter == "none" else OracleDrafter(HashRunner())
    output, _ = generate(target, proposer, Fixed(4), max_tokens=100)
    assert output == naive_greedy(target, PROMPT, 24 - len(PROMPT))


# --- n-gram drafting and determinism -----------------------------------------------------------


REPETITIVE = (3, 4, 5, 6, 7) * 4


@pytest.mark.parametrize("depth", [Fixed(4), Auto()], ids=["fixed", "auto"])
def test_ngram_drafting_saves_target_forwards_with_identical_output(depth):
    baseline_target, target = HashRunner(copy=True), HashRunner(copy=True)
    baseline, baseline_stats = generate(baseline_target, "none", prompt_ids=REPETITIVE, max_tokens=40)
    output, stats = generate(target, "ngram", depth, prompt_ids=REPETITIVE, max_tokens=40)
    assert output == baseline == naive_greedy(target, REPETITIVE, 40)
    assert_cache_invariant(target, REPETITIVE, output)
    # the first copy is a lookup; once confirmed, the copy follows its source (drafters/ngram.py)
    assert stats.accepted > 0 and set(stats.sources) <= {"ngram2", "ngram3", "ngram4", "follow0", "follow1", "follow2"}
    assert any(source.startswith("follow") for source in stats.sources)
    if isinstance(depth, Fixed):
        assert stats.target_forwards * 3 < baseline_stats.target_forwards


def test_same_seed_same_output_different_seed_different_output():
    def run(seed):
        sampling = SamplingParams(temperature=1.0, seed=seed)
        return generate(HashRunner(), "model", draft=HashRunner(seed=1), max_tokens=40, sampling=sampling)[0]

    assert run(3) == run(3)
    assert run(3) != run(4)
