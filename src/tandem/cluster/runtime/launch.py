"""Start a cluster file's workers on Ray and hand back the router (a batching engine).

`tandem serve --cluster FILE` starts a local Ray cluster, or joins one with `--ray-address`.
Each replica of each worker becomes an actor that asks Ray for the worker's resources (custom
resources such as `npu` name accelerators Ray does not know); a `both` worker becomes a verifier
and a drafter. A local cluster is declared with enough CPUs and custom resources for every
worker, so heterogeneity can be emulated on one small machine (slowdown, threads, groups).

The router sits in the group of the first drafting worker (drafts are made close to the user,
the article's edge), or "local". Calls between the router and a replica pay the round trip
between their groups, and so do a replica's calls to a drafter (emulated where the cluster file
gives latencies).
"""

import os
import socket
import sys
from dataclasses import dataclass, replace

from tandem.cluster.runtime.actors import start_actor
from tandem.cluster.config.cluster_spec import ClusterSpec, WorkerSpec
from tandem.cluster.config.load import located_error
from tandem.cluster.runtime.health import DEFAULT_PERIOD_S, check_period
from tandem.cluster.runtime.emulation import Emulation
from tandem.cluster.runtime.pool import Worker
from tandem.cluster.runtime.reap import stopping_what_it_started
from tandem.cluster.runtime.replica import ReplicaSettings
from tandem.cluster.runtime.router import ClusterRouter
from tandem.engine.host_cache import default_cache_ram_bytes
from tandem.errors import ModelNotFoundError, TandemError
from tandem.models.backends import RunnerSpec
from tandem.sigterm import deferring_ctrl_c, keeping_sigterm_handler
from tandem.speculation.drafters.registry import USES_MODEL, check_drafter

DEFAULT_SLOTS = 8  # sequences per verifier replica
DRAFTER_SLOTS = 32  # sequences a drafter keeps caches for


@dataclass(frozen=True, slots=True)
class Role:
    role: str  # "verify" | "draft"
    model: str
    slots: int


def roles_of(worker: WorkerSpec) -> list[Role]:
    roles = []
    if worker.can_verify:
        roles.append(Role("verify", worker.model, DEFAULT_SLOTS))
    if worker.can_draft and worker.drafting_model:
        roles.append(Role("draft", worker.drafting_model, DRAFTER_SLOTS))
    return roles


def router_group(spec: ClusterSpec) -> str:
    return next((w.group for w in spec.workers if w.can_draft), "local")


RAY_CONNECT_SECONDS = 10


def check_reachable(address: str, timeout_s: float = RAY_CONNECT_SECONDS) -> None:
    """TandemError unless something accepts a connection at Ray's HOST:PORT ('auto' and ray://
    addresses are Ray's to resolve)."""
    if address == "auto" or "://" in address:
        return
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise TandemError(f"--ray-address {address!r} is not HOST:PORT (a Ray head's GCS address, e.g. 10.0.0.5:6379)")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as error:
        raise TandemError(f"no Ray cluster answers at {address} ({error.strerror or error}, {timeout_s:g} s): "
                          "start its head there (`ray start --head --port PORT`) or give its address") from None


def start_ray(spec: ClusterSpec, address: str | None = None) -> None:
    import ray

    if ray.is_initialized():
        return
    if address:
        check_reachable(address)  # ray.init retries an address nobody answers at for ever, Ctrl-C held
        with keeping_sigterm_handler(), deferring_ctrl_c():
            ray.init(address=address, log_to_driver=False)
        return
    cpus, gpus, need = local_cluster_resources(spec)
    note = shared_cores_note(cpus, os.cpu_count() or 1)
    if note:
        print(note, file=sys.stderr)
    # a Ctrl-C waits for the start (a few seconds), then shuts Ray down; a SIGTERM mid-start (Ray's
    # own handler ends the process there) leaves no Ray agent behind
    with keeping_sigterm_handler(), stopping_what_it_started(ray.shutdown):
        with deferring_ctrl_c():
            ray.init(num_cpus=cpus, num_gpus=gpus or None, resources=need or None, include_dashboard=False,
                     log_to_driver=False)


def local_cluster_resources(spec: ClusterSpec) -> tuple[int, int, dict[str, float]]:
    """What a local Ray cluster is declared with: (CPUs, GPUs, custom resources), enough for every
    replica of every worker (at least this machine's CPUs), so heterogeneity can be emulated here."""
    need: dict[str, float] = {}
    for worker in spec.workers:
        for _ in roles_of(worker):
            for name, amount in worker.ray_resources.items():
                need[name] = need.get(name, 0.0) + amount * worker.replicas
    cpus = max(os.cpu_count() or 1, int(need.pop("CPU", 1) + 0.999))
    gpus = int(need.pop("GPU", 0) + 0.999)
    return cpus, gpus, need


def shared_cores_note(cpus: int, machine_cpus: int) -> str | None:
    """Said where a local cluster's workers ask for more CPUs than the machine has (they start
    anyway: emulation shares the cores)."""
    if cpus <= machine_cpus:
        return None
    return (f"note: the cluster file's workers ask for {cpus} CPUs in all and this machine has {machine_cpus}: "
            f"on one machine they share its cores (Ray is told {cpus})")


def build_workers(spec: ClusterSpec, settings: ReplicaSettings = ReplicaSettings()) -> tuple[list[Worker], list[Worker]]:
    """Every replica of every worker, launched and ready; verifier replicas with `settings`, their
    host tier sized by the file (`replica_cache_ram`)."""
    home = router_group(spec)
    verifiers, drafters = [], []
    cache_ram = replica_cache_ram(spec)
    for worker in spec.workers:
        rtt = spec.network.rtt_ms(home, worker.group)
        for replica in range(worker.replicas):
            for role in roles_of(worker):
                name = f"{worker.name}-{role.role}-{replica}"
                pool = verifiers if role.role == "verify" else drafters
                rtt_ms = rtt if role.role == "verify" else 0.0  # drafters are called by replicas (links)
                start = _starter(worker, role, name, rtt_ms, replace(settings, cache_ram_bytes=cache_ram[worker.name]))
                pool.append(Worker(name, role.role, start, rtt_ms=rtt_ms, group=worker.group))
    workers = verifiers + drafters
    print(f"starting {len(workers)} cluster workers (each loads its model; a first start profiles it: "
          f"minutes)...", file=sys.stderr, flush=True)
    for w in workers:
        w.launch()  # all actors load their models concurrently
    for ready, w in enumerate(workers, start=1):
        if not w.wait_ready():
            why = f": {w.start_error}" if w.start_error else ""
            raise TandemError(f"cluster worker {w.name} failed to start{why} (the Ray logs: "
                              f"/tmp/ray/session_latest/logs)")
        print(f"  {w.name} ready ({ready}/{len(workers)})", file=sys.stderr, flush=True)
    return verifiers, drafters


def prepare_models(spec: ClusterSpec) -> None:
    """Pull and convert every model the workers load, here and once, with the progress bars a
    worker's log would hide (Ray keeps actors' output out of this terminal), before the actors
    start: replicas of one model would otherwise each pull it at once."""
    from tandem.models.resolve import gguf_path, hf_path

    done = set()
    for i, worker in enumerate(spec.workers):
        for role in roles_of(worker):
            if (role.model, worker.backend) in done:
                continue
            done.add((role.model, worker.backend))
            try:
                if worker.backend == "torch":
                    hf_path(role.model)
                else:
                    gguf_path(role.model)
            except ModelNotFoundError as error:
                field = "model" if role.model == worker.model else "draft_model"
                raise located_error(spec, ("workers", i, field), str(error)) from None


def check_one_tokenizer(spec: ClusterSpec, vocabulary=None) -> None:
    """Every model the workers run must share the served model's tokenizer: token ids pass
    between them (drafts, moved streams, the n-gram store) and mean nothing across tokenizers.
    Two verifier models of one family are fine; a model of another family is refused here (it
    failed each request with a drafter worker's traceback, or left requests unanswered).
    `vocabulary(model) -> {token: id}`: the tokenizer's (its files, read here)."""
    if vocabulary is None:
        from tandem.models.resolve import tokenizer_path
        from tandem.text.tokenizer import TextTokenizer

        def vocabulary(model: str) -> dict[str, int]:
            return TextTokenizer(str(tokenizer_path(model))).vocabulary()

    served = next(w.model for w in spec.workers if w.can_verify)
    reference = vocabulary(served)
    for model in sorted({role.model for w in spec.workers for role in roles_of(w)} - {served}):
        other = vocabulary(model)
        if other != reference:
            differing = len(set(other.items()) ^ set(reference.items()))
            raise TandemError(f"the cluster's models must share one tokenizer (its workers pass token ids to each "
                              f"other): {model} ({len(other)} tokens) and the served {served} ({len(reference)} "
                              f"tokens) map {differing} entries differently")


def replica_cache_ram(spec: ClusterSpec) -> dict[str, int]:
    """Bytes of each verifier replica's prompt-cache host tier, by worker: its `cache_ram`, else
    an equal share of one process's default (`default_cache_ram_bytes`) among all the
    cluster's verifier replicas, so that replicas sharing a machine stay within what one
    `tandem serve` would take there."""
    replicas = sum(w.replicas for w in spec.workers if w.can_verify)
    share = default_cache_ram_bytes() // max(1, replicas)
    return {w.name: share if w.cache_ram is None else w.cache_ram for w in spec.workers}


def _starter(worker: WorkerSpec, role: Role, name: str, rtt_ms: float, settings: ReplicaSettings):
    runner = RunnerSpec(role.model, worker.backend, worker.device, worker.dtype, worker.threads)
    emulation = Emulation(worker.slowdown, rtt_ms)
    resources = dict(worker.ray_resources)
    num_cpus = resources.pop("CPU", 0.0)
    return lambda: start_actor(role.role, name, runner, role.slots, emulation, num_cpus, resources, settings)


@dataclass(frozen=True, slots=True)
class ClusterOptions:
    """`tandem serve --cluster FILE [--ray-address ADDR] [--draft-ahead] [--health-period S]`."""

    spec: ClusterSpec
    ray_address: str | None = None
    draft_ahead: bool = False
    health_period_s: float = DEFAULT_PERIOD_S

    @property
    def target(self) -> WorkerSpec:
        """The model the cluster serves: its first verifier's (their tokenizers must agree)."""
        return next(w for w in self.spec.workers if w.can_verify)

    @property
    def has_drafter(self) -> bool:
        return self.spec.has_draft_model


def check_draft_ahead(drafter: str) -> None:
    """Draft-ahead overlaps draft workers' model rounds with verification: a drafter that drafts
    no model rounds would run it for nothing (`serve --draft-ahead`, `bench-cluster`'s config)."""
    if not USES_MODEL[drafter]:
        raise TandemError(f"draft-ahead overlaps draft workers' model drafts with verification; drafter "
                          f"{drafter!r} drafts in the replica, so it would do nothing: use --drafter "
                          f"model or hybrid, or leave draft-ahead out")


def launch_cluster(spec: ClusterSpec, drafter: str, k: int | str, ray_address: str | None = None,
                   max_running: int | None = None, health_period_s: float = DEFAULT_PERIOD_S,
                   draft_ahead: bool = False, settings: ReplicaSettings = ReplicaSettings()) -> ClusterRouter:
    check_period(health_period_s)
    check_drafter(drafter, spec.has_draft_model,
                  how_to_add="the cluster file has no worker with a draft_model")
    if not ray_address:
        prepare_models(spec)  # on this machine, where the workers run: each pull or conversion once, shown
        check_one_tokenizer(spec)  # before Ray starts, not as a replica's failed step
    start_ray(spec, ray_address)
    verifiers, drafters = build_workers(spec, settings)
    if not verifiers:
        raise TandemError("the cluster has no verifier")
    router = ClusterRouter(verifiers, drafters, drafter, k, max_running, health_period_s, spec.network.rtt_ms,
                           draft_ahead)
    router.health.start()  # workers are watched from now on, with or without requests
    return router
