"""The text edge, inbound: a validated OpenAI body becomes token ids and a GenerationRequest.

Checks here answer 400/404 before anything reaches the engine: the model name, n != 1, a drafter
this server cannot run, an empty prompt, and a prompt or max_tokens that does not fit the target's
context (the message names the numbers), and one over the operator's --max-prompt-tokens or
--max-tokens-limit. Sampling defaults follow OpenAI (temperature 1, top_p 1); max_tokens defaults
to DEFAULT_MAX_TOKENS, capped by the room the context leaves and by --max-tokens-limit.
"""

import asyncio
from dataclasses import dataclass

from jinja2 import TemplateError

from tandem.engine.events import SpeculationOptions
from tandem.engine.request import GenerationRequest
from tandem.errors import TandemError
from tandem.serve.api.errors import APIError
from tandem.serve.api.protocol import ChatCompletionRequest, CompletionRequest, SamplingFields
from tandem.serve.state import ServerState
from tandem.speculation.depth import Auto, Fixed
from tandem.speculation.sampling import SamplingParams
from tandem.text.stop_strings import StopStrings

DEFAULT_MAX_TOKENS = 256
DEFAULT_TEMPERATURE = 1.0  # OpenAI's default; send temperature 0 for greedy decoding


@dataclass(frozen=True, slots=True)
class PreparedRequest:
    generation: GenerationRequest  # token ids, limits, sampling, stops: what the engine runs
    options: SpeculationOptions
    stop_strings: tuple[str, ...]  # the text edge cuts the shown text at these
    stream: bool
    include_usage: bool
    cache_params: dict  # everything besides the prompt that decides the answer

    @property
    def prompt_tokens(self) -> int:
        return len(self.generation.prompt_ids)


async def prepare_completion(state: ServerState, body: CompletionRequest) -> PreparedRequest:
    _check_body(state, body)
    if isinstance(body.prompt, tuple):  # token ids, as the client's tokenizer gave them
        prompt_ids = body.prompt
        if max(prompt_ids) >= state.tokenizer.size:
            raise APIError(400, f"prompt token id {max(prompt_ids)} is outside the model's vocabulary (ids 0 to "
                           f"{state.tokenizer.size - 1})", param="prompt", code="invalid_value")
    else:
        prompt_ids = await _tokenize(state.tokenizer.encode, body.prompt)
    return _prepared(state, body, prompt_ids, "prompt")


async def prepare_chat(state: ServerState, body: ChatCompletionRequest) -> PreparedRequest:
    _check_body(state, body)
    messages = [m.as_template_message() for m in body.messages]
    if not any(m["content"] for m in messages):
        raise APIError(400, "the prompt is empty: every message has empty content", param="messages",
                       code="invalid_value")
    prompt_ids = await _tokenize(state.tokenizer.chat_prompt_ids, messages)
    return _prepared(state, body, prompt_ids, "messages")


def _check_body(state: ServerState, body: SamplingFields) -> None:
    if body.model != state.model_name:
        raise APIError(404, f"The model '{body.model}' does not exist; this server serves '{state.model_name}'.",
                       param="model", code="model_not_found")
    if body.stream_options is not None and not body.stream:
        raise APIError(400, "stream_options is only allowed with stream: true", param="stream_options",
                       code="invalid_value")
    if body.n not in (None, 1):
        raise APIError(400, f"only n=1 is supported, got n={body.n}", param="n", code="unsupported_value")
    if body.logit_bias and max(body.logit_bias) >= state.tokenizer.size:  # as OpenAI's: a key is a token id
        raise APIError(400, f"logit_bias key {max(body.logit_bias)} is not a token id of this model (ids 0 to "
                       f"{state.tokenizer.size - 1})", param="logit_bias", code="invalid_value")
    options = body.speculation()
    drafter = options.drafter
    if drafter is not None and drafter not in state.drafters:
        raise APIError(400, f"drafter '{drafter}' is not available on this server (it has no draft model); "
                       f"choose one of {', '.join(state.drafters)}", param="tandem.drafter", code="invalid_value")
    if (drafter or state.speculation_defaults.drafter) == "none" and options.k not in (None, Auto(), Fixed(0)):
        raise APIError(400, f"k {options.k} with drafter 'none': that drafter drafts nothing (as `--drafter none "
                       f"--k N` is refused); leave k out, or choose another drafter", param="tandem.k",
                       code="invalid_value")


async def _tokenize(tokenize, text_or_messages) -> tuple[int, ...]:
    """Off the event loop: a long prompt takes a while to tokenize."""
    try:
        return tuple(await asyncio.to_thread(tokenize, text_or_messages))
    except (TandemError, TemplateError) as error:
        raise APIError(400, f"cannot build the prompt: {error}", code="invalid_value") from None


def _prepared(state: ServerState, body: SamplingFields, prompt_ids: tuple[int, ...], prompt_param: str):
    _check_server_limits(state, len(prompt_ids), body, prompt_param)
    max_tokens = _new_token_limit(state.context_length, len(prompt_ids), body, prompt_param)
    if state.settings.max_tokens_limit is not None:
        max_tokens = min(max_tokens, state.settings.max_tokens_limit)
    try:
        sampling = SamplingParams(
            temperature=DEFAULT_TEMPERATURE if body.temperature is None else body.temperature,
            top_k=max(body.top_k or 0, 0),  # vLLM's -1 is off, as 0 is
            top_p=1.0 if body.top_p is None else body.top_p,
            seed=body.seed,
        )
        stops = StopStrings(state.tokenizer.decode, body.stop) if body.stop else None
        generation = GenerationRequest(prompt_ids, max_tokens, sampling, state.tokenizer.stop_token_ids, stops,
                                       cache_salt=body.cache_salt)
    except TandemError as error:
        raise APIError(400, str(error), code="invalid_value") from None
    options, defaults = body.speculation(), state.speculation_defaults
    cache_params = {"max_tokens": max_tokens, "temperature": sampling.temperature, "top_p": sampling.top_p,
                    "top_k": sampling.top_k, "seed": sampling.seed, "stop": list(body.stop),
                    "drafter": options.drafter or defaults.drafter,
                    "k": defaults.k if options.k is None else options.k,
                    **({"cache_salt": body.cache_salt} if body.cache_salt is not None else {})}  # unsalted keys as before
    return PreparedRequest(generation, options, tuple(body.stop), bool(body.stream), body.include_usage, cache_params)


def _check_server_limits(state: ServerState, prompt_tokens: int, body: SamplingFields, prompt_param: str) -> None:
    """The operator's limits (--max-prompt-tokens, --max-tokens-limit), tighter than the context's."""
    settings = state.settings
    if settings.max_prompt_tokens is not None and prompt_tokens > settings.max_prompt_tokens:
        raise APIError(400, f"the prompt has {_tokens(prompt_tokens)}, over this server's limit of "
                       f"{settings.max_prompt_tokens}: shorten the prompt", param=prompt_param, code="prompt_too_long")
    requested = body.new_token_limit()
    if settings.max_tokens_limit is not None and requested is not None and requested > settings.max_tokens_limit:
        param = "max_completion_tokens" if getattr(body, "max_completion_tokens", None) else "max_tokens"
        raise APIError(400, f"{param} is {requested}, over this server's limit of {settings.max_tokens_limit} new "
                       "tokens per request", param=param, code="max_tokens_exceeded")


def _new_token_limit(context: int, prompt_tokens: int, body: SamplingFields, prompt_param: str) -> int:
    if prompt_tokens == 0:
        raise APIError(400, "the prompt is empty: give at least one token of input", param=prompt_param,
                       code="invalid_value")
    if prompt_tokens >= context:
        raise APIError(400, f"the prompt has {_tokens(prompt_tokens)} and this model's context is {context} "
                       f"tokens, prompt and answer: shorten the prompt to at most {context - 1} tokens",
                       param=prompt_param, code="context_length_exceeded")
    room = context - prompt_tokens
    requested = body.new_token_limit()
    if requested is None:
        return min(DEFAULT_MAX_TOKENS, room)
    if requested > room:
        param = "max_completion_tokens" if getattr(body, "max_completion_tokens", None) else "max_tokens"
        raise APIError(400, f"{param} is {requested} but the prompt has {_tokens(prompt_tokens)} and this "
                       f"model's context is {context} tokens: at most {room} new token{'' if room == 1 else 's'} fit{'s' if room == 1 else ''}",
                       param=param, code="context_length_exceeded")
    return requested


def _tokens(count: int) -> str:
    return f"{count} token{'' if count == 1 else 's'}"
