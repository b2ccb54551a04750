"""Drive a batching engine (single-process or cluster router) with a closed loop of C
concurrent requests, on token ids, and measure what clients would see: completion tokens per
second over the run, request latency, time to first token, time per output token and
inter-token gaps."""

import time
from collections import deque
from dataclasses import asdict, dataclass

from tandem.bench.stats import percentile
from tandem.engine.request import GenerationRequest


@dataclass(frozen=True, slots=True)
class RunFigures:
    requests: int
    concurrency: int
    completion_tokens: int
    seconds: float
    throughput_tok_s: float
    latency_ms_p50: float
    latency_ms_p99: float
    ttft_ms_p50: float
    ms_per_token_p50: float  # a request's latency over its tokens
    acceptance: float | None
    steps: int = 0  # engine steps the run took
    step_overhead_ms_mean: float = 0.0  # per step, outside prefill, draft and verify calls
    call_seconds: float = 0.0  # summed over steps: the wall time of their prefill, draft and verify calls
    itl_ms_p50: float | None = None  # gaps between a request's successive token-bearing updates
    itl_ms_p99: float | None = None
    draft_seconds: float = 0.0  # summed over steps: planning and drafting (within call_seconds)
    scored_tokens: int = 0  # tokens the target scored: rounds (last token + drafts) and prompt chunks

    def to_json(self) -> dict:
        return {key: (round(value, 3) if isinstance(value, float) else value) for key, value in asdict(self).items()}


def drive(engine, requests: list[GenerationRequest], concurrency: int, tag: str,
          join_delay_s: float = 0.0) -> RunFigures:
    """`join_delay_s`: a client's next request arrives this long after its last one finished
    (an HTTP round trip); 0 adds it before the next step, as a loop on the engine thread would."""
    pending = deque(enumerate(requests))
    started, first, ended, produced, last = {}, {}, {}, {}, {}
    freed: deque[float] = deque()  # when each client slot freed by a finished request may send again
    gaps_ms = []
    drafted = accepted = steps = 0
    overhead_s = calls_s = draft_s = 0.0
    scored = 0
    begin = time.perf_counter()
    while pending or engine.has_work:
        while freed and freed[0] <= time.perf_counter():  # those clients may send again
            freed.popleft()
        while pending and len(started) - len(ended) + len(freed) < concurrency:
            index, request = pending.popleft()
            engine.add(f"{tag}-{index}", request)
            started[index] = time.perf_counter()
        if not engine.has_work and freed:
            time.sleep(max(0.0, freed[0] - time.perf_counter()))
            continue
        updates, report = engine.step()
        now = time.perf_counter()
        if report is not None:  # None: a cluster's replicas finished no round meanwhile
            steps += 1
            step_calls_s = report.prefill_seconds + report.draft_seconds + report.verify_seconds
            calls_s += step_calls_s
            draft_s += report.draft_seconds
            scored += report.batch_tokens + report.prefill_tokens
            overhead_s += max(0.0, report.step_seconds - step_calls_s)
        for update in updates:
            index = int(update.seq_id.rsplit("-", 1)[1])
            if update.token_ids:
                first.setdefault(index, now)
                if index in last:
                    gaps_ms.append((now - last[index]) * 1000)
                last[index] = now
                produced[index] = produced.get(index, 0) + len(update.token_ids)
            drafted += update.drafted
            accepted += update.accepted
            if update.finished:
                ended[index] = now
                if join_delay_s > 0:
                    freed.append(now + join_delay_s)
    seconds = time.perf_counter() - begin
    latency = [(ended[i] - started[i]) * 1000 for i in ended]
    per_token = [(ended[i] - started[i]) * 1000 / produced[i] for i in ended if produced.get(i)]
    tokens = sum(produced.values())
    return RunFigures(len(requests), concurrency, tokens, seconds, tokens / seconds,
                      percentile(latency, 50), percentile(latency, 99),
                      percentile([(first[i] - started[i]) * 1000 for i in first], 50),
                      percentile(per_token, 50), accepted / drafted if drafted else None,
                      steps, 1000 * overhead_s / steps if steps else 0.0, calls_s,
                      percentile(gaps_ms, 50), percentile(gaps_ms, 99), draft_s, scored)
