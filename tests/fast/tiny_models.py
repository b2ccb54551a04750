"""Tiny causal LMs built in the test (random weights, fp32): real transformers and real torch
kernels, small enough that a whole generation takes milliseconds."""

from pathlib import Path

VOCAB = 97


def build_tiny_model(folder: Path, seed: int, hidden: int = 32, layers: int = 2) -> Path:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=False,
    )
    model = Qwen2ForCausalLM(config)
    with torch.no_grad():  # sharpen the logits so greedy choices are far from ties
        model.lm_head.weight.mul_(8.0)
    model.save_pretrained(folder)
    return folder


def build_tiny_llama(folder: Path, seed: int, hidden: int = 32, layers: int = 2) -> Path:
    """A tiny Llama (SmolLM2's architecture: no attention biases, tied embeddings)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=hidden, intermediate_size=hidden * 2,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=256, tie_word_embeddings=True)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(4.0)
    model.save_pretrained(folder)
    return folder
