"""A simulated Device from a `DeviceProfile` (cluster/profiles/profile.py): its cost by total tokens.

The simulator prices a fused batch by its total token count plus a per-sequence term, so from a
profile priced at one context it takes
- cost(n) = step_ms(batch 1, n) for the profiled n (n is then the total count),
- per_sequence_ms = (step_ms(B, 1) - step_ms(1, B)) / (B - 1) at the largest profiled batch B:
  what B sequences of one token cost beyond one sequence of B tokens (their KV caches),
- cost(total) for totals past the profiled n (prefill, big batches) from the batch-B curve:
  step_ms(B, total / B) - (B - 1) per_sequence_ms.
- the same read at the profile's deepest context is the cost's deep curve: a call on more
  cached tokens than `context` is priced between the two (CostModel.cost_ms, linear in the
  context, as the engine's own runner profile reads a step), one on fewer at `context`; the
  per-sequence term likewise, read at both contexts (Device.per_sequence_at; read at `context`
  alone, an L4's batch of 8 x 4 tokens at 2,048 cached tokens was priced 8% under its curve).
The profile's prompt curve (one sequence's prompt, logits at its last token) prices prefill and
a draft model's catch-up where the profile has one; beside the cost curve read at the profile's
shortest context it also gives what a logits row costs (`logits_row_ms`: the two at the largest n
both hold, the difference over the n - 1 rows the prompt curve does not ask), which a prompt part
scored in one call with rounds does not pay (planning.py `verify_ms`). `slowdown` multiplies every time (a worker
made slower, or shared with other work, or a run's devices at the speed it found them).

A profile keeps each point's fastest sample, and a run of many calls meets the device at its
typical speed, so every time is also multiplied by the profile's `typical_over_fastest` (the
2-core VMs here: calls shaped like a chat run's took a median 1.0-1.4x their fastest);
`typical=False` prices at the fastest.

The engine holds a step's prompt chunks beside decoding streams down to a floor chunk it reads
off its runner's profile at 64 cached tokens (engine/step_budget.py `floor_chunk`), so the
device's floor is read off the profile's curve at its shortest context, not at the context that
prices the calls: an earlier profile of the mixed smollm2 replicas gave 20 tokens at 64 and
43 at 512 (the replicas' engines read 7 off their runner profile), and at 43 the simulated fast
replica's steps beside streams carried 55 prompt tokens on average where the replica's carried
16-23 in most (docs/cluster.md, "Prompt chunks and the shared prefix").
"""

from tandem.cluster.profiles.profile import DeviceProfile
from tandem.cluster.sim.config import Device
from tandem.engine.step_budget import floor_chunk
from tandem.models.cost import CostModel

LARGE_TOTALS = (128, 256, 512, 1024, 2048, 4096, 8192)  # totals priced from the big-batch curve


def device_from_profile(name: str, profile: DeviceProfile, *, group: str = "local", context: int | None = None,
                        slowdown: float = 1.0, fused: bool = True, typical: bool = True) -> Device:
    context = profile.contexts[0] if context is None else context
    if typical:
        slowdown *= profile.typical_over_fastest or 1.0
    per_sequence = _per_sequence_ms(profile, context) if fused else 0.0
    points = _totals_ms(profile, context, per_sequence)
    deepest = profile.contexts[-1]
    deep_per_sequence = (_per_sequence_ms(profile, deepest) if fused else 0.0) if deepest > context else None
    deep = _totals_ms(profile, deepest, deep_per_sequence) if deep_per_sequence is not None else {}
    scaled = CostModel({n: ms * slowdown for n, ms in points.items()}, deep_ms={n: ms * slowdown for n, ms in deep.items()},
                       base_context=context if deep else 0, deep_context=deepest if deep else 0)
    return Device(name, scaled, fused, group, per_sequence * slowdown, prompt_cost=profile.prompt_cost(slowdown),
                  prefill_floor=engine_floor(profile), logits_row_ms=logits_row_ms(profile) * slowdown,
                  deep_per_sequence_ms=None if deep_per_sequence is None else deep_per_sequence * slowdown)


def _totals_ms(profile: DeviceProfile, context: int, per_sequence: float) -> dict[int, float]:
    """One sequence's call over n tokens at the profiled n, past them from the largest batch."""
    sizes = profile.sizes(1)
    points = {n: profile.step_ms(1, n, context) for n in sizes}
    biggest = profile.batches[-1]
    if biggest > 1:
        for total in LARGE_TOTALS:
            if total > sizes[-1]:
                points[total] = profile.step_ms(biggest, total / biggest, context) - (biggest - 1) * per_sequence
    return points


def logits_row_ms(profile: DeviceProfile) -> float:
    """What one logits row adds to a token's cost: the one-sequence curve at the profile's
    shortest context against the prompt curve, at the largest n both measured (0 without a
    prompt curve, or where the two do not differ)."""
    prompt = dict(profile.prompt_ms)
    shared = [n for n in profile.sizes(1) if n in prompt and n > 1]
    if not shared:
        return 0.0
    n = shared[-1]
    return max(0.0, (profile.step_ms(1, n, profile.contexts[0]) - prompt[n]) / (n - 1))


def engine_floor(profile: DeviceProfile) -> int:
    """The floor chunk the engine would read off this device's one-sequence curve at the
    profile's shortest context (the engine's runner profile is taken at 64 cached tokens)."""
    shortest = profile.contexts[0]
    curve = CostModel({n: profile.step_ms(1, n, shortest) for n in profile.sizes(1)})
    return floor_chunk(curve.cost_ms)


def _per_sequence_ms(profile: DeviceProfile, context: int) -> float:
    biggest = profile.batches[-1]
    if biggest == 1:
        return 0.0
    extra = profile.step_ms(biggest, 1, context) - profile.step_ms(1, biggest, context)
    return max(0.0, extra / (biggest - 1))
