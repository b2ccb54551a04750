"""A pipeline assembles what one generation needs: the target's tokenizer (the text edge), the
target and draft runners, the drafter and the depth policy. The CLI and the benchmark both use it.
"""

from dataclasses import dataclass
from typing import Iterator

from tandem.engine.generator import SpeculativeGenerator
from tandem.engine.request import GenerationRequest
from tandem.engine.stats import GenerationStats
from tandem.errors import TandemError
from tandem.models.backends import RunnerSpec, load_runner
from tandem.models.resolve import tokenizer_path
from tandem.spec.depth import build_depth
from tandem.spec.drafters.registry import build_drafter
from tandem.spec.sampling import SamplingParams
from tandem.text.stops import StopStrings
from tandem.text.stream import TextStream
from tandem.text.tokenizer import TextTokenizer, check_same_vocabulary

K_LIMIT = 64


def parse_k(value: str | int) -> int | str:
    """`auto` or a non-negative integer up to K_LIMIT."""
    if value == "auto":
        return "auto"
    try:
        k = int(value)
    except (TypeError, ValueError):
        raise TandemError(f"k must be 'auto' or an integer, got {value!r}") from None
    if not 0 <= k <= K_LIMIT:
        raise TandemError(f"k must be between 0 and {K_LIMIT}, got {k}")
    return k


@dataclass(frozen=True, slots=True)
class PipelineConfig:
    target: RunnerSpec
    draft: RunnerSpec | None = None
    drafter: str = "hybrid"
    k: int | str = "auto"

    def __post_init__(self):
        object.__setattr__(self, "k", parse_k(self.k))
        if self.drafter in ("model", "hybrid") and self.draft is None:
            raise TandemError(f"--drafter {self.drafter} needs a draft model: pass --draft NAME")


class Pipeline:
    def __init__(self, config: PipelineConfig):
        self.config = config
        self.tokenizer = TextTokenizer(str(tokenizer_path(config.target.model)))
        draft_runner = None
        if config.draft is not None and config.drafter in ("model", "hybrid"):
            check_same_vocabulary(self.tokenizer, TextTokenizer(str(tokenizer_path(config.draft.model))))
            draft_runner = load_runner(config.draft)
        self.target = load_runner(config.target)
        self.drafter = build_drafter(config.drafter, draft_runner)
        self.depth = build_depth(config.drafter, config.k, self.target.cost)  # learns across requests

    def prompt_ids(self, prompt: str | None = None, messages: list[dict] | None = None) -> tuple[int, ...]:
        if messages is not None:
            _check_messages(messages)
            return tuple(self.tokenizer.chat_prompt_ids(messages))
        if not prompt:
            raise TandemError("the prompt is empty: give --prompt TEXT or --messages JSON")
        return tuple(self.tokenizer.encode(prompt))

    def request(self, prompt_ids, max_tokens: int, sampling: SamplingParams, stop: list[str] | None = None):
        stops = StopStrings(self.tokenizer.decode, stop or [])
        return GenerationRequest(
            tuple(prompt_ids), max_tokens, sampling, self.tokenizer.stop_token_ids, stops if stop else None
        )

    def stream_text(self, request: GenerationRequest, stats: GenerationStats) -> Iterator[tuple[str, list[int]]]:
        """Yield (text delta, token ids of the round) as generation goes; a final flush at the end."""
        generator = SpeculativeGenerator(self.target, self.drafter, self.depth)
        text = TextStream(self.tokenizer.decode, _stop_strings(request))
        for ids in generator.stream(request, stats):
            yield text.push(ids), ids
        yield text.finish(), []


def _stop_strings(request: GenerationRequest) -> list[str]:
    return request.stop_condition.strings if isinstance(request.stop_condition, StopStrings) else []


def _check_messages(messages) -> None:
    if not isinstance(messages, list) or not messages:
        raise TandemError("messages must be a non-empty JSON list of {role, content} objects")
    for message in messages:
        if not (isinstance(message, dict) and isinstance(message.get("role"), str)
                and isinstance(message.get("content"), str)):
            raise TandemError(f"each message needs string 'role' and 'content' fields, got {message!r}")
    if not any(m["content"].strip() for m in messages):
        raise TandemError("the prompt is empty: every message has empty content")
