"""The speculative loop against a fast numpy double of a model runner: stops, limits, stats, and
lossless greedy output against a naive decode that recomputes every token from scratch.

`HashRunner` keeps a real KV cache of token ids; the logits at a position are a pure function of
the cached prefix (a table lookup on the last two tokens, optionally plus an induction-style
bonus for copying), so a wrong rollback changes what the model says next. The naive reference
calls the same pure function on the whole committed sequence, with no cache at all.
"""

import math

import numpy as np
import pytest

from tandem.engine.generator import SpeculativeGenerator
from tandem.engine.request import GenerationRequest
from tandem.engine.stats import GenerationStats
from tandem.errors import TandemError
from tandem.models.cost import CostModel
from tandem.spec.depth import AutoDepth, FixedDepth
from tandem.spec.drafters.base import Draft, DraftRequest
from tandem.spec.drafters.model import ModelDrafter
from tandem.spec.drafters.ngram import NgramDrafter
from tandem.spec.drafters.none import NoDrafter
from tandem.spec.sampling import SamplingParams

VOCAB = 32
PROMPT = (5, 17, 3, 28, 9)


class HashRunner:
    """A ModelRunner double: deterministic logits from the cached prefix, milliseconds per run."""

    def __init__(self, seed=0, context_length=256, copy=False, vocab=VOCAB):
        self.name = f"hash-{seed}"
        self.vocab_size = vocab
        self.context_length = context_length
        self.cost = CostModel({1: 20.0, 16: 20.0})  # GPU-like: verifying is nearly free
        rng = np.random.default_rng(seed)
        self.table = rng.normal(scale=3.0, size=(vocab + 1, vocab, vocab)).astype(np.float32)
        self.copy = copy
        self.cache: list[int] = []

    def next_logits(self, prefix) -> np.ndarray:
        """The pure function of the model.  -> [vocab]."""
        previous = prefix[-2] if len(prefix) > 1 else self.vocab_size  # row vocab: no previous
        logits = self.table[previous, prefix[-1]].copy()
        if self.copy:  # favour what followed the latest earlier occurrence of the last token
            for i in range(len(prefix) - 2, -1, -1):
                if prefix[i] == prefix[-1]:
                    logits[prefix[i + 1]] += 20.0
                    break
        return logits

    @property
    def num_cached_tokens(self) -> int:
        return len(self.cache)

    def forward(self, token_ids, num_logits=None) -> np.ndarray:
        self.cache.extend(int(t) for t in token_ids)
        if len(self.cache) > self.context_length:
            raise OverflowError(f"cache of {len(self.cache)} past context {self.context_length}")
        n = len(token_ids) if num_logits is None else num_logits
        end = len(self.cache)
        rows = [self.next_logits(self.cache[:i]) for i in range(end - n + 1, end + 1)]
        return np.stack(rows) if rows else np.zeros((0, self.vocab_size), np.float32)  # [n, vocab]

    def rollback(self, length: int) -> None:
        assert 0 <= length <= len(self.cache), (length, len(self.cache))
        del self.cache[length:]

    def reset(self) -> None:
        self.cache = []


class LeakyRollbackRunner(HashRunner):
    """A broken runner that keeps one token too many on rollback (the first rejected draft)."""

    def rollback(self, length: int) -> None:
        super().rollback(min(length + 1, len(self.cache)))


class OracleDrafter:
    """Proposes the target's own greedy continuation. `corrupt(round)` names a draft index to
    change (so the target rejects it); `ignore_limit` proposes k tokens whatever the limit."""

    name = "oracle"

    def __init__(self, model: HashRunner, corrupt=lambda round_index: None, ignore_limit=False):
        self.model = model
        self.corrupt = corrupt
        self.ignore_limit = ignore_limit
        self.limits: list[int] = []

    def cost_ms(self, num_tokens: int) -> float:
        return 0.1

    def propose(self, token_ids, request: DraftRequest) -> Draft:
        self.limits.append(request.limit)
        k = request.depth.choose_k(self.name, self.cost_ms, 64 if self.ignore_limit else request.limit)
        tokens = list(token_ids)
        for _ in range(k):
            tokens.append(int(np.argmax(self.model.next_logits(tokens))))
        drafts = tokens[len(token_ids):]
        bad = self.corrupt(len(self.limits) - 1)
        if bad is not None and bad < k:
            drafts[bad] = (drafts[bad] + 1) % VOCAB
        return Draft(drafts, None, self.name)


class StopAfter:
    def __init__(self, n: int):
        self.n = n

    def tokens_to_keep(self, output_ids):
        return self.n if len(output_ids) >= self.n else None


class StopBeforeSequence:
    """Like a stop string: stop at the first occurrence of `sequence`, which is not emitted."""

    def __init__(self, sequence: list[int]):
        self.sequence = sequence

    def tokens_to_keep(self, output_ids):
        n = len(self.sequence)
        for start in range(len(output_ids) - n + 1):
            if output_ids[start : start + n] == self.sequence:
                return start
        return None


def naive_greedy(model: HashRunner, prompt, max_tokens: int) -> list[int]:
    """The slow reference: every token from the whole sequence, no cache, no drafts."""
    tokens = list(prompt)
    for _ in range(max_tokens):
        tokens.append(int(np.argmax(model.next_logits(tokens))))
    return tokens[len(prompt):]


def generate(target, drafter, depth=None, **request):
    request.setdefault("prompt_ids", PROMPT)
    generator = SpeculativeGenerator(target, drafter, depth or FixedDepth(4))
    return generator.generate(GenerationRequest(**request))


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
    output, stats = generate(target, NoDrafter(), prompt_ids=prompt, max_tokens=30)
    assert output == naive_greedy(target, prompt, 30)
    assert_cache_invariant(target, prompt, output)
    assert stats.target_forwards == (1 if len(prompt) > 1 else 0) + 30
    assert stats.drafted == 0 and stats.chosen_k == [0] * 30


def test_drafting_own_greedy_continuation_accepts_everything():
    target = HashRunner()
    drafter = ModelDrafter(HashRunner())  # the same model as a draft model
    reference = naive_greedy(target, PROMPT, 30)
    output, stats = generate(target, drafter, FixedDepth(4), max_tokens=30)
    assert output == reference
    assert_cache_invariant(target, PROMPT, output)
    assert stats.accepted == stats.drafted == sum(stats.chosen_k) > 0
    assert stats.summary()["acceptance_by_position"] == [1.0] * 4
    assert stats.target_forwards == 1 + math.ceil(30 / 5)  # prefill + rounds of 4 drafts + bonus
    # the drafter keeps its own cache across requests: a second prompt, then the first again
    other = (1, 2, 3)
    assert generate(target, drafter, max_tokens=12, prompt_ids=other)[0] == naive_greedy(target, other, 12)
    assert generate(target, drafter, max_tokens=30)[0] == reference


def test_self_drafting_with_sampling_accepts_everything():
    sampling = SamplingParams(temperature=0.9, top_k=10, seed=5)
    output, stats = generate(HashRunner(), ModelDrafter(HashRunner()), max_tokens=25, sampling=sampling)
    assert len(output) == 25
    assert stats.accepted == stats.drafted > 0  # q_draft == p_target, so min(1, p / q) = 1


def test_partial_acceptance_is_lossless_and_stats_are_consistent():
    target = HashRunner()
    drafter = OracleDrafter(HashRunner(), corrupt=every_third_round_rejects)
    output, stats = generate(target, drafter, FixedDepth(4), max_tokens=40)
    assert output == naive_greedy(target, PROMPT, 40)
    assert_cache_invariant(target, PROMPT, output)
    expected_accepted = [
        k if every_third_round_rejects(r) is None else min(k, every_third_round_rejects(r))
        for r, k in enumerate(stats.chosen_k)
    ]
    assert stats.accepted == sum(expected_accepted)
    assert stats.drafted == sum(stats.chosen_k)
    assert stats.new_tokens == len(output) == stats.accepted + len(stats.chosen_k)
    assert stats.target_forwards == 1 + len(stats.chosen_k)
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
    output, _ = generate(target, drafter, FixedDepth(4), max_tokens=40)
    assert output != naive_greedy(target, PROMPT, 40)


# --- stops ------------------------------------------------------------------------------------


def first_new_token_index(reference, start=1):
    """An index j >= start whose token does not occur earlier in reference."""
    return next(j for j in range(start, len(reference)) if reference[j] not in reference[:j])


def stream(target, drafter, depth, request) -> tuple[list[list[int]], GenerationStats]:
    stats = GenerationStats()
    chunks = list(SpeculativeGenerator(target, drafter, depth).stream(request, stats))
    return chunks, stats


def test_eos_inside_an_accepted_round_cuts_the_output_there():
    target = HashRunner()
    reference = naive_greedy(target, PROMPT, 30)
    j = first_new_token_index(reference)
    assert j < 6  # inside the first round, which accepts 6 drafts
    request = GenerationRequest(PROMPT, max_tokens=30, stop_token_ids=frozenset({reference[j]}))
    chunks, stats = stream(target, OracleDrafter(HashRunner()), FixedDepth(6), request)
    assert chunks == [reference[:j]]
    assert stats.chosen_k == [6] and stats.accepted == 6 and stats.new_tokens == j


def test_eos_as_the_first_token_emits_nothing():
    target = HashRunner()
    eos = naive_greedy(target, PROMPT, 1)[0]
    request = GenerationRequest(PROMPT, max_tokens=30, stop_token_ids=frozenset({eos}))
    chunks, stats = stream(target, OracleDrafter(HashRunner()), FixedDepth(6), request)
    assert chunks == [] and stats.new_tokens == 0


def test_an_eos_token_in_the_prompt_does_not_stop():
    target = HashRunner()
    reference = naive_greedy(target, PROMPT, 12)
    eos = next(t for t in PROMPT if t not in reference)
    output, _ = generate(target, NgramDrafter(), max_tokens=12, stop_token_ids=frozenset({eos}))
    assert output == reference


@pytest.mark.parametrize("max_tokens", [1, 2, 5, 7, 11])
def test_max_tokens_is_exact(max_tokens):
    target = HashRunner()
    drafter = OracleDrafter(HashRunner())
    output, _ = generate(target, drafter, FixedDepth(8), max_tokens=max_tokens)
    assert output == naive_greedy(target, PROMPT, max_tokens)
    assert drafter.limits[0] == max_tokens - 1  # room for the round's own target token
    assert_cache_invariant(target, PROMPT, output)


def test_max_tokens_is_exact_when_a_drafter_ignores_the_limit():
    target = HashRunner()
    drafter = OracleDrafter(HashRunner(), ignore_limit=True)
    output, stats = generate(target, drafter, FixedDepth(8), max_tokens=5)
    assert output == naive_greedy(target, PROMPT, 5)
    assert stats.accepted == 8 and stats.new_tokens == 5  # the round accepted 9, 5 were kept


def test_max_tokens_is_exact_when_an_eos_follows_the_cap_in_an_over_long_round():
    target = HashRunner()
    reference = naive_greedy(target, PROMPT, 30)
    j = first_new_token_index(reference, start=3)
    assert j < 8  # the EOS lies inside the 9 tokens the first round emits, past max_tokens = 2
    drafter = OracleDrafter(HashRunner(), ignore_limit=True)
    eos = frozenset({reference[j]})
    output, _ = generate(target, drafter, FixedDepth(8), max_tokens=2, stop_token_ids=eos)
    assert output == reference[:2]


@pytest.mark.parametrize("keep", [1, 4, 6])
def test_stop_condition_cuts_mid_round(keep):
    target = HashRunner()
    reference = naive_greedy(target, PROMPT, 30)
    request = GenerationRequest(PROMPT, max_tokens=30, stop_condition=StopAfter(keep))
    chunks, stats = stream(target, OracleDrafter(HashRunner()), FixedDepth(6), request)
    assert chunks == [reference[:keep]] and stats.chosen_k == [6]


def test_stop_sequence_spanning_rounds_is_not_emitted():
    target = HashRunner()
    reference = naive_greedy(target, PROMPT, 30)
    start = next(j for j in range(4, 20) if reference[j : j + 2] not in
                 [reference[i : i + 2] for i in range(j)])
    request = GenerationRequest(
        PROMPT, max_tokens=30, stop_condition=StopBeforeSequence(reference[start : start + 2])
    )
    chunks, _ = stream(target, OracleDrafter(HashRunner()), FixedDepth(2), request)
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
    output, _ = SpeculativeGenerator(target, OracleDrafter(HashRunner()), FixedDepth(6)).generate(request)
    assert output == reference[:j]
    assert_cache_invariant(target, PROMPT, output)


# --- context length ---------------------------------------------------------------------------


@pytest.mark.parametrize("prompt_len", [16, 20])
def test_prompt_that_fills_the_context_is_refused(prompt_len):
    target = HashRunner(context_length=16)
    with pytest.raises(TandemError, match="context"):
        generate(target, NoDrafter(), prompt_ids=tuple(range(prompt_len)), max_tokens=4)


def test_prompt_one_short_of_the_context_gets_one_token():
    target = HashRunner(context_length=16)
    prompt = tuple(range(15))
    output, _ = generate(target, NgramDrafter(), prompt_ids=prompt, max_tokens=1)
    assert output == naive_greedy(target, prompt, 1)


@pytest.mark.parametrize("drafter", ["none", "oracle"])
def test_generation_stops_at_the_context_length(drafter):
    """max_tokens beyond the context: the output ends when the context is full, and the target
    is never asked to cache more positions than its context holds."""
    target = HashRunner(context_length=24)
    proposer = NoDrafter() if drafter == "none" else OracleDrafter(HashRunner())
    output, _ = generate(target, proposer, FixedDepth(4), max_tokens=100)
    assert output == naive_greedy(target, PROMPT, 24 - len(PROMPT))


# --- n-gram drafting and determinism -----------------------------------------------------------


REPETITIVE = (3, 4, 5, 6, 7) * 4


@pytest.mark.parametrize("depth", [FixedDepth(4), AutoDepth(CostModel({1: 20.0, 16: 20.0}))],
                         ids=["fixed", "auto"])
def test_ngram_drafting_saves_target_forwards_with_identical_output(depth):
    baseline_target, target = HashRunner(copy=True), HashRunner(copy=True)
    baseline, baseline_stats = generate(baseline_target, NoDrafter(), prompt_ids=REPETITIVE, max_tokens=40)
    output, stats = generate(target, NgramDrafter(), depth, prompt_ids=REPETITIVE, max_tokens=40)
    assert output == baseline == naive_greedy(target, REPETITIVE, 40)
    assert_cache_invariant(target, REPETITIVE, output)
    assert stats.accepted > 0 and set(stats.sources) <= {"ngram2", "ngram3", "ngram4"}
    if isinstance(depth, FixedDepth):
        assert stats.target_forwards * 3 < baseline_stats.target_forwards


def test_same_seed_same_output_different_seed_different_output():
    def run(seed):
        sampling = SamplingParams(temperature=1.0, seed=seed)
        return generate(HashRunner(), ModelDrafter(HashRunner(seed=1)), max_tokens=40, sampling=sampling)[0]

    assert run(3) == run(3)
    assert run(3) != run(4)
