"""A compact decoder for the catalog's architectures, run over a ragged batch and a paged KV cache.

Qwen2 and Llama (SmolLM2) share one shape: token embedding, then per layer a pre-norm
grouped-query attention with rotary positions and a pre-norm SwiGLU MLP, a final RMSNorm and a
(possibly tied) output projection. Qwen2 adds biases to q, k and v. This file holds the weights
(q/k/v and gate/up fused into one matrix each, so a layer is four matmuls over every token of the
step) and the forward pass over a `StepLayout` (paged/layout.py). It reads the same
`model.safetensors` + `config.json` folder transformers reads; transformers' model is the slow
reference the tests compare logits and greedy outputs with.
"""

import json
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from tandem.errors import TandemError
from tandem.models.paged.kv_cache import PagedKvCache
from tandem.models.paged.layout import StepLayout

MODEL_TYPES = ("qwen2", "llama")


def attention_backends() -> list:
    """The attention kernels a step may use: every one but cuDNN's, which builds an execution plan
    for each new shape. A serving step's context is one token longer than the last, so every
    step met a new shape: measured on an H100 (1.5B bf16, scripts/gpu_check.py --only sdpa),
    decode steps of 65 ms at C=1 and 83 ms at C=16 with cuDNN allowed, 18 and 30 ms on a second
    pass over lengths already planned, 28 ms at both without it."""
    names = ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "MATH", "OVERRIDEABLE")
    return [getattr(SDPBackend, name) for name in names if hasattr(SDPBackend, name)]


@dataclass(frozen=True, slots=True)
class DecoderConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_eps: float
    rope_theta: float
    attention_bias: bool
    tie_word_embeddings: bool
    max_positions: int

    @classmethod
    def from_folder(cls, folder: str | Path) -> "DecoderConfig":
        return cls.from_dict(json.loads((Path(folder) / "config.json").read_text()))

    @classmethod
    def from_dict(cls, raw: dict) -> "DecoderConfig":
        model_type = raw.get("model_type")
        if model_type not in MODEL_TYPES:
            raise TandemError(f"the fused torch runner knows {', '.join(MODEL_TYPES)} models, not {model_type}; "
                              "use --torch-runner serial")
        if raw.get("use_sliding_window"):
            raise TandemError("the fused torch runner has no sliding-window attention; use --torch-runner serial")
        rope = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
        if rope.get("rope_type", rope.get("type", "default")) != "default":
            raise TandemError(f"the fused torch runner has plain rotary positions only, not {rope}; "
                              "use --torch-runner serial")
        heads = raw["num_attention_heads"]
        return cls(
            vocab_size=raw["vocab_size"], hidden_size=raw["hidden_size"],
            intermediate_size=raw["intermediate_size"], num_layers=raw["num_hidden_layers"],
            num_heads=heads, num_kv_heads=raw.get("num_key_value_heads", heads),
            head_dim=raw.get("head_dim") or raw["hidden_size"] // heads, rms_eps=raw["rms_norm_eps"],
            rope_theta=float(rope.get("rope_theta", raw.get("rope_theta", 10000.0))),
            attention_bias=model_type == "qwen2" or bool(raw.get("attention_bias")),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            max_positions=raw.get("max_position_embeddings", 4096),
        )


@dataclass(slots=True)
class LayerWeights:
    input_norm: torch.Tensor  # [hidden]
    qkv: torch.Tensor  # [(heads + 2 * kv_heads) * head_dim, hidden]
    qkv_bias: torch.Tensor | None  # [(heads + 2 * kv_heads) * head_dim]
    out: torch.Tensor  # [hidden, heads * head_dim]
    post_norm: torch.Tensor  # [hidden]
    gate_up: torch.Tensor  # [2 * intermediate, hidden]
    down: torch.Tensor  # [hidden, intermediate]


class PagedDecoder:
    def __init__(self, config: DecoderConfig, tensors: dict[str, torch.Tensor], dtype: torch.dtype,
                 device: torch.device):
        self.config = config
        self.dtype = dtype
        self.device = device

        def take(name: str) -> torch.Tensor:
            if name not in tensors:
                raise TandemError(f"the weights lack {name}")
            return tensors[name].to(device=device, dtype=dtype).contiguous()

        self.embed = take("model.embed_tokens.weight")  # [vocab, hidden]
        self.final_norm = take("model.norm.weight")  # [hidden]
        tied = config.tie_word_embeddings or "lm_head.weight" not in tensors
        self.lm_head = self.embed if tied else take("lm_head.weight")  # [vocab, hidden]
        self.layers = [self._layer(take, f"model.layers.{i}.", config) for i in range(config.num_layers)]
        inverse = torch.arange(0, config.head_dim, 2, dtype=torch.float32, device=device) / config.head_dim
        self.inv_freq = 1.0 / (config.rope_theta ** inverse)  # [head_dim / 2]
        self._backends = attention_backends()

    @staticmethod
    def _layer(take, prefix: str, config: DecoderConfig) -> LayerWeights:
        attention = prefix + "self_attn."
        bias = None
        if config.attention_bias:
            bias = torch.cat([take(f"{attention}{p}_proj.bias") for p in "qkv"])
        return LayerWeights(
            input_norm=take(prefix + "input_layernorm.weight"),
            qkv=torch.cat([take(f"{attention}{p}_proj.weight") for p in "qkv"]),
            qkv_bias=bias,
            out=take(attention + "o_proj.weight"),
            post_norm=take(prefix + "post_attention_layernorm.weight"),
            gate_up=torch.cat([take(prefix + "mlp.gate_proj.weight"), take(prefix + "mlp.up_proj.weight")]),
            down=take(prefix + "mlp.down_proj.weight"),
        )

    @classmethod
    def load(cls, folder: str | Path, dtype: torch.dtype, device: torch.device) -> "PagedDecoder":
        from safetensors import safe_open

        config = DecoderConfig.from_folder(folder)
        tensors = {}
        for path in sorted(Path(folder).glob("*.safetensors")):
            with safe_open(str(path), framework="pt") as handle:
                for name in handle.keys():
                    tensors[name] = handle.get_tensor(name).to(dtype)
        if not tensors:
            raise TandemError(f"{folder} holds no .safetensors weights")
        return cls(config, tensors, dtype, device)

    @property
    def decode_bytes(self) -> int:
        """Weight bytes one decode step must read: every layer, the final norm, the output layer."""
        tensors = [self.final_norm, self.lm_head] + [t for layer in self.layers for t in (
            layer.input_norm, layer.qkv, layer.qkv_bias, layer.out, layer.post_norm, layer.gate_up, layer.down)
            if t is not None]
        return sum(t.numel() * t.element_size() for t in tensors)

    @torch.inference_mode()
    def forward(self, token_ids: torch.Tensor, layout: StepLayout, cache: PagedKvCache) -> torch.Tensor:
        """token_ids [tokens] of every slot in the step; returns float32 logits
        [len(layout.logit_rows), vocab] for the rows the layout asks for."""
        cos, sin = self._rotary(layout.positions)  # [tokens, head_dim] each
        hidden = F.embedding(token_ids, self.embed)  # [tokens, hidden]
        with sdpa_kernel(self._backends):
            for index, layer in enumerate(self.layers):
                hidden = hidden + self._attention(layer, _rms_norm(hidden, layer.input_norm, self.config.rms_eps),
                                                  cos, sin, layout, cache, index)
                hidden = hidden + self._mlp(layer, _rms_norm(hidden, layer.post_norm, self.config.rms_eps))
        last = _rms_norm(hidden[layout.logit_rows], self.final_norm, self.config.rms_eps)  # [logits, hidden]
        return F.linear(last, self.lm_head).float()  # [logits, vocab]

    def _rotary(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions.float()[:, None] * self.inv_freq[None, :]  # [tokens, head_dim / 2]
        angles = torch.cat([freqs, freqs], dim=-1)  # [tokens, head_dim]
        return angles.cos().to(self.dtype), angles.sin().to(self.dtype)

    def _attention(self, layer: LayerWeights, x: torch.Tensor, cos, sin, layout: StepLayout,
                   cache: PagedKvCache, index: int) -> torch.Tensor:
        c = self.config
        tokens = x.shape[0]
        qkv = F.linear(x, layer.qkv, layer.qkv_bias)  # [tokens, (heads + 2 * kv_heads) * head_dim]
        q, k, v = qkv.split([c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim,
                             c.num_kv_heads * c.head_dim], dim=-1)
        q = _rotate(q.view(tokens, c.num_heads, c.head_dim), cos, sin)  # [tokens, heads, head_dim]
        k = _rotate(k.view(tokens, c.num_kv_heads, c.head_dim), cos, sin)  # [tokens, kv_heads, head_dim]
        cache.write(index, layout.write_rows, k, v.view(tokens, c.num_kv_heads, c.head_dim))
        out = torch.empty_like(q)  # [tokens, heads, head_dim]
        for group in layout.groups:
            keys, values = cache.gather(index, group.context_rows)  # [n, context, kv_heads, head_dim]
            queries = q[group.query_index]  # [n, queries, heads, head_dim]
            attended = F.scaled_dot_product_attention(
                queries.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2),
                attn_mask=group.mask, enable_gqa=c.num_heads != c.num_kv_heads,
            )  # [n, heads, queries, head_dim]
            flat = attended.transpose(1, 2).reshape(-1, c.num_heads, c.head_dim)  # [n * queries, heads, head_dim]
            out[group.token_rows] = flat[group.padded_rows]
        return F.linear(out.view(tokens, -1), layer.out)  # [tokens, hidden]

    def _mlp(self, layer: LayerWeights, x: torch.Tensor) -> torch.Tensor:
        gate, up = F.linear(x, layer.gate_up).chunk(2, dim=-1)  # [tokens, intermediate] each
        return F.linear(F.silu(gate) * up, layer.down)  # [tokens, hidden]


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """As transformers computes it: in float32, cast back before the weight."""
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary positions, rotate-half form. x [tokens, heads, head_dim]; cos, sin [tokens, head_dim]."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]
