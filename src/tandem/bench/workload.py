"""Benchmark prompts: loading a JSONL workload, picking a quick subset, formatting to token ids.

One JSON object per line: `messages` (chat messages for the target's chat template) or `prompt`
(raw text, no template), with optional `id` and `category`. Every error names the file and line.
Formatting happens once per prompt, so every configuration sees the same token ids.
"""

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from tandem.errors import TandemError
from tandem.text.chat_messages import checked_messages

DEFAULT_WORKLOAD = Path(__file__).parent / "workloads" / "default.jsonl"
LONG_WORKLOAD = Path(__file__).parent / "workloads" / "long_output.jsonl"
EDITS_WORKLOAD = Path(__file__).parent / "workloads" / "edits.jsonl"
# --prompts NAME, or a path
NAMED_WORKLOADS = {"default": DEFAULT_WORKLOAD, "long": LONG_WORKLOAD, "edits": EDITS_WORKLOAD}
DEFAULT_CATEGORY = "uncategorised"


# warm-up requests, in no workload: a warm-up on a timed prompt left its answer in the engine's
# cross-request drafters (suffix index, n-gram store), which then copied it when that prompt ran
WARMUP_PROMPTS = (
    "Write a Python function that returns the n-th Fibonacci number iteratively, with a docstring.",
    "Say hello in five words.",
)


@dataclass(frozen=True, slots=True)
class BenchPrompt:
    id: str
    category: str
    messages: tuple[dict, ...] | None = None
    prompt: str | None = None

    def __post_init__(self):
        if (self.messages is None) == (self.prompt is None):
            raise TandemError(f"prompt {self.id!r} needs exactly one of 'messages' and 'prompt'")


class PromptTokenizer(Protocol):
    def encode(self, text: str) -> list[int]: ...

    def chat_prompt_ids(self, messages: list[dict]) -> list[int]: ...


def format_prompt(tokenizer: PromptTokenizer, prompt: BenchPrompt) -> tuple[int, ...]:
    """The prompt's token ids: messages through the chat template, raw text as is."""
    if prompt.messages is not None:
        return tuple(tokenizer.chat_prompt_ids([dict(m) for m in prompt.messages]))
    return tuple(tokenizer.encode(prompt.prompt))


def load_prompts(path: str | Path) -> list[BenchPrompt]:
    """A JSONL workload: a file, or a packaged one by name (NAMED_WORKLOADS)."""
    path = NAMED_WORKLOADS.get(str(path), Path(path))
    if path.is_dir():
        raise TandemError(f"{path} is a folder; --prompts wants a JSONL file or one of: {', '.join(NAMED_WORKLOADS)}")
    if not path.is_file():
        raise TandemError(f"no such prompts file: {path}")
    try:
        text = path.read_text(encoding="utf-8-sig")  # a byte-order mark, as some editors write, is not JSON
    except (OSError, UnicodeDecodeError) as error:
        raise TandemError(f"cannot read the prompts file {path}: {error}") from None
    prompts, seen = [], {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        prompt = parse_line(line, number, path)
        if prompt.id in seen:
            first = seen[prompt.id]
            raise TandemError(f"{path} line {number}: id {prompt.id!r} is already used on line {first}")
        seen[prompt.id] = number
        prompts.append(prompt)
    if not prompts:
        raise TandemError(f"{path} holds no prompts")
    return prompts


def recorded_prompts_file(path: str | Path) -> str:
    """How a run's results name its prompts: a packaged workload by its name, a file by its absolute
    path (bench-ceiling reads it again, from whatever folder it is run in)."""
    return str(path) if str(path) in NAMED_WORKLOADS else str(Path(path).resolve())


def parse_line(line: str, number: int, path: str | Path = "<prompts>") -> BenchPrompt:
    where = f"{path} line {number}"
    try:
        record = json.loads(line)
    except json.JSONDecodeError as error:
        raise TandemError(f"{where}: not valid JSON ({error})") from None
    if not isinstance(record, dict):
        raise TandemError(f"{where}: expected a JSON object, got {type(record).__name__}")
    prompt_id = record.get("id", f"line-{number}")
    category = record.get("category", DEFAULT_CATEGORY)
    if not isinstance(prompt_id, (str, int)) or not isinstance(category, str) or not category:
        raise TandemError(f"{where}: 'id' must be a string or integer and 'category' a non-empty string")
    messages, prompt = record.get("messages"), record.get("prompt")
    if (messages is None) == (prompt is None):
        raise TandemError(f"{where}: give exactly one of 'messages' and 'prompt'")
    if prompt is not None and not (isinstance(prompt, str) and prompt.strip()):
        raise TandemError(f"{where}: 'prompt' must be a string with more than white space")
    if messages is not None:
        messages = tuple(_checked_messages(messages, where))
    return BenchPrompt(str(prompt_id), category, messages, prompt)


def _checked_messages(messages, where: str) -> list[dict]:
    try:
        return checked_messages(messages)
    except TandemError as error:
        raise TandemError(f"{where}: {error}") from None


def select_prompts(prompts: list[BenchPrompt], limit: int | None = None,
                   per_category: int | None = None) -> list[BenchPrompt]:
    """The first `per_category` of each category (file order kept), then the first `limit`."""
    for name, value in (("--limit", limit), ("--per-category", per_category)):
        if value is not None and value < 1:
            raise TandemError(f"{name} must be a positive integer, got {value}")
    if per_category is not None:
        counts: dict[str, int] = {}
        kept = []
        for prompt in prompts:
            counts[prompt.category] = counts.get(prompt.category, 0) + 1
            if counts[prompt.category] <= per_category:
                kept.append(prompt)
        prompts = kept
    return prompts[:limit] if limit is not None else list(prompts)
