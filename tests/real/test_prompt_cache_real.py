"""The prompt cache on smollm2. llama.cpp: a slot's state saved to the host tier and restored
scores exactly as the state saved, and outputs through resident slots, copies and host restores
equal the cold prefill's (but for measured near-ties), with the host tier inside its byte budget
throughout. fp32 torch (the fused runner): resident blocks and host restores, token for token."""

import sys

import numpy as np
import pytest

from real_support import MAX_TOKENS, NEAR_TIE_LOGITS, greedy_alone, parting_gap
from tandem.engine.batch_engine import BatchEngine
from tandem.engine.build import EngineConfig, disk_model_key
from tandem.engine.disk_cache import DiskPromptCache
from tandem.engine.host_cache import HostEntry, HostPromptCache
from tandem.engine.request import GenerationRequest
from tandem.models.backends import RunnerSpec
from tandem.models.batch_runner import BatchItem, SlotView
from tandem.models.llamacpp_batch_runner import LlamaCppBatchRunner

RUNNING = 2
RESIDENT = 1  # finished sequences kept in the pool beside the running ones


def runner(small_gguf, cache_slots=RUNNING + RESIDENT) -> LlamaCppBatchRunner:
    return LlamaCppBatchRunner(small_gguf, RUNNING, context_length=1024, threads=2, cache_slots=cache_slots)


def test_a_restored_state_gives_the_logits_of_the_state_saved(small_gguf, chat_prompt_ids):
    model = runner(small_gguf)
    prompt = list(chat_prompt_ids[0])
    model.forward_batch([BatchItem(0, tuple(prompt), 0)])
    state = model.save_state(0)
    assert model.save_state(0) == state  # llama.cpp writes every byte of the unwritten buffer it is given
    next_token = BatchItem(0, (prompt[-1],), 1)
    saved_logits = model.forward_batch([next_token])[0]  # [1, vocab]
    model.rollback(0, 0)
    assert model.restore_state(2, state, len(prompt))  # another slot, a resident one
    assert model.num_cached_tokens(2) == len(prompt)
    restored_logits = model.forward_batch([BatchItem(2, (prompt[-1],), 1)])[0]
    assert np.array_equal(saved_logits, restored_logits)


def test_a_state_from_the_disk_tier_gives_a_new_process_the_logits_saved(small_gguf, chat_prompt_ids, tmp_path):
    """A slot's state written to disk under the model's key (its file's checksum, backend and
    llama.cpp build) and read back into a fresh runner, as after a restart, scores exactly as
    the state saved; another model's key finds nothing."""
    key = disk_model_key(EngineConfig(RunnerSpec(small_gguf, backend="llamacpp"), drafter="ngram"), with_draft=False)
    model = runner(small_gguf)
    prompt = list(chat_prompt_ids[0])
    model.forward_batch([BatchItem(0, tuple(prompt), 0)])
    written = DiskPromptCache(tmp_path, 1 << 30, key)
    assert written.put(HostEntry(tuple(prompt), model.save_state(0)), key)
    written.close()
    saved_logits = model.forward_batch([BatchItem(0, (prompt[-1],), 1)])[0]  # [1, vocab]

    disk = DiskPromptCache(tmp_path, 1 << 30, key)
    entry = disk.load(disk.lookup(prompt, key))
    fresh = runner(small_gguf)
    assert fresh.restore_state(1, entry.target_state, len(entry.tokens))
    restored_logits = fresh.forward_batch([BatchItem(1, (prompt[-1],), 1)])[0]
    assert np.array_equal(saved_logits, restored_logits)
    other_key = disk_model_key(EngineConfig(RunnerSpec(small_gguf, backend="torch", device="cpu"), drafter="ngram"),
                               with_draft=False)
    assert DiskPromptCache(tmp_path, 1 << 30, other_key).lookup(prompt, other_key) is None


def test_a_state_too_large_for_the_pool_is_refused_and_leaves_the_slot_empty(small_gguf):
    big = LlamaCppBatchRunner(small_gguf, RUNNING, context_length=1024, threads=2)
    big.forward_batch([BatchItem(0, tuple(range(100, 900)), 0)])
    state = big.save_state(0)
    small = LlamaCppBatchRunner(small_gguf, 1, context_length=512, threads=2)
    assert not small.restore_state(0, state, 800)
    assert small.num_cached_tokens(0) == 0


def _run(engine: BatchEngine, requests, host: HostPromptCache | None) -> dict[str, list[int]]:
    outputs: dict[str, list[int]] = {}
    for seq_id, request in requests:
        engine.add(seq_id, request)
        outputs[seq_id] = []
        while engine.has_work:  # one at a time: each finds what the previous ones left
            updates, _ = engine.step()
            for update in updates:
                outputs.setdefault(update.seq_id, []).extend(update.token_ids)
            if host is not None:
                assert host.nbytes <= host.capacity_bytes
    return outputs


def _conversations(engine: BatchEngine, chat_prompt_ids, tokenizer, host):
    """Six conversations' first turns, one after another, then their second turns: the requests
    and their outputs."""
    stops = tokenizer.stop_token_ids
    first_turns = [(f"{i}a", GenerationRequest(list(p), MAX_TOKENS, stop_token_ids=stops))
                   for i, p in enumerate(chat_prompt_ids[:6])]
    answers = _run(engine, first_turns, host)
    follow_up = tokenizer.encode(" Now explain it in one sentence.")
    second_turns = [(f"{i}b", GenerationRequest(list(p) + answers[f"{i}a"] + follow_up, MAX_TOKENS,
                                                stop_token_ids=stops)) for i, p in enumerate(chat_prompt_ids[:6])]
    return first_turns + second_turns, answers | _run(engine, second_turns, host)


@pytest.mark.parametrize("drafter", ["none", "hybrid"])
def test_outputs_through_host_restores_equal_cold_prefills(small_gguf, chat_prompt_ids, small_tokenizer, drafter):
    """Six conversations through three slots: their first turns evict each other to the host
    tier, and each second turn restores its history (target and draft) from there. Every turn
    decodes what its whole prompt decodes from a cold cache alone, but where llama.cpp's unified
    pool lays the cells out otherwise (flash attention sums over cells in pool order), outputs may
    part on a near-tie of the target's logits, as fused batches do (docs/prompt-cache.md)."""
    host = HostPromptCache(64 << 20, "smollm2")
    draft = runner(small_gguf) if drafter == "hybrid" else None
    engine = BatchEngine(runner(small_gguf), draft, drafter, "auto" if draft else 0, host_cache=host)
    requests, outputs = _conversations(engine, chat_prompt_ids, small_tokenizer, host)
    assert host.saved >= 3 and engine.prompt_cache.host_restores >= 3, (host.saved, engine.prompt_cache.host_restores)
    assert engine.prompt_cache.hits > engine.prompt_cache.queries // 3

    identical = _compare_with_cold(small_gguf, requests, outputs)
    assert identical >= len(requests) // 2
    print(f"through the host tier vs cold alone: {identical}/{len(requests)} identical")


@pytest.mark.parametrize("cache_slots", [2, 8])
def test_fp32_torch_outputs_through_resident_caches_and_host_restores_equal_target_only(
        small_hf, chat_prompt_ids, small_tokenizer, torch_target, cache_slots):
    """The fused torch runner, 2 running: with 8 block tables the second turns find their
    histories resident in the pool; with 2 they come back from the host tier. Either way every
    turn's output is the target-only greedy output of its whole prompt, token for token."""
    from tandem.models.paged.fused_runner import FusedTorchRunner

    def fused():
        return FusedTorchRunner.load(small_hf, "cpu", "fp32", RUNNING, 1024, threads=2, cache_slots=cache_slots)

    host = HostPromptCache(256 << 20, "smollm2-torch")
    engine = BatchEngine(fused(), fused(), "hybrid", "auto", host_cache=host)
    requests, outputs = _conversations(engine, chat_prompt_ids, small_tokenizer, host)
    restored, hits = engine.prompt_cache.host_restores, engine.prompt_cache.hits
    assert (restored >= 3) if cache_slots == 2 else (restored == 0 and hits > engine.prompt_cache.queries // 3)
    for seq_id, request in requests:
        reference = greedy_alone(torch_target.forward, torch_target.reset, request.prompt_ids, MAX_TOKENS,
                                 request.stop_token_ids)
        assert outputs[seq_id] == reference, seq_id


def _compare_with_cold(small_gguf, requests, outputs) -> int:
    """How many outputs equal their prompt's cold greedy decoding alone; any other must part
    from it on a near-tie of the target's logits."""
    single = SlotView(LlamaCppBatchRunner(small_gguf, 1, context_length=1024, threads=2))
    identical = 0
    for seq_id, request in requests:
        reference = greedy_alone(single.forward, single.reset, request.prompt_ids, MAX_TOKENS,
                                 request.stop_token_ids)
        if outputs[seq_id] == reference:
            identical += 1
            continue
        i, gap = parting_gap(single.forward, single.reset, request.prompt_ids, outputs[seq_id], reference,
                             request.stop_token_ids)
        assert gap < NEAR_TIE_LOGITS, (seq_id, i, gap, outputs[seq_id][:i + 2], reference[:i + 2])
    return identical


def test_a_cancelled_prefill_leaves_only_what_it_computed(small_gguf, chat_prompt_ids, small_tokenizer):
    """A request cancelled after one prompt chunk leaves its slot holding exactly that chunk; the
    same prompt later reuses it (or its host copy) and decodes what a cold prefill decodes (but
    for near-ties)."""
    stops = small_tokenizer.stop_token_ids
    prompt = list(chat_prompt_ids[1]) * 3
    host = HostPromptCache(64 << 20, "smollm2")
    engine = BatchEngine(runner(small_gguf), None, "none", 0, host_cache=host, step_token_budget=32)
    engine.add("busy", GenerationRequest(list(chat_prompt_ids[2]), MAX_TOKENS, stop_token_ids=stops))
    engine.step()
    engine.add("cancelled", GenerationRequest(prompt, MAX_TOKENS, stop_token_ids=stops))
    engine.step()
    slot = engine.running["cancelled"].slot
    engine.cancel("cancelled")
    kept = engine.slots.cached[slot]
    assert 0 < len(kept) < len(prompt) - 1 and kept == prompt[: len(kept)]
    assert engine.target.num_cached_tokens(slot) == len(kept)
    again = GenerationRequest(prompt, MAX_TOKENS, stop_token_ids=stops)
    outputs = _run(engine, [("again", again)], host)
    assert engine.running == {} and outputs["again"]
    assert engine.prompt_cache.hits >= len(kept)  # what the cancelled request computed was reused
    _compare_with_cold(small_gguf, [("again", again)], outputs)


def test_an_idle_finished_cache_moves_to_the_host_tier_and_comes_back(small_gguf, chat_prompt_ids, small_tokenizer):
    """A finished sequence's cache stays in its slot while others run for IDLE_STEPS steps (its
    cells would slow their attention after that), then moves to the host tier; the same prompt
    later restores it and decodes as a cold prefill does (but for near-ties)."""
    from tandem.engine.prompt_cache import IDLE_STEPS

    stops = small_tokenizer.stop_token_ids
    host = HostPromptCache(64 << 20, "smollm2")
    engine = BatchEngine(runner(small_gguf), None, "none", 0, host_cache=host)
    first = GenerationRequest(list(chat_prompt_ids[2]), 2, stop_token_ids=stops)
    _run(engine, [("first", first)], host)
    [slot] = engine.slots.retained_slots()
    engine.add("long", GenerationRequest(list(chat_prompt_ids[0]), IDLE_STEPS + 4, stop_token_ids=frozenset()))
    for _ in range(IDLE_STEPS - 1):
        engine.step()
    assert engine.slots.cached[slot] and host.saved == 0  # not idle long enough yet
    for _ in range(2):
        engine.step()
    assert not engine.slots.cached[slot] and host.saved == 1 and host.nbytes <= host.capacity_bytes
    while engine.has_work:
        engine.step()
    again = GenerationRequest(list(chat_prompt_ids[2]), MAX_TOKENS, stop_token_ids=stops)
    outputs = _run(engine, [("again", again)], host)
    assert engine.prompt_cache.host_restores == 1
    _compare_with_cold(small_gguf, [("again", again)], outputs)


def test_a_restarted_server_finds_the_conversation_on_disk(small_gguf, tmp_path):
    """`tandem serve --cache-dir`: a conversation's first turn, then SIGTERM (the free slot's
    caches are written on the way out); a new server process on the same folder answers the
    second turn with the history counted as cached (usage.prompt_tokens_details) and the same
    answer the first server gave it."""
    import signal

    from serve_support import start_server

    command = [sys.executable, "-m", "tandem.cli.main", "serve", "--target", "smollm2-135m-instruct", "--drafter", "ngram",
               "--backend", "llamacpp", "--threads", "2", "--port", "0", "--cache", "off",
               "--cache-dir", str(tmp_path), "--grace-seconds", "5"]
    history = [{"role": "user", "content": "Explain what a hash table is, in detail, with an example. " * 6}]

    def ask(server, messages):
        return server.client().chat.completions.create(model="smollm2-135m-instruct", messages=messages,
                                                       max_tokens=16, temperature=0)

    first = start_server(command)
    try:
        answer = ask(first, history)
        history += [{"role": "assistant", "content": answer.choices[0].message.content},
                    {"role": "user", "content": "Now in one sentence."}]
        before = ask(first, history)
        first.process.send_signal(signal.SIGTERM)
        assert first.process.wait(60) == 0
    finally:
        first.stop()
    assert list(tmp_path.rglob("*.tkv")), "nothing was written to the disk tier"
    second = start_server(command)
    try:
        after = ask(second, history)
    finally:
        second.stop()
    assert after.usage.prompt_tokens_details.cached_tokens >= answer.usage.prompt_tokens
    assert after.choices[0].message.content == before.choices[0].message.content
