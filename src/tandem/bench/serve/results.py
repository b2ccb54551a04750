"""Assembling `results.json` from a sweep: per concurrency level, each config's figures, its
requests, and the ratios between configs.

Shape: the header (command, settings, machine) as given, then `configs` (labels in the order
asked), `servers` (label -> command, notes, base URL) and `levels`: a list, by ascending
concurrency, of {concurrency, order, configs: {label: summary + draft sources (Tandem servers: rounds, drafted
and accepted tokens per source in that run; None for others) + engine steps (Tandem servers: steps, those
with prompt tokens, seconds in steps, drafting and verifying; None for others) + requests}, ratios}.
"""

from tandem.bench.serve.client import RequestRecord
from tandem.bench.serve.metrics import compare, summarize
from tandem.bench.serve.sweep import SweepOutcome

# (a, b): "a vs b" ratios reported wherever both ran; every ratio > 1 means a did better.
RATIO_PAIRS = (
    ("tandem-spec", "tandem-nospec"),
    ("tandem-spec", "llamacpp-server"),
    ("tandem-nospec", "llamacpp-server"),
    ("tandem-spec", "llama-server"),
    ("tandem-nospec", "llama-server"),
    ("tandem-spec", "llama-server-ngram"),
    ("tandem-spec", "llama-server-ngram-map"),
    ("tandem-spec", "llama-server-draft"),
    ("tandem-spec", "tandem-ngram"),
    ("tandem-spec", "tandem-suffix"),
    ("tandem-spec", "tandem-model"),
    ("tandem-waves", "tandem-spec"),
    ("tandem-waves", "llama-server"),
)
ROUND_DIGITS = 3


def ratios(summaries: dict[str, dict]) -> list[dict]:
    return [{"a": a, "b": b, **compare(summaries[a], summaries[b])}
            for a, b in RATIO_PAIRS if a in summaries and b in summaries]


def request_entry(record: RequestRecord) -> dict:
    def ms(seconds: float | None) -> float | None:
        return None if seconds is None else round(1000 * seconds, ROUND_DIGITS)

    return {
        "id": record.prompt_id,
        "category": record.category,
        "ok": record.ok,
        "error": record.error,
        "sent_ms": ms(record.sent_s),  # from the run's start: the wall time is the largest sent_ms + e2e_ms
        "ttft_ms": ms(record.ttft_s),
        "e2e_ms": ms(record.e2e_s),
        "prompt_tokens": record.prompt_tokens,  # as the server's usage says (None where it sends none)
        "cached_tokens": record.cached_tokens,
        "completion_tokens": record.completion_tokens,
        "token_chunks": record.token_chunks,
        "finish_reason": record.finish_reason,
        "drafted": record.drafted,
        "accepted": record.accepted,
        "itl_ms": [ms(gap) for gap in record.itl_s],
        "text": record.text,  # the answer (tandem bench-ceiling reads it)
    }


def build_results(outcome: SweepOutcome, header: dict) -> dict:
    levels = []
    for concurrency in sorted(outcome.results):
        runs = outcome.results[concurrency]
        summaries = {label: summarize(run) for label, run in runs.items()}
        sources = outcome.sources.get(concurrency, {})
        steps = outcome.steps.get(concurrency, {})
        levels.append({
            "concurrency": concurrency,
            "order": outcome.orders[concurrency],
            "configs": {label: {**summaries[label], "draft_sources": sources.get(label),
                                "engine_steps": steps.get(label),
                                "request_records": [request_entry(r) for r in run.records]}
                        for label, run in runs.items()},
            "ratios": ratios(summaries),
        })
    return {**header, "configs": list(outcome.servers), "servers": outcome.servers, "levels": levels}


def failed_runs(results: dict) -> list[str]:
    """The configs (with their level) whose every request failed: a run that measured nothing."""
    return [f"{label} at C={level['concurrency']}" for level in results["levels"]
            for label, config in level["configs"].items()
            if config["request_records"] and not any(r["ok"] for r in config["request_records"])]
