"""The device acceptance rules (torch, device_acceptance.py) against the numpy reference
(acceptance.py): greedy gives the same result on random logits; speculative sampling gives the
same AcceptResult from the same seed, and leaves the rng in the same state, over many random
cases and SamplingParams settings; the tokens it emits follow p_target (chi-square, with the
harness in sampling_harness.py); and bf16 logits work. Runs on the CPU; all seeds are fixed.
"""

import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from sampling_harness import (  # noqa: E402  (the chi-square harness, shared)
    DRAFT_LOGITS,
    P_START,
    P_TARGET,
    PAIR_P,
    Q_DRAFT,
    TARGET_LOGITS,
    assert_follows,
    first_token_counts,
    token_pair_counts,
)
from tandem.speculation.acceptance import accept_round  # noqa: E402
from tandem.speculation.device_acceptance import accept_sampling_on_device  # noqa: E402
from tandem.speculation.sampling import SamplingParams, probs_from_logits  # noqa: E402


@pytest.fixture(autouse=True)
def device_rule_for_cpu_tensors(monkeypatch):
    """accept_round reads CPU float32 tensors with the numpy rule (HOST_DEVICES); here every
    tensor takes the torch rule, as a GPU's logits do, so the tests compare the two rules."""
    monkeypatch.setattr("tandem.speculation.acceptance.HOST_DEVICES", ())

GREEDY = SamplingParams()
SAMPLING_SETTINGS = [
    SamplingParams(temperature=1.0),
    SamplingParams(temperature=0.7, top_k=5),
    SamplingParams(temperature=1.3, top_p=0.8),
    SamplingParams(temperature=0.9, top_k=12, top_p=0.9),
    SamplingParams(temperature=2.0, top_k=1),
]


def both_rules(drafts, q_draft, logits: np.ndarray, params, seed: int):
    """(numpy result, device result, whether both rngs end in the same state)."""
    numpy_rng, device_rng = np.random.default_rng(seed), np.random.default_rng(seed)
    expected = accept_round(drafts, q_draft, logits, params, numpy_rng, position=0)
    got = accept_round(drafts, q_draft, torch.from_numpy(logits), params, device_rng, position=0)
    return expected, got, numpy_rng.bit_generator.state == device_rng.bit_generator.state


# --- greedy ------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", ["all_accepted", "none_accepted", "one_wrong", "k0", "ties"])
def test_greedy_matches_numpy(case):
    rng = np.random.default_rng(21)
    for trial in range(50):
        k = 0 if case == "k0" else int(rng.integers(1, 6))
        vocab = 40
        if case == "ties":  # few distinct values: argmax must pick the first maximum, as numpy's
            logits = rng.integers(0, 3, size=(k + 1, vocab)).astype(np.float32)
        else:
            logits = rng.standard_normal((k + 1, vocab)).astype(np.float32)  # [k + 1, vocab]
        drafts = np.argmax(logits, axis=-1)[:k].tolist()
        if case == "none_accepted":
            drafts[0] = (drafts[0] + 1) % vocab
        elif case in ("one_wrong", "ties"):
            wrong = int(rng.integers(0, k))
            drafts[wrong] = (drafts[wrong] + 1 + int(rng.integers(0, vocab - 1))) % vocab
        expected, got, _ = both_rules(drafts, None, logits, GREEDY, seed=trial)
        assert got == expected, (case, trial, drafts)
        if case == "all_accepted" or case == "k0":
            assert got.accepted == k
        if case == "none_accepted":
            assert got.accepted == 0


# --- sampling: same seed, same result ----------------------------------------------------------


def random_round(rng: np.random.Generator, params: SamplingParams, one_hot: bool):
    """Target logits, a draft whose logits are the target's plus noise, its q and its tokens.
    The draft's vocabulary is sometimes narrower or wider than the target's (fit_vocab)."""
    k, vocab = int(rng.integers(0, 5)), 48
    target_logits = (2.0 * rng.standard_normal((k + 1, vocab))).astype(np.float32)  # [k + 1, vocab]
    draft_vocab = vocab + int(rng.choice([-3, 0, 0, 5]))
    draft_logits = np.full((k, draft_vocab), -30.0)  # [k, draft_vocab]
    width = min(vocab, draft_vocab)
    draft_logits[:, :width] = target_logits[:k, :width] + 0.8 * rng.standard_normal((k, width))
    q_draft = probs_from_logits(draft_logits, params)  # [k, draft_vocab]
    drafts = [int(rng.choice(width, p=row[:width] / row[:width].sum())) for row in q_draft]
    return drafts, None if one_hot else q_draft, target_logits


@pytest.mark.parametrize("one_hot", [False, True], ids=["model_q", "one_hot"])
@pytest.mark.parametrize("params", SAMPLING_SETTINGS, ids=lambda p: f"t{p.temperature}_k{p.top_k}_p{p.top_p}")
def test_sampling_same_seed_same_result(params, one_hot):
    rng = np.random.default_rng([31, int(one_hot)])
    outcomes = set()
    for trial in range(300):
        drafts, q_draft, logits = random_round(rng, params, one_hot)
        expected, got, same_rng_state = both_rules(drafts, q_draft, logits, params, seed=trial)
        assert got == expected, (trial, drafts)
        assert same_rng_state, trial  # the next round draws the same uniforms on both paths
        outcomes.add("bonus" if got.accepted == len(drafts) else "recovered")
    assert outcomes == {"bonus", "recovered"}  # both branches were exercised


@pytest.mark.parametrize("params", SAMPLING_SETTINGS, ids=lambda p: f"t{p.temperature}_k{p.top_k}_p{p.top_p}")
def test_the_positional_rule_matches_numpy(params):
    """A seeded request's rule (uniforms by output position, no rng): the same tokens on both."""
    rng, outcomes = np.random.default_rng(33), set()
    for trial in range(200):
        seeded = SamplingParams(params.temperature, params.top_k, params.top_p, seed=trial)
        drafts, q_draft, logits = random_round(rng, seeded, one_hot=bool(trial % 2))
        position = int(rng.integers(0, 500))
        unused = np.random.default_rng(0)
        expected = accept_round(drafts, q_draft, logits, seeded, unused, position=position)
        assert accept_round(drafts, q_draft, torch.from_numpy(logits), seeded, unused, position=position) == expected
        outcomes.add("bonus" if expected.accepted == len(drafts) else "replaced")
    assert outcomes == {"bonus", "replaced"}


def test_many_rounds_one_rng_give_the_same_stream():
    params, rng = SAMPLING_SETTINGS[3], np.random.default_rng(41)
    rounds = [random_round(rng, params, one_hot=False) for _ in range(100)]
    numpy_rng, device_rng = np.random.default_rng(5), np.random.default_rng(5)
    numpy_stream = [accept_round(d, q, x, params, numpy_rng, position=0) for d, q, x in rounds]
    device_stream = [accept_round(d, q, torch.from_numpy(x), params, device_rng, position=0) for d, q, x in rounds]
    assert device_stream == numpy_stream


# --- bf16 logits -------------------------------------------------------------------------------


@pytest.mark.parametrize("params", [GREEDY, SAMPLING_SETTINGS[1], SAMPLING_SETTINGS[2]], ids=["greedy", "top_k", "top_p"])
def test_bf16_logits_match_numpy_on_their_float32_values(params):
    rng = np.random.default_rng(51)
    draft_params = SAMPLING_SETTINGS[0] if params.greedy else params  # greedy: any q will do
    for trial in range(100):
        drafts, q_draft, logits = random_round(rng, draft_params, one_hot=False)
        bf16_logits = torch.from_numpy(logits).to(torch.bfloat16)  # [k + 1, vocab]
        numpy_rng, device_rng = np.random.default_rng(trial), np.random.default_rng(trial)
        expected = accept_round(drafts, q_draft, bf16_logits.float().numpy(), params, numpy_rng, position=0)
        assert accept_round(drafts, q_draft, bf16_logits, params, device_rng, position=0) == expected, trial


# --- the emitted tokens follow p_target ----------------------------------------------------------


def device_rule(draft_tokens, q_draft, p_target, rng):
    """accept_sampling's signature, run by the device rule on p_target and q_draft moved to torch."""
    q_on_device = None if q_draft is None else torch.from_numpy(np.asarray(q_draft, dtype=np.float64))
    return accept_sampling_on_device(draft_tokens, q_on_device, torch.from_numpy(p_target), rng)


def test_device_first_token_follows_p_target_with_model_q():
    assert_follows(first_token_counts(device_rule, P_TARGET, Q_DRAFT, 15_000, seed=61), P_TARGET)


@pytest.mark.parametrize("token", [0, 3, 5])  # p largest, q = 0 elsewhere, p = 0
def test_device_first_token_follows_p_target_with_one_hot_q(token):
    counts = first_token_counts(device_rule, P_TARGET, Q_DRAFT, 10_000, seed=62, one_hot_token=token)
    assert_follows(counts, P_TARGET)


@pytest.mark.parametrize("one_hot", [False, True], ids=["model_q", "one_hot"])
def test_device_k3_token_pairs_follow_p_target(one_hot):
    counts = token_pair_counts(device_rule, 4_000, seed=63, one_hot=one_hot)
    assert_follows(counts[0].sum(axis=1), P_START)
    assert_follows(counts[0], PAIR_P[0])
    assert_follows(counts[1], PAIR_P[1])


@pytest.mark.parametrize(
    "params",
    [SamplingParams(temperature=0.8, top_k=4), SamplingParams(temperature=1.3, top_p=0.7)],
    ids=["top_k", "top_p"],
)
def test_device_rule_from_logits_follows_the_processed_distribution(params):
    """The whole device path from logits (torch top-k / top-p included) through accept_round."""
    p = probs_from_logits(TARGET_LOGITS[None, :], params)[0]  # [vocab]
    q = probs_from_logits(DRAFT_LOGITS[None, :], params)[0]
    logits = torch.from_numpy(np.stack([TARGET_LOGITS, TARGET_LOGITS]).astype(np.float32))  # [k + 1, vocab]

    def from_logits(draft_tokens, q_draft, p_target, rng):
        return accept_round(draft_tokens, q_draft, logits, params, rng, position=0)

    assert_follows(first_token_counts(from_logits, p, q, 10_000, seed=64), p)


@pytest.mark.parametrize("temperature, top_p", [(0.7, 1.0), (1e-308, 1.0), (5e-324, 1.0), (1.0, 0.0), (1.0, 0.6)])
def test_device_probabilities_match_numpy_down_to_a_tiny_temperature(temperature, top_p):
    from tandem.speculation.device_sampling import probs_from_logits as device_probs_from_logits

    logits = np.stack([TARGET_LOGITS, DRAFT_LOGITS]).astype(np.float32) * 40  # [2, vocab]
    params = SamplingParams(temperature=temperature, top_k=4, top_p=top_p)
    expected = probs_from_logits(logits, params)  # [2, vocab]
    got = device_probs_from_logits(torch.from_numpy(logits), params).numpy()
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-15)



# --- torch stays optional ----------------------------------------------------------------------


def test_acceptance_module_does_not_import_torch():
    code = "import sys, tandem.speculation.acceptance; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
