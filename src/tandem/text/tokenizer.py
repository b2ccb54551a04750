"""A text tokenizer (transformers, loaded from a local folder) and the shared-vocabulary check."""

import functools
import os

from tandem.errors import TandemError, VocabularyMismatchError

END_OF_TURN_TOKENS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<end_of_turn>")


class TextTokenizer:
    def __init__(self, folder: str):
        from transformers import AutoTokenizer

        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        try:
            self._tok = AutoTokenizer.from_pretrained(str(folder))
        except (OSError, ValueError) as error:
            raise TandemError(f"cannot load a tokenizer from {folder}: {error}") from None
        self.folder = str(folder)

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False))

    def decode(self, token_ids: list[int]) -> str:
        return self._tok.decode(token_ids, skip_special_tokens=True)

    def chat_prompt_ids(self, messages: list[dict]) -> list[int]:
        """Apply the chat template once, with the assistant turn opened."""
        if not self._tok.chat_template:
            raise TandemError(f"the tokenizer in {self.folder} has no chat template: use --prompt")
        text = self._tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return self.encode(text)

    @functools.cached_property
    def stop_token_ids(self) -> frozenset[int]:
        vocab = self._tok.get_vocab()
        ids = {vocab[t] for t in END_OF_TURN_TOKENS if t in vocab}
        if self._tok.eos_token_id is not None:
            ids.add(self._tok.eos_token_id)
        return frozenset(ids)

    def vocabulary(self) -> dict[str, int]:
        return self._tok.get_vocab()


def check_same_vocabulary(target: TextTokenizer, draft: TextTokenizer) -> None:
    """Draft and target must map every token to the same id (a padded embedding is fine)."""
    target_vocab, draft_vocab = target.vocabulary(), draft.vocabulary()
    if target_vocab == draft_vocab:
        return
    differing = sorted(set(target_vocab.items()) ^ set(draft_vocab.items()))
    example = differing[0] if differing else ("?", -1)
    raise VocabularyMismatchError(
        f"the draft and target tokenizers differ ({len(target_vocab)} vs {len(draft_vocab)} tokens, "
        f"{len(differing)} differing entries, e.g. {example[0]!r} -> {example[1]}): "
        "speculative decoding needs a draft model with the target's tokenizer"
    )
