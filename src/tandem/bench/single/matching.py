"""Greedy match: does each configuration produce the same token ids as the references?

Greedy speculative decoding is lossless, so Tandem configurations should equal `none` token for
token; against other engines (llama.cpp, transformers) small numeric differences can flip a
near-tie, after which the texts part. For each divergence the index of the first differing token
is kept (when one output is a prefix of the other, that is the shorter one's length).
"""

from typing import Sequence

from tandem.bench.single.harness import RunRecord
from tandem.token_ids import first_divergence


def match_against(runs: Sequence[RunRecord], reference: Sequence[RunRecord]) -> dict:
    """Runs and reference runs are in the same prompt order."""
    divergences = []
    for run, ref in zip(runs, reference, strict=True):
        index = first_divergence(run.token_ids, ref.token_ids)
        if index is not None:
            divergences.append({"id": run.prompt_id, "first_diff": index})
    total = len(runs)
    return {
        "rate": (total - len(divergences)) / total if total else None,
        "matched": total - len(divergences),
        "prompts": total,
        "divergences": divergences,
    }


def match_table(records: dict[str, list[RunRecord]], references: Sequence[str]) -> dict:
    """{label: {reference: match}} for every reference present, other than the label itself."""
    present = [ref for ref in references if ref in records]
    return {
        label: {ref: match_against(runs, records[ref]) for ref in present if ref != label}
        for label, runs in records.items()
    }
