"""The copy ceiling: how fast greedy decoding could go on a workload whose answers repeat their
input, were every draft the longest verbatim run of the answer found in the prompt or in the
answer so far (an oracle: it knows the answer), each round priced on the target's measured
verify curve. A plain suffix matcher (what followed the most recent earlier occurrence of the
last SUFFIX_TOKENS tokens, at most SUFFIX_DRAFT of them) is priced the same way, for scale.
Every later change to drafting is judged against the ceiling (`tandem bench-ceiling`,
cli/bench_ceiling_cmd.py). The long-run ceiling drafts only the oracle's runs of LONG_RUN
tokens or more: the part of the ceiling a drafter that copies (and cannot know the answer) may
hope to reach.

A round drafts d tokens and scores d + 1 (the drafts and the token after the last accepted one)
on the c tokens before it (the prompt and the answer so far), costing cost(d + 1, c); it emits
its a accepted drafts and the target's own next token. The answer's first token comes from the
prompt's prefill and is not counted; rounds cover the rest. `ContextCurves` prices a round at
its own context from curves measured at a few: a 64-token round costs ~20% more at 2,000 cached
tokens than at 1,000 (Qwen2.5-Coder-1.5B Q4_K_M, AMX, 2 threads), so one curve at 1,024 made the
ceiling of a long edit (a 1,000-token file answered whole) ~15% too fast.
"""

import bisect
from collections import defaultdict
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

from tandem.speculation.drafters.ngram import find_ngram_match

SUFFIX_TOKENS = 3  # the suffix matcher's key length
SUFFIX_DRAFT = 16  # and its longest draft (it cannot tell a long copy from a wrong one)
MAX_DRAFT = 63  # the longest draft the oracle makes, as Tandem's (a round of 64 tokens, one flash-attention tile)
LONG_RUN = 8  # the long-run ceiling drafts only the oracle's runs of at least this many tokens

CostMs = Callable[[int, int], float]  # (tokens scored, tokens cached before them) -> ms


class ContextCurves:
    """Verify curves measured at a few cached lengths: n tokens on c cached ones cost the
    curves' n-token costs interpolated linearly in c (attention's share of a call grows with c),
    extrapolated from the nearest two outside them (one curve: the same cost at every c)."""

    def __init__(self, curves: Mapping[int, Callable[[int], float]]):
        if not curves:
            raise ValueError("ContextCurves needs at least one curve")
        self.contexts = sorted(curves)
        self.curves = dict(curves)

    def cost_ms(self, tokens: int, context: int) -> float:
        if len(self.contexts) == 1:
            return self.curves[self.contexts[0]](tokens)
        i = min(max(bisect.bisect_left(self.contexts, context), 1), len(self.contexts) - 1)
        low, high = self.contexts[i - 1], self.contexts[i]
        at_low, at_high = self.curves[low](tokens), self.curves[high](tokens)
        return max(0.0, at_low + (at_high - at_low) * (context - low) / (high - low))


@dataclass(frozen=True, slots=True)
class Round:
    drafted: int
    accepted: int
    context: int = 0  # tokens before the round: the prompt and the answer so far

    @property
    def emitted(self) -> int:
        return self.accepted + 1


class _Source:
    """prompt + answer so far, with each token's positions, growing one token at a time."""

    def __init__(self, prompt: Sequence[int]):
        self.tokens: list[int] = []
        self.positions: dict[int, list[int]] = defaultdict(list)
        for token in prompt:
            self.append(token)

    def append(self, token: int) -> None:
        self.positions[token].append(len(self.tokens))
        self.tokens.append(token)


def longest_copy_run(source: Sequence[int], positions: dict[int, list[int]], wanted: Sequence[int],
                     limit: int) -> int:
    """The longest L <= limit such that wanted[:L] is a contiguous run of source."""
    best, limit = 0, min(limit, len(wanted))
    if limit < 1:
        return 0
    for start in positions.get(wanted[0], ()):
        length = 0
        while (length < limit and start + length < len(source)
               and source[start + length] == wanted[length]):
            length += 1
        best = max(best, length)
        if best == limit:
            break
    return best


def _rounds(prompt: Sequence[int], answer: Sequence[int], propose) -> list[Round]:
    source = _Source(prompt)
    if answer:
        source.append(answer[0])
    rounds, position = [], 1
    while position < len(answer):
        left = len(answer) - position  # the round emits at most this many
        drafted, accepted = propose(source, answer[position:], left - 1)
        rounds.append(Round(drafted, accepted, len(source.tokens)))
        for token in answer[position: position + accepted + 1]:
            source.append(token)
        position += accepted + 1
    return rounds


def oracle_rounds(prompt: Sequence[int], answer: Sequence[int], max_draft: int = MAX_DRAFT) -> list[Round]:
    """Each round drafts the longest run of the rest of the answer found verbatim in the prompt
    and the answer so far (all of it accepted)."""
    def propose(source: _Source, rest: Sequence[int], limit: int) -> tuple[int, int]:
        run = longest_copy_run(source.tokens, source.positions, rest, min(limit, max_draft))
        return run, run

    return _rounds(prompt, answer, propose)


def suffix_rounds(prompt: Sequence[int], answer: Sequence[int], max_draft: int = MAX_DRAFT) -> list[Round]:
    """Each round drafts what followed the last SUFFIX_TOKENS tokens' most recent earlier
    occurrence; the drafts agreeing with the answer are accepted."""
    def propose(source: _Source, rest: Sequence[int], limit: int) -> tuple[int, int]:
        # what followed the most recent earlier occurrence of the last SUFFIX_TOKENS tokens
        match = find_ngram_match(source.tokens, min(limit, max_draft, SUFFIX_DRAFT), SUFFIX_TOKENS, SUFFIX_TOKENS)
        draft = match.continuation if match is not None else []
        accepted = 0
        while accepted < len(draft) and draft[accepted] == rest[accepted]:
            accepted += 1
        return len(draft), accepted

    return _rounds(prompt, answer, propose)


def rounds_ms(rounds: Sequence[Round], cost_ms: CostMs) -> float:
    """Time of the rounds: each scores its drafts and one more token on its context."""
    return sum(cost_ms(r.drafted + 1, r.context) for r in rounds)


def oracle_ms(rounds: Sequence[Round], cost_ms: CostMs) -> float:
    """Time of the oracle's rounds, each at the cheaper of drafting its run and decoding the same
    tokens one a forward: knowing every round's outcome, it never drafts at a loss (a run of one
    or two tokens can cost more in one call than plainly, where a CPU is compute-bound), so the
    ceiling is never below plain decoding."""
    return sum(_cheaper_ms(r, cost_ms) for r in rounds)


def long_run_ms(rounds: Sequence[Round], cost_ms: CostMs, min_run: int = LONG_RUN) -> float:
    """Time of the oracle's rounds where only runs of at least min_run tokens are drafted (where
    that pays) and the rest decoded one token a forward: what a copy drafter could reach, which
    cannot know where the answer's short coincidences with its context (a word, a bracket) come from."""
    return sum(_cheaper_ms(r, cost_ms) if r.drafted >= min_run else _decoded_ms(r, cost_ms) for r in rounds)


def _cheaper_ms(round_: Round, cost_ms: CostMs) -> float:
    """The round drafted in one call, or its tokens decoded one a forward, whichever costs less."""
    return min(cost_ms(round_.drafted + 1, round_.context), _decoded_ms(round_, cost_ms))


def _decoded_ms(round_: Round, cost_ms: CostMs) -> float:
    """The round's tokens decoded one a forward instead."""
    return sum(cost_ms(1, round_.context + i) for i in range(round_.emitted))


def plain_ms(prompt_tokens: int, answer_tokens: int, cost_ms: CostMs) -> float:
    """Time of plain decoding for the answer's tokens after the first: one token a forward, on
    the prompt and the answer before it."""
    return sum(cost_ms(1, prompt_tokens + i) for i in range(1, answer_tokens))
