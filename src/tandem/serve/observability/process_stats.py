"""What a long run watches for leaks, read when /metrics is scraped: the process's resident memory
and open file descriptors (prometheus_client's standard `process_*` metrics), its threads, and
the engine's KV slots held by sequences (`tandem:kv_slots_in_use`: 0 once the server is idle,
whatever was cancelled or disconnected on the way). `tandem soak` samples these."""

from typing import Callable

import psutil
from prometheus_client import CollectorRegistry, Gauge, ProcessCollector

from tandem.serve.observability.metric_instruments import PREFIX


def track_process(registry: CollectorRegistry, model_name: str, kv_slots_in_use: Callable[[], int]) -> None:
    ProcessCollector(registry=registry)
    process = psutil.Process()
    threads = Gauge(PREFIX + "process_threads", "Threads of the server process (native ones included).",
                    ["model_name"], registry=registry)
    threads.labels(model_name).set_function(process.num_threads)
    slots = Gauge(PREFIX + "kv_slots_in_use", "KV-cache slots held by sequences (0 when idle).",
                  ["model_name"], registry=registry)
    slots.labels(model_name).set_function(kv_slots_in_use)
