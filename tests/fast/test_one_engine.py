"""One scenario through the three ways Tandem runs it: `tandem generate` (the engine stepped in
this thread), `tandem serve` (the engine thread behind EngineWorker) and the cluster (the
router over a replica, which runs the same engine, and a drafter worker). fp32 torch: the tokens must be identical, and so
must every drafter decision (which source drafted each round, and how many tokens)."""

from engine_support import make_engine, serial_runner
from tandem.cluster.runtime.drafter_worker import DrafterWorker
from tandem.cluster.runtime.endpoints import LocalEndpoint
from tandem.cluster.runtime.pool import Worker
from tandem.cluster.runtime.replica import ReplicaEngine
from tandem.cluster.runtime.router import ClusterRouter
from tandem.engine.events import SpeculationOptions
from tandem.engine.request import GenerationRequest
from tandem.engine.run_request import stream_tokens
from tandem.engine.stats import GenerationStats
from tandem.engine.worker import EngineWorker

PROMPT = (5, 17, 33, 2, 9, 41, 5, 17, 33, 2, 60, 61, 62, 5, 17)  # repeats: copies and model drafts
MAX_TOKENS = 40
OPTIONS = SpeculationOptions("hybrid", 3)


def request() -> GenerationRequest:
    return GenerationRequest(PROMPT, max_tokens=MAX_TOKENS)


def decisions(reports, seq_id: str) -> list[tuple[str, int]]:
    return [(r.source, r.k) for report in reports for r in report.rounds if r.seq_id == seq_id]


def through_generate(tiny_target, tiny_draft):
    stats = GenerationStats()
    tokens = [t for chunk in stream_tokens(make_engine(tiny_target, tiny_draft, slots=1), request(), stats, OPTIONS)
              for t in chunk]
    return tokens, list(zip(stats.chosen_sources, stats.chosen_k))


def through_serve(tiny_target, tiny_draft):
    reports = []
    worker = EngineWorker(make_engine(tiny_target, tiny_draft, slots=2), observers=[reports.append]).start()
    try:
        handle = worker.submit(request(), OPTIONS)
        tokens = []
        while not handle.finished:
            tokens += handle.next_update_sync(timeout=60).token_ids
    finally:
        worker.shutdown(grace_seconds=1)
    return tokens, decisions(reports, handle.seq_id)


def through_cluster(tiny_target, tiny_draft):
    def worker(name, role, make, threads=1):
        w = Worker(name, role, lambda: LocalEndpoint(name, make(), threads))
        w.launch()
        assert w.wait_ready()
        return w

    verifier = worker("verify-0", "verify", lambda: ReplicaEngine(serial_runner(tiny_target, 2), max_running=2), 4)
    drafter = worker("draft-0", "draft", lambda: DrafterWorker(serial_runner(tiny_draft, 2)))
    router = ClusterRouter([verifier], [drafter])
    router.add("c", request(), OPTIONS)
    tokens, reports = [], []
    try:
        while router.has_work:
            updates, report = router.step()
            reports += [report] if report is not None else []
            tokens += [t for u in updates for t in u.token_ids]
    finally:
        router.close()
        verifier.endpoint.kill()
    return tokens, decisions(reports, "c")


def test_generate_serve_and_cluster_give_the_same_tokens_and_decisions(tiny_target, tiny_draft):
    generated = through_generate(tiny_target, tiny_draft)
    served = through_serve(tiny_target, tiny_draft)
    clustered = through_cluster(tiny_target, tiny_draft)
    assert len(generated[0]) == MAX_TOKENS
    assert generated == served == clustered
    sources = {source for source, _ in generated[1]}
    assert "model" in sources and any(s.startswith(("ngram", "suffix")) for s in sources)  # both kinds ran
