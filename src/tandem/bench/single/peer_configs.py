"""Peer configurations: other engines decoding the same token ids greedily, for comparison.

- `llamacpp-plain`: llama-cpp-python's own generation loop on the target's GGUF.
- `hf-generate`: transformers `generate` with the target alone (the HF folder, --device/--dtype).
- `hf-assisted`: transformers assisted generation with the draft model as `assistant_model`
  (on the target's device and dtype; --draft-device/--draft-dtype apply to Tandem only; a
  re-quantized catalog draft is given as its source, which float weights serve better).
- `hf-prompt-lookup`: transformers prompt-lookup decoding (`:n=` sets the tokens proposed, default 10).

All stop at the target tokenizer's stop ids, like Tandem, so token counts compare.
"""

from typing import Sequence

from tandem.bench.single.config_base import ConfigSpec
from tandem.token_ids import cut_at_stop
from tandem.bench.single.models import BenchModels
from tandem.errors import TandemError
from tandem.models.catalog import float_source
from tandem.sigterm import deferring_ctrl_c

PROMPT_LOOKUP_TOKENS = 10


class LlamaCppPlain:
    OPTIONS: tuple[str, ...] = ()
    is_peer = True
    setup_rank = 1
    uses_draft_model = False

    def __init__(self, spec: ConfigSpec, models: BenchModels):
        self.label = spec.label
        self.models = models
        self.llm = None

    def setup(self) -> None:
        from llama_cpp import Llama

        from tandem.models.resolve import gguf_path

        threads = self.models.choice.cpu_threads
        path = gguf_path(self.models.choice.target.model)
        context = self.models.choice.target.context_length
        try:
            with deferring_ctrl_c():  # a Ctrl-C in llama.cpp's log callback is swallowed (models/llamacpp_batch_runner.py)
                self.llm = Llama(model_path=str(path), n_ctx=context, n_threads=threads,
                                 n_threads_batch=threads, verbose=False)
        except (ValueError, RuntimeError, OSError) as error:
            raise TandemError(f"llama.cpp cannot load {path}: {error}") from None

    def run(self, prompt_ids: Sequence[int], max_tokens: int) -> tuple[list[int], dict]:
        stop_ids = self.models.stop_token_ids
        self.llm.reset()  # no prefix reuse from the previous prompt: every config prefills in full
        output = []
        for token in self.llm.generate(list(prompt_ids), top_k=1, top_p=1.0, min_p=0.0, temp=0.0,
                                       repeat_penalty=1.0):
            if token in stop_ids:
                break
            output.append(token)
            if len(output) >= max_tokens:
                break
        return output, {}


class HfGenerate:
    OPTIONS: tuple[str, ...] = ()
    is_peer = True
    setup_rank = 1
    uses_draft_model = False

    def __init__(self, spec: ConfigSpec, models: BenchModels):
        self.spec = spec
        self.label = spec.label
        self.models = models
        self.model = None

    def setup(self) -> None:
        self.model = self.models.hf_model(self.models.choice.target.model)

    def generate_options(self) -> dict:
        return {}

    def run(self, prompt_ids: Sequence[int], max_tokens: int) -> tuple[list[int], dict]:
        import torch

        stop_ids = sorted(self.models.stop_token_ids)
        ids = torch.tensor([list(prompt_ids)], dtype=torch.long, device=self.model.device)  # [1, n]
        with torch.inference_mode():
            output = self.model.generate(
                input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                temperature=None, top_p=None, top_k=None, max_new_tokens=max_tokens,
                eos_token_id=stop_ids, pad_token_id=stop_ids[0], **self.generate_options(),
            )  # [1, n + new]
        new_ids = output[0, ids.shape[1]:].tolist()
        return cut_at_stop(new_ids, self.models.stop_token_ids, max_tokens), {}


class HfAssisted(HfGenerate):
    assistant = None
    uses_draft_model = True

    def setup(self) -> None:
        super().setup()
        self.assistant = self.models.hf_model(float_source(self.models.choice.draft.model))  # the draft torch runs best

    def generate_options(self) -> dict:
        return {"assistant_model": self.assistant}


class HfPromptLookup(HfGenerate):
    OPTIONS = ("n",)

    def __init__(self, spec: ConfigSpec, models: BenchModels):
        super().__init__(spec, models)
        raw = spec.option("n", str(PROMPT_LOOKUP_TOKENS))
        if not raw.isdigit() or int(raw) < 1:
            raise TandemError(f"{self.label}: n must be a positive integer, got {raw!r}")
        self.lookup_tokens = int(raw)

    def generate_options(self) -> dict:
        return {"prompt_lookup_num_tokens": self.lookup_tokens}
