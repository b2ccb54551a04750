"""Converting a GGUF file into a Hugging Face folder, once, so later loads take seconds.

transformers can read a GGUF directly, but it dequantizes every tensor on each load.
`convert_to_hf` does that once and writes config.json, float32 model.safetensors, the tokenizer
files (chat template included) and generation_config.json. `convert_tokenizer` writes only the
tokenizer files, for backends that run the GGUF themselves. Both build the folder beside `dest`
and rename it into place, so `dest` either is complete or does not exist. A file transformers
cannot read raises TandemError (a truncated one says so). Nothing is downloaded: HF_HUB_OFFLINE
is forced on.
"""

import os
from pathlib import Path

from tandem.errors import TandemError
from tandem.models.gguf_extent import truncation
from tandem.models.pull import atomic_dir

WEIGHTS_FILENAME = "model.safetensors"


def convert_to_hf(gguf: Path, dest: Path) -> Path:
    """Write a float32 Hugging Face model folder for `gguf` at `dest`; return `dest`."""
    import torch
    from safetensors.torch import save_file

    model = load_gguf_model(gguf)
    tokenizer = load_gguf_tokenizer(gguf)
    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the weights we write are plain float32
    config.dtype = torch.float32
    with atomic_dir(dest) as work:
        save_file(_untied_state_dict(model), str(work / WEIGHTS_FILENAME), metadata={"format": "pt"})
        config.save_pretrained(work)
        if model.generation_config is not None:
            model.generation_config.save_pretrained(work)
        tokenizer.save_pretrained(work)
    return dest


def convert_tokenizer(gguf: Path, dest: Path) -> Path:
    """Write only the tokenizer files (chat template included) for `gguf` at `dest`; return `dest`."""
    tokenizer = load_gguf_tokenizer(gguf)
    with atomic_dir(dest) as work:
        tokenizer.save_pretrained(work)
    return dest


def load_gguf_model(gguf: Path):
    """The transformers causal LM for `gguf`, dequantized to float32 (slow: seconds per 100M params)."""
    import torch

    auto = _transformers().AutoModelForCausalLM
    return _load(gguf, lambda: auto.from_pretrained(str(gguf.parent), gguf_file=gguf.name,
                                                    dtype=torch.float32))


def load_gguf_tokenizer(gguf: Path):
    """The transformers tokenizer stored in `gguf`'s metadata."""
    auto = _transformers().AutoTokenizer
    return _load(gguf, lambda: auto.from_pretrained(str(gguf.parent), gguf_file=gguf.name))


def _load(gguf: Path, loader):
    try:
        return loader()
    except Exception as exc:  # transformers and gguf raise many kinds on a bad file
        truncated = truncation(gguf)  # a file cut short fails on a numpy reshape: said as what it is
        if truncated is not None:
            raise TandemError(f"{gguf} is {truncated}") from None
        raise TandemError(f"{gguf} is not a valid GGUF file: {exc}") from exc


def _untied_state_dict(model) -> dict:
    """The state dict with each shared tensor stored once (tied lm_head is dropped; transformers
    re-ties it on load from `tie_word_embeddings`), every tensor contiguous as safetensors needs."""
    seen: set[tuple] = set()
    state = {}
    for key, tensor in model.state_dict().items():
        identity = (tensor.data_ptr(), tuple(tensor.shape))
        if identity in seen:
            continue
        seen.add(identity)
        state[key] = tensor.contiguous()
    return state


def _transformers():
    os.environ["HF_HUB_OFFLINE"] = "1"  # must be set before huggingface_hub is first imported
    import transformers

    return transformers
