"""Figures derived from run records: latency, acceptance, time split and speedups.

ms/token of a set of runs = total seconds / total new tokens (so long answers weigh more);
p50/p90/p99 are percentiles of per-prompt ms/token (linear interpolation; prompts with no new
token are left out). Speedup of a configuration vs a reference = reference ms/token / its ms/token,
so 2.0 means twice as fast. Acceptance and the time split exist only where the stats hold engine
counters (Tandem configurations); elsewhere they are None.
"""

from typing import Sequence

import numpy as np

from tandem.bench.single.harness import RunRecord
from tandem.bench.stats import percentile, ratio

PERCENTILES = (50, 90, 99)


def ms_per_token(records: Sequence[RunRecord]) -> float | None:
    tokens = sum(r.new_tokens for r in records)
    return 1000 * sum(r.seconds for r in records) / tokens if tokens else None


def prompt_ms_per_token(records: Sequence[RunRecord]) -> list[float]:
    return [1000 * r.seconds / r.new_tokens for r in records if r.new_tokens]


def _has_engine_stats(records: Sequence[RunRecord]) -> bool:
    return bool(records) and all("drafted" in r.stats for r in records)


def acceptance(records: Sequence[RunRecord]) -> dict:
    if not _has_engine_stats(records):
        return {"acceptance_rate": None, "mean_accepted_len": None, "drafted": None, "accepted": None}
    drafted = sum(r.stats["drafted"] for r in records)
    accepted = sum(r.stats["accepted"] for r in records)
    rounds = sum(r.stats["rounds_with_draft"] for r in records)
    return {
        "acceptance_rate": ratio(accepted, drafted),
        "mean_accepted_len": accepted / rounds if rounds else None,
        "drafted": drafted,
        "accepted": accepted,
    }


def acceptance_by_position(records: Sequence[RunRecord]) -> list[dict] | None:
    """Per draft position (0 = first draft token): rounds drafting it, rounds accepting it, rate."""
    if not _has_engine_stats(records):
        return None
    size = max((len(r.stats["drafted_by_position"]) for r in records), default=0)
    drafted, accepted = np.zeros(size, dtype=np.int64), np.zeros(size, dtype=np.int64)
    for r in records:
        for counts, key in ((drafted, "drafted_by_position"), (accepted, "accepted_by_position")):
            counts[: len(r.stats[key])] += np.asarray(r.stats[key], dtype=np.int64)
    return [
        {"position": i, "drafted": int(d), "accepted": int(a), "rate": a / d if d else None}
        for i, (d, a) in enumerate(zip(drafted, accepted))
    ]


def time_split(records: Sequence[RunRecord]) -> dict | None:
    """Prefill, draft, verify and overhead time summed over prompts, as fractions of the wall
    time; `decode_ms_per_token` is the time after prefill per token decoded after it (a prompt's
    first new token comes of its prefill)."""
    if not _has_engine_stats(records):
        return None
    wall = sum(r.seconds for r in records)
    draft = sum(r.stats["draft_s"] for r in records)
    verify = sum(r.stats["verify_s"] for r in records)
    prefill = sum(r.stats.get("prefill_s", 0.0) for r in records)
    overhead = max(0.0, wall - prefill - draft - verify)
    decoded = sum(max(0, r.new_tokens - 1) for r in records)
    if not wall:
        return None
    return {"prefill": prefill / wall, "draft": draft / wall, "verify": verify / wall,
            "overhead": overhead / wall, "wall_s": wall,
            "decode_ms_per_token": (wall - prefill) * 1000 / decoded if decoded else None}


def latency(records: Sequence[RunRecord]) -> dict:
    per_prompt = prompt_ms_per_token(records)
    seconds = sum(r.seconds for r in records)
    tokens = sum(r.new_tokens for r in records)
    figures = {
        "prompts": len(records),
        "new_tokens": tokens,
        "seconds": seconds,
        "ms_per_token": ms_per_token(records),
        "tokens_per_s": tokens / seconds if seconds else None,
    }
    figures.update({f"p{q}_ms_per_token": percentile(per_prompt, q) for q in PERCENTILES})
    return figures


def speedups(ms: dict[str, float | None], label: str, references: Sequence[str]) -> dict[str, float | None]:
    """Speedup of `label` vs each reference present (itself excluded)."""
    return {ref: ratio(ms[ref], ms[label]) for ref in references if ref in ms and ref != label}


def by_category(records: Sequence[RunRecord]) -> dict[str, list[RunRecord]]:
    groups: dict[str, list[RunRecord]] = {}
    for record in records:
        groups.setdefault(record.category, []).append(record)
    return groups


def category_table(records: dict[str, list[RunRecord]], references: Sequence[str]) -> dict:
    """{category: {label: {"ms_per_token", "speedup": {reference: x}}}}."""
    grouped = {label: by_category(runs) for label, runs in records.items()}
    categories = list(dict.fromkeys(r.category for runs in records.values() for r in runs))
    table = {}
    for category in categories:
        ms = {label: ms_per_token(groups.get(category, [])) for label, groups in grouped.items()}
        table[category] = {
            label: {"ms_per_token": ms[label], "speedup": speedups(ms, label, references)} for label in ms
        }
    return table
