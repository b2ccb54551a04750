"""Speculative greedy output equals target-only output token for token (fp32 torch), and the
target-only path equals transformers' own greedy `generate` (the slow reference)."""

import pytest

from tandem.engine.generator import SpeculativeGenerator
from tandem.engine.request import GenerationRequest
from tandem.models.torch_runner import TorchRunner
from tandem.spec.depth import AutoDepth, FixedDepth
from tandem.spec.drafters.hybrid import HybridDrafter
from tandem.spec.drafters.model import ModelDrafter
from tandem.spec.drafters.ngram import NgramDrafter
from tandem.spec.drafters.none import NoDrafter

PROMPTS = [
    (5, 17, 33, 2, 9, 41),
    (1, 2, 3, 4, 1, 2, 3, 4, 1, 2),
    (60, 61, 62, 60, 61, 62, 60, 61),
    (88,),
]
MAX_TOKENS = 24


@pytest.fixture(scope="module")
def runners(tiny_target, tiny_draft):
    return {
        "target": TorchRunner(str(tiny_target)),
        "draft": TorchRunner(str(tiny_draft)),
        "self": TorchRunner(str(tiny_target)),
    }


@pytest.fixture(scope="module")
def references(runners):
    generator = SpeculativeGenerator(runners["target"], NoDrafter(), FixedDepth(0))
    return {p: generator.generate(GenerationRequest(p, max_tokens=MAX_TOKENS))[0] for p in PROMPTS}


def hf_greedy(model_dir, prompt, max_tokens):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    ids = torch.tensor([list(prompt)])
    out = model.generate(ids, max_new_tokens=max_tokens, min_new_tokens=max_tokens, do_sample=False)
    return out[0, len(prompt):].tolist()


def test_target_only_matches_transformers_generate(tiny_target, references):
    for prompt in PROMPTS:
        assert references[prompt] == hf_greedy(tiny_target, prompt, MAX_TOKENS), prompt


def make_drafter(kind, runners):
    if kind == "ngram":
        return NgramDrafter()
    model = ModelDrafter(runners["self" if kind == "self" else "draft"])
    return HybridDrafter(model) if kind == "hybrid" else model


@pytest.mark.parametrize("kind", ["model", "ngram", "hybrid", "self"])
@pytest.mark.parametrize("k", [1, 4, "auto"])
def test_speculative_greedy_equals_target_only(runners, references, kind, k):
    target = runners["target"]
    depth = AutoDepth(target.cost) if k == "auto" else FixedDepth(k)
    generator = SpeculativeGenerator(target, make_drafter(kind, runners), depth)
    for prompt in PROMPTS:
        output, stats = generator.generate(GenerationRequest(prompt, max_tokens=MAX_TOKENS))
        assert output == references[prompt], (kind, k, prompt)
        if kind == "self" and k == 4:
            assert stats.accepted == stats.drafted > 0  # a model drafting for itself is always right
            assert stats.target_forwards < MAX_TOKENS
