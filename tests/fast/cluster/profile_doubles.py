"""Hand-built profiles and clusters for planner tests: a fused device whose forward call costs
`total_ms[tokens]` for the batch's total token count, the shape llama.cpp and GPUs both have."""

from tandem.cluster.config.cluster_spec import ClusterSpec, NetworkSpec, WorkerSpec
from tandem.cluster.profiles.profile import Curve, DeviceProfile
from tandem.models.cost import CostModel

SIZES = (1, 2, 4, 8, 16)
BATCHES = (1, 2, 4, 8)
CONTEXT = 512


def fused_profile(total_ms: dict[int, float], model: str = "m", batches=BATCHES, **more) -> DeviceProfile:
    cost = CostModel(dict(total_ms))
    curves = tuple(Curve(b, CONTEXT, tuple((n, cost.cost_ms(b * n)) for n in SIZES)) for b in batches)
    return DeviceProfile(model, "llamacpp", "cpu", "gguf", 1, "measured", curves, **more)


def cluster(*workers: WorkerSpec, rtt: dict[tuple[str, str], float] | None = None, **more) -> ClusterSpec:
    return ClusterSpec(tuple(workers), NetworkSpec(rtt or {}), **more)


def verifier(name: str = "v", replicas: int = 1, **more) -> WorkerSpec:
    return WorkerSpec(name, "verify", "target", replicas=replicas, **more)


def drafter(name: str = "d", replicas: int = 1, **more) -> WorkerSpec:
    return WorkerSpec(name, "draft", "draft", replicas=replicas, **more)


def both_worker(name: str = "b", replicas: int = 1, **more) -> WorkerSpec:
    return WorkerSpec(name, "both", "target", draft_model="draft", replicas=replicas, **more)


FLAT = {1: 10.0, 128: 11.0}  # GPU-like: verifying 128 tokens costs about what 1 does
STEEP = {1: 10.0, 2: 20.0, 4: 40.0, 16: 160.0, 128: 1280.0}  # CPU-like: proportional
CHEAP_DRAFT = {1: 0.5, 128: 1.5}
