"""Thin Ray actors: each builds its runner inside its own worker process and forwards calls to
the plain worker class (cluster/runtime/verifier_worker.py, cluster/runtime/drafter_worker.py). No logic lives here."""

from tandem.cluster.runtime.drafter_worker import DrafterWorker
from tandem.cluster.runtime.emulation import Emulation
from tandem.cluster.runtime.endpoints import RayEndpoint
from tandem.cluster.runtime.verifier_worker import VerifierWorker
from tandem.models.backends import RunnerSpec


def _runner(spec: RunnerSpec, slots: int):
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from tandem.models.batch_backends import load_batch_runner

    return load_batch_runner(spec, slots)


def _with_placement(info: dict) -> dict:
    import ray

    return {**info, "resources": ray.get_runtime_context().get_assigned_resources()}


class VerifierHost:
    def __init__(self, spec: RunnerSpec, slots: int, emulation: Emulation):
        self.worker = VerifierWorker(_runner(spec, slots), emulation)

    def info(self):
        return _with_placement(self.worker.info())

    def ping(self):
        return self.worker.ping()

    def open(self, seq_id, token_ids):
        return self.worker.open(seq_id, token_ids)

    def verify(self, items):
        return self.worker.verify(items)

    def close(self, seq_ids):
        return self.worker.close(seq_ids)


class DrafterHost:
    def __init__(self, spec: RunnerSpec, slots: int, emulation: Emulation):
        self.worker = DrafterWorker(_runner(spec, slots), emulation)

    def info(self):
        return _with_placement(self.worker.info())

    def ping(self):
        return self.worker.ping()

    def propose(self, items):
        return self.worker.propose(items)

    def forget(self, seq_ids):
        return self.worker.forget(seq_ids)


HOSTS = {"verify": VerifierHost, "draft": DrafterHost}


def start_actor(role: str, name: str, spec: RunnerSpec, slots: int, emulation: Emulation,
                num_cpus: float, resources: dict[str, float]) -> RayEndpoint:
    """Create the actor where Ray finds `num_cpus` and the custom `resources` free."""
    import ray

    custom = dict(resources)
    num_gpus = custom.pop("GPU", 0.0)  # Ray's own accelerator resource has its own option
    actor_class = ray.remote(HOSTS[role])
    actor = actor_class.options(num_cpus=num_cpus, num_gpus=num_gpus, resources=custom or None,
                                max_restarts=0, max_concurrency=1).remote(spec, slots, emulation)
    return RayEndpoint(name, actor)
