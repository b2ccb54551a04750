"""Thin Ray actors: each builds its runner inside its own worker process and forwards calls to
the plain worker class (cluster/runtime/replica.py, cluster/runtime/drafter_worker.py). No logic
lives here. A replica's actor serves calls concurrently (its poll waits for news while adds and
pings come in); a drafter's one at a time."""

from tandem.cluster.runtime.drafter_worker import DrafterWorker
from tandem.cluster.runtime.emulation import Emulation
from tandem.cluster.runtime.endpoints import RayEndpoint
from tandem.cluster.runtime.replica import ReplicaEngine, ReplicaSettings
from tandem.models.backends import RunnerSpec

REPLICA_CONCURRENCY = 8  # calls a replica's actor serves at once


def _runner(spec: RunnerSpec, slots: int):
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from tandem.models.batch_backends import load_batch_runner

    return load_batch_runner(spec, slots)


def _with_placement(info: dict) -> dict:
    import ray

    return {**info, "resources": ray.get_runtime_context().get_assigned_resources()}


class ReplicaHost:
    def __init__(self, spec: RunnerSpec, slots: int, emulation: Emulation, settings: ReplicaSettings = ReplicaSettings()):
        from tandem.engine.build import host_cache_for
        from tandem.speculation.shared_store.store import open_ngram_store

        runner = _runner(spec, slots)
        store = open_ngram_store(settings.ngram_store_url, namespace=settings.ngram_namespace)
        self.worker = ReplicaEngine(runner, emulation, max_running=slots,
                                    step_token_budget=settings.step_token_budget,
                                    host_cache=host_cache_for(runner, None, settings.cache_ram_bytes),
                                    ngram_store=store, prefill_floor=settings.prefill_floor,
                                    prefill_waves=settings.prefill_waves)

    def info(self):
        return _with_placement(self.worker.info())

    def ping(self):
        return self.worker.ping()

    def add(self, seq_id, request, options, moved=None):
        return self.worker.add(seq_id, request, options, moved)

    def cancel(self, seq_ids):
        return self.worker.cancel(seq_ids)

    def detach(self, seq_id):
        return self.worker.detach(seq_id)

    def poll(self):
        return self.worker.poll()

    def set_drafters(self, links, draft_ahead=False):
        return self.worker.set_drafters(links, draft_ahead)

    def clear_caches(self):
        return self.worker.clear_caches()


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


HOSTS = {"verify": ReplicaHost, "draft": DrafterHost}


def start_actor(role: str, name: str, spec: RunnerSpec, slots: int, emulation: Emulation,
                num_cpus: float, resources: dict[str, float],
                settings: ReplicaSettings = ReplicaSettings()) -> RayEndpoint:
    """Create the actor where Ray finds `num_cpus` and the custom `resources` free (a replica's
    with `settings`)."""
    import ray

    custom = dict(resources)
    num_gpus = custom.pop("GPU", 0.0)  # Ray's own accelerator resource has its own option
    actor_class = ray.remote(HOSTS[role])
    actor = actor_class.options(num_cpus=num_cpus, num_gpus=num_gpus, resources=custom or None,
                                max_restarts=0, max_concurrency=REPLICA_CONCURRENCY if role == "verify" else 1,
                                ).remote(spec, slots, emulation, *((settings,) if role == "verify" else ()))
    return RayEndpoint(name, actor)
