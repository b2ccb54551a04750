"""Models shared by every configuration of one benchmark run, each loaded once.

Configurations ask `BenchModels` for what they need: the target's tokenizer (the one that formats
every prompt), one target and one draft batch runner (one slot each: the batching engine with one
running sequence, as `tandem generate` runs it) shared by all Tandem configurations (two runners
even when a model drafts for itself, since each holds its own KV cache), and Hugging Face models
for the transformers peers.
A 1.5B model in torch fp32 takes 7 GB, so an HF peer on the same folder, device and dtype as a
loaded torch runner reuses that runner's model instead of loading a second copy.
"""

import os
from dataclasses import dataclass

from tandem.engine.step_budget import STEP_TOKEN_BUDGET, THROUGHPUT_PREFILL_FLOOR
from tandem.models.backends import RunnerSpec
from tandem.models.batch_backends import load_batch_runner
from tandem.models.batch_runner import BatchRunner
from tandem.models.resolve import hf_path, tokenizer_path
from tandem.speculation.depth import Auto, Depth, parse_depth
from tandem.text.tokenizer import TextTokenizer, check_same_vocabulary


@dataclass(frozen=True, slots=True)
class ModelChoice:
    """What the command line chose: target and draft specs, the default k, CPU threads, the
    most tokens one engine step scores (long prompts go in chunks of it), and the engine's
    prompt floor and waves beside decoding streams (as `tandem serve` takes them)."""

    target: RunnerSpec
    draft: RunnerSpec
    k: Depth = Auto()
    threads: int | None = None
    step_token_budget: int = STEP_TOKEN_BUDGET
    prefill_floor: int | None = THROUGHPUT_PREFILL_FLOOR
    prefill_waves: bool = False

    def __post_init__(self):
        object.__setattr__(self, "k", parse_depth(self.k))

    @property
    def cpu_threads(self) -> int:
        return self.threads or os.cpu_count() or 1

    def torch_spec(self, model: str) -> RunnerSpec:
        """Where the transformers peers run `model`: the target's device and dtype, on torch."""
        return RunnerSpec(model, "torch", self.target.device, self.target.dtype, self.threads).resolved()


class BenchModels:
    def __init__(self, choice: ModelChoice):
        self.choice = choice
        self._tokenizer: TextTokenizer | None = None
        self._runners: dict[str, tuple[RunnerSpec, BatchRunner]] = {}  # role -> (resolved spec, runner)
        self._hf_models: dict[RunnerSpec, object] = {}

    @property
    def tokenizer(self) -> TextTokenizer:
        if self._tokenizer is None:
            self._tokenizer = TextTokenizer(str(tokenizer_path(self.choice.target.model)))
        return self._tokenizer

    @property
    def stop_token_ids(self) -> frozenset[int]:
        return self.tokenizer.stop_token_ids

    def target_runner(self) -> BatchRunner:
        return self._runner("target", self.choice.target)

    def draft_runner(self) -> BatchRunner:
        if "draft" not in self._runners:
            self.check_draft_vocabulary()
        return self._runner("draft", self.choice.draft)

    def check_draft_vocabulary(self) -> None:
        """The draft model maps every token to the target's id (VocabularyMismatchError if not)."""
        check_same_vocabulary(self.tokenizer, TextTokenizer(str(tokenizer_path(self.choice.draft.model))),
                              "leave the configs that draft with a model out of --configs: none, ngram and suffix "
                              "draft without one")

    def _runner(self, role: str, spec: RunnerSpec) -> BatchRunner:
        """One runner per role: a model drafting for itself still needs its own KV cache."""
        if role not in self._runners:
            self._runners[role] = (spec.resolved(), load_batch_runner(spec, 1))
        return self._runners[role][1]

    def cost_curves(self) -> dict[str, dict[str, float]]:
        """Each loaded runner's cost curve (ms per forward of n tokens), as the depth policy saw it."""
        return {role: runner.cost.to_json() for role, (_, runner) in self._runners.items()}

    def hf_model(self, model: str):
        """A transformers causal LM for `model` on the target's device and dtype, loaded once."""
        spec = self.choice.torch_spec(model)
        if spec not in self._hf_models:
            self._hf_models[spec] = self._loaded_torch_model(spec) or _load_hf_model(spec)
        return self._hf_models[spec]

    def _loaded_torch_model(self, spec: RunnerSpec):
        """The model inside an already-loaded torch runner for the same folder, device and dtype."""
        for loaded, runner in self._runners.values():
            same = (loaded.backend, loaded.device, loaded.dtype) == (spec.backend, spec.device, spec.dtype)
            if same and hf_path(loaded.model) == hf_path(spec.model):
                view = getattr(runner, "views", [runner])[0]  # a serial torch runner's first slot
                return getattr(view, "_model", None)  # TorchRunner keeps its transformers model here
        return None


def _load_hf_model(spec: RunnerSpec):
    import torch
    from transformers import AutoModelForCausalLM

    from tandem.models.torch_runner import torch_dtype

    if spec.threads:
        torch.set_num_threads(spec.threads)
    model = AutoModelForCausalLM.from_pretrained(str(hf_path(spec.model)), dtype=torch_dtype(spec.dtype))
    return model.to(torch.device(spec.device)).eval()
