"""The engine on a real model pair, one request at a time as `tandem generate` runs it:
smollm2's Q4 GGUF in llama.cpp drafting for its own fp32 weights in torch (same tokenizer), and
llama.cpp as the target."""

from pathlib import Path

import numpy as np
import pytest

from real_support import MAX_TOKENS, NEAR_TIE_LOGITS, greedy_alone, parting_gap
from tandem.engine.batch_engine import BatchEngine
from tandem.engine.request import GenerationRequest
from tandem.engine.run_request import generate
from tandem.models.batch_runner import SerialBatchRunner, SlotView
from tandem.models.llamacpp_batch_runner import LlamaCppBatchRunner


@pytest.fixture(scope="module")
def llama_draft(small_gguf):
    return LlamaCppBatchRunner(small_gguf, 1, threads=2)


def test_target_only_equals_transformers_generate(small_hf, chat_prompt_ids, torch_reference):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(small_hf, dtype=torch.float32).eval()
    for prompt, reference in zip(chat_prompt_ids[:3], torch_reference[:3]):
        out = model.generate(torch.tensor([prompt]), max_new_tokens=len(reference), do_sample=False)
        assert out[0, len(prompt):].tolist()[: len(reference)] == reference


@pytest.mark.parametrize("drafter,k", [("model", 3), ("model", "auto"), ("hybrid", "auto"), ("ngram", "auto")])
def test_fp32_torch_greedy_is_lossless_with_llamacpp_draft(
    torch_target, llama_draft, chat_prompt_ids, torch_reference, small_tokenizer, drafter, k
):
    target = SerialBatchRunner(lambda: torch_target, 1)
    engine = BatchEngine(target, llama_draft if drafter != "ngram" else None, drafter, k)
    drafted = 0
    for prompt, reference in zip(chat_prompt_ids, torch_reference):
        request = GenerationRequest(prompt, MAX_TOKENS, stop_token_ids=small_tokenizer.stop_token_ids)
        output, stats = generate(engine, request)
        assert output == reference
        drafted += stats.drafted
    if drafter != "ngram":
        assert drafted > 0  # speculation really happened


def test_llamacpp_target_divergences_are_near_ties(small_gguf, chat_prompt_ids, small_tokenizer):
    """Quantized backend: measure agreement of speculative vs target-only; any divergence must
    sit on a near-tie of the target's logits."""
    target = LlamaCppBatchRunner(small_gguf, 1, threads=2)
    draft = LlamaCppBatchRunner(small_gguf, 1, threads=2)
    alone = SlotView(LlamaCppBatchRunner(small_gguf, 1, threads=2))
    stops = small_tokenizer.stop_token_ids
    speculative = BatchEngine(target, draft, "hybrid", 4)
    for prompt in chat_prompt_ids:
        reference = greedy_alone(alone.forward, alone.reset, prompt, MAX_TOKENS, stops)
        output, stats = generate(speculative, GenerationRequest(prompt, MAX_TOKENS, stop_token_ids=stops))
        assert stats.accepted > 0
        if output == reference:
            continue
        i, gap = parting_gap(alone.forward, alone.reset, prompt, output, reference, stops)
        assert gap < NEAR_TIE_LOGITS, (i, gap)


def test_llamacpp_rollback_gives_identical_logits(small_gguf):
    runner = SlotView(LlamaCppBatchRunner(small_gguf, 1, threads=2))
    ids = list(range(200, 240))
    full = runner.forward(ids)  # [40, vocab]
    runner.rollback(30)
    again = runner.forward(ids[30:], num_logits=4)  # [4, vocab]
    assert runner.num_cached_tokens == 40
    np.testing.assert_array_equal(full[-4:], again)


def test_a_requantized_draft_is_the_same_bytes_at_any_thread_count_and_drafts_losslessly(
    small_gguf, tmp_path, torch_target, chat_prompt_ids, torch_reference, small_tokenizer
):
    """The catalog's derived drafts are re-quantized on the user's machine (models/requantize.py):
    the file must come out the same whatever the threads (its checksum is pinned), be Q4_0, and
    draft for the target with greedy output unchanged."""
    import gguf as gguf_reader

    from tandem.models.requantize import requantize

    one, two = tmp_path / "one.gguf", tmp_path / "two.gguf"
    requantize(Path(small_gguf), one, "Q4_0", threads=1)
    requantize(Path(small_gguf), two, "Q4_0", threads=2)
    assert one.read_bytes() == two.read_bytes()
    types = {t.tensor_type.name for t in gguf_reader.GGUFReader(one).tensors if len(t.shape) == 2}
    assert "Q4_0" in types and not types & {"Q4_1", "Q5_0", "Q4_K"}  # smollm2's matrices were Q4_1
    engine = BatchEngine(SerialBatchRunner(lambda: torch_target, 1), LlamaCppBatchRunner(str(one), 1, threads=2),
                         "model", 3)
    drafted = 0
    for prompt, reference in zip(chat_prompt_ids, torch_reference):
        output, stats = generate(engine, GenerationRequest(prompt, MAX_TOKENS, stop_token_ids=small_tokenizer.stop_token_ids))
        assert output == reference
        drafted += stats.drafted
    assert drafted > 0


def test_a_llamacpp_pool_smaller_than_every_full_context_says_so(small_gguf):
    """`--max-running 8 --context-length 512` gives 2,048 cells, four full contexts, and the start
    said nothing of it (a trial expected eight full-length requests at once); a pool that holds
    them all says nothing."""
    shared = LlamaCppBatchRunner(small_gguf, 8, context_length=512, threads=1)
    assert shared.pool_tokens == 2048
    assert shared.describe_pool().startswith("KV pool: 2048 cells shared by 8 sequences of up to 512 tokens, "
                                             "4 at full length at once")
    assert LlamaCppBatchRunner(small_gguf, 1, context_length=512, threads=1).describe_pool() is None
