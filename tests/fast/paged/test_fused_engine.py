"""The one engine on the fused torch runner: every sequence's greedy output, in any batch mix
(1..16 running, joining and leaving at random steps, drafts of random lengths and their
rollbacks, cancellations), equals the slow reference token for token; and the KV pool gets
every block back."""

import random

import pytest

from engine_support import PROMPTS, fused_runner, make_engine, naive_greedy
from tandem.engine.batch_engine import BatchEngine
from tandem.engine.events import SpeculationOptions
from tandem.engine.host_cache import HostPromptCache
from tandem.engine.request import GenerationRequest
from tandem.models.batch_runner import KvPoolFullError
from tiny_models import VOCAB

MAX_TOKENS = 16


def _random_prompts(rng: random.Random, count: int) -> list[tuple[int, ...]]:
    prompts = list(PROMPTS)
    while len(prompts) < count:
        base = rng.choice(prompts) if rng.random() < 0.3 else ()  # some share a prefix
        prompts.append(tuple(base) + tuple(rng.randrange(VOCAB) for _ in range(rng.randint(1, 40))))
    return prompts


@pytest.fixture(scope="module")
def mix(tiny_target):
    rng = random.Random(11)
    prompts = _random_prompts(rng, 24)
    references = {p: naive_greedy(tiny_target, p, MAX_TOKENS) for p in set(prompts)}
    return prompts, references


def _drive(engine: BatchEngine, prompts, rng: random.Random, cancel_share: float):
    """Requests arrive at random steps with random drafters and depths; some are cancelled."""
    arrivals = {}
    for index, prompt in enumerate(prompts):
        arrivals.setdefault(rng.randrange(30), []).append((f"r{index}", prompt))
    drafters = [d for d in ("ngram", "model", "hybrid", "none") if d in engine.drafters]
    outputs, finished, cancelled, step = {}, {}, set(), 0
    while engine.has_work or any(s >= step for s in arrivals):
        for seq_id, prompt in arrivals.get(step, []):
            options = SpeculationOptions(drafter=rng.choice(drafters), k=rng.choice([None, 0, 1, 3, 7]))
            engine.add(seq_id, GenerationRequest(prompt, max_tokens=MAX_TOKENS), options)
            outputs[seq_id] = []
        if engine.running and rng.random() < cancel_share:
            victim = rng.choice(list(engine.running))
            engine.cancel(victim)
            cancelled.add(victim)
        if engine.has_work:
            updates, report = engine.step()
            assert report.running <= 16
            for update in updates:
                outputs[update.seq_id] += update.token_ids
                if update.finished:
                    finished[update.seq_id] = update.finish_reason
        step += 1
    return outputs, finished, cancelled


@pytest.mark.parametrize("seed,slots,cache_slots,host", [(1, 16, None, False), (2, 16, None, False),
                                                        (3, 4, 12, True)])
def test_greedy_outputs_in_random_mixes_equal_the_reference(tiny_target, tiny_draft, mix, seed, slots,
                                                            cache_slots, host):
    """The third mix runs 4 at a time over 12 block tables and a host tier: prompts sharing a
    prefix hit resident caches, copies and restores."""
    prompts, references = mix
    host_cache = HostPromptCache(64 << 20, "tiny") if host else None
    engine = make_engine(tiny_target, tiny_draft, "hybrid", slots=slots, runner="fused", cache_slots=cache_slots,
                         host_cache=host_cache)
    outputs, finished, cancelled = _drive(engine, prompts, random.Random(seed), cancel_share=0.05)
    for index, prompt in enumerate(prompts):
        seq_id = f"r{index}"
        if seq_id in cancelled:
            assert outputs[seq_id] == references[prompt][: len(outputs[seq_id])]
        else:
            assert finished[seq_id] == "length" and outputs[seq_id] == references[prompt], seq_id


def test_every_block_is_free_after_requests_cancellations_and_retained_caches(tiny_target, tiny_draft, mix):
    prompts, _ = mix
    engine = make_engine(tiny_target, tiny_draft, "hybrid", slots=8, runner="fused")
    _drive(engine, prompts, random.Random(5), cancel_share=0.3)
    assert not engine.has_work
    engine.clear_caches()  # retained prompt caches hold blocks until then
    for runner in (engine.target, engine.draft):
        assert runner.blocks.num_free == runner.blocks.num_blocks, "a KV block leaked"
        assert not any(runner.blocks.refs)


def test_a_full_pool_waits_instead_of_failing(tiny_target):
    """A pool that holds two contexts' worth: requests queue for room and all finish."""
    target = fused_runner(tiny_target, slots=6, context=64)
    small = type(target)(target.decoder, 6, 64, kv_memory=target.kv_bytes // target.pool_tokens * 160)
    small.cost = target.cost
    engine = BatchEngine(small, None, "none")
    for index, prompt in enumerate(PROMPTS * 2):
        engine.add(f"r{index}", GenerationRequest(prompt + (3,) * 30, max_tokens=MAX_TOKENS))
    finished = {}
    while engine.has_work:
        for update in engine.step()[0]:
            if update.finished:
                finished[update.seq_id] = update.finish_reason
    assert len(finished) == 10 and set(finished.values()) == {"length"}


@pytest.mark.parametrize("length", [120, 200])
def test_a_repeated_prompt_keeps_its_cache_in_a_small_pool(tiny_target, length):
    """The slot holding a finished request's prompt was evicted (into nothing, without a host
    tier) to make room for that very prompt again, counted as new: a repeat near the pool's
    size prefilled from scratch. The slot a prompt takes gives up its cells, so they are not
    counted twice, and it is never evicted for room."""
    target = fused_runner(tiny_target, slots=2, context=256)
    small = type(target)(target.decoder, 2, 256, kv_memory=target.kv_bytes // target.pool_tokens * 256)
    small.cost = target.cost
    engine = BatchEngine(small, None, "none")
    prompt = tuple(random.Random(3).randrange(VOCAB) for _ in range(length))
    cached = []
    for index in range(2):
        engine.add(f"r{index}", GenerationRequest(prompt, max_tokens=8))
        while engine.has_work:
            cached += [update.cached_tokens for update in engine.step()[0] if update.finished]
    assert cached == [0, len(prompt) - 1]  # all but the last prompt token, which the first round scores


def overflowing(tiny_target, monkeypatch, drafter: str):
    """An engine admitting three 30-token requests without headroom into an 80-token pool that
    cannot hold them all (the pool's runner, and the prompts, beside it)."""
    monkeypatch.setattr("tandem.engine.batch_engine.KV_HEADROOM_TOKENS", 0)
    target = fused_runner(tiny_target, slots=3, context=64)
    small = type(target)(target.decoder, 3, 64, kv_memory=target.kv_bytes // target.pool_tokens * 80)
    small.cost = target.cost
    engine = BatchEngine(small, None, drafter)
    prompts = [PROMPTS[0] + (9,) * 14, PROMPTS[1] + (4,) * 10, PROMPTS[2] + (7,) * 12]
    for index, prompt in enumerate(prompts):
        engine.add(f"r{index}", GenerationRequest(prompt, max_tokens=30))
    return engine, small, prompts


def test_a_pool_that_overflows_mid_generation_preempts_and_recomputes(tiny_target, monkeypatch):
    """Admission without headroom lets three sequences start in an 80-token pool that cannot
    hold them all: the step that overflows is undone, the youngest sequence goes back to the
    queue and is recomputed later, and every output still equals the reference."""
    engine, small, prompts = overflowing(tiny_target, monkeypatch, "none")
    outputs, preempted = {f"r{i}": [] for i in range(3)}, 0
    while engine.has_work:
        waiting = engine.num_waiting
        updates, _ = engine.step()
        preempted += engine.num_waiting > waiting
        for update in updates:
            outputs[update.seq_id] += update.token_ids
    assert preempted >= 1
    for index, prompt in enumerate(prompts):
        assert outputs[f"r{index}"] == naive_greedy(tiny_target, prompt, 30)
    engine.clear_caches()
    assert small.blocks.num_free == small.blocks.num_blocks


def test_a_preempted_sequence_cancelled_while_waiting_leaves_no_drafter_state(tiny_target, monkeypatch):
    """A sequence preempted mid-generation waits with its drafters' per-sequence state (its
    suffix index, its copy's alignment); cancelled there (a client that gave up), that state
    goes with it, as it does for a running sequence. It used to stay for the server's life."""
    engine, _, _ = overflowing(tiny_target, monkeypatch, "suffix")
    cancelled = None
    while engine.has_work:
        waiting = engine.num_waiting
        engine.step()
        if cancelled is None and engine.num_waiting > waiting:
            cancelled = engine.waiting[0].seq_id  # the youngest went back to the front of the queue
            assert per_sequence_state(engine, cancelled), "the preempted sequence had drafted"
            assert engine.cancel(cancelled).finish_reason == "cancelled"
    assert cancelled is not None
    assert not any(per_sequence_state(engine, f"r{i}") for i in range(3))


def per_sequence_state(engine, seq_id: str) -> list[str]:
    """The drafters' per-sequence maps that still hold seq_id."""
    return [f"{name}.{field}" for name, d in engine.drafters.items()
            for field in ("own", "follows", "departed", "unjoined", "substitutions")
            if seq_id in getattr(d, field, {})]


def _run_to_end(engine: BatchEngine, max_steps: int = 200) -> tuple[dict, dict]:
    """Outputs and finish updates of every request, failing the test past max_steps."""
    outputs, finished = {}, {}
    for _ in range(max_steps):
        if not engine.has_work:
            return outputs, finished
        for update in engine.step()[0]:
            outputs.setdefault(update.seq_id, []).extend(update.token_ids)
            if update.finished:
                finished[update.seq_id] = update
    pytest.fail(f"still running after {max_steps} steps: {list(engine.running)}")


def test_a_call_that_keeps_failing_with_nothing_to_free_fails_its_request(tiny_target, monkeypatch):
    """A lone sequence whose target call fails for another reason than room (llama.cpp's decode
    failing on it): nothing can be freed, so the request fails with the runner's error after
    STUCK_STEPS tries. The same call used to be retried at every step for ever (a hung request,
    the engine thread busy); the requests behind it still run."""
    target = fused_runner(tiny_target, slots=2, context=64)
    engine = BatchEngine(target, None, "none")
    engine.add("poisoned", GenerationRequest(PROMPTS[0], max_tokens=8))
    engine.add("next", GenerationRequest(PROMPTS[1], max_tokens=8))
    engine.max_running = 1
    scored = type(target).forward_batch

    def failing_on_the_first(self, items, views=False):
        if "poisoned" in engine.running:
            raise KvPoolFullError("llama.cpp decode failed (llama_decode returned -1); the KV pool may be full")
        return scored(self, items, views)

    monkeypatch.setattr(type(target), "forward_batch", failing_on_the_first)
    outputs, finished = _run_to_end(engine)
    assert finished["poisoned"].finish_reason == "error"
    assert "llama_decode returned -1" in finished["poisoned"].error
    assert finished["next"].finish_reason == "length"
    assert outputs["next"] == naive_greedy(tiny_target, PROMPTS[1], 8)
    engine.clear_caches()
    assert target.blocks.num_free == target.blocks.num_blocks


def test_a_lone_call_that_fails_once_is_retried(tiny_target, monkeypatch):
    """One failed call with nothing to free is not yet a stuck request: the next step retries
    it, and the answer is the reference's."""
    target = fused_runner(tiny_target, slots=1, context=64)
    engine = BatchEngine(target, None, "none")
    engine.add("r0", GenerationRequest(PROMPTS[2], max_tokens=8))
    scored, failures = type(target).forward_batch, []

    def failing_once(self, items, views=False):
        if len(failures) < 1:
            failures.append(1)
            raise KvPoolFullError("a passing failure")
        return scored(self, items, views)

    monkeypatch.setattr(type(target), "forward_batch", failing_once)
    outputs, finished = _run_to_end(engine)
    assert finished["r0"].finish_reason == "length" and outputs["r0"] == naive_greedy(tiny_target, PROMPTS[2], 8)


def test_a_pool_sized_by_its_sequences_runs_them_all_at_once(tiny_target):
    """The pool was capped at every slot's full context, while admission keeps a headroom of
    cells per running sequence for drafts: with prompts near the context, one of four slots never
    ran (a trial's 2 GiB budget, 90 MiB used, said the four sequences 'need no more')."""
    target = fused_runner(tiny_target, slots=4, context=128)
    engine = BatchEngine(target, None, "none")
    rng = random.Random(8)
    for index in range(4):
        engine.add(f"r{index}", GenerationRequest(tuple(rng.randrange(VOCAB) for _ in range(118)), max_tokens=8))
    most_running = 0
    while engine.has_work:
        most_running = max(most_running, engine.step()[1].running)
    assert most_running == 4


def test_steps_report_preemptions_and_the_pools_cells_in_use(tiny_target, monkeypatch, caplog):
    engine, small, _ = overflowing(tiny_target, monkeypatch, "none")
    reports = []
    with caplog.at_level("WARNING", logger="tandem.engine.batch_engine"):
        while engine.has_work:
            reports.append(engine.step()[1])
    assert sum(r.preempted for r in reports) == engine.preempted >= 1
    assert all(r.kv_pool_cells == small.pool_tokens and 0 <= r.kv_cells_used <= r.kv_pool_cells for r in reports)
    assert max(r.kv_cells_used for r in reports) > small.pool_tokens // 2 and reports[-1].kv_cells_used == 0
    assert "went back to the queue for KV room (1 so far)" in caplog.text


def test_a_failed_call_counts_towards_its_own_sequence_alone(tiny_target, monkeypatch):
    """A's one failed call, A then cancelled, made B's first failed call its second: B failed
    after a single try."""
    target = fused_runner(tiny_target, slots=1, context=64)
    engine = BatchEngine(target, None, "none")
    scored, failing = type(target).forward_batch, {"a", "b"}

    def failing_once_each(self, items, views=False):
        (seq_id,) = engine.running
        if seq_id in failing:
            failing.discard(seq_id)
            raise KvPoolFullError("a passing failure")
        return scored(self, items, views)

    monkeypatch.setattr(type(target), "forward_batch", failing_once_each)
    engine.add("a", GenerationRequest(PROMPTS[0], max_tokens=8))
    engine.step()
    assert engine.cancel("a").finish_reason == "cancelled"
    engine.add("b", GenerationRequest(PROMPTS[1], max_tokens=8))
    outputs, finished = _run_to_end(engine)
    assert finished["b"].finish_reason == "length" and outputs["b"] == naive_greedy(tiny_target, PROMPTS[1], 8)
