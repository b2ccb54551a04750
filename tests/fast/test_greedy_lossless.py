"""Speculative greedy output equals target-only output token for token (fp32 torch, through the
batching engine with one sequence, as `tandem generate` runs it), and the target-only path
equals transformers' own greedy `generate` (the slow reference)."""

import pytest

from engine_support import make_engine
from tandem.engine.request import GenerationRequest
from tandem.engine.run_request import generate

PROMPTS = [
    (5, 17, 33, 2, 9, 41),
    (1, 2, 3, 4, 1, 2, 3, 4, 1, 2),
    (60, 61, 62, 60, 61, 62, 60, 61),
    (88,),
]
MAX_TOKENS = 24


@pytest.fixture(scope="module")
def target_only(tiny_target, tiny_draft):
    engine = make_engine(tiny_target, tiny_draft, "none", 0, slots=1)
    return {p: generate(engine, GenerationRequest(p, max_tokens=MAX_TOKENS))[0] for p in PROMPTS}


def hf_greedy(model_dir, prompt, max_tokens):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    ids = torch.tensor([list(prompt)])
    out = model.generate(ids, max_new_tokens=max_tokens, min_new_tokens=max_tokens, do_sample=False)
    return out[0, len(prompt):].tolist()


def test_target_only_matches_transformers_generate(tiny_target, target_only):
    for prompt in PROMPTS:
        assert target_only[prompt] == hf_greedy(tiny_target, prompt, MAX_TOKENS), prompt


@pytest.mark.parametrize("kind", ["model", "ngram", "hybrid", "self"])
@pytest.mark.parametrize("k", [1, 4, "auto"])
def test_speculative_greedy_equals_target_only(tiny_target, tiny_draft, target_only, kind, k):
    """"self": the target drafting for itself as the draft model. One engine serves the
    prompts one after another, so slot and draft-cache reuse are covered too."""
    draft = tiny_target if kind == "self" else tiny_draft
    engine = make_engine(tiny_target, draft, "model" if kind == "self" else kind, k, slots=1)
    for prompt in PROMPTS:
        output, stats = generate(engine, GenerationRequest(prompt, max_tokens=MAX_TOKENS))
        assert output == target_only[prompt], (kind, k, prompt)
        if kind == "self" and k == 4:
            assert stats.accepted == stats.drafted > 0  # a model drafting for itself is always right
            assert stats.target_forwards < MAX_TOKENS
