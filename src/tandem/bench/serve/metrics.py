"""Figures of one closed-loop run (one server at one concurrency), and ratios between servers.

Only successful requests count toward tokens and latencies; failed ones count as errors.
Throughput = completion tokens / wall time of the run; requests/s = successful requests / wall
time. Percentiles (linear interpolation) are over requests for TTFT, TPOT and e2e, and over
every inter-token gap of every request for ITL (a gap is between two streamed chunks, and a
chunk may hold several tokens: Tandem sends each round's accepted tokens in one, so an ITL ratio
is given only between servers that stream about as many tokens a chunk). TPOT = (the last
chunk's arrival - the first's) / (completion tokens - 1). Acceptance = accepted / drafted tokens
summed over the requests whose usage reports them (None where none does).
"""

from typing import Sequence

from tandem.bench.stats import percentile, ratio
from tandem.bench.serve.client import RequestRecord
from tandem.bench.serve.loadgen import LoadResult

QUANTILES = (50, 99)
MAX_ERRORS_KEPT = 3
CHUNKING_TOLERANCE = 0.1  # tokens a chunk within 10% of each other: their gaps compare


def _ms(values: Sequence[float]) -> list[float]:
    return [1000 * v for v in values]


def _quantiles(name: str, values: Sequence[float]) -> dict:
    return {f"{name}_p{q}": percentile(values, q) for q in QUANTILES}


def latency_figures(ok: Sequence[RequestRecord]) -> dict:
    """TTFT, ITL and TPOT in milliseconds, e2e in seconds: p50 and p99 of each."""
    figures = {}
    figures.update(_quantiles("ttft_ms", _ms([r.ttft_s for r in ok if r.ttft_s is not None])))
    figures.update(_quantiles("itl_ms", _ms([gap for r in ok for gap in r.itl_s])))
    figures.update(_quantiles("tpot_ms", _ms([r.tpot_s for r in ok if r.tpot_s is not None])))
    figures.update(_quantiles("e2e_s", [r.e2e_s for r in ok]))
    return figures


def acceptance_figures(ok: Sequence[RequestRecord]) -> dict:
    reported = [r for r in ok if r.drafted is not None and r.accepted is not None]
    if not reported:
        return {"drafted": None, "accepted": None, "acceptance_rate": None}
    drafted = sum(r.drafted for r in reported)
    accepted = sum(r.accepted for r in reported)
    return {"drafted": drafted, "accepted": accepted, "acceptance_rate": ratio(accepted, drafted)}


def summarize(result: LoadResult) -> dict:
    ok = [r for r in result.records if r.ok]
    failed = [r for r in result.records if not r.ok]
    tokens = sum(r.completion_tokens for r in ok)
    wall = result.wall_s
    return {
        "concurrency": result.concurrency,
        "requests": len(result.records),
        "errors": len(failed),
        "error_samples": [r.error for r in failed[:MAX_ERRORS_KEPT]],
        "completion_tokens": tokens,
        "tokens_per_chunk": ratio(tokens, sum(r.token_chunks for r in ok)),
        "tokens_from_usage": bool(ok) and all(r.tokens_from_usage for r in ok),
        "wall_s": wall,
        "throughput_tok_s": tokens / wall if wall else None,
        "requests_per_s": len(ok) / wall if wall else None,
        "peak_in_flight": result.peak_in_flight,
        "mean_in_flight": result.mean_in_flight,
        **latency_figures(ok),
        **acceptance_figures(ok),
    }


def compare(a: dict, b: dict) -> dict:
    """How much better summary `a` is than `b`, every figure oriented so > 1 means `a` wins:
    throughput a/b; for latencies, b/a."""
    return {
        "throughput": ratio(a["throughput_tok_s"], b["throughput_tok_s"]),
        "ttft_p50": ratio(b["ttft_ms_p50"], a["ttft_ms_p50"]),
        "itl_p50": ratio(b["itl_ms_p50"], a["itl_ms_p50"]) if _chunked_alike(a, b) else None,
        "tpot_p50": ratio(b["tpot_ms_p50"], a["tpot_ms_p50"]),
        "e2e_p50": ratio(b["e2e_s_p50"], a["e2e_s_p50"]),
    }


def _chunked_alike(a: dict, b: dict) -> bool:
    """Whether two runs streamed about as many tokens a chunk (a run without the figure, an older
    results.json, is taken to)."""
    a_chunk, b_chunk = a.get("tokens_per_chunk"), b.get("tokens_per_chunk")
    if not a_chunk or not b_chunk:  # None, or no tokens counted: nothing to tell them apart by
        return True
    return abs(a_chunk / b_chunk - 1) <= CHUNKING_TOLERANCE
