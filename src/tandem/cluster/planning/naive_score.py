"""The source articles' naive placement rule, reproduced so the planner can be compared with it.

The article scores each device as

    score = (0.6 x compute + 0.4 x bandwidth) x (1 - utilisation)

with compute (peak TFLOP/s) and bandwidth (GB/s) each normalised here by the cluster's largest,
and pairs the two best devices. (Its code returns the best-scoring device first, in the draft
slot; we give the rule the reading its prose implies: the best device verifies.) Generalised to
a cluster: the best-scoring worker that can verify verifies with all its replicas, every other
worker that can draft drafts with the draft model, and k is the article's default of 5
(`num_speculative_tokens=5`). The planner then predicts that placement with its own cost model.

Compute and bandwidth come from a public-spec profile's numbers, or, for a measured profile,
from its curves: effective bandwidth = weight bytes / time of one token; effective compute =
the most FLOP/s any curve point reached (2 x params x tokens / time). Both are divided by the
worker's emulated slowdown.
"""

from dataclasses import dataclass
from typing import Mapping

from tandem.cluster.config.cluster_spec import ClusterSpec, WorkerSpec
from tandem.cluster.profiles.model_shapes import model_shape
from tandem.cluster.profiles.profile import DeviceProfile

COMPUTE_WEIGHT = 0.6
BANDWIDTH_WEIGHT = 0.4
NAIVE_DRAFTER = "model"
NAIVE_K = 5  # the article's num_speculative_tokens default


@dataclass(frozen=True, slots=True)
class DeviceScore:
    worker: str
    compute_tflops: float
    bandwidth_gbs: float
    utilization: float
    score: float
    basis: str  # "public spec" | "measured curve"


def device_numbers(worker: WorkerSpec, profile: DeviceProfile) -> tuple[float, float, str]:
    """(TFLOP/s, GB/s, basis) of a worker's device, slowed by its emulated slowdown."""
    if profile.peak_tflops is not None and profile.bandwidth_gbs is not None:
        return profile.peak_tflops / worker.slowdown, profile.bandwidth_gbs / worker.slowdown, "public spec"
    shape = model_shape(profile.model)
    weights = shape.weight_bytes(profile.backend, profile.dtype)
    one_token_s = profile.step_ms(1, 1, profile.contexts[0]) / 1000
    flops = max(2 * shape.params * c.batch * n / (ms / 1000) for c in profile.curves for n, ms in c.latency_ms)
    return flops / 1e12 / worker.slowdown, weights / one_token_s / 1e9 / worker.slowdown, "measured curve"


def device_scores(spec: ClusterSpec, profiles: Mapping[tuple[str, str], DeviceProfile]) -> tuple[DeviceScore, ...]:
    """Each worker's naive score, from the profile of the model it would mainly run."""
    numbers = {}
    for worker in spec.workers:
        model = worker.model if worker.can_verify else worker.drafting_model
        numbers[worker.name] = device_numbers(worker, profiles[(worker.name, model)])
    top_compute = max(c for c, _, _ in numbers.values())
    top_bandwidth = max(b for _, b, _ in numbers.values())
    scores = []
    for worker in spec.workers:
        compute, bandwidth, basis = numbers[worker.name]
        raw = COMPUTE_WEIGHT * compute / top_compute + BANDWIDTH_WEIGHT * bandwidth / top_bandwidth
        scores.append(DeviceScore(worker.name, compute, bandwidth, worker.utilization,
                                  raw * (1 - worker.utilization), basis))
    return tuple(scores)


def naive_roles(spec: ClusterSpec, scores: tuple[DeviceScore, ...]) -> tuple[dict[str, int], dict[str, int]]:
    """(verifier replicas, draft replicas) by worker name, as the naive rule places them."""
    by_name = {s.worker: s.score for s in scores}
    top = max((w for w in spec.workers if w.can_verify), key=lambda w: by_name[w.name])
    drafters = {w.name: w.replicas for w in spec.workers if w.can_draft and w.name != top.name}
    return {top.name: top.replicas}, drafters
