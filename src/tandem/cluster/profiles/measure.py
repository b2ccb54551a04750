"""Measure a `DeviceProfile`: time one batch runner scoring n new tokens per sequence, for every
(context, batch, n) in a `ProfileGrid`, and record memory use.

For each context the first slot is filled once and the others share that prefix (copy_prefix;
slots that cannot copy are filled one by one), after one warm-up call. Every call asks for
logits at all n positions, as a verification step does; between calls each slot is rolled back.
Then the prompt curve: one slot, from an empty cache, scoring n prompt tokens (up to
PROMPT_SIZES) with logits at the last position only, as a prefill or a draft model's catch-up.

Other work on the machine only ever adds time, and it comes in bursts, so the grid is swept
`repeats` times (a burst then spoils one sample of many points, not every sample of one) and
each point keeps its fastest sample. Then each point is capped by every point that does at
least as much work (no smaller context, batch or n): doing more never costs less, so any such
measurement is also an upper bound on this one.

The fastest sample is what a planner compares sizes by; a run of many calls meets the device at
its typical speed. On a shared VM the two differ: so the profile also records
`typical_over_fastest`, the median over its points of (median sample / fastest sample), which
the simulator prices calls at (cluster/sim/from_profile.py).
"""

import os
import resource
import statistics
import time
from dataclasses import dataclass
from datetime import datetime, timezone

from tandem.cluster.profiles.profile import Curve, DeviceProfile, MemoryUse
from tandem.errors import TandemError
from tandem.heap import resident_bytes
from tandem.models.backends import RunnerSpec, precision_of
from tandem.models.batch_backends import load_batch_runner
from tandem.models.batch_runner import BatchItem, BatchRunner
from tandem.models.catalog import CATALOG
from tandem.progress import ProgressBar

FILLER_VOCAB = 200  # filler token ids cycle through 1..FILLER_VOCAB
PROMPT_SIZES = (128, 256)  # prompt lengths timed beyond the grid's sizes


@dataclass(frozen=True, slots=True)
class ProfileGrid:
    sizes: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)  # n new tokens per sequence
    contexts: tuple[int, ...] = (64, 512, 2048)
    batches: tuple[int, ...] = (1, 2, 4, 8)
    repeats: int = 3

    def __post_init__(self):
        for name in ("sizes", "contexts", "batches"):
            values = getattr(self, name)
            if not values or list(values) != sorted(set(values)) or values[0] < (0 if name == "contexts" else 1):
                raise TandemError(f"profile {name} must be distinct, ascending and positive (got "
                                  f"{','.join(map(str, values))})")
        if self.batches[0] != 1:
            raise TandemError(f"profile batches must include 1, the one-sequence curve every plan reads (got "
                              f"{','.join(map(str, self.batches))})")
        if self.repeats < 1:
            raise TandemError(f"repeats must be >= 1 (got {self.repeats})")

    @property
    def points(self) -> int:
        return len(self.sizes) * len(self.contexts) * len(self.batches)


def measure_profile(spec: RunnerSpec, grid: ProfileGrid = ProfileGrid(), progress: bool = True) -> DeviceProfile:
    """Load `spec` as a batch runner with max(grid.batches) slots and time the grid."""
    needed = context_needed(grid)
    trained = CATALOG[spec.model].context_length if spec.model in CATALOG else None
    if trained is not None and needed - 1 > trained:  # known before loading (it loaded and timed ~20 s first)
        raise _too_long(spec, grid, needed, trained)
    spec = RunnerSpec(spec.model, spec.backend, spec.device, spec.dtype, spec.threads,
                      max(spec.context_length, needed)).resolved()
    before = resident_bytes()
    runner = load_batch_runner(spec, grid.batches[-1])
    return profile_runner(runner, spec, grid, progress, loaded_bytes=resident_bytes() - before)


def _too_long(spec: RunnerSpec, grid: ProfileGrid, needed: int, holds: int) -> TandemError:
    return TandemError(f"profiling {spec.model} needs {needed - 1} tokens of context (--contexts up to "
                       f"{grid.contexts[-1]} plus --sizes up to {grid.sizes[-1]}); it holds {holds}")


def profile_runner(runner: BatchRunner, spec: RunnerSpec, grid: ProfileGrid = ProfileGrid(), progress: bool = True,
                   loaded_bytes: int = 0) -> DeviceProfile:
    """Time the grid on a loaded runner (max(grid.batches) slots or more) that `spec` describes:
    also for a runner made another way (scripts/gpu_check.py: random weights on a GPU)."""
    needed = context_needed(grid)
    if runner.context_length < needed - 1:  # past what the model was trained on: not a profile of it
        raise _too_long(spec, grid, needed, runner.context_length)
    samples: dict[tuple[int, int, int], list[float]] = {}
    prompt_sizes = sorted(set(grid.sizes) | set(PROMPT_SIZES))
    prompt_samples: dict[int, list[float]] = {}
    with ProgressBar(total=(grid.points + len(prompt_sizes)) * grid.repeats, desc=f"profiling {spec.model}", unit="call",
              disable=not progress) as bar:
        for context in grid.contexts:
            _fill(runner, context, grid.batches[-1])
            for _ in range(grid.repeats):
                _sweep(runner, context, grid, samples, bar.update)
        _fill(runner, 0, grid.batches[-1])
        for _ in range(grid.repeats):
            for n in prompt_sizes:
                prompt_samples.setdefault(n, []).append(_time_prompt(runner, n))
                bar.update()
    capped = _cap_by_more_work({key: min(times) for key, times in samples.items()})
    prompt = tuple((n, min(min(prompt_samples[m]) for m in prompt_sizes if m >= n)) for n in prompt_sizes)
    curves = tuple(Curve(batch, context, tuple((n, capped[(context, batch, n)]) for n in grid.sizes))
                   for context in grid.contexts for batch in grid.batches)
    return DeviceProfile(
        model=spec.model, backend=spec.backend, device=spec.device,
        dtype=precision_of(spec.backend, spec.dtype),
        threads=spec.threads or os.cpu_count(), source="measured", curves=curves,
        measured_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        memory=MemoryUse(loaded_bytes, _peak_resident_bytes(), _device_bytes(spec.device)), prompt_ms=prompt,
        typical_over_fastest=typical_over_fastest([*samples.values(), *prompt_samples.values()]),
    )


def context_needed(grid: ProfileGrid) -> int:
    """The context length a runner needs for the grid: its deepest call and the prompt curve."""
    return max(grid.contexts[-1] + grid.sizes[-1], *PROMPT_SIZES) + 1


def typical_over_fastest(samples: list[list[float]]) -> float:
    """The median over points of (the point's median sample / its fastest): how much slower than
    its best a device typically ran while profiled (1.0 with one sample a point)."""
    return round(statistics.median(statistics.median(times) / min(times) for times in samples), 4)


def _filler(count: int) -> tuple[int, ...]:
    return tuple(1 + i % FILLER_VOCAB for i in range(count))


def _fill(runner: BatchRunner, context: int, slots: int) -> None:
    """Every slot holds `context` filler tokens (after one warm-up call)."""
    for slot in range(slots):
        runner.rollback(slot, 0)
    runner.forward_batch([BatchItem(0, _filler(1), 1)])
    runner.rollback(0, 0)
    if context == 0:
        return
    runner.forward_batch([BatchItem(0, _filler(context), 0)])
    for slot in range(1, slots):
        if runner.can_copy_prefix:
            runner.copy_prefix(0, slot, context)
        else:
            runner.forward_batch([BatchItem(slot, _filler(context), 0)])


def _sweep(runner: BatchRunner, context: int, grid: ProfileGrid, samples: dict, tick) -> None:
    """Time every (batch, n) once at this context, adding each sample to its point's."""
    for batch in grid.batches:
        for n in grid.sizes:
            samples.setdefault((context, batch, n), []).append(_time_call(runner, batch, n, context))
            tick()


def _time_call(runner: BatchRunner, batch: int, n: int, context: int) -> float:
    """ms of one call scoring n tokens in each of `batch` slots; the slots are rolled back."""
    items = [BatchItem(slot, _filler(n), n) for slot in range(batch)]
    start = time.perf_counter()
    runner.forward_batch(items, views=True)  # as the engine verifies
    elapsed = (time.perf_counter() - start) * 1000
    for slot in range(batch):
        runner.rollback(slot, context)
    return elapsed


def _time_prompt(runner: BatchRunner, n: int) -> float:
    """ms of slot 0 scoring an n-token prompt from an empty cache, logits at its last token."""
    start = time.perf_counter()
    runner.forward_batch([BatchItem(0, _filler(n), 1)])
    elapsed = (time.perf_counter() - start) * 1000
    runner.rollback(0, 0)
    return elapsed


def _cap_by_more_work(samples: dict[tuple[int, int, int], float]) -> dict[tuple[int, int, int], float]:
    """Each (context, batch, n) capped by the fastest point that does at least as much work."""
    return {key: min(ms for other, ms in samples.items() if all(o >= k for o, k in zip(other, key)))
            for key in samples}


def _peak_resident_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def _device_bytes(device: str) -> int | None:
    if not device.startswith("cuda"):
        return None
    import torch

    return int(torch.cuda.max_memory_allocated(device))
