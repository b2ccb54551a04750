"""The few numbers about a model that a roofline needs: parameters, weight bytes, KV bytes.

Shapes of the catalog models come from their Hugging Face `config.json` (layers, KV heads, head
size) and model cards (parameter counts). A model outside the catalog has no shape here; give
its worker a measured profile instead.
"""

from dataclasses import dataclass
from types import MappingProxyType

from tandem.errors import TandemError
from tandem.models.catalog import CATALOG

BYTES_PER_PARAM = MappingProxyType({"fp32": 4, "bf16": 2, "fp16": 2})
KV_BYTES_PER_ELEMENT = 2  # fp16 KV cache (llama.cpp's default and torch's bf16/fp16)


@dataclass(frozen=True, slots=True)
class ModelShape:
    name: str
    params: float  # parameter count
    layers: int
    kv_heads: int
    head_dim: int

    def __post_init__(self):
        if self.params <= 0 or min(self.layers, self.kv_heads, self.head_dim) < 1:
            raise TandemError(f"model shape {self.name}: all sizes must be positive")

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * KV_BYTES_PER_ELEMENT  # K and V

    def weight_bytes(self, backend: str, dtype: str) -> float:
        """llama.cpp reads the GGUF (quantised) weights; torch reads params x dtype width."""
        if backend == "llamacpp" and self.name in CATALOG:
            return float(CATALOG[self.name].size_bytes)
        if dtype not in BYTES_PER_PARAM:
            raise TandemError(f"{self.name}: no weight size for {backend}/{dtype}")
        return self.params * BYTES_PER_PARAM[dtype]


MODEL_SHAPES = MappingProxyType({shape.name: shape for shape in (
    ModelShape("qwen2.5-coder-1.5b-instruct", 1.54e9, layers=28, kv_heads=2, head_dim=128),
    ModelShape("qwen2.5-coder-0.5b-instruct", 0.49e9, layers=24, kv_heads=2, head_dim=64),
    ModelShape("qwen2.5-coder-0.5b-instruct-q4_0", 0.49e9, layers=24, kv_heads=2, head_dim=64),  # the same, re-quantized
    ModelShape("smollm2-135m-instruct", 0.135e9, layers=30, kv_heads=3, head_dim=64),
)})


def model_shape(name: str) -> ModelShape:
    try:
        return MODEL_SHAPES[name]
    except KeyError:
        known = ", ".join(MODEL_SHAPES)
        raise TandemError(f"no model shape for {name!r} (known: {known}); "
                          "a public-spec profile needs one: measure this model with `tandem profile`") from None
