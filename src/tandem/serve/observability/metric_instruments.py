"""The Prometheus instruments of one served model: names, help texts, labels and buckets.

Names follow vLLM's (`vllm:` becomes `tandem:`) where vLLM has an equivalent; prometheus_client
appends `_total` to counters. Instruments without extra labels are pre-bound to the model name.
As vLLM does, no `_created` series (prometheus_client's default adds one per counter and
histogram, typed a gauge in the text format: twice the series for nothing a query uses).
"""

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics

disable_created_metrics()  # process-wide; read when samples are collected

PREFIX = "tandem:"
TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5)
E2E_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 60.0, 120.0, 300.0)
STEP_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
K_BUCKETS = tuple(float(k) for k in range(17))  # chosen speculation depth 0..16, then +Inf


class Instruments:
    def __init__(self, registry: CollectorRegistry, model_name: str):
        def counter(name, doc, *labels):
            return _bind(Counter(PREFIX + name, doc, ["model_name", *labels], registry=registry), model_name, labels)

        def gauge(name, doc, *labels):
            return _bind(Gauge(PREFIX + name, doc, ["model_name", *labels], registry=registry), model_name, labels)

        def histogram(name, doc, buckets):
            return Histogram(PREFIX + name, doc, ["model_name"], buckets=buckets, registry=registry).labels(model_name)

        # requests
        self.num_requests_running = gauge("num_requests_running", "Sequences in the engine's running batch.")
        self.num_requests_waiting = gauge("num_requests_waiting", "Requests queued, not yet admitted.")
        self.num_preemptions = counter("num_preemptions", "Running sequences put back in the queue for KV room "
                                       "(their prompt and output recomputed when they run again).")
        self.kv_cache_usage = gauge("kv_cache_usage_perc", "Share of the target's KV pool the running sequences "
                                    "hold, 0 to 1 (retained prompt caches, evicted first, not counted; 0 without "
                                    "a pool).")
        self.request_success = counter("request_success", "Finished requests by finish reason.", "finished_reason")
        self.request_rejected = counter("request_rejected", "Requests refused before the engine, by HTTP status.",
                                        "http_status")
        self.time_to_first_token = histogram("time_to_first_token_seconds", "Time to first token.", TTFT_BUCKETS)
        self.inter_token_latency = histogram("inter_token_latency_seconds", "Time between output tokens.",
                                             ITL_BUCKETS)
        self.e2e_request_latency = histogram("e2e_request_latency_seconds", "End-to-end request latency.",
                                             E2E_BUCKETS)
        self.prompt_tokens = counter("prompt_tokens", "Prompt tokens of requests whose prompt was processed.")
        self.generation_tokens = counter("generation_tokens", "Completion tokens, counted as they are streamed.")
        # speculative decoding
        self.num_drafts = counter("spec_decode_num_drafts", "Speculation rounds with at least one draft token.")
        self.num_draft_tokens = counter("spec_decode_num_draft_tokens", "Draft tokens verified by the target.")
        self.num_accepted_tokens = counter("spec_decode_num_accepted_tokens", "Draft tokens the target accepted.")
        self.accepted_per_pos = counter("spec_decode_num_accepted_tokens_per_pos",
                                        "Accepted draft tokens by 1-based draft position.", "position")
        self.rejected_per_pos = counter("spec_decode_num_rejected_tokens_per_pos",
                                        "Rounds whose first rejected draft token sat at this 1-based position.",
                                        "position")
        self.rounds_by_source = counter("spec_decode_rounds", "Speculation rounds by draft source.", "source")
        self.draft_tokens_by_source = counter("spec_decode_draft_tokens_by_source",
                                              "Draft tokens verified, by draft source.", "source")
        self.accepted_tokens_by_source = counter("spec_decode_accepted_tokens_by_source",
                                                 "Draft tokens accepted, by draft source.", "source")
        self.chosen_k = histogram("spec_decode_chosen_k", "Chosen speculation depth k per round.", K_BUCKETS)
        self.acceptance_rate_rolling = gauge("acceptance_rate_rolling",
                                             "Acceptance rate over the most recent draft tokens.")
        self.acceptance_alert = gauge("acceptance_alert", "1 while the rolling acceptance rate is below threshold.")
        self.acceptance_alert_threshold = gauge("acceptance_alert_threshold", "The acceptance alert's threshold.")
        # engine steps and devices
        self.engine_step_seconds = histogram("engine_step_seconds", "Wall time of one engine step.", STEP_BUCKETS)
        self.prefill_step_seconds = histogram("prefill_step_seconds",
                                              "Prompt processing in a call of its own, per step (prompt chunks scored "
                                              "in the verify call count in verify_step_seconds).", STEP_BUCKETS)
        self.prompt_steps = counter("engine_prompt_steps", "Engine steps that scored prompt tokens (a prompt or a "
                                    "chunk of one), in a call of their own or in the verify call.")
        self.draft_step_seconds = histogram("draft_step_seconds",
                                            "Planning and drafting per step (draft-model forwards, copy lookups).",
                                            STEP_BUCKETS)
        self.verify_step_seconds = histogram("verify_step_seconds",
                                             "The batched target forward: rounds and prompt chunks.",
                                             STEP_BUCKETS)
        self.device_memory = gauge("device_memory_bytes", "Memory in use: process RSS (cpu), allocated (cuda:i).",
                                   "device")
        self.device_utilization = gauge("device_utilization",
                                        "Fraction of recent wall time the role's model was computing.", "role")
        # cluster workers (tandem serve --cluster)
        self.worker_up = gauge("worker_up", "1 while a cluster worker answers, 0 while dead or restarting.",
                               "worker", "role")
        self.worker_sequences = gauge("worker_sequences", "Sequences a cluster worker holds.", "worker")
        self.worker_restarts = counter("worker_restarts", "Times a cluster worker was restarted.", "worker")
        self.cluster_routed = counter("cluster_routed_requests", "Placements on a verifier replica, by why it was "
                                      "chosen: cost, prefix (it held the prompt's prefix), failover, move.",
                                      "worker", "reason")
        # prompt (prefix) cache: tokens looked up and found, as vLLM counts them
        self.prefix_cache_queries = counter("prefix_cache_queries", "Prompt tokens looked up in the prompt cache.")
        self.prefix_cache_hits = counter("prefix_cache_hits", "Prompt tokens found in the prompt cache.")
        self.prefix_cache_host_bytes = gauge("prefix_cache_host_bytes",
                                             "Bytes of KV states in the prompt cache's host tier.")
        self.prefix_cache_disk_bytes = gauge("prefix_cache_disk_bytes",
                                             "Bytes of KV state files in the prompt cache's disk tier.")
        # drafters' memory of earlier answers
        self.drafting_memory_bytes = gauge("drafting_memory_bytes",
                                           "Bytes the suffix index and the in-process n-gram store are "
                                           "charged against their bounds (at or above what they hold).")
        # response cache
        self.cache_hits = counter("response_cache_hits", "Response-cache lookups that hit.")
        self.cache_misses = counter("response_cache_misses", "Response-cache lookups that missed.")


def _bind(metric, model_name: str, extra_labels: tuple):
    """Pre-bind metrics without extra labels; the others are bound per call."""
    return metric if extra_labels else metric.labels(model_name)
