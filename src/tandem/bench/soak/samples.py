"""One look at a server during a soak, read from its /metrics: memory, file descriptors, threads,
KV slots held, the engine's queue, and the prompt cache's host-tier bytes. A server without one
of these metrics (not Tandem, or an older one) reads None for it rather than failing the soak."""

from dataclasses import asdict, dataclass

from prometheus_client.parser import text_string_to_metric_families

WATCHED = {  # sample field -> metric sample name
    "rss_bytes": "process_resident_memory_bytes",
    "open_fds": "process_open_fds",
    "threads": "tandem:process_threads",
    "kv_slots_in_use": "tandem:kv_slots_in_use",
    "running": "tandem:num_requests_running",
    "waiting": "tandem:num_requests_waiting",
    "prompt_cache_bytes": "tandem:prefix_cache_host_bytes",
    "drafting_memory_bytes": "tandem:drafting_memory_bytes",
}


@dataclass(frozen=True, slots=True)
class ServerSample:
    elapsed_s: float  # since the soak's load started
    phase: str  # "load" while clients run, "idle" after they stopped and the server drained
    requests_done: int  # requests finished so far (ok, failed or abandoned)
    errors: int  # failed requests so far
    rss_bytes: float | None = None
    open_fds: float | None = None
    threads: float | None = None
    kv_slots_in_use: float | None = None
    running: float | None = None
    waiting: float | None = None
    prompt_cache_bytes: float | None = None  # the prompt cache's host tier: bounded by --cache-ram
    drafting_memory_bytes: float | None = None  # suffix index and n-gram store, as charged: bounded

    @property
    def unbounded_bytes(self) -> float | None:
        """Resident memory beyond what fills up to a bound by design: the prompt cache's host tier
        and the drafters' memory of earlier answers (as charged, at or above what it holds)."""
        if self.rss_bytes is None:
            return None
        return self.rss_bytes - (self.prompt_cache_bytes or 0.0) - (self.drafting_memory_bytes or 0.0)

    def to_json(self) -> dict:
        return asdict(self)


def read_metrics(text: str) -> dict[str, float | None]:
    """The watched values in a Prometheus text exposition (summed over label sets)."""
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            values[sample.name] = values.get(sample.name, 0.0) + sample.value
    return {field: values.get(name) for field, name in WATCHED.items()}
