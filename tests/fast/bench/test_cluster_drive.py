"""bench-cluster's closed-loop driver over a real (tiny) batching engine: every request is
served, concurrency is honoured, and the figures add up (inter-token gaps included)."""

from tandem.bench.cluster.drive import drive
from tandem.engine.request import GenerationRequest
from engine_support import MAX_TOKENS, PROMPTS, make_engine


def test_drive_serves_every_request_and_counts_tokens(tiny_target, tiny_draft):
    engine = make_engine(tiny_target, tiny_draft, "model", 2, slots=2)
    requests = [GenerationRequest(p, max_tokens=MAX_TOKENS) for p in PROMPTS]
    figures = drive(engine, requests, concurrency=2, tag="t")
    assert figures.requests == len(PROMPTS) and figures.completion_tokens == MAX_TOKENS * len(PROMPTS)
    assert figures.throughput_tok_s > 0 and figures.latency_ms_p50 <= figures.latency_ms_p99
    assert 0 <= figures.acceptance <= 1 and not engine.has_work
    assert 0 < figures.itl_ms_p50 <= figures.itl_ms_p99 <= figures.latency_ms_p99  # gaps within requests
