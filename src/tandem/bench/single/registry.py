"""The configuration registry and the `--configs` parser.

`--configs none,hybrid:k=4,hybrid:k=auto,llamacpp-plain` names configurations; a `:key=value`
suffix (repeatable) sets an option the configuration declares in its `OPTIONS`. Labels (the
normalised entry) must be unique, since results are keyed by them.
"""

from tandem.bench.single.config_base import BenchConfig, ConfigFactory, ConfigSpec
from tandem.bench.single.models import BenchModels
from tandem.bench.single.peer_configs import HfAssisted, HfGenerate, HfPromptLookup, LlamaCppPlain
from tandem.bench.single.tandem_configs import HybridConfig, ModelConfig, NgramConfig, NoneConfig, SuffixConfig
from tandem.errors import TandemError

CONFIGS: dict[str, ConfigFactory] = {
    "none": NoneConfig,
    "ngram": NgramConfig,
    "suffix": SuffixConfig,
    "model": ModelConfig,
    "hybrid": HybridConfig,
    "llamacpp-plain": LlamaCppPlain,
    "hf-generate": HfGenerate,
    "hf-assisted": HfAssisted,
    "hf-prompt-lookup": HfPromptLookup,
}
BASELINE = "none"  # target-only Tandem: the denominator of "speedup vs none"
REFERENCES = ("none", "llamacpp-plain", "hf-generate")  # greedy outputs others are compared with


def parse_config_names(text: str, registry: dict[str, ConfigFactory] = CONFIGS) -> list[ConfigSpec]:
    entries = [entry.strip() for entry in text.split(",")]
    if not text.strip() or any(not entry for entry in entries):
        raise TandemError(f"--configs needs comma-separated names without empty entries, got {text!r}")
    specs = [parse_config_name(entry, registry) for entry in entries]
    labels = [spec.label for spec in specs]
    duplicates = sorted({label for label in labels if labels.count(label) > 1})
    if duplicates:
        raise TandemError(f"--configs names {', '.join(duplicates)} more than once")
    return specs


def parse_config_name(entry: str, registry: dict[str, ConfigFactory] = CONFIGS) -> ConfigSpec:
    kind, *suffixes = [part.strip() for part in entry.split(":")]
    if kind not in registry:
        raise TandemError(f"unknown config {kind!r}; known configs: {', '.join(registry)}")
    allowed = registry[kind].OPTIONS
    options = {}
    for suffix in suffixes:
        key, sep, value = (part.strip() for part in suffix.partition("="))
        if not sep or not key or not value:
            raise TandemError(f"config {entry!r}: options are written key=value, got {suffix!r}")
        if key not in allowed:
            known = ", ".join(allowed) if allowed else "none"
            raise TandemError(f"config {entry!r}: unknown option {key!r} for {kind} (options: {known})")
        if key in options:
            raise TandemError(f"config {entry!r}: option {key!r} is given twice")
        options[key] = value
    return ConfigSpec(kind, tuple(sorted(options.items())))


def build_configs(specs: list[ConfigSpec], models: BenchModels) -> list[BenchConfig]:
    """Construct (validating options) without loading anything; `setup_all` loads."""
    return [CONFIGS[spec.kind](spec, models) for spec in specs]


def setup_all(configs: list[BenchConfig]) -> None:
    for config in sorted(configs, key=lambda c: c.setup_rank):
        config.setup()
