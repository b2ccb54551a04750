"""A text tokenizer (transformers, loaded from a local folder) and the shared-vocabulary check.

Chat messages are text, never markup: a message whose content spells a special token
("<|im_start|>system ...") is encoded with that text as plain characters, so a user cannot open a
turn of another role. Only the template's own markup becomes special tokens.
"""

import functools
import os
import re
import secrets

from tandem.errors import TandemError, VocabularyMismatchError
from tandem.text.chat_roles import template_role

END_OF_TURN_TOKENS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<end_of_turn>")


class TextTokenizer:
    """A model's Hugging Face tokenizer (its folder, `models.resolve.tokenizer_path`): text and chat
    messages to token ids, ids to text, and the ids that end an answer (`stop_token_ids`)."""

    def __init__(self, folder: str):
        from transformers import AutoTokenizer

        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        try:
            self._tok = AutoTokenizer.from_pretrained(str(folder))
        except (OSError, ValueError) as error:
            raise TandemError(f"cannot load a tokenizer from {folder}: {error}") from None
        self.folder = str(folder)

    @property
    def size(self) -> int:
        """How many token ids it knows (its vocabulary and added tokens)."""
        return len(self._tok)

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False))

    def decode(self, token_ids: list[int]) -> str:
        return self._tok.decode(token_ids, skip_special_tokens=True)

    def chat_prompt_ids(self, messages: list[dict]) -> list[int]:
        """Apply the chat template once, with the assistant turn opened. `messages`: dicts with a
        string role and content (text/chat_messages.py's `checked_messages` makes them so from
        OpenAI's shapes, text parts included)."""
        if not (isinstance(messages, list) and messages and all(
                isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                for m in messages)):  # a KeyError, or jinja's UndefinedError, deep in the template
            raise TandemError("chat messages are a non-empty list of {'role': str, 'content': str} "
                              "(text/chat_messages.py's checked_messages takes OpenAI's text parts too)")
        if not self._tok.chat_template:
            raise TandemError(f"the tokenizer in {self.folder} has no chat template: use --prompt")
        messages = [{**m, "role": template_role(m["role"])} for m in messages]  # every caller alike
        text = self._render(messages)
        if not any(self._spells_a_special_token(m["content"]) for m in messages):
            return self.encode(text)  # the common case: one encode of the whole text
        return self._encode_contents_as_text(messages, text)

    def _render(self, messages: list[dict]) -> str:
        return self._tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)

    def _spells_a_special_token(self, text: str) -> bool:
        return any(token in text for token in self._special_token_texts)

    @functools.cached_property
    def _special_token_texts(self) -> tuple[str, ...]:
        return tuple(t.content for t in self._tok.added_tokens_decoder.values() if t.special and t.content)

    def _encode_contents_as_text(self, messages: list[dict], text: str) -> list[int]:
        """Encode the template's markup with its special tokens and each message's content as
        plain text: render the template once more with a marker for each content, and encode the
        pieces between markers apart from the contents."""
        tag = secrets.token_hex(8)
        markers = {f"[[content-{tag}-{i}]]": m["content"] for i, m in enumerate(messages)}
        marked = self._render([{**m, "content": marker} for m, marker in zip(messages, markers)])
        pieces = re.split("(" + "|".join(map(re.escape, markers)) + ")", marked)  # markup, marker, markup, ...
        if "".join(markers.get(piece, piece) for piece in pieces) != text:
            raise TandemError("a message spells a special token, and this model's chat template changes "
                              "message text, so it cannot be kept as plain text")
        ids: list[int] = []
        for piece in pieces:
            if piece in markers:
                ids += self._tok.encode(markers[piece], add_special_tokens=False, split_special_tokens=True)
            elif piece:
                ids += self.encode(piece)
        return ids

    @functools.cached_property
    def stop_token_ids(self) -> frozenset[int]:
        vocab = self._tok.get_vocab()
        ids = {vocab[t] for t in END_OF_TURN_TOKENS if t in vocab}
        if self._tok.eos_token_id is not None:
            ids.add(self._tok.eos_token_id)
        return frozenset(ids)

    def vocabulary(self) -> dict[str, int]:
        return self._tok.get_vocab()


DRAFTERS_WITHOUT_A_MODEL = "draft from the context without a model: --drafter ngram, suffix or none"


def check_same_vocabulary(target: TextTokenizer, draft: TextTokenizer, instead: str = DRAFTERS_WITHOUT_A_MODEL) -> None:
    """Draft and target must map every token to the same id (a padded embedding is fine). instead:
    what the error offers beside naming another draft (the command's own way to draft without one)."""
    target_vocab, draft_vocab = target.vocabulary(), draft.vocabulary()
    if target_vocab == draft_vocab:
        return
    differing = sorted(set(target_vocab.items()) ^ set(draft_vocab.items()))
    example = differing[0] if differing else ("?", -1)
    raise VocabularyMismatchError(
        f"the draft and target tokenizers differ ({len(target_vocab)} vs {len(draft_vocab)} tokens, "
        f"{len(differing)} differing entries, e.g. {example[0]!r} -> {example[1]}): "
        f"speculative decoding needs a draft model with the target's tokenizer (name one with --draft, or {instead})"
    )
