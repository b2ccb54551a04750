"""Which draft sources a Tandem server used in a run: its /metrics counters of rounds, draft tokens
and accepted tokens by source, read before and after the run (the difference is the run's), so a
report shows what `hybrid` chose between and how each source did."""

import httpx
from prometheus_client.parser import text_string_to_metric_families

COUNTERS = {  # metric family -> field
    "tandem:spec_decode_rounds": "rounds",
    "tandem:spec_decode_draft_tokens_by_source": "drafted",
    "tandem:spec_decode_accepted_tokens_by_source": "accepted",
}
FIELDS = ("rounds", "drafted", "accepted")
METRICS_TIMEOUT_S = 10.0

SourceCounts = dict[str, dict[str, float]]  # source -> {rounds, drafted, accepted}


def parse_sources(text: str) -> SourceCounts:
    counts: SourceCounts = {}
    for family in text_string_to_metric_families(text):
        field = COUNTERS.get(family.name.removesuffix("_total"))  # untyped families keep it
        if field is None:
            continue
        for sample in family.samples:
            if sample.name.endswith("_total") and "source" in sample.labels:
                entry = counts.setdefault(sample.labels["source"], dict.fromkeys(FIELDS, 0.0))
                entry[field] += sample.value
    return counts


def read_metrics(metrics_url: str | None) -> str | None:
    """The server's /metrics text now (draft sources, engine steps); None where it has no metrics
    or they cannot be read."""
    if metrics_url is None:
        return None
    try:
        response = httpx.get(metrics_url, timeout=METRICS_TIMEOUT_S)
        response.raise_for_status()
    except httpx.HTTPError:
        return None
    return response.text


def source_delta(before: SourceCounts, after: SourceCounts) -> dict[str, dict[str, int]]:
    """The run's counts per source (most drafted first), sources it never used left out."""
    delta = {}
    for source, counts in after.items():
        old = before.get(source, {})
        run = {field: int(round(counts[field] - old.get(field, 0.0))) for field in FIELDS}
        if run["rounds"] or run["drafted"]:
            delta[source] = run
    return dict(sorted(delta.items(), key=lambda item: (-item[1]["drafted"], -item[1]["rounds"], item[0])))
