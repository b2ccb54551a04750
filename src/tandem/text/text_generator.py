"""The text edge of `tandem generate`: the target's tokenizer around a batching engine.

Turns a prompt or chat messages into token ids, builds the engine request (stop token ids, stop
strings), and streams the engine's token ids back as text deltas (complete UTF-8, never part of
a stop string). The engine itself only sees token ids.
"""

from typing import Iterator

from tandem.engine.batch_engine import BatchEngine
from tandem.engine.build import EngineConfig, build_engine
from tandem.engine.request import GenerationRequest
from tandem.engine.run_request import stream_tokens
from tandem.engine.stats import GenerationStats
from tandem.errors import TandemError
from tandem.models.resolve import tokenizer_path
from tandem.speculation.sampling import SamplingParams
from tandem.text.chat_messages import checked_messages
from tandem.text.stop_strings import StopStrings
from tandem.text.stream import TextStream
from tandem.text.tokenizer import TextTokenizer

DEFAULT_MAX_TOKENS = 128  # `tandem generate`'s, where --max-tokens is not given


class TextGenerator:
    def __init__(self, config: EngineConfig, engine: BatchEngine | None = None):
        self.config = config
        self.tokenizer = TextTokenizer(str(tokenizer_path(config.target.model)))
        self.engine = engine or build_engine(config, max_running=1)

    def prompt_ids(self, prompt: str | None = None, messages: list[dict] | None = None) -> tuple[int, ...]:
        if messages is not None:
            return tuple(self.tokenizer.chat_prompt_ids(checked_messages(messages)))
        if not prompt:
            raise TandemError("the prompt is empty: give --prompt TEXT or --messages JSON")
        return tuple(self.tokenizer.encode(prompt))

    def request(self, prompt_ids, max_tokens: int | None, sampling: SamplingParams, stop: list[str] | None = None):
        """The engine request; a prompt and max_tokens beyond the context are refused, as the server
        refuses them (the answer would end at the context without a word). `max_tokens` None:
        DEFAULT_MAX_TOKENS, capped by what the context leaves after the prompt (as the server's default)."""
        context = self.engine.context_length
        asked = self.config.target.context_length
        capped = asked is not None and asked > context  # by what the model was trained on, or the KV pool
        room = context - len(prompt_ids)
        if room < 1:
            raise TandemError(f"a {len(prompt_ids)}-token prompt leaves no room for an answer in the context of "
                              f"{context} tokens: shorten the prompt"
                              + (" (the model holds no more)" if capped else " or raise --context-length"))
        if max_tokens is None:
            max_tokens = min(DEFAULT_MAX_TOKENS, room)
        elif max_tokens > room:
            advice = (f"lower --max-tokens to {room} or shorten the prompt"
                      + (" (the model holds no more)" if capped else ", or raise --context-length"))
            raise TandemError(f"a {len(prompt_ids)}-token prompt and --max-tokens {max_tokens} exceed the context of "
                              f"{context} tokens: {advice}")
        stops = StopStrings(self.tokenizer.decode, stop or [])
        return GenerationRequest(
            tuple(prompt_ids), max_tokens, sampling, self.tokenizer.stop_token_ids, stops if stop else None
        )

    def stream_text(self, request: GenerationRequest, stats: GenerationStats) -> Iterator[tuple[str, list[int]]]:
        """Yield (text delta, token ids of the step) as generation goes; a final flush at the end."""
        text = TextStream(self.tokenizer.decode, _stop_strings(request))
        for ids in stream_tokens(self.engine, request, stats):
            yield text.push(ids), ids
        yield text.finish(), []


def _stop_strings(request: GenerationRequest) -> list[str]:
    return request.stop_condition.strings if isinstance(request.stop_condition, StopStrings) else []
