"""Helpers for the fast engine tests (plain functions; fixtures live in conftest.py): tiny
prompts, serial and fused torch batch runners over a tiny model, the batching engine over it, a driver
that steps it with requests arriving at given steps, and the slow reference: naive target-only
greedy decoding, one full forward per token, no cache tricks."""

from collections import defaultdict

import numpy as np

from tandem.engine.batch_engine import BatchEngine
from tandem.engine.events import SpeculationOptions
from tandem.engine.request import GenerationRequest
from tandem.models.batch_runner import SerialBatchRunner
from tandem.models.cost import CostModel
from tandem.models.paged.fused_runner import FusedTorchRunner
from tandem.models.torch_runner import TorchRunner
from tandem.speculation.drafters.registry import USES_MODEL

PROMPTS = [
    (5, 17, 33, 2, 9, 41),
    (1, 2, 3, 4, 1, 2, 3, 4, 1, 2),
    (60, 61, 62, 60, 61, 62, 60, 61),
    (88,),
    (5, 17, 33, 2, 9, 41, 7, 7),  # shares a prefix with the first
]
MAX_TOKENS = 20
CHEAP_VERIFY = {1: 1.0, 16: 1.2, 64: 2.0}  # GPU-like: scoring more tokens is almost free


def serial_runner(model_dir, slots: int, cost: dict = CHEAP_VERIFY) -> SerialBatchRunner:
    base = TorchRunner(str(model_dir))
    base.cost = CostModel(dict(cost))
    views = iter([base] + [base.fork() for _ in range(slots - 1)])
    return SerialBatchRunner(lambda: next(views), slots)


def fused_runner(model_dir, slots: int, cost: dict = CHEAP_VERIFY, context: int = 256,
                 cache_slots: int | None = None) -> FusedTorchRunner:
    runner = FusedTorchRunner.load(str(model_dir), "cpu", "fp32", slots, context, cache_slots=cache_slots)
    runner.cost = CostModel(dict(cost))
    return runner


RUNNERS = {"serial": serial_runner, "fused": fused_runner}


def make_engine(tiny_target, tiny_draft, drafter="hybrid", k="auto", slots=3, runner="serial",
                cache_slots: int | None = None, **kwargs) -> BatchEngine:
    """runner: "serial" (transformers, one slot at a time) or "fused" (one paged forward, with
    `cache_slots` block tables: finished sequences stay resident beside the running ones)."""
    load = RUNNERS[runner]
    extra = {"cache_slots": cache_slots} if cache_slots else {}
    target = load(tiny_target, slots, CHEAP_VERIFY, **extra)
    draft = load(tiny_draft, slots, CHEAP_VERIFY, **extra) if USES_MODEL[drafter] else None
    return BatchEngine(target, draft, drafter, k, **kwargs)


def naive_greedy(model_dir, prompt, max_tokens: int, stop_ids=frozenset()) -> list[int]:
    """Target-only greedy decoding the slow way: a fresh cache and a forward over the whole
    context for every token."""
    runner = TorchRunner(str(model_dir))
    tokens, output = list(prompt), []
    while len(output) < max_tokens:
        runner.reset()
        token = int(np.argmax(runner.forward(tokens, num_logits=1)[0]))
        if token in stop_ids:
            break
        tokens.append(token)
        output.append(token)
    return output


def run_all(engine: BatchEngine, arrivals: dict[int, list[tuple[str, tuple, SpeculationOptions]]],
            max_tokens: int = MAX_TOKENS):
    """Step until idle; `arrivals[step]` lists requests added before that step."""
    outputs, reasons, step = defaultdict(list), {}, 0
    while engine.has_work or any(s >= step for s in arrivals):
        for seq_id, prompt, options in arrivals.get(step, []):
            engine.add(seq_id, GenerationRequest(prompt, max_tokens=max_tokens), options)
        if engine.has_work:
            updates, report = engine.step()
            assert report.running <= engine.max_running
            for update in updates:
                outputs[update.seq_id] += update.token_ids
                if update.finished:
                    reasons[update.seq_id] = update.finish_reason
        step += 1
    return outputs, reasons


def collect_sync(handle, timeout=30.0):
    """A worker's request read to its end from a thread: (its token ids, its last update)."""
    tokens = []
    while True:
        update = handle.next_update_sync(timeout=timeout)
        tokens += update.token_ids
        if update.finished:
            return tokens, update
