"""Where a Tandem server's time went in a run: its /metrics histograms of engine steps (how many,
the seconds inside them, in drafting and in the verify forward, and how many scored prompt
tokens), read before and after the run as the draft sources are (the difference is the run's).
Set against the run's wall time, what lies outside the steps is the server's own: HTTP,
detokenizing, hand-offs between threads, waiting for requests."""

from prometheus_client.parser import text_string_to_metric_families

HISTOGRAMS = {  # metric family -> (field of its sample count, field of its sum of seconds)
    "tandem:engine_step_seconds": ("steps", "step_s"),
    "tandem:draft_step_seconds": (None, "draft_s"),
    "tandem:verify_step_seconds": (None, "verify_s"),
}
COUNTERS = {"tandem:engine_prompt_steps_total": "prompt_steps"}  # sample name -> field: steps that scored prompts
COUNTS = ("steps", "prompt_steps")
SECONDS = ("step_s", "draft_s", "verify_s")
FIELDS = COUNTS + SECONDS

StepTotals = dict[str, float]


def parse_steps(text: str) -> StepTotals:
    totals = dict.fromkeys(FIELDS, 0.0)
    for family in text_string_to_metric_families(text):
        count_field, sum_field = HISTOGRAMS.get(family.name, (None, None))
        for sample in family.samples:
            if sample.name in COUNTERS:  # whatever family the parser files it under (with or without _total)
                totals[COUNTERS[sample.name]] += sample.value
            elif sample.name.endswith("_count") and count_field:
                totals[count_field] += sample.value
            elif sample.name.endswith("_sum") and sum_field:
                totals[sum_field] += sample.value
    return totals


def step_delta(before: StepTotals, after: StepTotals) -> dict[str, float]:
    """The run's steps: counts as integers, seconds to the millisecond."""
    return {**{field: int(round(after[field] - before[field])) for field in COUNTS},
            **{field: round(after[field] - before[field], 3) for field in SECONDS}}
