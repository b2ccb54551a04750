"""What one engine step may score: its token budget, how much of it prompt chunks may take beside
decoding streams (chunked prefill), and how drafts and chunks are cut to fit. Pure functions of
the sequences and the target's cost curve; `BatchEngine` (engine/batch_engine.py) calls them."""

from dataclasses import replace

from tandem.engine.sequence import Sequence
from tandem.errors import TandemError
from tandem.models.cost import CostModel
from tandem.numbers import is_int
from tandem.speculation.drafters.base import SequenceDraft

# A step exceeds its budget only where the rounds alone do (then the oldest prompt still gets its
# minimum chunk), or where auto-depth drafts outgrow the one token reserved for each beside a
# prompt that finishes with drafts of its fixed k.
STEP_TOKEN_BUDGET = 512  # tokens one step's target forward scores: rounds first, prompt chunks after
MIN_PREFILL_CHUNK = 16  # prompt tokens the oldest prompt still gets when the rounds fill the budget
STALL_FACTOR = 3.0  # a step with prompt chunks costs at most this many times the decoding rounds alone,
FULL_SPEED_CHUNK = 64  # calls up to this size set the device's batch speed (the largest profiled)
FLOOR_SLACK = 1.15  # or what the floor chunk costs: the smallest call within this of the batch speed's cost a token
# `tandem serve`'s floor on one engine (`--prefill-floor` unset; a cluster's replicas keep the
# profile's, for their gap bound): prompts beside streams near a CPU's whole-prompt speed. AMD EPYC,
# 1.5B Q4 on two threads, C=4, answers of 25-75 tokens, in process against the profile's ~31:
# 64 tokens 1.08x, 128 1.14x, 256 1.10x tok/s; ITL p99 0.7-0.9, 1.4-1.6, 2.6-2.8 s against 0.5-0.6
# (docs/vs-llama-server.md#one-engine-prompts-go-in-128-token-chunks-2026-11-27).
THROUGHPUT_PREFILL_FLOOR = 128

Chunk = tuple[Sequence, int]  # a still-prefilling sequence and how many prompt tokens it scores


def check_prefill_floor(tokens: int | None) -> None:
    """None: read off the profile (`floor_chunk`); else a number of prompt tokens."""
    if tokens is not None and (not is_int(tokens) or not 1 <= tokens <= 4096):
        raise TandemError(f"the prefill floor must be auto or 1..4096 tokens, got {tokens!r}")


def check_step_token_budget(tokens: int) -> None:
    if not is_int(tokens) or tokens < 1:
        raise TandemError(f"the step token budget must be a positive integer, got {tokens!r}")


def prompt_chunks(prefilling: list[Sequence], left: int, progress: bool) -> list[Chunk]:
    """Prompt chunks from the budget left, oldest first. Where the rounds leave nothing and
    no prompt finishes this step (no progress), the oldest still gets MIN_PREFILL_CHUNK
    tokens (or its rest), so no prompt starves."""
    found = []
    for seq in prefilling:
        n = min(len(seq.unprefilled), left)
        if n <= 0 and not found and not progress:
            n = min(len(seq.unprefilled), MIN_PREFILL_CHUNK)
        if n <= 0:
            break
        found.append((seq, n))
        left -= n
    return found


def drafts_within(rounds: list[Sequence], drafts: list[SequenceDraft], limit: int) -> list[SequenceDraft]:
    """The drafts cut, longest first, so that the rounds score at most `limit` tokens
    (--step-tokens bounds what a step scores, as vLLM's max_num_batched_tokens does, drafts
    included): each draft is cut to at most a common length, the largest that fits. A cut
    draft is still exact (acceptance reads a draft's tokens in order, and a sampled draft's q
    rows with them). Only each round's last token (and rest of prompt) is never cut."""
    over = round_tokens(rounds, drafts) - limit
    lengths = [len(d.token_ids) for d in drafts]
    if over <= 0 or not any(lengths):
        return drafts
    keep = sum(lengths) - over
    level = max(lengths)
    while level > 0 and sum(min(n, level) for n in lengths) > keep:
        level -= 1
    return [d if len(d.token_ids) <= level else
            replace(d, token_ids=d.token_ids[:level], q_draft=None if d.q_draft is None else d.q_draft[:level])
            for d in drafts]


def round_tokens(rounds: list[Sequence], drafts: list[SequenceDraft]) -> int:
    """Tokens the rounds score: each one's rest of prompt, last token and drafts."""
    return sum(len(seq.unprefilled) + 1 + len(d.token_ids) for seq, d in zip(rounds, drafts))


def held_back_budget(cost: CostModel, rounds: int, budget: int, floor: int | None = None) -> int:
    """Tokens a step beside decoding rounds (`rounds` tokens) may score: as many as cost no more
    than STALL_FACTOR times the rounds alone or the floor chunk alone, whichever is more, and
    at least the rounds plus MIN_PREFILL_CHUNK (all within `budget`). The floor (None) is read
    off the profile, not the learned corrections: those follow the contexts served, not the
    kernels; `--prefill-floor N` fixes it."""
    floor = floor_chunk(cost.profiled_ms) if floor is None else floor
    limit = max(STALL_FACTOR * cost.cost_ms(rounds), cost.cost_ms(floor))
    fits = largest_within(cost.cost_ms, limit, rounds, budget)
    return max(fits, min(rounds + MIN_PREFILL_CHUNK, budget))


def floor_chunk(cost_ms) -> int:
    """The fewest tokens a call may score at a cost a token within FLOOR_SLACK of the cheapest
    call below FULL_SPEED_CHUNK tokens (FULL_SPEED_CHUNK where none fewer does). Not of the
    FULL_SPEED_CHUNK-token call itself: llama.cpp's CPU flash attention scores 64 positions as
    one tile, and where its matrix products are cheap (AMX) that call dips ~15% below every
    smaller one, which put smollm2's floor at the whole 64 (16 tokens were 20% dearer a token)."""
    batch_speed_ms = min(cost_ms(n) / n for n in range(1, FULL_SPEED_CHUNK))
    return next((n for n in range(1, FULL_SPEED_CHUNK) if cost_ms(n) <= FLOOR_SLACK * batch_speed_ms * n),
                FULL_SPEED_CHUNK)


def largest_within(cost_ms, limit_ms: float, low: int, high: int) -> int:
    """The largest n in [low, high] with cost_ms(n) <= limit_ms (low where none is)."""
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (middle, high) if cost_ms(middle) <= limit_ms else (low, middle - 1)
    return low
