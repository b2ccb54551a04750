"""Chunked prefill in the batching engine: a step's target forward scores at most the step token
budget (decoding rounds first, prompt chunks in what is left), so a long prompt joining never
stalls a running stream; chunking changes no output (greedy against the naive reference,
seeded sampling against the unchunked engine), and a cancel mid-prefill frees the slot."""

import math

import pytest

from engine_support import MAX_TOKENS, PROMPTS, make_engine, naive_greedy, run_all
from tandem.engine import batch_engine, step_budget
from tandem.engine.batch_engine import BatchEngine
from tandem.engine.step_budget import MIN_PREFILL_CHUNK, STEP_TOKEN_BUDGET, floor_chunk
from tandem.engine.build import EngineConfig
from tandem.engine.events import SpeculationOptions
from tandem.engine.request import GenerationRequest
from tandem.errors import TandemError
from tandem.models.backends import RunnerSpec
from tandem.speculation.batch_depth import DraftCandidate
from tandem.speculation.drafters.base import DraftOffer, SequenceDraft
from tandem.speculation.sampling import SamplingParams

LONG = tuple((11 * i + 5) % 97 for i in range(40))  # a prompt many budgets long
LONG_TWIN = LONG[:30] + (3, 1, 4, 1, 5)  # shares 30 prompt tokens with LONG
STREAM_TOKENS = 40  # a stream that outlives the long prompt's prefill


@pytest.fixture(scope="module")
def long_references(tiny_target):
    return {p: naive_greedy(tiny_target, p, MAX_TOKENS) for p in (LONG, LONG_TWIN)}


def count_forward_tokens(engine: BatchEngine) -> list[int]:
    """Tokens each target forward of the engine scores, in order."""
    scored = []
    forward = engine.target.forward_batch

    def counted(items, views=False):
        scored.append(sum(len(item.token_ids) for item in items))
        return forward(items, views)

    engine.target.forward_batch = counted
    return scored


def check_slots_each_step(engine: BatchEngine) -> list:
    """Wrap engine.step: after each step every slot caches what the slot table says, and a
    running sequence's slot holds its tokens but the last, less what is still unprefilled.
    Returns the step reports, filled as the engine steps."""
    reports, step = [], engine.step

    def checked_step():
        updates, report = step()
        for slot, cached in enumerate(engine.slots.cached):
            assert engine.target.num_cached_tokens(slot) == len(cached)
        for seq in engine.running.values():
            assert engine.slots.cached[seq.slot] == seq.tokens[: len(seq.tokens) - 1 - len(seq.unprefilled)]
        reports.append(report)
        return updates, report

    engine.step = checked_step
    return reports


def step_until_first_token(engine: BatchEngine, seq_id: str, stream_id: str, scored: list[int]):
    """Step until seq_id commits; check the stream gets a token every step. Returns each step's
    report and seq_id's first committed tokens."""
    reports = []
    while True:
        updates, report = engine.step()
        reports.append(report)
        tokens = {u.seq_id: u.token_ids for u in updates}
        assert len(tokens[stream_id]) >= 1  # the running stream never waits for the prefill
        assert report.batch_tokens + report.prefill_tokens == scored[-1]
        if tokens.get(seq_id):
            return reports, list(tokens[seq_id])


def test_a_long_prompt_is_prefilled_in_chunks_while_a_stream_decodes(tiny_target, tiny_draft, references,
                                                                    long_references):
    budget = 8
    engine = make_engine(tiny_target, tiny_draft, "none", 0, slots=2, step_token_budget=budget)
    scored = count_forward_tokens(engine)
    engine.add("stream", GenerationRequest(PROMPTS[0], max_tokens=STREAM_TOKENS))
    engine.step()
    engine.add("long", GenerationRequest(LONG, max_tokens=MAX_TOKENS))
    reports, first = step_until_first_token(engine, "long", "stream", scored)
    steps = len(reports)
    # the stream's round takes 1 token a step, the prompt the other 7; the last chunk rides with
    # the long prompt's first round (its last token)
    assert steps == math.ceil(len(LONG) / (budget - 1))
    assert all(tokens <= budget for tokens in scored)
    assert [r.prefill_tokens for r in reports] == [7] * (steps - 1) + [len(LONG) - 1 - 7 * (steps - 1)]
    assert all("long" in r.prefilled for r in reports)
    assert all([x.seq_id for x in r.rounds] == ["stream"] for r in reports[:-1])  # none mid-prefill
    outputs, _ = run_all(engine, {})
    assert first + outputs["long"] == long_references[LONG]


def test_rounds_over_the_budget_still_leave_the_oldest_prompt_its_minimum_chunk(tiny_target, tiny_draft):
    engine = make_engine(tiny_target, tiny_draft, "none", 0, slots=3, step_token_budget=1)
    scored = count_forward_tokens(engine)
    for seq_id, prompt in (("s0", PROMPTS[0]), ("s1", PROMPTS[2])):
        engine.add(seq_id, GenerationRequest(prompt, max_tokens=STREAM_TOKENS))
    while len(engine.running) < 2 or not all(seq.output for seq in engine.running.values()):
        engine.step()  # both streams decode
    engine.add("long", GenerationRequest(LONG, max_tokens=MAX_TOKENS))
    reports, _ = step_until_first_token(engine, "long", "s0", scored)
    steps = len(reports)
    chunks = math.ceil((len(LONG) - 1) / MIN_PREFILL_CHUNK)
    assert steps == chunks + 1  # the chunks took the whole prompt: its first round comes alone
    last = len(LONG) - 1 - MIN_PREFILL_CHUNK * (chunks - 1)
    assert [r.prefill_tokens for r in reports[:chunks]] == [MIN_PREFILL_CHUNK] * (chunks - 1) + [last]
    assert all(tokens <= 2 + MIN_PREFILL_CHUNK for tokens in scored[-steps:])  # the documented exception


@pytest.mark.parametrize("drafter,k", [("model", 6), ("ngram", 64)])
def test_drafts_are_cut_so_a_step_scores_at_most_the_budget(tiny_target, tiny_draft, references, drafter, k):
    """--step-tokens bounded prompt chunks only: three rounds of a fixed k 6 scored 21 tokens a step
    on a budget of 7 (k 64, 195). Now the drafts are cut to fit; the output is unchanged."""
    engine = make_engine(tiny_target, tiny_draft, drafter, k, slots=3, step_token_budget=7)
    scored = count_forward_tokens(engine)
    reports = []
    step = engine.step
    engine.step = lambda: (lambda result: reports.append(result[1]) or result)(step())
    prompts = PROMPTS[:3]
    outputs, _ = run_all(engine, {0: [(f"r{i}", p, SpeculationOptions()) for i, p in enumerate(prompts)]})
    for i, prompt in enumerate(prompts):
        assert outputs[f"r{i}"] == references[prompt]
    decoding = [tokens for tokens, report in zip(scored, reports) if not report.prefilled]
    assert decoding and max(decoding) <= 7
    assert sum(r.batch_tokens > len(r.rounds) for r in reports if not r.prefilled)  # it still drafted


def arrivals(prompts, options=None):
    """Three prompts at a time: more requests than slots, joining at different steps."""
    by_step = {0: [], 1: [], 4: []}
    for i, prompt in enumerate(prompts):
        by_step[[0, 1, 4][i % 3]].append((f"r{i}", prompt, options[i] if options else SpeculationOptions()))
    return by_step


MIXED_PROMPTS = [LONG, PROMPTS[0], LONG_TWIN, PROMPTS[1], PROMPTS[2], PROMPTS[4]]


@pytest.mark.parametrize("budget", [1, 7, 64])
@pytest.mark.parametrize("drafter,k", [("none", 0), ("ngram", "auto"), ("model", 3), ("model", "auto"),
                                       ("hybrid", "auto")])
def test_chunked_greedy_equals_target_only(tiny_target, tiny_draft, references, long_references, budget, drafter, k):
    expected = references | long_references
    engine = make_engine(tiny_target, tiny_draft, drafter, k, slots=3, step_token_budget=budget)
    reports = check_slots_each_step(engine)
    outputs, reasons = run_all(engine, arrivals(MIXED_PROMPTS))
    for i, prompt in enumerate(MIXED_PROMPTS):
        assert outputs[f"r{i}"] == expected[prompt], (budget, drafter, k, i)
        assert reasons[f"r{i}"] in ("stop", "length")
    assert not engine.running and engine.slots.num_free == 3
    assert (sum(1 for r in reports if "r0" in r.prefilled) > 1) == (budget < len(LONG))  # LONG was chunked


@pytest.mark.parametrize("runner", ["serial", "fused"])
def test_the_draft_model_catches_up_in_chunks_beside_other_streams(tiny_target, tiny_draft, references,
                                                                  long_references, monkeypatch, runner):
    monkeypatch.setattr(batch_engine, "CATCH_UP_SHARE", 0.0)  # every catch-up: MIN_CATCH_UP a step
    # the tiny draft's curve is learned from the clock: where it reads flat, catching up would price
    # at 0 ms and pass a 0 ms share; a fixed rising price keeps the test on MIN_CATCH_UP
    monkeypatch.setattr(batch_engine, "catch_up_ms", lambda cost, unseen: float(unseen))
    expected = references | long_references
    engine = make_engine(tiny_target, tiny_draft, "model", 3, slots=3, runner=runner)
    fed, forward = [], engine.draft.forward_batch
    engine.draft.forward_batch = lambda items, views=False: fed.append(list(items)) or forward(items, views)
    outputs, _ = run_all(engine, arrivals(MIXED_PROMPTS))
    for i, prompt in enumerate(MIXED_PROMPTS):
        assert outputs[f"r{i}"] == expected[prompt], (runner, i)
    chunks = [item for items in fed for item in items if item.num_logits == 0]
    assert chunks and all(len(item.token_ids) <= batch_engine.MIN_CATCH_UP for item in chunks)
    assert all(sum(len(i.token_ids) for i in items if i.num_logits == 0) <= batch_engine.MIN_CATCH_UP
               for items in fed)  # the step's budget is shared


@pytest.mark.parametrize("budget", [1, 7, 64])
def test_per_request_drafters_mix_with_chunks(tiny_target, tiny_draft, references, long_references, budget):
    expected = references | long_references
    options = [SpeculationOptions("model", 4), SpeculationOptions("ngram", "auto"), SpeculationOptions("none"),
               SpeculationOptions("ngram", 2), SpeculationOptions(None, "auto"), SpeculationOptions("model", "auto")]
    engine = make_engine(tiny_target, tiny_draft, slots=3, step_token_budget=budget)
    check_slots_each_step(engine)
    outputs, _ = run_all(engine, arrivals(MIXED_PROMPTS, options))
    for i, prompt in enumerate(MIXED_PROMPTS):
        assert outputs[f"r{i}"] == expected[prompt], (budget, i)


def test_the_default_budget_prefills_short_prompts_in_one_step(tiny_target, tiny_draft):
    engine = make_engine(tiny_target, tiny_draft, "model", 4, slots=3)
    assert engine.step_token_budget == STEP_TOKEN_BUDGET
    engine.add("a", GenerationRequest(LONG, max_tokens=MAX_TOKENS))
    engine.add("b", GenerationRequest(PROMPTS[0], max_tokens=MAX_TOKENS))
    updates, report = engine.step()
    assert [u.seq_id for u in updates if u.token_ids] == ["a", "b"]
    assert report.prefilled == ("a", "b") and report.prefill_tokens == len(LONG) - 1 + len(PROMPTS[0]) - 1
    assert [r.k for r in report.rounds] == [4, 4]  # a fixed k drafts in the prefill round


def test_cancel_mid_prefill_frees_the_slot_and_keeps_its_chunks(tiny_target, tiny_draft, references,
                                                               long_references):
    engine = make_engine(tiny_target, tiny_draft, "none", 0, slots=2, step_token_budget=8)
    check_slots_each_step(engine)
    engine.add("long", GenerationRequest(LONG, max_tokens=MAX_TOKENS))
    engine.add("short", GenerationRequest(PROMPTS[1], max_tokens=MAX_TOKENS))
    engine.step()
    engine.step()
    seq = engine.running["long"]
    assert seq.unprefilled and not seq.output
    slot, cached = seq.slot, len(LONG) - 1 - len(seq.unprefilled)
    update = engine.cancel("long")
    assert update.finished and update.finish_reason == "cancelled"
    assert "long" not in engine.running and engine.slots.owner[slot] is None and engine.slots.num_free == 1
    assert engine.slots.cached[slot] == list(LONG[:cached]) and engine.target.num_cached_tokens(slot) == cached
    outputs, _ = run_all(engine, {})  # the engine goes on
    assert outputs["short"] == references[PROMPTS[1]]
    reports = check_slots_each_step(engine)
    outputs, _ = run_all(engine, {0: [("again", LONG, SpeculationOptions())]})
    assert outputs["again"] == long_references[LONG]
    assert sum(r.prefill_tokens for r in reports) == len(LONG) - 1 - cached  # the cancelled chunks were reused


def test_a_prompt_copies_what_a_prefilling_slot_caches_so_far(tiny_target, tiny_draft, long_references):
    engine = make_engine(tiny_target, tiny_draft, "none", 0, slots=2, step_token_budget=8)
    check_slots_each_step(engine)
    engine.add("long", GenerationRequest(LONG, max_tokens=MAX_TOKENS))
    for _ in range(3):
        engine.step()
    engine.add("twin", GenerationRequest(LONG_TWIN, max_tokens=MAX_TOKENS))
    engine._admit()  # what the next step does first
    twin = engine.running["twin"]
    assert len(twin.unprefilled) == len(LONG_TWIN) - 1 - 24  # 3 chunks of 8 copied, not the 30 shared
    outputs, _ = run_all(engine, {})
    assert outputs["twin"] == long_references[LONG_TWIN]


@pytest.mark.parametrize("drafter,k", [("none", 0), ("model", 3), ("ngram", 2)])
def test_seeded_sampling_is_the_same_chunked_or_not(tiny_target, tiny_draft, drafter, k):
    prompts = [LONG, PROMPTS[0], LONG_TWIN, PROMPTS[2]]

    def sampled(budget):
        engine = make_engine(tiny_target, tiny_draft, drafter, k, slots=3, step_token_budget=budget)
        for i, prompt in enumerate(prompts):
            engine.add(f"s{i}", GenerationRequest(prompt, MAX_TOKENS, SamplingParams(0.9, seed=7 + i)))
        outputs, _ = run_all(engine, {})
        return dict(outputs)

    whole = sampled(STEP_TOKEN_BUDGET)
    assert all(len(whole[f"s{i}"]) > 0 for i in range(len(prompts)))
    for budget in (1, 7):
        assert sampled(budget) == whole, budget


def test_the_budget_must_be_positive(tiny_target, tiny_draft):
    with pytest.raises(TandemError, match="step token budget"):
        make_engine(tiny_target, tiny_draft, "none", 0, step_token_budget=0)
    with pytest.raises(TandemError, match="step token budget"):
        EngineConfig(RunnerSpec("some-model"), drafter="ngram", step_token_budget=0)
    assert EngineConfig(RunnerSpec("some-model"), drafter="ngram", step_token_budget=64).step_token_budget == 64


JOINING = tuple(range(1, 90)) * 2  # a prompt joining a stream
JOINING_PREFILL = len(JOINING) - 1  # its tokens scored as prompt: the last one is its first round's


def chunk_sizes(target, cost_points: dict[int, float], joining: int, prefill_floor: int | None = None,
                step_token_budget: int = STEP_TOKEN_BUDGET, prefill_waves: bool = False) -> list[list[int]]:
    """One stream decoding on a runner with the given cost curve, then `joining` prompts like
    JOINING join, each with its own first token (prompts sharing a prefix would wait for one
    another's prefill): the prompt tokens each step scores for each of them, until the stream
    finishes or they all decode."""
    from tandem.models.cost import CostModel

    target.cost = CostModel(cost_points)
    target.cost.observe = lambda num_tokens, elapsed_ms, context=None: None  # the curve as given, uncorrected
    engine = BatchEngine(target, None, "none", prefill_floor=prefill_floor, step_token_budget=step_token_budget,
                         prefill_waves=prefill_waves)
    engine.add("stream", GenerationRequest((5, 6, 7), max_tokens=60))
    engine.step()
    names = [f"long-{i}" for i in range(joining)]
    for i, name in enumerate(names):
        engine.add(name, GenerationRequest((90 + i,) + JOINING[1:], max_tokens=2))

    def unprefilled() -> list[int]:  # still waiting for a slot: the whole prompt; finished: none
        waiting = {seq.seq_id for seq in engine.waiting}
        return [len(engine.running[name].unprefilled) if name in engine.running
                else JOINING_PREFILL * (name in waiting) for name in names]

    steps = []
    while "stream" in engine.running and any(unprefilled()):
        before = unprefilled()
        engine.step()
        steps.append([b - a for b, a in zip(before, unprefilled())])
    return steps


def test_the_floor_chunk_is_the_fewest_tokens_near_batch_speed():
    """The floor is the smallest call within FLOOR_SLACK (1.15) of the cheapest cost a token
    below 64 tokens: with a 90 ms fixed cost and 10 ms a token, (90 + 10n) / n <= 1.15 * 720 / 63
    from n = 29; on a linear curve one token is already at batch speed; on a flat one, 55 tokens."""
    from tandem.models.cost import CostModel

    assert floor_chunk(CostModel({1: 100.0, 64: 730.0}).cost_ms) == 29
    assert floor_chunk(CostModel({1: 10.0, 64: 640.0}).cost_ms) == 1
    assert floor_chunk(CostModel({1: 50.0, 64: 50.0}).cost_ms) == 55


def test_the_floor_looks_past_the_flash_tile_dip_at_64():
    """smollm2 on llama.cpp with AMX (a profile measured on the Xeon VM): the 64-token call, one
    flash-attention tile, costs less a token than any smaller call, 16 tokens 20% more. Judged
    against it the floor was the whole 64; against the cheapest smaller call it is 14."""
    from tandem.models.cost import CostModel

    amx_smollm2 = {1: 11.0, 2: 17.1, 3: 18.1, 4: 20.2, 6: 22.1, 8: 25.4, 12: 29.5, 16: 31.8, 24: 49.9,
                   32: 66.2, 48: 100.3, 63: 126.3, 64: 106.2}
    assert floor_chunk(CostModel(amx_smollm2).cost_ms) == 14


def test_beside_a_stream_a_chunk_costs_at_most_stall_factor_times_its_round_or_the_floor(tiny_target):
    """A curve with a fixed cost (100 ms for one token, 10 ms each more): beside one decoding
    stream (a 1-token round) a step may cost 300 ms (STALL_FACTOR) or what the 29-token floor
    chunk costs (380 ms), whichever is more: the joining prompt goes in 28 tokens at a time.
    Alone, it gets the whole budget."""
    from engine_support import fused_runner

    target = fused_runner(tiny_target, slots=3, context=256)
    sizes = [step[0] for step in chunk_sizes(target, {1: 100.0, 64: 730.0}, joining=1)]
    assert sizes[:3] == [28] * 3 and max(sizes) == 28
    alone = BatchEngine(target, None, "none")
    alone.add("long", GenerationRequest(JOINING, max_tokens=2))
    updates, report = alone.step()
    assert report.prefill_tokens == JOINING_PREFILL and updates  # the whole prompt in one step


def test_on_a_linear_curve_no_floor_lengthens_the_gap(tiny_target):
    """10 ms a token: one token is already at batch speed, so beside a 1-token round a step may
    cost only 30 ms (3 tokens), and the prompt gets the minimum chunk, MIN_PREFILL_CHUNK."""
    from engine_support import fused_runner

    target = fused_runner(tiny_target, slots=3, context=256)
    sizes = [step[0] for step in chunk_sizes(target, {1: 10.0, 64: 640.0}, joining=1)]
    assert sizes[:3] == [MIN_PREFILL_CHUNK] * 3 and max(sizes) == MIN_PREFILL_CHUNK


def test_a_fixed_prefill_floor_rules_over_the_profiles(tiny_target):
    """`--prefill-floor 48` on the linear curve above (whose own floor is one token): beside one
    stream a step may cost what 48 tokens alone cost, so the prompt goes in 47 at a time."""
    from engine_support import fused_runner

    target = fused_runner(tiny_target, slots=3, context=256)
    sizes = [step[0] for step in chunk_sizes(target, {1: 10.0, 64: 640.0}, joining=1, prefill_floor=48)]
    assert sizes[:3] == [47] * 3 and max(sizes) == 47


def test_the_prefill_floor_option_is_auto_or_a_token_count():
    import argparse

    from tandem.cli.options import prefill_floor_option

    assert prefill_floor_option("auto") == "auto" and prefill_floor_option("48") == 48
    for bad in ("0", "5000", "lots", "-3"):
        with pytest.raises(argparse.ArgumentTypeError, match="auto or a number of tokens"):
            prefill_floor_option(bad)
    with pytest.raises(TandemError, match="prefill floor"):
        step_budget.check_prefill_floor(0)


def test_one_engine_defaults_to_the_throughput_floor_and_auto_reads_the_profile():
    """`tandem serve`/`generate`/`bench` on one engine: unset means THROUGHPUT_PREFILL_FLOOR,
    `auto` the profile's floor (None to the engine), a number itself; `--prefill-waves` reaches
    the engine too (bench's engine once ignored both)."""
    import argparse

    from tandem.cli.bench_cmd import model_choice
    from tandem.cli.options import add_model_options, engine_config

    parser = argparse.ArgumentParser()
    add_model_options(parser)
    argvs = ([], ["--prefill-floor", "auto"], ["--prefill-floor", "48", "--prefill-waves"])
    for read in (engine_config, model_choice):
        chosen = [read(parser.parse_args(argv)) for argv in argvs]
        assert [c.prefill_floor for c in chosen] == [step_budget.THROUGHPUT_PREFILL_FLOOR, None, 48], read
        assert [c.prefill_waves for c in chosen] == [False, False, True], read
    assert step_budget.THROUGHPUT_PREFILL_FLOOR > 64  # beyond any profile's floor (FULL_SPEED_CHUNK at most)


def test_where_a_round_is_dear_the_stall_bound_rules_over_the_floor(tiny_target):
    """A curve where 3x a 1-token round (300 ms) buys more than the floor chunk alone (23
    tokens, 122 ms): a step may cost 300 ms, 64 tokens, so the prompt goes in 63 at a time."""
    from engine_support import fused_runner

    target = fused_runner(tiny_target, slots=3, context=256)
    sizes = [step[0] for step in chunk_sizes(target, {1: 100.0, 48: 147.0, 64: 300.0}, joining=1)]
    assert sizes[:2] == [63, 63]


def test_while_more_prompts_wait_than_streams_decode_nothing_is_held_back(tiny_target):
    """Two prompts joining one stream: they outnumber it, so the step scores both whole (the
    step token budget allows 355 tokens)."""
    from engine_support import fused_runner

    target = fused_runner(tiny_target, slots=3, context=256)
    steps = chunk_sizes(target, {1: 10.0, 64: 640.0}, joining=2)
    assert steps[0] == [JOINING_PREFILL, JOINING_PREFILL]


def test_a_wave_let_through_keeps_the_whole_budget_until_its_prompts_are_in(tiny_target):
    """With `--prefill-waves` (off by default): three prompts join one stream on the fixed-cost
    curve, 300 tokens a step: they outnumber it, so the first step scores the first prompt whole
    (and its round) and 121 tokens of the second. Then two prompts prefill beside two streams: no
    longer outnumbering them, but the wave keeps the whole budget (56 + 177 tokens, where the
    held-back budget would give 27)."""
    from engine_support import fused_runner

    target = fused_runner(tiny_target, slots=4, context=256)
    steps = chunk_sizes(target, {1: 100.0, 64: 730.0}, joining=3, step_token_budget=300, prefill_waves=True)
    assert steps[0] == [JOINING_PREFILL, 121, 0]
    assert steps[1] == [0, JOINING_PREFILL - 121, JOINING_PREFILL]
    held = chunk_sizes(fused_runner(tiny_target, slots=4, context=256), {1: 100.0, 64: 730.0}, joining=3,
                       step_token_budget=300)
    assert held[0] == steps[0] and sum(held[1]) == 27  # without (the default): held back at once


class AlwaysDrafts:
    """A copy drafter double that always offers up to 4 tokens (the stream's last token again) as
    source "always"; the test fixes the planner's estimate, so auto depth drafts them."""

    name = "always"
    uses_model = False

    def offer(self, seq, limit: int):
        return DraftOffer(DraftCandidate(self.name, min(4, limit), False, fixed_k=seq.fixed_k))

    def propose_batch(self, jobs, keep_drafting=None):
        return [SequenceDraft(self.name, [job.seq.tokens[-1]] * job.k) for job in jobs]


def test_beside_a_stream_its_auto_drafts_do_not_shrink_the_chunk(tiny_target):
    """The curve of the stall test above (the floor chunk, 29 tokens, sets the held-back budget),
    now with the stream drafting at auto depth: its drafts ride on top of the budget, and the
    joining prompt still goes in 28 tokens a step (with the drafts taken out of the budget, 24:
    one step more for the prompt, and beside each step the stream's whole round)."""
    from engine_support import fused_runner
    from tandem.models.cost import CostModel
    from tandem.speculation.depth import AcceptanceEstimate
    from tandem.speculation.drafters.registry import build_drafters

    target = fused_runner(tiny_target, slots=3, context=256)
    target.cost = CostModel({1: 100.0, 64: 730.0})
    target.cost.observe = lambda num_tokens, elapsed_ms, context=None: None  # the curve as given, uncorrected
    engine = BatchEngine(target, None, "always", drafters={**build_drafters(None, None), "always": AlwaysDrafts()})
    engine.planner.estimates["always"] = AcceptanceEstimate.with_prior(0.95)
    engine.planner.record = lambda source, drafted, accepted: None  # the estimate stays high
    engine.add("stream", GenerationRequest((5, 6, 7), max_tokens=60))
    engine.step()
    engine.add("long", GenerationRequest((90,) + JOINING[1:], max_tokens=2))
    sizes, drafted = [], []
    while "long" not in engine.running or engine.running["long"].unprefilled:
        _, report = engine.step()
        sizes.append(report.prefill_tokens)
        drafted.append(sum(r.k for r in report.rounds if r.seq_id == "stream"))
    assert min(drafted[1:]) == 4  # the stream drafted in every step beside the chunks
    assert sizes[1:4] == [28] * 3 and sum(sizes) == JOINING_PREFILL
