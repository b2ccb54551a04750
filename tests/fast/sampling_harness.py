"""The chi-square harness the exactness tests share (test_sampling_exact.py,
test_device_acceptance.py): a 6-token vocabulary with a target p and a draft q chosen to differ
(q > p, q < p, q = 0 where p > 0, p = 0 where q > 0), a k = 3 Markov chain of both, the counts
of the tokens a rule emits, and Pearson's test against the distribution they must follow.
"""

import numpy as np

# Upper 0.001 quantiles of the chi-square distribution, by degrees of freedom; from the
# NIST/SEMATECH e-Handbook of Statistical Methods, section 1.3.6.7.4 ("Critical Values of the
# Chi-Square Distribution", upper-tail probability 0.001). A correct sampler exceeds these with
# probability 0.001.
CHI2_CRITICAL_P001 = {2: 13.816, 3: 16.266, 4: 18.467, 8: 26.125, 19: 43.820, 24: 51.179}

VOCAB = 6
P_TARGET = np.array([0.35, 0.25, 0.20, 0.12, 0.08, 0.00])
Q_DRAFT = np.array([0.10, 0.40, 0.30, 0.00, 0.05, 0.15])
#                  q < p  q > p  q > p  q = 0  q < p  p = 0

# The k = 3 case: first token from START, then a Markov chain (each row conditions on the
# previous token). Rows of the target and the draft differ at every position.
P_START, Q_START = P_TARGET, Q_DRAFT
P_NEXT = np.array([
    [0.00, 0.50, 0.20, 0.10, 0.10, 0.10],
    [0.40, 0.00, 0.30, 0.00, 0.30, 0.00],
    [0.25, 0.25, 0.00, 0.25, 0.25, 0.00],
    [0.10, 0.10, 0.10, 0.10, 0.10, 0.50],
    [0.60, 0.00, 0.00, 0.40, 0.00, 0.00],
    [0.20, 0.20, 0.20, 0.20, 0.20, 0.00],
])  # [previous token, next token]
Q_NEXT = np.array([
    [0.30, 0.10, 0.00, 0.30, 0.10, 0.20],
    [0.10, 0.30, 0.10, 0.20, 0.00, 0.30],
    [0.50, 0.00, 0.50, 0.00, 0.00, 0.00],
    [0.00, 0.00, 0.00, 0.00, 1.00, 0.00],
    [0.20, 0.20, 0.20, 0.20, 0.20, 0.00],
    [0.05, 0.05, 0.05, 0.05, 0.05, 0.75],
])


def chi_square(counts: np.ndarray, probs: np.ndarray) -> tuple[float, int]:
    """Pearson's statistic and degrees of freedom; infinite if a token with p = 0 appeared."""
    support = probs > 0
    if counts[~support].any():
        return float("inf"), int(support.sum()) - 1
    expected = probs[support] * counts.sum()
    return float(((counts[support] - expected) ** 2 / expected).sum()), int(support.sum()) - 1


def assert_follows(counts: np.ndarray, probs: np.ndarray) -> None:
    statistic, dof = chi_square(counts.ravel(), probs.ravel())
    assert statistic < CHI2_CRITICAL_P001[dof], (statistic, dof, counts)


def assert_departs(counts: np.ndarray, probs: np.ndarray) -> None:
    statistic, dof = chi_square(counts.ravel(), probs.ravel())
    assert statistic > 10 * CHI2_CRITICAL_P001[dof], (statistic, dof, counts)


def first_token_counts(rule, p, q, trials, seed, one_hot_token=None) -> np.ndarray:
    """Counts of the first emitted token of `trials` rounds with one draft token drawn from q
    (or always `one_hot_token`, with q_draft None)."""
    draft_rng, accept_rng = np.random.default_rng([seed, 0]), np.random.default_rng([seed, 1])
    if one_hot_token is None:
        drafts = draft_rng.choice(len(q), size=trials, p=q)  # [trials]
        q_draft = q[None, :]  # [1, vocab]
    else:
        drafts = np.full(trials, one_hot_token)
        q_draft = None
    p_target = np.stack([p, p])  # [k + 1, vocab]; the bonus row is never the first token
    counts = np.zeros(len(p), dtype=np.int64)
    for draft in drafts.tolist():
        counts[rule([draft], q_draft, p_target, accept_rng).emitted([draft])[0]] += 1
    return counts


TARGET_LOGITS = np.array([3.0, 2.6, 2.2, 1.5, 1.0, 0.2, -0.5, -1.0])
DRAFT_LOGITS = np.array([-1.0, 0.5, 2.0, 2.5, 1.0, 3.0, 1.5, 0.0])


def token_pair_counts(rule, trials, seed, one_hot) -> np.ndarray:
    """Counts [pair, first, second] of the emitted token pairs (t0, t1) and (t2, t3) of a
    generation in rounds of k = 3; t3 is the bonus token whenever the first round accepts all.

    Drafts are a Markov chain under Q (or, one-hot, the token after the previous one, mod VOCAB);
    the target rows are P at the same contexts: row i conditions on the token before d_{i+1}.
    """
    draft_rng, accept_rng = np.random.default_rng([seed, 0]), np.random.default_rng([seed, 1])
    q_cdf_start, q_cdf_next = np.cumsum(Q_START), np.cumsum(Q_NEXT, axis=-1)
    counts = np.zeros((2, VOCAB, VOCAB), dtype=np.int64)
    for _ in range(trials):
        emitted: list[int] = []
        while len(emitted) < 4:
            previous = emitted[-1] if emitted else None
            drafts, q_rows, p_rows = [], [], [P_START if previous is None else P_NEXT[previous]]
            for u in draft_rng.random(3).tolist():
                if one_hot:
                    token = 0 if previous is None else (previous + 1) % VOCAB
                else:
                    cdf = q_cdf_start if previous is None else q_cdf_next[previous]
                    q_rows.append(Q_START if previous is None else Q_NEXT[previous])
                    token = int(np.searchsorted(cdf, u * cdf[-1], side="right"))
                drafts.append(token)
                p_rows.append(P_NEXT[token])
                previous = token
            q_draft = None if one_hot else np.stack(q_rows)  # [3, vocab]
            emitted += rule(drafts, q_draft, np.stack(p_rows), accept_rng).emitted(drafts)
        counts[0, emitted[0], emitted[1]] += 1
        counts[1, emitted[2], emitted[3]] += 1
    return counts


# Under p_target: p(t0, t1) = p(t0) p(t1 | t0), and p(t2, t3) = p(t2) p(t3 | t2) with
# p(t2) = START @ NEXT @ NEXT.
PAIR_P = np.stack([P_START[:, None] * P_NEXT, (P_START @ P_NEXT @ P_NEXT)[:, None] * P_NEXT])
