"""Speculative sampling is exact: the emitted tokens follow the target's distribution p_target,
whatever the draft's q_draft. Checked by chi-square on a 6-token vocabulary with a p and a q
chosen to differ (q > p, q < p, q = 0 where p > 0, and p = 0 where q > 0): for one draft
token, for k = 3 drafts across rounds (token pairs, the bonus token included), for one-hot
(n-gram) proposals, and after top-k / top-p; and end to end, through the batching engine with
a tiny torch target and draft model.
The same harness run with two wrong rules (accept everything; the "p >= q - tolerance, else
argmax" shortcut) fails by a wide margin, which shows the test can tell exact from not.
All seeds are fixed, so a run is deterministic and never flaky.
"""

import numpy as np
import pytest

from engine_support import make_engine
from sampling_harness import (
    DRAFT_LOGITS,
    P_TARGET,
    PAIR_P,
    P_NEXT,
    P_START,
    Q_DRAFT,
    Q_NEXT,
    Q_START,
    TARGET_LOGITS,
    assert_departs,
    assert_follows,
    first_token_counts,
    token_pair_counts,
)
from tandem.engine.request import GenerationRequest
from tandem.engine.run_request import generate
from tandem.models.torch_runner import TorchRunner
from tandem.speculation.acceptance import AcceptResult, accept_positional, accept_sampling
from tandem.speculation.sampling import (SamplingParams, position_race, probs_from_logits, race_winner, sample,
                                        sample_at)

# --- the two wrong rules, same signature as accept_sampling ---------------------------------


def accept_every_draft(draft_tokens, q_draft, p_target, rng) -> AcceptResult:
    k = len(draft_tokens)
    return AcceptResult(k, sample(p_target[k], rng))


def accept_within_tolerance(draft_tokens, q_draft, p_target, rng, tolerance=0.1) -> AcceptResult:
    """Keep d_i if p(d_i) >= q(d_i) - tolerance, else emit argmax p (the articles' shortcut)."""
    for i, token in enumerate(draft_tokens):
        q_token = 1.0 if q_draft is None else q_draft[i][token]
        if p_target[i][token] < q_token - tolerance:
            return AcceptResult(i, int(np.argmax(p_target[i])))
    k = len(draft_tokens)
    return AcceptResult(k, sample(p_target[k], rng))


RULES = {"exact": accept_sampling, "accept_all": accept_every_draft, "tolerance": accept_within_tolerance}


# --- one draft token -------------------------------------------------------------------------


def test_first_token_follows_p_target():
    assert_follows(first_token_counts(accept_sampling, P_TARGET, Q_DRAFT, 100_000, seed=1), P_TARGET)


@pytest.mark.parametrize("rule", ["accept_all", "tolerance"])
def test_wrong_rules_fail_the_same_check(rule):
    counts = first_token_counts(RULES[rule], P_TARGET, Q_DRAFT, 20_000, seed=2)
    assert_departs(counts, P_TARGET)
    support = P_TARGET > 0  # and not only because a p = 0 token appeared
    assert_departs(counts[support], P_TARGET[support] / P_TARGET[support].sum())


@pytest.mark.parametrize("token", [0, 1, 3, 5])  # p largest, p mid, q = 0 elsewhere, p = 0
def test_one_hot_proposal_is_exact(token):
    counts = first_token_counts(accept_sampling, P_TARGET, Q_DRAFT, 30_000, seed=3, one_hot_token=token)
    assert_follows(counts, P_TARGET)


@pytest.mark.parametrize(
    "params",
    [SamplingParams(temperature=0.8, top_k=4), SamplingParams(temperature=1.3, top_p=0.7)],
    ids=["top_k", "top_p"],
)
def test_top_k_top_p_keep_exactness_for_the_processed_distribution(params):
    p = probs_from_logits(TARGET_LOGITS[None, :], params)[0]  # [vocab]
    q = probs_from_logits(DRAFT_LOGITS[None, :], params)[0]
    assert (p == 0).any() and ((q > 0) & (p == 0)).any()  # the filter bites; q proposes outside p
    counts = first_token_counts(accept_sampling, p, q, 60_000, seed=4)
    assert_follows(counts, p)


def test_top_p_zero_keeps_the_most_likely_token_alone():
    """OpenAI takes top_p from 0 to 1: 0 keeps the likeliest token (the filter kept none, 0/0)."""
    logits = np.stack([TARGET_LOGITS, DRAFT_LOGITS]).astype(np.float32)  # [2, vocab]
    probs = probs_from_logits(logits, SamplingParams(temperature=1.0, top_p=0.0))  # [2, vocab]
    np.testing.assert_array_equal(probs, np.eye(logits.shape[1])[logits.argmax(axis=1)])


@pytest.mark.parametrize("temperature", [1e-300, 1e-308, 5e-324])
def test_a_tiny_temperature_is_greedy_not_nan(temperature):
    """Logits divided by a temperature near zero overflow to inf, and inf - inf made every
    probability NaN: the server then sampled the vocabulary's last id (a padding token)."""
    logits = np.stack([TARGET_LOGITS, DRAFT_LOGITS]).astype(np.float32) * 40  # [2, vocab]
    for params in (SamplingParams(temperature=temperature), SamplingParams(temperature=temperature, top_k=3),
                   SamplingParams(temperature=temperature, top_p=0.5)):
        probs = probs_from_logits(logits, params)  # [2, vocab]
        assert np.isfinite(probs).all()
        np.testing.assert_array_equal(probs, np.eye(logits.shape[1])[logits.argmax(axis=1)])



# --- k = 3 drafts, token pairs across rounds -------------------------------------------------


@pytest.mark.parametrize("one_hot", [False, True], ids=["sampled_q", "one_hot"])
def test_k3_token_pairs_follow_p_target(one_hot):
    counts = token_pair_counts(accept_sampling, 25_000, seed=5, one_hot=one_hot)
    assert_follows(counts[0].sum(axis=1), P_START)  # the first token alone
    assert_follows(counts[0], PAIR_P[0])  # the second given the first
    assert_follows(counts[1], PAIR_P[1])  # the fourth (bonus when all accepted) given the third


@pytest.mark.parametrize("rule", ["accept_all", "tolerance"])
def test_wrong_rules_fail_the_k3_check(rule):
    counts = token_pair_counts(RULES[rule], 5_000, seed=6, one_hot=False)
    assert_departs(counts[0], PAIR_P[0])


# --- end to end: the batching engine with torch models --------------------------------------


class FirstTokens:
    """A stop condition: keep the first n output tokens, then stop (saves a round)."""

    def __init__(self, n: int):
        self.n = n

    def tokens_to_keep(self, output_ids):
        return self.n if len(output_ids) >= self.n else None


ENGINE_PROMPT = (12,)
ENGINE_SAMPLING = dict(temperature=1.0, top_k=3)  # 3 x 3 token pairs, so a few hundred runs do


@pytest.fixture(scope="module")
def near_draft(tiny_target, tmp_path_factory):
    """A draft that agrees with the target about 60% of the time: the target's weights with noise
    on the output layer (tiny_draft, an unrelated model, would be rejected nearly always)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_target)
    torch.manual_seed(0)
    with torch.no_grad():
        model.lm_head.weight.add_(0.06 * torch.randn_like(model.lm_head.weight))
    folder = tmp_path_factory.mktemp("near-draft")
    model.save_pretrained(folder)
    return folder


def next_probs(model_dir, tokens) -> np.ndarray:
    """The processed next-token distribution after `tokens`.  -> [vocab]"""
    logits = TorchRunner(str(model_dir)).forward(list(tokens), num_logits=1)  # [1, vocab]
    return probs_from_logits(logits, SamplingParams(**ENGINE_SAMPLING))[0]


@pytest.mark.parametrize("seeded", [True, False], ids=["positional_rule", "speculative_sampling"])
@pytest.mark.parametrize("runner", ["serial", "fused", "fused-device-rule"])
def test_engine_sampling_follows_the_target_for_the_first_two_tokens(tiny_target, near_draft, runner, seeded,
                                                                      monkeypatch):
    """Many one-token-prompt requests through BatchEngine (draft model, k = 2): the pairs of
    first emitted tokens (accepted drafts, recovered and bonus tokens alike) follow the target's
    exact p(t0) p(t1 | t0). Seeded requests take the positional rule; unseeded ones speculative
    sampling, on an rng the test seeds through Sequence.create (each request a fresh stream), so
    the run is still deterministic. The fused runner keeps logits on the device; on the CPU
    numpy reads them in place, and "fused-device-rule" sends them through the torch rule that
    a GPU uses."""
    if runner == "fused-device-rule":
        monkeypatch.setattr("tandem.speculation.acceptance.HOST_DEVICES", ())
        runner = "fused"
    if not seeded:
        streams = iter(range(10**6))
        make_rng = np.random.default_rng
        monkeypatch.setattr("tandem.engine.sequence.np.random.default_rng",
                            lambda seed=None: make_rng([77, next(streams)] if seed is None else seed))
    p_first = next_probs(tiny_target, ENGINE_PROMPT)  # [vocab]
    assert ((next_probs(near_draft, ENGINE_PROMPT) > 0) & (p_first == 0)).any()  # q proposes outside p
    pair_p = np.zeros((len(p_first), len(p_first)))  # [t0, t1]
    for t0 in np.flatnonzero(p_first).tolist():
        pair_p[t0] = p_first[t0] * next_probs(tiny_target, ENGINE_PROMPT + (t0,))
    engine = make_engine(tiny_target, near_draft, "model", 2, slots=1, runner=runner)
    counts, drafted, accepted = np.zeros_like(pair_p, dtype=np.int64), 0, 0
    for seed in range(250):
        sampling = SamplingParams(**ENGINE_SAMPLING, seed=seed if seeded else None)
        request = GenerationRequest(ENGINE_PROMPT, max_tokens=3, sampling=sampling, stop_condition=FirstTokens(2))
        output, stats = generate(engine, request)
        counts[output[0], output[1]] += 1
        drafted, accepted = drafted + stats.drafted, accepted + stats.accepted
    assert 0.2 * drafted < accepted < 0.9 * drafted  # both acceptance and rejection were exercised
    assert_follows(counts, pair_p)


# --- determinism ------------------------------------------------------------------------------


def emitted_stream(seed: int, rounds: int = 300) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    q_draft = np.stack([Q_DRAFT, Q_NEXT[0], Q_NEXT[1]])  # [3, vocab]
    p_target = np.stack([P_TARGET, P_NEXT[0], P_NEXT[1], P_NEXT[2]])  # [4, vocab]
    out = []
    for _ in range(rounds):
        drafts = [sample(q_draft[0], rng), 1, 2]
        out.append(accept_sampling(drafts, q_draft, p_target, rng).emitted(drafts))
    return out


def test_same_seed_same_tokens_different_seed_different_tokens():
    assert emitted_stream(seed=11) == emitted_stream(seed=11)
    assert emitted_stream(seed=11) != emitted_stream(seed=12)


# --- seeded requests: the positional rule -------------------------------------------------------


def positional_pair_counts(trials: int, seed: int, one_hot: bool) -> np.ndarray:
    """token_pair_counts for the positional rule: each trial a request with its own race per
    output position, run by every round that reaches the position (a round's unused races are
    the next round's), drafts from Q running the same races (or one-hot, as in the harness)."""
    rng = np.random.default_rng(seed)
    counts = np.zeros((2, len(P_START), len(P_START)), dtype=np.int64)
    for _ in range(trials):
        races, emitted = rng.standard_exponential((8, len(P_START))), []  # [position, vocab]
        while len(emitted) < 4:
            start, previous = len(emitted), (emitted[-1] if emitted else None)
            drafts, p_rows = [], [P_START if previous is None else P_NEXT[previous]]
            for depth in range(3):
                if one_hot:
                    token = 0 if previous is None else (previous + 1) % len(P_START)
                else:
                    token = race_winner(Q_START if previous is None else Q_NEXT[previous], races[start + depth])
                drafts.append(token)
                p_rows.append(P_NEXT[token])
                previous = token
            emitted += accept_positional(drafts, np.stack(p_rows), lambda i: races[start + i]).emitted(drafts)
        counts[0, emitted[0], emitted[1]] += 1
        counts[1, emitted[2], emitted[3]] += 1
    return counts


@pytest.mark.parametrize("one_hot", [False, True], ids=["coupled_q", "one_hot"])
def test_positional_rule_token_pairs_follow_p_target(one_hot):
    counts = positional_pair_counts(25_000, seed=7, one_hot=one_hot)
    assert_follows(counts[0].sum(axis=1), P_START)
    assert_follows(counts[0], PAIR_P[0])
    assert_follows(counts[1], PAIR_P[1])


def test_position_races_are_exponential_and_depend_on_seed_and_position_only():
    times = np.concatenate([position_race(seed, 3, 20) for seed in range(1_000)])  # [20,000]
    counts = np.histogram(1 - np.exp(-times), bins=20, range=(0.0, 1.0))[0]  # Exp(1) times: uniform here
    assert_follows(counts, np.full(20, 1 / 20))
    assert np.array_equal(position_race(5, 10, 30), position_race(5, 10, 151_936)[:30])  # any vocab: same times
    assert np.array_equal(position_race(5, 10, 30), position_race(5, 10, 30))
    assert not np.array_equal(position_race(5, 0, 30), position_race(6, 0, 30))
    assert not np.array_equal(position_race(5, 0, 30), position_race(5, 1, 30))


def test_a_race_never_picks_a_token_of_probability_zero():
    probs = np.array([0.0, 0.5, 0.0, 0.5])
    race = np.array([0.0, 2.0, 0.0, 1.0])  # a time of 0 over a probability of 0: no NaN
    assert race_winner(probs, race) == 3


def test_a_token_of_tiny_probability_wins_about_as_rarely_as_it_should():
    """numpy's float32 exponential draw is exactly 0 about once in 8 million: with a 49k or 151k
    vocabulary, one seeded position in 170 to 55 had a token of negligible probability win it (a user's
    seeded answer at temperature 0.1: 'Helloarp, welcome to the worldiatric')."""
    vocab = 151_936
    probs = np.full(vocab, 1e-6 / (vocab - 1))
    probs[7] = 1 - 1e-6  # [vocab]; any other token should win one position in a million
    winners = [race_winner(probs, position_race(seed, position, vocab)) for seed in range(3) for position in range(100)]
    assert winners == [7] * 300


def test_kernel_noise_moves_a_seeded_token_about_as_rarely_as_any_rule_can():
    """What made a user's seeded request change with the server's state: logits that differ in
    their last bits between call shapes (llama.cpp's Q4 kernels) moved the inverse CDF's
    boundaries in token-id order, so the token could become its id neighbour (seen: p 0.20 to
    0.024). No rule that fixes a position's randomness can keep every token when p moves to p':
    the best possible changes it with probability TV(p, p'); the race's winner changes with at
    most 2 TV / (1 + TV) (the Gumbel coupling's bound); the inverse CDF's, several times more."""
    rng = np.random.default_rng(0)
    vocab, positions, noise = 2_000, 3_000, 0.05
    params = SamplingParams(temperature=0.8)
    race_flips, cdf_flips, least, bound = 0, 0, 0.0, 0.0
    for position in range(positions):
        logits = rng.gumbel(size=(1, vocab)) * 1.5  # [1, vocab]: a few plausible tokens, a long tail
        noisy = logits + rng.normal(scale=noise, size=logits.shape)
        p, p_noisy = probs_from_logits(logits, params)[0], probs_from_logits(noisy, params)[0]
        tv = 0.5 * np.abs(p - p_noisy).sum()
        least, bound = least + tv, bound + 2 * tv / (1 + tv)
        race = position_race(1, position, vocab)
        race_flips += race_winner(p, race) != race_winner(p_noisy, race)
        uniform = float(rng.random())
        cdf_flips += sample_at(p, uniform) != sample_at(p_noisy, uniform)
    assert least * 0.8 < race_flips < bound * 1.2, (least, race_flips, bound)
    assert cdf_flips > 3 * race_flips, (cdf_flips, race_flips)


SEEDED = dict(temperature=0.7, top_k=3)


@pytest.mark.parametrize("runner", ["serial", "fused"])
def test_a_seed_gives_the_same_tokens_whatever_was_drafted(tiny_target, near_draft, runner):
    """What a seed promises: the same output for the same seed, at any drafter and k (as the
    planner or the load choose them), and equal to sampling without speculation. Speculative
    sampling's draws depend on how the rounds fall, so its output changed with k."""
    prompts = [(12,), (3, 40, 7), (90, 5)]
    configs = [("none", 0), ("model", 1), ("model", 3), ("model", "auto"), ("ngram", 4), ("hybrid", "auto")]
    outputs = {}
    for drafter, k in configs:
        engine = make_engine(tiny_target, near_draft, drafter, k, slots=3, runner=runner)
        for seed, prompt in enumerate(prompts):
            request = GenerationRequest(prompt, max_tokens=24, sampling=SamplingParams(**SEEDED, seed=seed))
            outputs[drafter, k, seed] = generate(engine, request)[0]
    for seed in range(len(prompts)):
        plain = outputs["none", 0, seed]
        assert len(set(plain)) > 2  # sampled, not a fixed point
        for drafter, k in configs:
            assert outputs[drafter, k, seed] == plain, (drafter, k, seed)
    drafted = make_engine(tiny_target, near_draft, "model", 3, slots=1, runner=runner)
    _, stats = generate(drafted, GenerationRequest(prompts[0], 24, SamplingParams(**SEEDED, seed=0)))
    assert 0 < stats.accepted < stats.drafted  # drafts were kept and replaced along the way


def test_a_request_resumed_from_its_output_so_far_goes_on_as_it_would_have(tiny_target, near_draft):
    """A cluster's failover or move re-submits a stream as its prompt plus the output so far
    (`output_offset` counts those tokens): a seeded stream then goes on with the tokens it
    would have emitted in one piece, its positions' uniforms kept."""
    engine = make_engine(tiny_target, near_draft, "model", 3, slots=1)
    sampling = SamplingParams(**SEEDED, seed=4)
    whole, _ = generate(engine, GenerationRequest((12, 5), max_tokens=20, sampling=sampling))
    resumed, _ = generate(engine, GenerationRequest((12, 5, *whole[:8]), max_tokens=12, sampling=sampling,
                                                    output_offset=8))
    assert resumed == whole[8:]
    restarted, _ = generate(engine, GenerationRequest((12, 5, *whole[:8]), max_tokens=12, sampling=sampling))
    assert restarted != whole[8:]  # without the offset the positions start again: other tokens
