"""What the engine is asked to do: prompt token ids, limits, sampling, stops. No text here."""

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from tandem.errors import TandemError
from tandem.numbers import is_int
from tandem.speculation.sampling import SamplingParams


class StopCondition(Protocol):
    def tokens_to_keep(self, output_ids: list[int]) -> int | None:
        """None to go on; otherwise how many of `output_ids` to emit before stopping."""
        ...


def _is_token_id(token) -> bool:
    return (type(token) is int or isinstance(token, np.integer)) and token >= 0


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    """max_tokens: at most this many new tokens; the engine also stops where the context is full
    (finish reason "length"), so an edge that promises max_tokens checks the room first."""

    prompt_ids: tuple[int, ...]
    max_tokens: int = 128
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stop_token_ids: frozenset[int] = frozenset()
    stop_condition: StopCondition | None = None  # e.g. stop strings, checked at the edge's request
    output_offset: int = 0  # output tokens at the end of prompt_ids (a placement resumed elsewhere):
    # the output positions of what this request emits start there (a seed's races follow them)
    cache_salt: str | None = None  # None: it shares cached prompt prefixes and drafting memory with every
    # request; a salt: its prompt prefixes with requests of the same salt alone, no host or disk tier, and
    # drafts from its own prompt and output alone (vLLM's cache_salt: users who must not learn of each other's prompts)

    def __post_init__(self):
        ids = self.prompt_ids
        if not (isinstance(ids, tuple) and ids and all(type(token) is int and token >= 0 for token in ids)):
            self._check_and_convert_ids()  # the common case (a tuple of token ids) takes one pass
        if not isinstance(self.sampling, SamplingParams):  # None or a dict failed in the engine's thread
            raise TandemError(f"sampling must be a SamplingParams, got {type(self.sampling).__name__}")
        self._check_and_convert_stops()
        if not (is_int(self.max_tokens) and self.max_tokens >= 1):
            raise TandemError(f"max tokens must be a positive integer, got {self.max_tokens!r}")
        if self.cache_salt is not None and not (isinstance(self.cache_salt, str) and self.cache_salt):
            raise TandemError(f"a cache salt must be a non-empty string, got {self.cache_salt!r}")
        if not (is_int(self.output_offset) and 0 <= self.output_offset < len(self.prompt_ids)):
            raise TandemError(f"the output offset must be below the prompt's length, got {self.output_offset!r}")

    def _check_and_convert_stops(self) -> None:
        """stop_token_ids a set, tuple, list or 1-D array of token ids (kept as a frozenset); a stop
        condition something with `tokens_to_keep`. Else a TandemError here, not a failed step for
        the batch."""
        stops = self.stop_token_ids
        if not isinstance(stops, (frozenset, set, tuple, list, np.ndarray)) or getattr(stops, "ndim", 1) != 1:
            raise TandemError(f"stop_token_ids must be a set, tuple, list or 1-D array of token ids, got "
                              f"{type(stops).__name__}")
        bad = next((token for token in stops if not _is_token_id(token)), None)
        if bad is not None:
            raise TandemError(f"stop_token_ids must be non-negative integers (token ids), got {bad!r}")
        if not (isinstance(stops, frozenset) and all(type(token) is int for token in stops)):
            object.__setattr__(self, "stop_token_ids", frozenset(int(token) for token in stops))
        if self.stop_condition is not None and not callable(getattr(self.stop_condition, "tokens_to_keep", None)):
            raise TandemError("a stop condition has a method tokens_to_keep(output_ids) (e.g. text/stop_strings.py's "
                              f"StopStrings), got {type(self.stop_condition).__name__}")

    def _check_and_convert_ids(self) -> None:
        """Text, an empty prompt, or ids that are no non-negative integers: a TandemError; a list,
        an array or numpy's ints: a tuple of Python ints."""
        if isinstance(self.prompt_ids, (str, bytes)):
            raise TandemError("prompt_ids are token ids (e.g. a tokenizer's output), not text")
        if not isinstance(self.prompt_ids, (tuple, list, np.ndarray)) or (isinstance(self.prompt_ids, np.ndarray)
                                                                           and self.prompt_ids.ndim != 1):
            raise TandemError(f"prompt_ids must be a tuple, list or 1-D array of token ids, got {type(self.prompt_ids).__name__}")
        if len(self.prompt_ids) == 0:
            raise TandemError("the prompt is empty: give at least one token of input")
        bad = next((token for token in self.prompt_ids if not _is_token_id(token)), None)
        if bad is not None:  # a float or a string reached llama.cpp's batch and failed the whole step
            raise TandemError(f"prompt_ids must be non-negative integers (token ids), got {bad!r}")
        object.__setattr__(self, "prompt_ids", tuple(int(token) for token in self.prompt_ids))  # numpy's ints stay out
