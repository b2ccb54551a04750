"""The fused torch runner against its slow references: transformers' model run one sequence
at a time (SerialBatchRunner over TorchRunner), on tiny Qwen2 and Llama models in fp32."""

import random
import re

import numpy as np
import pytest
import torch

from tandem.errors import TandemError
from tandem.models.batch_runner import BatchItem
from tandem.models.paged.decoder import PagedDecoder
from tandem.models.paged.fused_runner import FusedTorchRunner, KvPoolFullError
from tandem.models.paged.kv_cache import PagedKvCache
from engine_support import serial_runner
from tiny_models import VOCAB, build_tiny_llama


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    return build_tiny_llama(tmp_path_factory.mktemp("tiny-llama"), seed=3)


def _fused(model_dir, slots=4, context=256, kv_memory=None):
    return FusedTorchRunner.load(str(model_dir), "cpu", "fp32", slots, context, kv_memory=kv_memory)


def _host(logits) -> np.ndarray:
    return logits.cpu().numpy() if isinstance(logits, torch.Tensor) else logits


@pytest.mark.parametrize("model", ["tiny_target", "tiny_llama"])
def test_one_ragged_forward_matches_one_forward_per_sequence(model, request):
    model_dir = request.getfixturevalue(model)
    fused, serial = _fused(model_dir), serial_runner(model_dir, 4)
    rng = random.Random(1)
    for step in range(12):  # prefills, decodes, multi-token verifies and rollbacks, mixed
        items = []
        for slot in rng.sample(range(4), rng.randint(1, 4)):
            count = rng.choice([1, 1, 3, 5, 40]) if step else rng.randint(1, 60)
            tokens = tuple(rng.randrange(VOCAB) for _ in range(count))
            items.append(BatchItem(slot, tokens, rng.randint(0, count)))
        for fused_logits, serial_logits in zip(fused.forward_batch(items), serial.forward_batch(items)):
            assert fused_logits.shape == serial_logits.shape
            np.testing.assert_allclose(_host(fused_logits), serial_logits, atol=2e-4, rtol=1e-4)
        for slot in range(4):
            assert fused.num_cached_tokens(slot) == serial.num_cached_tokens(slot)
            if fused.num_cached_tokens(slot) > 3 and rng.random() < 0.4:
                length = rng.randint(0, fused.num_cached_tokens(slot))
                fused.rollback(slot, length)
                serial.rollback(slot, length)


def test_a_copied_prefix_scores_like_the_source_and_leaves_it_intact(tiny_target):
    fused = _fused(tiny_target)
    prompt = tuple(range(3, 40))
    fused.forward_batch([BatchItem(0, prompt, 0)])
    fused.copy_prefix(0, 1, 30)
    fused.rollback(0, 25)  # the source backs into a block it shares, then both write
    a, b = fused.forward_batch([BatchItem(0, prompt[25:], 1), BatchItem(1, prompt[30:], 1)])
    fresh = _fused(tiny_target)
    (reference,) = fresh.forward_batch([BatchItem(0, prompt, 1)])
    np.testing.assert_allclose(_host(a), _host(reference), atol=1e-5)
    np.testing.assert_allclose(_host(b), _host(reference), atol=1e-5)


def test_a_full_pool_refuses_the_step_without_changing_any_slot(tiny_target):
    decoder = PagedDecoder.load(str(tiny_target), torch.float32, torch.device("cpu"))
    config = decoder.config
    row_bytes = PagedKvCache.bytes_per_row(config.num_layers, config.num_kv_heads, config.head_dim, torch.float32)
    fused = FusedTorchRunner(decoder, 2, 64, kv_memory=row_bytes * 80)  # 5 blocks of 16
    fused.forward_batch([BatchItem(0, tuple(range(60)), 0)])
    before = (fused.blocks.num_free, list(fused.blocks.slots[1].table))
    with pytest.raises(KvPoolFullError):
        fused.forward_batch([BatchItem(0, (1,), 1), BatchItem(1, tuple(range(40)), 1)])
    assert (fused.blocks.num_free, fused.blocks.slots[1].table) == before and fused.num_cached_tokens(0) == 60


def test_a_budget_below_one_context_is_a_clear_error(tiny_target):
    """It said "a KV budget of 0 MiB ...: raise --kv-memory", neither by how much nor the other way out."""
    with pytest.raises(TandemError) as error:
        _fused(tiny_target, kv_memory=1024)
    assert re.fullmatch(r"a KV budget of 1.0 KiB holds 0 tokens, less than one context of 256 \(\S+ \S+\): "
                        r"raise --kv-memory to at least \d+M, or lower --context-length", str(error.value)), error.value


def test_logits_stay_on_the_device_as_float32(tiny_target):
    (logits,) = _fused(tiny_target).forward_batch([BatchItem(0, (1, 2, 3), 2)])
    assert isinstance(logits, torch.Tensor) and logits.dtype == torch.float32 and logits.shape == (2, VOCAB)


def test_attention_runs_without_cudnn_which_plans_every_new_context_length(tiny_target, monkeypatch):
    """cuDNN's attention builds an execution plan per new shape, and every serving step's context
    is one token longer than the last (on an H100: 65 ms decode steps with it, 28 without)."""
    import tandem.models.paged.decoder as decoder

    seen = []
    attention = decoder.F.scaled_dot_product_attention

    def recording(*args, **kwargs):
        seen.append((torch.backends.cuda.cudnn_sdp_enabled(), torch.backends.cuda.math_sdp_enabled()))
        return attention(*args, **kwargs)

    from torch.nn.attention import SDPBackend, sdpa_kernel

    monkeypatch.setattr(decoder.F, "scaled_dot_product_attention", recording)
    runner = _fused(tiny_target, slots=2)
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION, SDPBackend.MATH]):  # the caller allows cuDNN
        runner.forward_batch([BatchItem(0, (5, 6, 7), 3), BatchItem(1, (8,), 1)])
        assert torch.backends.cuda.cudnn_sdp_enabled()  # the choice holds inside a step only
    assert seen and all(cudnn is False and math is True for cudnn, math in seen)


def test_a_budget_just_below_one_context_says_sizes_that_differ(tiny_target):
    """Both sizes rounded alike: "a KV budget of 22 MiB ... one context of 512 (22 MiB)"."""
    needed = _fused(tiny_target).row_bytes * 256
    with pytest.raises(TandemError) as error:
        _fused(tiny_target, kv_memory=needed - 1)
    budget, context = re.match(r"a KV budget of (\S+ \S+) holds .*? \((\S+ \S+)\)", str(error.value)).groups()
    assert budget != context, error.value
