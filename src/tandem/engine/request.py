"""What the engine is asked to do: prompt token ids, limits, sampling, stops. No text here."""

from dataclasses import dataclass, field
from typing import Protocol

from tandem.errors import TandemError
from tandem.speculation.sampling import SamplingParams


class StopCondition(Protocol):
    def tokens_to_keep(self, output_ids: list[int]) -> int | None:
        """None to go on; otherwise how many of `output_ids` to emit before stopping."""
        ...


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    prompt_ids: tuple[int, ...]
    max_tokens: int = 128
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stop_token_ids: frozenset[int] = frozenset()
    stop_condition: StopCondition | None = None  # e.g. stop strings, checked at the edge's request
    output_offset: int = 0  # output tokens at the end of prompt_ids (a placement resumed elsewhere):
    # the output positions of what this request emits start there (a seed's races follow them)

    def __post_init__(self):
        if not self.prompt_ids:
            raise TandemError("the prompt is empty: give at least one token of input")
        if not (isinstance(self.max_tokens, int) and self.max_tokens >= 1):
            raise TandemError(f"max tokens must be a positive integer, got {self.max_tokens!r}")
        if not (isinstance(self.output_offset, int) and 0 <= self.output_offset < len(self.prompt_ids)):
            raise TandemError(f"the output offset must be below the prompt's length, got {self.output_offset!r}")
