"""bench-cluster's closed-loop driver over a real (tiny) batching engine: every request is
served, concurrency is honoured, and the figures add up (inter-token gaps included)."""

import time

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
    # every committed token was scored as a round's last token or an accepted draft; drafting's
    # time is part of the calls' time
    assert figures.scored_tokens >= figures.completion_tokens
    assert 0 < figures.draft_seconds <= figures.call_seconds


def test_a_join_delay_holds_each_replacement_back_like_a_clients_round_trip(tiny_target, tiny_draft):
    """With one client and a delay, the next request is added only that long after the last one
    finished (the loop waits while nothing runs); with none, before the next step."""
    for delay in (0.2, 0.0):
        engine = make_engine(tiny_target, tiny_draft, "model", 2, slots=2)
        added, finished = [], []
        add, step = engine.add, engine.step

        def add_and_note(seq_id, request):
            added.append(time.perf_counter())
            add(seq_id, request)

        def step_and_note():
            updates, report = step()
            finished.extend(time.perf_counter() for update in updates if update.finished)
            return updates, report

        engine.add, engine.step = add_and_note, step_and_note
        requests = [GenerationRequest(p, max_tokens=MAX_TOKENS) for p in PROMPTS[:3]]
        figures = drive(engine, requests, concurrency=1, tag="t", join_delay_s=delay)
        assert figures.requests == 3 and figures.completion_tokens == 3 * MAX_TOKENS and not engine.has_work
        waits = [joined - ended for ended, joined in zip(finished, added[1:])]
        assert len(waits) == 2 and all((w >= delay) if delay else (0 <= w < 0.05) for w in waits), waits
