"""Assembling `results.json`: every figure per configuration, per category, and per prompt."""

from typing import Sequence

from tandem.bench.single import metrics
from tandem.bench.single.config_base import BenchConfig
from tandem.bench.single.harness import RunRecord
from tandem.bench.single.matching import match_table
from tandem.bench.single.memory import PeakMemory
from tandem.bench.single.registry import BASELINE, REFERENCES

CATEGORY_REFERENCES = (BASELINE, "llamacpp-plain")


def build_results(configs: Sequence[BenchConfig], records: dict[str, list[RunRecord]],
                  memory: PeakMemory, header: dict) -> dict:
    """`header` holds the command, settings and machine info, copied as is."""
    peers = [config.label for config in configs if config.is_peer]
    speedup_refs = [BASELINE] + peers
    ms = {label: metrics.ms_per_token(runs) for label, runs in records.items()}
    matches = match_table(records, REFERENCES)
    summaries = {}
    for config in configs:
        runs = records[config.label]
        summaries[config.label] = {
            "is_peer": config.is_peer,
            **metrics.latency(runs),
            **metrics.acceptance(runs),
            "speedup": metrics.speedups(ms, config.label, speedup_refs),
            "peak_rss_mb": memory.peak_rss_mb.get(config.label),
            "peak_gpu_mb": memory.peak_gpu_mb.get(config.label),
            "time_split": metrics.time_split(runs),
            "acceptance_by_position": metrics.acceptance_by_position(runs),
            "match": matches[config.label],
            "prompts": [_prompt_entry(run) for run in runs],
        }
    return {
        **header,
        "baseline": BASELINE if BASELINE in records else None,
        "peers": peers,
        "configs": summaries,
        "categories": metrics.category_table(records, CATEGORY_REFERENCES),
    }


PROMPT_STATS = ("drafted", "accepted", "rounds_with_draft", "prefill_s", "draft_s", "verify_s", "target_forwards",
                "draft_sources", "drafted_by_position", "accepted_by_position")


def _prompt_entry(run: RunRecord) -> dict:
    entry = {
        "id": run.prompt_id,
        "category": run.category,
        "seconds": run.seconds,
        "new_tokens": run.new_tokens,
        "token_ids": list(run.token_ids),
    }
    if "drafted" in run.stats:  # what every figure of the report is summed from (a reader can redo them)
        entry["stats"] = {key: run.stats[key] for key in PROMPT_STATS if key in run.stats}
    return entry
