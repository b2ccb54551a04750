"""The requests of a serving benchmark: workload prompts turned into chat-completion payloads.

Every request is greedy (`temperature` 0), streamed, and asks for a usage chunk. A workload line
with raw `prompt` text is sent as one user message (the serving API is chat-only here). Prompts
are interleaved across categories (one of each in turn), so any window of the list has the
workload's category mix; each concurrency level takes the next `count` of that list, wrapping
around. A prompt taken again on the n-th wrap (n >= 1) gets REPEAT_MARK.format(n) put in front
of its last message, so no server sees the same request twice, nor the same prompt body:
Tandem's response cache answers a repeated greedy request without decoding, and llama-server's
prompt cache (kept in host memory) restores a repeated prompt up to where it changes (a mark at
the end let it evaluate 8 tokens of a 200-token repeat), either of which would make repeats look
free. The mark cannot hide the answer, though: a repeat's greedy answer is the earlier one, and
a server that drafts from its earlier answers (Tandem's shared n-gram store and suffix index)
copies it. So a wrap is said, at the start and in the report (`repeats`). Every server sees the
same requests at a level.

With a spread S, request i of a level may produce max_tokens + an offset in [-S, S] fixed by i
(`length_offset`): a closed loop whose answers all stop at one cap starts and ends them in the
same step, which favours whatever keeps such waves together; varied caps stagger them, as a
real workload's answers do.
"""

from dataclasses import dataclass
from typing import Sequence

from tandem.bench.serve.loadgen import LoadItem
from tandem.bench.workload import WARMUP_PROMPTS, BenchPrompt
from tandem.errors import TandemError

WARMUP_MESSAGES = ({"role": "user", "content": WARMUP_PROMPTS[-1]},)  # not in any workload
REPEAT_MARK = "({}) "
GOLDEN_FRACTION = 0.6180339887498949  # spreads request i's token cap (`length_offset`)


@dataclass(frozen=True, slots=True)
class BenchRequest:
    prompt_id: str
    category: str
    messages: tuple[dict, ...]
    max_tokens_offset: int = 0  # added to the run's max_tokens (`length_offset`)
    wrap: int = 0  # 0: the prompt's first use in the sweep; n: its n-th repeat (marked)


def length_offset(index: int, spread: int) -> int:
    """Request index's offset to the token cap, in [-spread, spread]: the golden-ratio sequence
    (i x 0.618... mod 1) scaled, so the offsets cover the range evenly, neighbours differ, and
    every server (and drafter) gets the same caps."""
    return round((index * GOLDEN_FRACTION) % 1.0 * 2 * spread) - spread


def prompt_messages(prompt: BenchPrompt) -> tuple[dict, ...]:
    if prompt.messages is not None:
        return tuple(dict(m) for m in prompt.messages)
    return ({"role": "user", "content": prompt.prompt},)


def interleave_categories(prompts: Sequence[BenchPrompt]) -> list[BenchPrompt]:
    """One prompt of each category in turn (categories in order of first appearance)."""
    groups: dict[str, list[BenchPrompt]] = {}
    for prompt in prompts:
        groups.setdefault(prompt.category, []).append(prompt)
    longest = max((len(g) for g in groups.values()), default=0)
    return [g[i] for i in range(longest) for g in groups.values() if i < len(g)]


def marked(messages: tuple[dict, ...], wrap: int) -> tuple[dict, ...]:
    """The messages as they are on the first pass (wrap 0), else with the repeat mark in front of
    the last one."""
    if wrap == 0:
        return messages
    last = dict(messages[-1], content=REPEAT_MARK.format(wrap) + messages[-1]["content"])
    return messages[:-1] + (last,)


def level_requests(prompts: Sequence[BenchPrompt], count: int, offset: int, spread: int = 0) -> list[BenchRequest]:
    """`count` requests from the interleaved list, starting at `offset`, wrapping around; with a
    spread, each its own offset to the token cap."""
    if not prompts:
        raise TandemError("the workload holds no prompts")
    ordered = interleave_categories(prompts)
    requests = []
    for position in range(offset, offset + count):
        wrap, index = divmod(position, len(ordered))
        prompt = ordered[index]
        request_id = prompt.id if wrap == 0 else f"{prompt.id}~{wrap}"
        requests.append(BenchRequest(request_id, prompt.category, marked(prompt_messages(prompt), wrap),
                                     length_offset(position - offset, spread), wrap))
    return requests


def repeats(requests: Sequence[BenchRequest]) -> int:
    """How many of the requests take a prompt the sweep used before."""
    return sum(1 for request in requests if request.wrap > 0)


def warmup_request() -> BenchRequest:
    return BenchRequest("warm-up", "warm-up", WARMUP_MESSAGES)


def chat_payload(request: BenchRequest, model: str, max_tokens: int, extras: dict) -> dict:
    """The JSON body for /v1/chat/completions; `extras` (per server kind) are merged last."""
    return {
        "model": model,
        "messages": [dict(m) for m in request.messages],
        "max_tokens": max_tokens + request.max_tokens_offset,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
        **extras,
    }


def load_items(requests: Sequence[BenchRequest], model: str, max_tokens: int, extras: dict) -> list[LoadItem]:
    return [LoadItem(r.prompt_id, r.category, chat_payload(r, model, max_tokens, extras)) for r in requests]
