"""The batching engine against naive target-only decoding (the slow reference): greedy outputs of
concurrent requests equal their target-only outputs alone, whatever the drafter, k, arrival
time, slot reuse or cancellation (fp32 torch, exact)."""

import pytest

from engine_support import MAX_TOKENS, PROMPTS, make_engine, run_all
from tandem.engine.events import SpeculationOptions
from tandem.engine.request import GenerationRequest
from tandem.speculation.sampling import SamplingParams


@pytest.mark.parametrize("drafter,k", [("hybrid", "auto"), ("model", 3), ("ngram", "auto"), ("none", 0), ("model", "auto")])
def test_concurrent_greedy_equals_target_only_alone(tiny_target, tiny_draft, references, drafter, k):
    engine = make_engine(tiny_target, tiny_draft, drafter, k, slots=3)
    arrivals = {0: [], 2: [], 5: []}
    for i, prompt in enumerate(PROMPTS):  # more requests than slots, joining at different steps
        arrivals[[0, 2, 5][i % 3]].append((f"r{i}", prompt, SpeculationOptions()))
    outputs, reasons = run_all(engine, arrivals)
    for i, prompt in enumerate(PROMPTS):
        assert outputs[f"r{i}"] == references[prompt], (drafter, k, i)
        assert reasons[f"r{i}"] in ("stop", "length")
    assert not engine.running and engine.slots.num_free == 3


def test_per_request_options_mix_in_one_batch(tiny_target, tiny_draft, references):
    engine = make_engine(tiny_target, tiny_draft, slots=4)
    options = [SpeculationOptions("ngram", "auto"), SpeculationOptions("model", 4),
               SpeculationOptions("none"), SpeculationOptions(None, 2), SpeculationOptions()]
    arrivals = {0: [(f"r{i}", p, o) for i, (p, o) in enumerate(zip(PROMPTS, options))]}
    outputs, _ = run_all(engine, arrivals)
    for i, prompt in enumerate(PROMPTS):
        assert outputs[f"r{i}"] == references[prompt]


def test_drafting_happens_when_verification_is_cheap(tiny_target, tiny_draft):
    engine = make_engine(tiny_target, tiny_draft, "model", 4, slots=2)
    engine.add("a", GenerationRequest(PROMPTS[0], max_tokens=MAX_TOKENS))
    _, report = engine.step()
    assert report.rounds[0].k == 4 and report.rounds[0].source == "model"


def test_cancel_frees_the_slot_within_one_step(tiny_target, tiny_draft):
    engine = make_engine(tiny_target, tiny_draft, slots=2)
    engine.add("a", GenerationRequest(PROMPTS[0], max_tokens=MAX_TOKENS))
    engine.add("b", GenerationRequest(PROMPTS[1], max_tokens=MAX_TOKENS))
    engine.add("c", GenerationRequest(PROMPTS[2], max_tokens=MAX_TOKENS))
    engine.step()
    assert engine.num_running == 2 and engine.num_waiting == 1
    update = engine.cancel("a")
    assert update.finished and update.finish_reason == "cancelled"
    assert engine.num_running == 1 and engine.slots.num_free == 1
    assert engine.cancel("c").finish_reason == "cancelled" and engine.num_waiting == 0
    assert engine.cancel("nope") is None


def test_repeated_prefix_reuses_the_cached_prompt(tiny_target, tiny_draft, references):
    engine = make_engine(tiny_target, tiny_draft, "none", 0, slots=2)
    outputs, _ = run_all(engine, {0: [("first", PROMPTS[0], SpeculationOptions())]})
    calls = []
    forward = engine.target.forward_batch
    engine.target.forward_batch = lambda items: calls.append(list(items)) or forward(items)
    outputs, _ = run_all(engine, {0: [("again", PROMPTS[4], SpeculationOptions())]})
    first = calls[0][0]  # prefill of the uncached prompt tokens + the first round, in one call
    assert len(first.token_ids) == len(PROMPTS[4]) - len(PROMPTS[0])  # only the new tokens
    assert outputs["again"] == references[PROMPTS[4]]


def test_seeded_sampling_is_reproducible_and_batch_independent(tiny_target, tiny_draft):
    def sampled(engine, prompts):
        arrivals = {0: [(f"s{i}", p, SpeculationOptions()) for i, p in enumerate(prompts)]}
        for seq_id, prompt, options in arrivals[0]:
            engine.add(seq_id, GenerationRequest(prompt, MAX_TOKENS, SamplingParams(0.9, seed=7)), options)
        outputs, _ = run_all(engine, {})
        return outputs

    alone = sampled(make_engine(tiny_target, tiny_draft, "model", 3), PROMPTS[:1])
    together = sampled(make_engine(tiny_target, tiny_draft, "model", 3), PROMPTS[:3])
    assert alone["s0"] == together["s0"] and len(alone["s0"]) > 0


def test_a_prompt_beyond_the_context_is_refused(tiny_target, tiny_draft):
    engine = make_engine(tiny_target, tiny_draft, "none", 0, slots=1)
    with pytest.raises(Exception, match="context"):
        engine.add("big", GenerationRequest(tuple([1] * (engine.context_length + 1)), 4))
