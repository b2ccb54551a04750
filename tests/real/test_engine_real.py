"""The engine on a real model pair: smollm2's Q4 GGUF in llama.cpp drafting for its own fp32
weights in torch (same tokenizer), and llama.cpp as the target."""

import numpy as np
import pytest

from tandem.engine.generator import SpeculativeGenerator
from tandem.engine.request import GenerationRequest
from tandem.models.llamacpp_runner import LlamaCppRunner
from tandem.models.torch_runner import TorchRunner
from tandem.spec.depth import AutoDepth, FixedDepth
from tandem.spec.drafters.hybrid import HybridDrafter
from tandem.spec.drafters.model import ModelDrafter
from tandem.spec.drafters.ngram import NgramDrafter
from tandem.spec.drafters.none import NoDrafter

MAX_TOKENS = 32
# A near-tie: the two candidate tokens' target logits differ by less than this. Batched and
# one-token forwards in llama.cpp use different kernels; their logits differ by up to ~0.5.
NEAR_TIE_LOGITS = 0.5


@pytest.fixture(scope="module")
def torch_target(small_hf):
    return TorchRunner(small_hf, "cpu", "fp32")


@pytest.fixture(scope="module")
def llama_draft(small_gguf):
    return LlamaCppRunner(small_gguf, threads=2)


@pytest.fixture(scope="module")
def torch_reference(torch_target, chat_prompt_ids, small_tokenizer):
    generator = SpeculativeGenerator(torch_target, NoDrafter(), FixedDepth(0))
    stops = small_tokenizer.stop_token_ids
    return [generator.generate(GenerationRequest(p, MAX_TOKENS, stop_token_ids=stops))[0] for p in chat_prompt_ids]


def test_target_only_equals_transformers_generate(small_hf, chat_prompt_ids, torch_reference):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(small_hf, dtype=torch.float32).eval()
    for prompt, reference in zip(chat_prompt_ids[:3], torch_reference[:3]):
        out = model.generate(torch.tensor([prompt]), max_new_tokens=len(reference), do_sample=False)
        assert out[0, len(prompt):].tolist()[: len(reference)] == reference


@pytest.mark.parametrize("kind,k", [("model", 3), ("model", "auto"), ("hybrid", "auto"), ("ngram", "auto")])
def test_fp32_torch_greedy_is_lossless_with_llamacpp_draft(
    torch_target, llama_draft, chat_prompt_ids, torch_reference, small_tokenizer, kind, k
):
    model = ModelDrafter(llama_draft)
    drafter = {"model": model, "hybrid": HybridDrafter(model), "ngram": NgramDrafter()}[kind]
    depth = AutoDepth(torch_target.cost) if k == "auto" else FixedDepth(k)
    generator = SpeculativeGenerator(torch_target, drafter, depth)
    drafted = 0
    for prompt, reference in zip(chat_prompt_ids, torch_reference):
        request = GenerationRequest(prompt, MAX_TOKENS, stop_token_ids=small_tokenizer.stop_token_ids)
        output, stats = generator.generate(request)
        assert output == reference
        drafted += stats.drafted
    if kind != "ngram":
        assert drafted > 0  # speculation really happened


def test_llamacpp_target_divergences_are_near_ties(small_gguf, chat_prompt_ids, small_tokenizer):
    """Quantized backend: measure agreement of speculative vs target-only; any divergence must
    sit on a near-tie of the target's logits."""
    target = LlamaCppRunner(small_gguf, threads=2)
    draft = LlamaCppRunner(small_gguf, threads=2)
    stops = small_tokenizer.stop_token_ids
    plain = SpeculativeGenerator(target, NoDrafter(), FixedDepth(0))
    speculative = SpeculativeGenerator(target, HybridDrafter(ModelDrafter(draft)), FixedDepth(4))
    for prompt in chat_prompt_ids:
        reference, _ = plain.generate(GenerationRequest(prompt, MAX_TOKENS, stop_token_ids=stops))
        output, stats = speculative.generate(GenerationRequest(prompt, MAX_TOKENS, stop_token_ids=stops))
        assert stats.accepted > 0
        if output == reference:
            continue
        i = next(i for i, (a, b) in enumerate(zip(output, reference)) if a != b)
        target.reset()
        logits = target.forward(list(prompt) + reference[:i], num_logits=1)[0]  # [vocab]
        gap = abs(float(logits[reference[i]]) - float(logits[output[i]]))
        assert gap < NEAR_TIE_LOGITS, (i, gap)


def test_llamacpp_rollback_gives_identical_logits(small_gguf):
    runner = LlamaCppRunner(small_gguf, threads=2)
    ids = list(range(200, 240))
    full = runner.forward(ids)  # [40, vocab]
    runner.rollback(30)
    again = runner.forward(ids[30:], num_logits=4)  # [4, vocab]
    assert runner.num_cached_tokens == 40
    np.testing.assert_array_equal(full[-4:], again)
