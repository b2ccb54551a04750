"""The batching engine on smollm2: fp32 torch target, fused and serial (exact), llama.cpp fused batches (measured:
any divergence from the request run alone sits on a near-tie of the target's logits)."""

from collections import defaultdict

import pytest

from real_support import MAX_TOKENS, NEAR_TIE_LOGITS, greedy_alone, parting_gap
from tandem.engine.batch_engine import BatchEngine
from tandem.engine.request import GenerationRequest
from tandem.models.backends import RunnerSpec
from tandem.models.batch_backends import load_batch_runner
from tandem.models.batch_runner import SlotView
from tandem.models.llamacpp_batch_runner import LlamaCppBatchRunner

SMALL = "smollm2-135m-instruct"
SLOTS = 3
PROMPTS = 4  # of the shared chat prompts: enough for a batch that changes shape as requests end


def run_together(engine: BatchEngine, requests: list[GenerationRequest]) -> list[list[int]]:
    outputs = defaultdict(list)
    for i, request in enumerate(requests):
        engine.add(str(i), request)
    drafted = 0
    while engine.has_work:
        updates, _ = engine.step()
        for update in updates:
            outputs[update.seq_id] += update.token_ids
            drafted += update.drafted
    engine.drafted_in_test = drafted
    return [outputs[str(i)] for i in range(len(requests))]


@pytest.fixture(scope="module")
def requests(chat_prompt_ids, small_tokenizer):
    return [GenerationRequest(p, MAX_TOKENS, stop_token_ids=small_tokenizer.stop_token_ids)
            for p in chat_prompt_ids[:PROMPTS]]


@pytest.mark.parametrize("torch_runner", ["fused", "serial"])
def test_fp32_torch_batched_greedy_equals_each_request_alone(requests, torch_reference, torch_runner):
    """The fused runner (one paged forward, the compact decoder) and the serial one (transformers)."""
    target = load_batch_runner(RunnerSpec(SMALL, "torch", "cpu", "fp32", 2, torch_runner=torch_runner), SLOTS)
    draft = load_batch_runner(RunnerSpec(SMALL, "llamacpp", threads=2), SLOTS)
    engine = BatchEngine(target, draft, "hybrid", 3)
    assert run_together(engine, requests) == torch_reference[:PROMPTS]
    assert engine.drafted_in_test > 0


def test_llamacpp_fused_batches_diverge_only_on_near_ties(requests, small_gguf):
    target = load_batch_runner(RunnerSpec(SMALL, "llamacpp", threads=2), SLOTS)
    draft = load_batch_runner(RunnerSpec(SMALL, "llamacpp", threads=2), SLOTS)
    together = run_together(BatchEngine(target, draft, "hybrid", "auto"), requests)
    single = SlotView(LlamaCppBatchRunner(small_gguf, 1, threads=2))
    matches = 0
    for request, output in zip(requests, together):
        reference = greedy_alone(single.forward, single.reset, request.prompt_ids, MAX_TOKENS, request.stop_token_ids)
        if output == reference:
            matches += 1
            continue
        i, gap = parting_gap(single.forward, single.reset, request.prompt_ids, output, reference,
                             request.stop_token_ids)
        assert gap < NEAR_TIE_LOGITS, (i, gap, output[:i + 2], reference[:i + 2])
    print(f"llama.cpp batched vs alone: {matches}/{len(requests)} identical")


def test_llamacpp_batch_runner_keeps_to_its_threads_for_multi_token_calls(small_gguf):
    """llama-cpp-python gives multi-token calls every core unless told otherwise; a one-thread
    cluster worker that took both cores of this machine ran 3-9x slower beside its peers."""
    import llama_cpp

    runner = LlamaCppBatchRunner(str(small_gguf), 2, threads=1)
    assert llama_cpp.llama_n_threads(runner._ctx.ctx) == 1
    assert llama_cpp.llama_n_threads_batch(runner._ctx.ctx) == 1


def test_llamacpp_batch_runner_attends_with_flash_attention(small_gguf):
    """The flash kernel skips the masked cells of other slots in the unified cache (the plain one
    multiplies through them: a 16-sequence serving level ran 15% slower); llama-cpp-python's
    default is off, so the runner must set it."""
    import llama_cpp

    runner = LlamaCppBatchRunner(str(small_gguf), 2, threads=1)
    assert runner._ctx.params.flash_attn_type == llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED


def test_releasing_openmp_threads_frees_the_team_a_main_thread_decode_left(small_gguf):
    """A llama.cpp decode on this thread leaves an OpenMP worker behind (threads - 1 of them);
    release_openmp_threads frees it, so an engine thread's team is the process's only one."""
    import os
    import time

    from tandem.models.openmp import release_openmp_threads

    def os_threads() -> int:
        return len(os.listdir("/proc/self/task"))

    LlamaCppBatchRunner(str(small_gguf), 1, threads=2)  # its first decode (sizing buffers) runs here
    before = os_threads()
    assert release_openmp_threads()
    deadline = time.monotonic() + 5
    while os_threads() > before - 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert os_threads() == before - 1


def test_llamacpp_logits_buffer_is_sized_at_start_and_big_calls_are_split(small_gguf):
    """llama.cpp never shrinks its logits buffer, so the runner grows it to `max_outputs` positions
    at start and splits a call asking for more: resident memory does not step up mid-run, and the
    split call gives the logits one big call gives."""
    import numpy as np
    import psutil

    from tandem.models.batch_runner import BatchItem

    tokens = [(17 * i) % 900 + 10 for i in range(80)]
    # one slot: its longest copy round (64 positions); eight: each one's deepest model round (8 x 17)
    small = LlamaCppBatchRunner(str(small_gguf), max_slots=1, context_length=512, threads=2)
    big = LlamaCppBatchRunner(str(small_gguf), max_slots=8, context_length=512, threads=2)
    assert (small.max_outputs, big.max_outputs) == (64, 136)
    split = small.forward_batch([BatchItem(0, tokens, 70)])[0]  # 70 positions: two calls
    whole = big.forward_batch([BatchItem(0, tokens, 70)])[0]
    assert split.shape == whole.shape == (70, small.vocab_size)
    # the split is the two calls it stands for, made by hand: tokens 0-73 (the last 64 scored), then 74-79
    by_hand = LlamaCppBatchRunner(str(small_gguf), max_slots=1, context_length=512, threads=2)
    first = by_hand.forward_batch([BatchItem(0, tokens[:74], 64)])[0]
    second = by_hand.forward_batch([BatchItem(0, tokens[74:], 6)])[0]
    np.testing.assert_allclose(split, np.concatenate([first, second]), atol=1e-3)
    # and the same positions as one call: batch shapes differ (Q4 kernels), and a call of 64 positions
    # or more takes the flash-attention tile path, summing in another order (0.65 apart on AMD EPYC;
    # up to ~1.1 between tile paths, design.md)
    np.testing.assert_allclose(split, whole, atol=2.0)
    assert (split.argmax(-1) == whole.argmax(-1)).mean() > 0.9
    big.rollback(0, 0)

    def deepest_verify_of_every_slot() -> None:
        big.forward_batch([BatchItem(slot, tokens[:17], 17) for slot in range(8)])
        for slot in range(8):
            big.rollback(slot, 0)

    deepest_verify_of_every_slot()  # numpy's own buffers for the copies settle
    process = psutil.Process()
    before = process.memory_info().rss
    for _ in range(3):
        deepest_verify_of_every_slot()
    assert process.memory_info().rss - before < 16 * 2**20  # no step up: the buffer was already that size


def test_llamacpp_short_rounds_scored_apart_give_what_each_alone_gives(small_gguf):
    """Sixteen 4-token verify rounds reach the flash kernel's tile, so the runner scores them in
    two calls below it: each round's logits are then those it gets scored alone (packed into one
    tiled call they were not: up to 1.1 apart, 4 of 64 argmaxes flipped on this model)."""
    import numpy as np

    from tandem.models.batch_runner import BatchItem
    from tandem.models.llamacpp_batch_runner import BATCH_TOKENS, plan_calls

    runner = LlamaCppBatchRunner(str(small_gguf), max_slots=16, context_length=512, threads=2)
    for slot in range(16):
        runner.forward_batch([BatchItem(slot, [(31 * slot + 7 * i) % 900 + 10 for i in range(20)], 0)])
    rounds = [BatchItem(slot, [(13 * slot + i) % 900 + 10 for i in range(4)], 4) for slot in range(16)]
    assert len(plan_calls(rounds, BATCH_TOKENS, runner.max_outputs)) == 2

    def score(items) -> list[np.ndarray]:
        logits = runner.forward_batch(items)  # [4, vocab] per item
        for item in items:
            runner.rollback(item.slot, 20)
        return logits

    together = np.stack(score(rounds))  # [16, 4, vocab]
    alone = np.stack([score([item])[0] for item in rounds])
    np.testing.assert_allclose(together, alone, atol=1e-3)


def test_llamacpp_views_hold_the_rows_copies_hold(small_gguf):
    """`views=True` hands over llama.cpp's own buffer for the rows of a forward's last call and
    copies those of earlier calls; either way every item's rows equal the copies a plain call
    returns. Here sixteen short rounds and one deep one go in two calls (`plan_calls`)."""
    import numpy as np

    from tandem.models.batch_runner import BatchItem
    from tandem.models.llamacpp_batch_runner import BATCH_TOKENS, plan_calls

    runner = LlamaCppBatchRunner(str(small_gguf), max_slots=16, context_length=512, threads=2)
    for slot in range(16):
        runner.forward_batch([BatchItem(slot, [(31 * slot + 7 * i) % 900 + 10 for i in range(20)], 0)])
    items = [BatchItem(slot, [(13 * slot + i) % 900 + 10 for i in range(4)], 4) for slot in range(15)]
    items.append(BatchItem(15, [(5 * i) % 900 + 10 for i in range(40)], 40))
    assert len(plan_calls(items, BATCH_TOKENS, runner.max_outputs)) == 2

    def score(views: bool) -> list[np.ndarray]:
        logits = runner.forward_batch(items, views=views)
        for item in items:
            runner.rollback(item.slot, 20)
        return logits

    copies = score(False)
    views = score(True)
    assert [rows.shape for rows in views] == [(item.num_logits, runner.vocab_size) for item in items]
    for rows, copy in zip(views, copies):
        np.testing.assert_allclose(rows, copy, atol=1e-3)
    assert all(rows.flags.owndata for rows in copies)
    assert not views[-1].flags.owndata  # the deep round came last: llama.cpp's buffer
    assert all(rows.flags.owndata for rows in views[:-1])  # the short rounds' call came first: copied
    kept = views[-1].copy()
    runner.forward_batch([BatchItem(15, [11, 12], 2)], views=True)  # the next call writes the buffer
    runner.rollback(15, 20)
    assert not np.array_equal(views[-1], kept)
