"""Random workloads for the batching engine, and the checks a step must pass (plain functions; the
test is test_engine_fuzz.py).

A case is one engine (serial or fused runner, slots, context, drafter, depth, step budget, a tight
KV pool, a host tier) and requests that arrive at given steps: prompts that share prefixes, repeat
a pattern, fill the context or are one token long; later turns that extend an earlier answer;
salts, stop ids, per-request drafters and depths, seeded sampling, cancellations. Between steps
the engine's books must agree with its runners'; at the end it must be idle with every KV block
free once its caches are cleared.
"""

import functools
import random
from dataclasses import dataclass, field

from engine_support import CHEAP_VERIFY, naive_greedy, serial_runner
from tiny_models import VOCAB

from tandem.engine.batch_engine import BatchEngine
from tandem.engine.events import SpeculationOptions
from tandem.engine.host_cache import HostPromptCache
from tandem.engine.request import GenerationRequest
from tandem.models.cost import CostModel
from tandem.models.paged.fused_runner import FusedTorchRunner
from tandem.speculation.drafters.registry import USES_MODEL
from tandem.speculation.sampling import SamplingParams

DRAFTERS = ["none", "ngram", "suffix", "model", "hybrid"]


@dataclass
class FuzzRequest:
    seq_id: str
    prompt: tuple[int, ...]
    max_tokens: int
    arrive: int  # the step before which it is added
    stop: frozenset[int] = frozenset()
    salt: str | None = None
    drafter: str | None = None  # None: the engine's
    k: int | str | None = None
    sampling: SamplingParams = field(default_factory=SamplingParams)  # greedy unless seeded

    def generation(self) -> GenerationRequest:
        return GenerationRequest(self.prompt, self.max_tokens, self.sampling, self.stop, cache_salt=self.salt)


@dataclass
class FuzzCase:
    runner: str  # "serial" | "fused"
    slots: int
    context: int
    drafter: str
    k: int | str
    step_budget: int
    requests: list[FuzzRequest]
    cancels: dict[int, list[str]]  # step -> the requests cancelled before it
    cache_slots: int | None = None  # fused: block tables beyond the running ones
    kv_tokens: int | None = None  # fused: a pool this small (None: room for every slot)
    headroom: int | None = None  # KV_HEADROOM_TOKENS for this case (small: preemption happens)
    host_bytes: int = 0
    max_running: int | None = None


def random_case(rng: random.Random, tiny_target, crowded: bool = False) -> FuzzCase:
    """crowded: many requests behind one long shared prefix, small step budgets, salts, cancels."""
    runner = rng.choice(["serial", "fused", "fused"])
    slots = rng.randint(2, 5) if crowded else rng.randint(1, 4)
    context = rng.choice([96, 256] if crowded else [64, 96, 256])
    case = FuzzCase(runner, slots, context, rng.choice(DRAFTERS), rng.choice(["auto", 0, 1, 2, 4, 7]),
                    rng.choice([1, 5, 8, 16, 17, 33] if crowded else [1, 3, 7, 16, 40, 512]), [], {})
    if runner == "fused":
        if rng.random() < 0.4:
            case.cache_slots = slots + rng.randint(1, 6)
        if rng.random() < 0.5:
            case.kv_tokens = rng.choice([context, context + 16, context * 3 // 2, context * 2])
            case.headroom = rng.choice([0, 0, 4, 16]) if rng.random() < 0.7 else None
    case.host_bytes = rng.choice([0, 0, 100_000, 300_000, 64 << 20])
    case.max_running = rng.randint(1, slots) if rng.random() < 0.2 else None
    if crowded:
        base = tuple(rng.randrange(VOCAB) for _ in range(rng.randint(17, 80)))
        prefixes = [base, base[: rng.randint(16, len(base))]]
    else:
        prefixes = [tuple(rng.randrange(VOCAB) for _ in range(rng.randint(16, 40))) for _ in range(2)]
    seeded = rng.random() < 0.25
    for i in range(rng.randint(3, 8) if crowded else rng.randint(1, 7)):
        sampling = (SamplingParams(rng.choice([0.7, 1.0]), rng.choice([0, 0, 5]), rng.choice([1.0, 0.9]),
                                   rng.randrange(1000)) if seeded and rng.random() < 0.7 else SamplingParams())
        case.requests.append(FuzzRequest(
            f"r{i}", _random_prompt(rng, prefixes, context), rng.choice([1, 2, 5, 12, 24, 24]),
            rng.choice([0, 0, 0, 1, 2, 4, 7]), frozenset(rng.randrange(VOCAB) for _ in range(rng.choice([0, 0, 1, 3]))),
            rng.choice([None, None, None, "a", "b"]), rng.choice([None, None, *DRAFTERS]),
            rng.choice([None, None, "auto", 0, 1, 3, 6]), sampling))
    if rng.random() < 0.5:  # later turns: an earlier prompt and its answer (or part of it), then new tokens
        for j in range(rng.randint(1, 3)):
            earlier = rng.choice(case.requests)
            history = list(earlier.prompt) + naive_greedy_cached(tiny_target, earlier.prompt, earlier.max_tokens)
            if rng.random() < 0.5:
                history = history[: rng.randint(1, len(history))]
            history = (history + [rng.randrange(VOCAB) for _ in range(rng.randint(0, 4))])[: context - 1]
            case.requests.append(FuzzRequest(
                f"turn{j}", tuple(history), rng.choice([1, 8, 24]), rng.choice([10, 15, 20, 30, 45]),
                salt=rng.choice([earlier.salt, None, "a"]), drafter=earlier.drafter, k=earlier.k,
                sampling=earlier.sampling))
    if crowded or rng.random() < 0.25:
        for request in rng.sample(case.requests, rng.randint(1, len(case.requests))):
            case.cancels.setdefault(request.arrive + rng.randint(0, 6), []).append(request.seq_id)
    return case


def _random_prompt(rng: random.Random, prefixes: list[tuple[int, ...]], context: int) -> tuple[int, ...]:
    kind = rng.random()
    if kind < 0.1:
        prompt = (rng.randrange(VOCAB),)
    elif kind < 0.2:  # a few tokens short of the context
        prompt = tuple(rng.randrange(VOCAB) for _ in range(context - rng.randint(1, 6)))
    elif kind < 0.55:  # a shared prefix, and a little more
        prompt = rng.choice(prefixes) + tuple(rng.randrange(VOCAB) for _ in range(rng.randint(0, 10)))
    elif kind < 0.7:  # a repeated pattern: copy drafters find it
        pattern = [rng.randrange(VOCAB) for _ in range(rng.randint(2, 5))]
        prompt = tuple((pattern * 20)[: rng.randint(6, 40)])
    else:
        prompt = tuple(rng.randrange(VOCAB) for _ in range(rng.randint(2, 30)))
    return prompt[: context - 1]


@functools.cache
def naive_greedy_cached(model_dir, prompt: tuple[int, ...], max_tokens: int, stop=frozenset()) -> list[int]:
    """naive_greedy, each case computed once (later turns and repeats ask again); do not mutate."""
    return naive_greedy(model_dir, prompt, max_tokens, stop)


def build_case_engine(case: FuzzCase, tiny_target, tiny_draft, requests: list[FuzzRequest] | None = None,
                      drafter: str | None = None, k=None) -> BatchEngine:
    """The case's engine for `requests` (the case's own by default), or another drafter and depth."""
    requests = case.requests if requests is None else requests
    drafter = drafter or case.drafter
    uses_model = USES_MODEL[drafter] or any(r.drafter and USES_MODEL[r.drafter] for r in requests)
    target = _runner(case, tiny_target, case.kv_tokens)
    draft = _runner(case, tiny_draft, None) if uses_model else None
    host = HostPromptCache(case.host_bytes, "tiny") if case.host_bytes else None
    return BatchEngine(target, draft, drafter, case.k if k is None else k, step_token_budget=case.step_budget,
                       host_cache=host, max_running=case.max_running)


def _runner(case: FuzzCase, model_dir, kv_tokens: int | None):
    if case.runner == "serial":
        return serial_runner(model_dir, case.slots)
    runner = FusedTorchRunner.load(str(model_dir), "cpu", "fp32", case.slots, case.context,
                                   cache_slots=case.cache_slots)
    if kv_tokens is not None:  # the same decoder, a pool of this many tokens
        runner = FusedTorchRunner(runner.decoder, case.slots, case.context, runner.row_bytes * kv_tokens,
                                  cache_slots=case.cache_slots)
    runner.cost = CostModel(dict(CHEAP_VERIFY))
    return runner


@dataclass
class Outcome:
    outputs: dict[str, list[int]]
    reasons: dict[str, str]
    accepted: dict[str, int]


def drive(engine: BatchEngine, requests: list[FuzzRequest], cancels: dict[int, list[str]] | None = None,
          max_steps: int = 4000) -> Outcome:
    """Step until idle, adding and cancelling as the case says; check the books between steps."""
    outcome = Outcome({r.seq_id: [] for r in requests}, {}, {r.seq_id: 0 for r in requests})
    cancels = cancels or {}
    last_arrival = max(r.arrive for r in requests)
    for step in range(max_steps):
        if not engine.has_work and step > last_arrival:
            return outcome
        for request in (r for r in requests if r.arrive == step):
            engine.add(request.seq_id, request.generation(), SpeculationOptions(request.drafter, request.k))
        for seq_id in cancels.get(step, []):
            if seq_id not in outcome.reasons and engine.cancel(seq_id) is not None:
                outcome.reasons[seq_id] = "cancelled"
        if engine.has_work:
            updates, report = engine.step()
            assert report.running <= engine.max_running
            for update in updates:
                assert update.seq_id not in outcome.reasons, f"an update after {update.seq_id} finished"
                assert update.accepted <= min(update.drafted, len(update.token_ids)), update
                outcome.outputs[update.seq_id] += update.token_ids
                outcome.accepted[update.seq_id] += update.accepted
                if update.finished:
                    outcome.reasons[update.seq_id] = update.finish_reason
            check_books(engine)
    raise AssertionError(f"not idle after {max_steps} steps")


def check_books(engine: BatchEngine) -> None:
    """Each running sequence's slot holds what it says, in the slot table and in both runners."""
    for seq in engine.running.values():
        assert engine.slots.owner[seq.slot] == seq.seq_id
        assert engine.target.num_cached_tokens(seq.slot) == seq.cached_length
        assert list(engine.slots.cached[seq.slot]) == seq.tokens[: seq.cached_length]
        if engine.draft is not None:
            assert engine.draft.num_cached_tokens(seq.slot) == len(seq.draft_cached)
    assert sorted(o for o in engine.slots.owner if o is not None) == sorted(engine.running)


def check_idle(engine: BatchEngine) -> None:
    """Nothing running or waiting, the slot table true to the runner; no block held once the
    retained caches are cleared."""
    assert not (engine.has_work or engine.running or engine.waiting) and engine.kv_slots_in_use == 0
    for slot, cached in enumerate(engine.slots.cached):
        assert engine.target.num_cached_tokens(slot) == len(cached)
    engine.clear_caches()
    for runner in (engine.target, engine.draft):
        if runner is not None and hasattr(runner, "blocks"):
            assert runner.blocks.num_free == runner.blocks.num_blocks and not any(runner.blocks.refs)
