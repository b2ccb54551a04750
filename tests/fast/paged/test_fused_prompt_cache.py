"""The prompt cache on the fused torch runner (issue: nothing computed twice): finished
sequences' blocks stay resident in the paged pool beyond the running slots, and evicted ones go
to the host tier and come back; every hit's greedy output equals a cold prefill's, token for
token (fp32), and a full pool evicts rather than fails."""

import torch

from engine_support import MAX_TOKENS, fused_runner, make_engine, naive_greedy, run_all
from tandem.engine.batch_engine import BatchEngine
from tandem.engine.events import SpeculationOptions
from tandem.engine.disk_cache import DiskPromptCache
from tandem.engine.host_cache import HostPromptCache
from tandem.engine.request import GenerationRequest
from tandem.models.batch_runner import BatchItem

PROMPT = tuple(range(3, 40))  # 37 tokens: more than two KV blocks
# five conversations' first turns, each longer than MIN_COPY_TOKENS and unlike the others
FIRST_TURNS = [tuple((7 * user + i) % 90 + 3 for i in range(24 + 3 * user)) for user in range(5)]


def _next_turns(outputs) -> list[tuple[int, ...]]:
    return [turn + tuple(outputs[f"u{user}"]) + (11, 12) for user, turn in enumerate(FIRST_TURNS)]


def test_a_restored_state_scores_like_the_state_saved(tiny_target):
    runner = fused_runner(tiny_target, slots=2)
    runner.forward_batch([BatchItem(0, PROMPT, 0)])
    state = runner.save_state(0)
    assert len(state) == len(PROMPT) * runner.row_bytes
    assert runner.save_state(0) == state  # every byte of the unwritten bytes is written
    # the slow reference: every layer's pool rows stacked, then copied out
    rows = torch.tensor(runner.blocks.rows(0, 0, len(PROMPT)))
    stacked = torch.stack([pool[rows] for pool in (*runner.cache.keys, *runner.cache.values)])
    assert stacked.contiguous().view(torch.uint8).numpy().tobytes() == state
    assert runner.save_state(1) == b""  # an empty slot
    kept = bytes(state)
    assert runner.restore_state(1, state, len(PROMPT)) and runner.num_cached_tokens(1) == len(PROMPT)
    assert state == kept and runner.save_state(1) == state  # read in place, never written
    # each slot scored in a call of its own: rows of one batched call may round differently
    # (7e-7 apart on an AMD EPYC), while two calls of the same shape compute the same sums
    saved = runner.forward_batch([BatchItem(0, (5, 6), 2)])[0]
    restored = runner.forward_batch([BatchItem(1, (5, 6), 2)])[0]
    assert torch.equal(saved, restored)


def test_a_state_that_does_not_fit_is_refused_and_leaves_the_slot_empty(tiny_target):
    runner = fused_runner(tiny_target, slots=2)
    runner.forward_batch([BatchItem(0, PROMPT, 0), BatchItem(1, (1, 2), 0)])
    state = runner.save_state(0)
    assert not runner.restore_state(1, state[:-1], len(PROMPT))  # truncated
    assert not runner.restore_state(1, state, len(PROMPT) + 1)  # another length
    assert runner.num_cached_tokens(1) == 0
    free = runner.blocks.num_free
    assert runner.restore_state(1, state, len(PROMPT)) and runner.blocks.num_free == free - 3


def test_finished_conversations_stay_resident_beyond_the_running_slots(tiny_target, tiny_draft):
    """2 sequences run at once over 8 block tables: five conversations' second turns each find
    their whole history resident and score only their new tokens."""
    engine = make_engine(tiny_target, tiny_draft, "none", 0, slots=2, runner="fused", cache_slots=8)
    first, _ = run_all(engine, {0: [(f"u{u}", turn, SpeculationOptions()) for u, turn in enumerate(FIRST_TURNS)]})
    hits_before = engine.prompt_cache.hits
    second = _next_turns(first)
    outputs, _ = run_all(engine, {0: [(f"u{u}", turn, SpeculationOptions()) for u, turn in enumerate(second)]})
    # each history is cached but for its last output token (never scored) and the two new ones
    assert engine.prompt_cache.hits - hits_before == sum(len(turn) - 3 for turn in second)
    for user, turn in enumerate(second):
        assert outputs[f"u{user}"] == naive_greedy(tiny_target, turn, MAX_TOKENS)


def test_the_host_tier_brings_back_a_conversation_evicted_from_the_pool(tiny_target, tiny_draft):
    """2 block tables, so later users' turns push earlier histories (target and draft) out of
    the pool to host memory; their next turns restore them, and the outputs equal cold ones."""
    host = HostPromptCache(64 << 20, "tiny")
    engine = make_engine(tiny_target, tiny_draft, "model", 3, slots=2, runner="fused", host_cache=host)
    first, _ = run_all(engine, {0: [(f"u{u}", turn, SpeculationOptions()) for u, turn in enumerate(FIRST_TURNS)]})
    assert len(host) >= 3 and host.nbytes <= host.capacity_bytes
    second = _next_turns(first)
    outputs, _ = run_all(engine, {0: [(f"u{u}", turn, SpeculationOptions()) for u, turn in enumerate(second)]})
    assert engine.prompt_cache.host_restores >= 3
    for user, turn in enumerate(second):
        assert outputs[f"u{user}"] == naive_greedy(tiny_target, turn, MAX_TOKENS)


def test_a_restarted_engine_finds_the_last_ones_conversations_on_disk(tiny_target, tiny_draft, tmp_path):
    """The disk tier: the first engine's evicted histories go to host and disk, and closing it
    writes the ones still resident; a second engine (new runners, empty host tier, as after a
    restart) restores every user's history (target and draft) from the files, and the outputs
    equal cold ones."""
    def engine_over(folder):
        return make_engine(tiny_target, tiny_draft, "model", 3, slots=2, runner="fused",
                           host_cache=HostPromptCache(64 << 20, "tiny"),
                           disk_cache=DiskPromptCache(folder, 64 << 20, "tiny"))

    before = engine_over(tmp_path)
    first, _ = run_all(before, {0: [(f"u{u}", turn, SpeculationOptions()) for u, turn in enumerate(FIRST_TURNS)]})
    before.close()
    after = engine_over(tmp_path)
    assert len(after.prompt_cache.disk) == len(FIRST_TURNS)
    second = _next_turns(first)
    outputs, _ = run_all(after, {0: [(f"u{u}", turn, SpeculationOptions()) for u, turn in enumerate(second)]})
    assert after.prompt_cache.disk_restores == len(FIRST_TURNS)
    assert after.prompt_cache.hits == sum(len(turn) - 3 for turn in second)
    for user, turn in enumerate(second):
        assert outputs[f"u{user}"] == naive_greedy(tiny_target, turn, MAX_TOKENS)
    after.close()


def test_resident_caches_give_their_blocks_to_new_requests(tiny_target):
    """A pool of 320 tokens under 12 block tables: after one wave of requests their caches stay
    resident; a second wave of other prompts needs the blocks, takes them (least recently used
    first) and every request finishes; nothing leaks."""
    target = fused_runner(tiny_target, slots=3, context=64)
    small = type(target)(target.decoder, 3, 64, kv_memory=target.row_bytes * 320, cache_slots=12)
    small.cost = target.cost
    engine = BatchEngine(small, None, "none")
    waves = [[turn + (3,) * 10 for turn in FIRST_TURNS], [(2,) + turn + (4,) * 10 for turn in FIRST_TURNS]]
    finished = {}
    for wave, prompts in enumerate(waves):
        for index, prompt in enumerate(prompts):
            engine.add(f"w{wave}r{index}", GenerationRequest(prompt, max_tokens=MAX_TOKENS))
        while engine.has_work:
            for update in engine.step()[0]:
                if update.finished:
                    finished[update.seq_id] = update.finish_reason
            assert engine.slots.cached_total() <= small.pool_tokens
        if wave == 0:
            assert len(engine.slots.retained_slots()) >= 2  # resident, beyond nothing running
    assert len(finished) == 10 and set(finished.values()) == {"length"}
    assert not any(cached[: len(waves[0][0])] == list(waves[0][0]) for cached in engine.slots.cached)  # evicted
    engine.clear_caches()
    assert small.blocks.num_free == small.blocks.num_blocks


def test_a_state_names_the_model_version_not_only_its_path(tmp_path, monkeypatch):
    """Saved states are keyed by their runner's state_format. It named the path only, so a
    cluster moving a stream between nodes with different files at one path would restore one
    model's KV into another; it names the model's version now."""
    import os
    import shutil

    from tandem.models.backends import RunnerSpec
    from tandem.models.batch_backends import load_batch_runner
    from tiny_models import build_tiny_model

    monkeypatch.setenv("TANDEM_HOME", str(tmp_path / "home"))
    folder = build_tiny_model(tmp_path / "model", seed=1)

    def state_format() -> str:
        spec = RunnerSpec(str(folder), backend="torch", device="cpu", threads=1)
        return load_batch_runner(spec, slots=1).state_format

    first = state_format()
    assert state_format() == first  # the same files: states restore
    shutil.rmtree(folder)
    build_tiny_model(folder, seed=2)  # another model at the same path
    for file in folder.iterdir():
        os.utime(file, ns=(10**18, 10**18))
    assert state_format() != first
