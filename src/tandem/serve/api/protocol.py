"""The OpenAI request bodies Tandem accepts, as pydantic models. Shapes only: no tokens, no engine.

Types are strict (`"max_tokens": "5"` is refused, as OpenAI does), except that a whole number
written as a float (`1.0`) is an integer, as JSON Schema says. Fields this server does not
implement are refused where they would change the answer (`refused`: OpenAI's, and the sampling
fields of vLLM and llama.cpp that their users send), and other unknown fields are ignored. Tandem's own extension object `"tandem": {"drafter": ..., "k": ...}`
refuses unknown fields, so a typo there is reported rather than silently ignored.
"""

from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, PlainValidator, model_validator
from pydantic_core import PydanticCustomError

from tandem.engine.events import SpeculationOptions
from tandem.numbers import is_int
from tandem.speculation.depth import K_LIMIT
from tandem.speculation.sampling import MAX_TEMPERATURE
from tandem.speculation.drafters.registry import DRAFTER_NAMES
from tandem.text.chat_messages import content_text
from tandem.text.chat_roles import CHAT_ROLES

# OpenAI's fields that change no token of an answer: ignored without a word (other unknown fields
# are ignored too, and the server's log names each once: serve/api/body.py)
FIELDS_WITHOUT_EFFECT = frozenset({"user", "metadata", "store", "service_tier", "prediction", "parallel_tool_calls",
                                   "safety_identifier", "prompt_cache_key", "prompt_cache_retention"})
STREAM_OPTIONS_WITHOUT_EFFECT = frozenset({"include_obfuscation"})  # OpenAI's padding of chunks: none is sent
MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 256  # per stop string
MAX_CACHE_SALT_CHARS = 256


def _whole_number(value):
    """1.0 is the integer 1 (JSON Schema's rule; JSON has one number type); 1.5 stays a float and is refused."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**63:
        return int(value)
    return value


def integer(**bounds):
    """An int field type with bounds (ge, lt, ...) that takes whole-number floats."""
    return Annotated[int, Field(**bounds), BeforeValidator(_whole_number)]  # this order keeps the schema's bounds


def _one_prompt(value) -> str | tuple[int, ...]:
    """A prompt's text, or its token ids (as vLLM and OpenAI take them: a list of ids, or a list
    of one such list); one prompt per request."""
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], (str, list)):
        value = value[0]
    if isinstance(value, str):
        return value
    if isinstance(value, list) and value and all(is_int(token) for token in value):
        if not all(0 <= token < 2**31 for token in value):
            raise PydanticCustomError("invalid_value", "token ids must be non-negative integers below 2^31")
        return tuple(value)
    if isinstance(value, list) and len(value) > 1 and all(isinstance(p, (str, list)) for p in value):
        raise PydanticCustomError("unsupported_value", "one prompt per request: send each of these "
                                  f"{len(value)} prompts as its own request")
    if value == []:
        raise PydanticCustomError("invalid_value", "the prompt is empty")
    raise PydanticCustomError("invalid_value", "must be a string, a list of token ids, or a list of exactly "
                              "one of either")


def _stop_strings(value) -> list[str]:
    if value is None:
        return []
    strings = [value] if isinstance(value, str) else value
    if not (isinstance(strings, list) and all(isinstance(s, str) for s in strings)):
        raise PydanticCustomError("invalid_type", "must be a string or a list of strings")
    strings = list(dict.fromkeys(s for s in strings if s))  # empty ones dropped, repeats counted once
    if len(strings) > MAX_STOP_STRINGS:
        raise PydanticCustomError("invalid_value", f"at most {MAX_STOP_STRINGS} stop strings are allowed")
    if any(len(s) > MAX_STOP_CHARS for s in strings):
        raise PydanticCustomError("invalid_value", f"a stop string may hold at most {MAX_STOP_CHARS} characters")
    return strings


def _depth(value) -> int | str | None:
    if value is None or value == "auto":
        return value
    value = _whole_number(value)
    if is_int(value) and 0 <= value <= K_LIMIT:
        return value
    raise PydanticCustomError("invalid_value", f"must be 'auto' or an integer from 0 to {K_LIMIT}")


def _seed(value) -> int | None:
    """0 to 2^63-1; -1 is no seed (llama.cpp's "random", which its clients send by default)."""
    value = _whole_number(value)
    if value is None or value == -1 and type(value) is int:
        return None
    if is_int(value) and 0 <= value < 2**63:
        return value
    raise PydanticCustomError("invalid_value", "must be an integer from 0 to 2^63-1 (or -1: no seed)")


def _no_bias(value) -> frozenset[int] | None:
    """logit_bias is not implemented: an empty map, or one whose every bias is 0, changes nothing
    and passes; its token ids are kept, for the vocabulary's check where the tokenizer is known."""
    if isinstance(value, dict):
        bad_key = next((key for key in value if not (key.isascii() and key.isdigit() and len(key) <= 10)), None)
        if bad_key is not None:  # as OpenAI's: keys are token ids
            raise PydanticCustomError("invalid_value", "logit_bias keys must be token ids (e.g. \"50256\"), not {key}",
                                      {"key": repr(bad_key[:32])})
        bad_bias = next((b for b in value.values() if type(b) not in (int, float)), None)
        if bad_bias is not None:
            raise PydanticCustomError("invalid_type", "logit_bias values must be numbers from -100 to 100, not {bias}",
                                      {"bias": repr(bad_bias)[:32]})
    if value is None:
        return None
    if isinstance(value, dict) and all(b == 0 for b in value.values()):
        return frozenset(int(key) for key in value)
    raise PydanticCustomError("unsupported_value", "logit_bias is not supported by this server (only biases of 0)")


def refused(name: str, *no_ops, schema=None, instead: str = ""):
    """A field this server does not implement. Its no-op values (what clients send by default:
    null, false, 0, an empty list, text output) pass; any other would change what comes back, so
    it is refused with a 400 rather than silently ignored (OpenAI clients expose them all).
    `instead`: what to send in its place, where there is something."""

    def check(value):
        if value is None or any(value == no_op and type(value) is type(no_op) for no_op in no_ops):
            return None
        raise PydanticCustomError("unsupported_value", f"{name} is not supported by this server"
                                  + (f": {instead}" if instead else ""))

    return PlainValidator(check, json_schema_input_type=schema)


class TextPart(BaseModel):  # for the schema only: _message_text checks content parts
    type: Literal["text"]
    text: str


def _message_text(value) -> str:
    """A message's content: a string, or a list of {"type": "text", "text": ...} parts, one line each."""
    text = content_text(value)
    if text is not None:
        return text
    others = [p["type"] for p in value if isinstance(p, dict) and isinstance(p.get("type"), str)
              and p["type"] != "text"] if isinstance(value, list) else []
    if others:  # image_url, input_audio, file: well formed, not implemented
        raise PydanticCustomError("unsupported_value", f"content parts of type {others[0]!r} are not supported "
                                  "by this server (text only)")
    raise PydanticCustomError("invalid_type", "must be a string or a list of text parts")


class TandemOptions(BaseModel):
    """The `"tandem"` extension object: how to speculate for this request."""

    model_config = ConfigDict(extra="forbid", strict=True)
    drafter: Literal[DRAFTER_NAMES] | None = None
    k: Annotated[int | str | None, PlainValidator(_depth, json_schema_input_type=Literal["auto"] | Annotated[
        int, Field(ge=0, le=K_LIMIT)] | None)] = None

    def speculation(self) -> SpeculationOptions:
        return SpeculationOptions(drafter=self.drafter, k=self.k)


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    include_usage: bool | None = False
    # vLLM's usage on every chunk: refused, not ignored (a client asking for it got none without a word)
    continuous_usage_stats: Annotated[None, refused("stream_options.continuous_usage_stats", False,
                                                    schema=Literal[False] | None)] = None


class TextFormat(BaseModel):  # for the schema only: response_format's one accepted value
    type: Literal["text"]


class SamplingFields(BaseModel):
    """What both endpoints share: the model, limits, sampling, stops, streaming, the extension."""

    model_config = ConfigDict(extra="ignore", strict=True)
    model: str
    max_tokens: integer(ge=1) | None = None
    temperature: float | None = Field(None, ge=0.0, le=MAX_TEMPERATURE)
    top_p: float | None = Field(None, ge=0.0, le=1.0)  # 0: the most likely token alone
    top_k: integer(ge=-1) | None = None  # not OpenAI's; as vLLM takes it, -1 (and 0) for off
    seed: Annotated[int | None, PlainValidator(_seed, json_schema_input_type=Annotated[
        int, Field(ge=-1, lt=2**63)] | None)] = None
    stop: Annotated[list[str], PlainValidator(_stop_strings, json_schema_input_type=str | Annotated[
        list[str], Field(max_length=MAX_STOP_STRINGS)] | None)] = Field(default_factory=list)
    logit_bias: Annotated[frozenset[int] | None, PlainValidator(_no_bias, json_schema_input_type=dict[str, Literal[0]]
                                                                 | None)] = None
    n: integer(ge=1) | None = None
    cache_salt: Annotated[str, Field(min_length=1, max_length=MAX_CACHE_SALT_CHARS)] | None = None  # vLLM's
    presence_penalty: Annotated[None, refused("presence_penalty", 0, 0.0, schema=Literal[0] | None)] = None
    frequency_penalty: Annotated[None, refused("frequency_penalty", 0, 0.0, schema=Literal[0] | None)] = None
    # other servers' sampling fields (vLLM's, llama.cpp's), which their users send here too
    min_tokens: Annotated[None, refused("min_tokens", 0, schema=Literal[0] | None)] = None
    min_p: Annotated[None, refused("min_p", 0, 0.0, schema=Literal[0] | None)] = None
    typical_p: Annotated[None, refused("typical_p", 1, 1.0, schema=Literal[1] | None)] = None
    repetition_penalty: Annotated[None, refused("repetition_penalty", 1, 1.0, schema=Literal[1] | None)] = None
    repeat_penalty: Annotated[None, refused("repeat_penalty", 1, 1.0, schema=Literal[1] | None)] = None
    stop_token_ids: Annotated[None, refused("stop_token_ids", [], schema=Annotated[list, Field(max_length=0)] | None)] = None
    ignore_eos: Annotated[None, refused("ignore_eos", False, schema=Literal[False] | None)] = None
    include_stop_str_in_output: Annotated[None, refused("include_stop_str_in_output", False,
                                                        schema=Literal[False] | None)] = None
    echo: Annotated[None, refused("echo", False, schema=Literal[False] | None)] = None  # vLLM's chat takes it too
    best_of: Annotated[None, refused("best_of", 1, 1.0, schema=Literal[1] | None)] = None
    guided_json: Annotated[None, refused("guided_json (structured outputs)")] = None
    guided_regex: Annotated[None, refused("guided_regex (structured outputs)")] = None
    guided_choice: Annotated[None, refused("guided_choice (structured outputs)")] = None
    guided_grammar: Annotated[None, refused("guided_grammar (structured outputs)")] = None
    grammar: Annotated[None, refused("grammar (structured outputs)")] = None
    json_schema: Annotated[None, refused("json_schema (structured outputs)")] = None
    structured_outputs: Annotated[None, refused("structured_outputs")] = None  # vLLM's newer form of guided_*
    response_format: Annotated[None, refused("response_format (JSON mode, structured outputs)", {"type": "text"},
                                             schema=TextFormat | None)] = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    tandem: TandemOptions | None = None

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    def speculation(self) -> SpeculationOptions:
        return self.tandem.speculation() if self.tandem else SpeculationOptions()

    def new_token_limit(self) -> int | None:
        return self.max_tokens


class CompletionRequest(SamplingFields):
    """POST /v1/completions."""

    prompt: Annotated[str | tuple[int, ...], PlainValidator(_one_prompt, json_schema_input_type=str | Annotated[
        list[str], Field(min_length=1, max_length=1)] | Annotated[list[int], Field(min_length=1)] | Annotated[
        list[Annotated[list[int], Field(min_length=1)]], Field(min_length=1, max_length=1)])]
    logprobs: Annotated[None, refused("logprobs")] = None
    suffix: Annotated[None, refused("suffix", "", schema=Literal[""] | None)] = None
    max_completion_tokens: Annotated[None, refused(
        "max_completion_tokens", instead="on /v1/completions send max_tokens (max_completion_tokens is chat's)")] = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    role: Literal[CHAT_ROLES]
    content: Annotated[str, PlainValidator(_message_text, json_schema_input_type=str | list[TextPart])]
    tool_calls: Annotated[None, refused("tool_calls (function calling)", [],
                                        schema=Annotated[list, Field(max_length=0)] | None)] = None
    function_call: Annotated[None, refused("function_call (function calling)")] = None

    @model_validator(mode="before")
    @classmethod
    def _assistant_null_content_is_empty(cls, data):
        """OpenAI lets an assistant turn's content be null (agents send it beside tool_calls): it is empty text."""
        if isinstance(data, dict) and data.get("role") == "assistant" and data.get("content", "") is None:
            return {**data, "content": ""}
        return data

    def as_template_message(self) -> dict:
        """The role and text the tokenizer's template takes (it maps "developer": chat_roles.py)."""
        return {"role": self.role, "content": self.content}


class ChatCompletionRequest(SamplingFields):
    """POST /v1/chat/completions."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: integer(ge=1) | None = None
    logprobs: Annotated[None, refused("logprobs", False, schema=Literal[False] | None)] = None
    top_logprobs: Annotated[None, refused("top_logprobs", 0, 0.0, schema=Literal[0] | None)] = None
    tools: Annotated[None, refused("tools (function calling)", [], schema=Annotated[list, Field(max_length=0)] | None)] = None
    tool_choice: Annotated[None, refused("tool_choice", "none", schema=Literal["none"] | None)] = None
    functions: Annotated[None, refused("functions (function calling)", [], schema=Annotated[
        list, Field(max_length=0)] | None)] = None
    function_call: Annotated[None, refused("function_call", "none", schema=Literal["none"] | None)] = None
    modalities: Annotated[None, refused("modalities (audio output)", ["text"], schema=Literal[("text",)] | None)] = None
    audio: Annotated[None, refused("audio (audio output)")] = None
    web_search_options: Annotated[None, refused("web_search_options (web search)")] = None
    reasoning_effort: Annotated[None, refused("reasoning_effort (reasoning models)")] = None
    verbosity: Annotated[None, refused("verbosity")] = None
    # vLLM's chat template controls: the template is applied as it is, opening a new assistant turn
    add_generation_prompt: Annotated[None, refused("add_generation_prompt", True, schema=Literal[True] | None)] = None
    continue_final_message: Annotated[None, refused("continue_final_message (a new assistant turn always opens)",
                                                    False, schema=Literal[False] | None)] = None
    chat_template: Annotated[None, refused("chat_template (the model's own is applied)")] = None
    chat_template_kwargs: Annotated[None, refused("chat_template_kwargs", {}, schema=Annotated[
        dict, Field(max_length=0)] | None)] = None

    def new_token_limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens
