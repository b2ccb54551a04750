"""OpenAI response bodies for both endpoints: whole responses and streaming chunks.

`chat` shapes: `chat.completion` / `chat.completion.chunk` with `message` / `delta`; `text` shapes:
`text_completion` with `text`. Tandem adds `"tandem": {"cached": bool}` to whole responses, and
to every chunk of a stream replayed from the response cache.
"""

import time
import uuid
from dataclasses import dataclass, field

KINDS = ("chat", "text")


@dataclass(frozen=True, slots=True)
class ResponseShape:
    kind: str  # "chat" (POST /v1/chat/completions) or "text" (POST /v1/completions)
    model: str
    cached: bool = False
    include_usage: bool = False  # streaming: chunks carry "usage": null, a last chunk the usage
    id: str = ""
    created: int = field(default_factory=lambda: int(time.time()))

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {self.kind!r}")
        if not self.id:
            prefix = "chatcmpl" if self.kind == "chat" else "cmpl"
            object.__setattr__(self, "id", f"{prefix}-{uuid.uuid4().hex}")

    def full(self, text: str, finish_reason: str, usage: dict) -> dict:
        if self.kind == "chat":
            choice = {"index": 0, "message": {"role": "assistant", "content": text}}
        else:
            choice = {"index": 0, "text": text}
        choice |= {"logprobs": None, "finish_reason": finish_reason}
        return self._envelope("chat.completion" if self.kind == "chat" else "text_completion", [choice]) | {
            "usage": usage, "tandem": {"cached": self.cached}}

    def opening_chunk(self) -> dict | None:
        """Chat streams open with the assistant role; text streams have no opening chunk."""
        if self.kind != "chat":
            return None
        return self._chunk({"delta": {"role": "assistant", "content": ""}, "finish_reason": None})

    def text_chunk(self, text: str) -> dict:
        content = {"delta": {"content": text}} if self.kind == "chat" else {"text": text}
        return self._chunk(content | {"finish_reason": None})

    def final_chunk(self, finish_reason: str) -> dict:
        content = {"delta": {}} if self.kind == "chat" else {"text": ""}
        return self._chunk(content | {"finish_reason": finish_reason})

    def usage_chunk(self, usage: dict) -> dict:
        return self._stream_envelope([]) | {"usage": usage}

    def _chunk(self, choice: dict) -> dict:
        body = self._stream_envelope([{"index": 0, **choice, "logprobs": None}])
        return body | {"usage": None} if self.include_usage else body

    def _stream_envelope(self, choices: list) -> dict:
        body = self._envelope("chat.completion.chunk" if self.kind == "chat" else "text_completion", choices)
        return body | {"tandem": {"cached": True}} if self.cached else body

    def _envelope(self, object_name: str, choices: list) -> dict:
        return {"id": self.id, "object": object_name, "created": self.created, "model": self.model,
                "choices": choices}
