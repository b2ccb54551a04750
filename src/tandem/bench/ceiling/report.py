"""`tandem bench-ceiling`: a bench-serve run's decode rates per category set against the copy
ceiling of its own prompts and answers (bench/ceiling/oracle.py), on the target's verify curve measured
here at the workload's context. The answers are one config's streamed texts (token ids again
through the target's tokenizer); only first-pass requests (no repeat mark) are read. Given a
replay, Tandem's own copy drafting is priced on the same answers (bench/ceiling/drafting_replay.py), so a
config's shortfall splits into drafting's (replayed / ceiling) and the runtime's (measured /
replayed)."""

import json
import re
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from tandem.bench.ceiling.oracle import (LONG_RUN, MAX_DRAFT, CostMs, long_run_ms, oracle_ms, oracle_rounds, plain_ms,
                                        rounds_ms, suffix_rounds)
from tandem.bench.workload import format_prompt, load_prompts
from tandem.errors import TandemError
from tandem.models.cost import CostModel
from tandem.progress import ProgressBar

CURVE_SIZES = (1, 2, 4, 8, 16, 24, 32, 48, 63, 64)
Replay = Callable[[Sequence[int], Sequence[int]], float]  # (prompt, answer) -> priced decode ms


@dataclass
class CategoryCeiling:
    requests: int = 0
    tokens: int = 0  # answer tokens after the first (the decode phase)
    plain_ms: float = 0.0
    suffix_ms: float = 0.0
    oracle_ms: float = 0.0
    long_ms: float = 0.0  # the oracle drafting only its runs of LONG_RUN or more
    replay_ms: float = 0.0  # Tandem's copy drafting replayed (0: not replayed)
    oracle_rounds: int = 0
    measured: dict = field(default_factory=lambda: defaultdict(lambda: [0, 0.0]))  # config -> [tokens, seconds]


def load_level(results_path: Path, concurrency: int | None) -> tuple[dict, dict]:
    """The results' header and its level at `concurrency` (the lowest where None)."""
    try:
        results = json.loads(Path(results_path).read_text())
    except (OSError, ValueError) as error:  # ValueError: not UTF-8, or not JSON
        raise TandemError(f"cannot read {results_path} as a bench-serve results.json ({error})") from None
    problem = _shape_problem(results)
    if problem:
        raise TandemError(f"{results_path} is not a bench-serve results.json: {problem}")
    levels = results["levels"]
    if not levels:
        raise TandemError(f"{results_path} holds no concurrency level")
    wanted = concurrency if concurrency is not None else min(level["concurrency"] for level in levels)
    for level in levels:
        if level["concurrency"] == wanted:
            return results, level
    raise TandemError(f"{results_path} has no level at concurrency {wanted}")


def _shape_problem(results) -> str | None:
    """What a results.json lacks that the ceiling reads, or None."""
    if not isinstance(results, dict):
        return f"a JSON object was expected, got {type(results).__name__}"
    if "scenarios" in results and "levels" not in results:
        return "a multiturn run's conversations have no concurrency levels to price (run bench-serve --prompts edits or long)"
    settings = results.get("settings")
    if not isinstance(settings, dict) or not all(isinstance(settings.get(key), str) for key in ("target", "prompts_file")):
        return "its settings name no target and prompts_file"
    levels = results.get("levels")
    if not isinstance(levels, list):
        return "it has no list of levels"
    for level in levels:
        if not isinstance(level, dict) or not isinstance(level.get("concurrency"), int) \
                or not isinstance(level.get("configs"), dict) or not level["configs"]:
            return "a level has no concurrency or no configs"
        for label, config in level["configs"].items():
            records = config.get("request_records") if isinstance(config, dict) else None
            if not isinstance(records, list) or not all(isinstance(r, dict) and "id" in r for r in records):
                return f"config {label!r} has no request records"
    return None


_CURVE_LINE = re.compile(r"verify curve at (\d+) cached tokens \(ms\): (.+)")


def curve_lines(curves: dict[int, CostModel]) -> list[str]:
    """One line per context, as bench-ceiling prints its curves (and `read_curves` reads them)."""
    return ["verify curve at %d cached tokens (ms): %s" % (context, ", ".join(
        f"{n}: {curve.cost_ms(n):.2f}" for n in sorted(curve.latency_ms))) for context, curve in sorted(curves.items())]


def read_curves(text: str) -> dict[int, CostModel]:
    """The curves in a previous bench-ceiling's output, by context: a run from another machine
    priced at that machine's costs."""
    curves = {}
    for number, line in enumerate(text.splitlines(), start=1):
        found = _CURVE_LINE.search(line)
        if not found:
            continue
        try:
            points = {int(n): float(ms) for n, ms in (pair.split(":") for pair in found.group(2).split(","))}
        except ValueError:
            raise TandemError(f"line {number}: a verify curve must read 'N: MS, ...', got {found.group(2)!r}") from None
        if not points or min(points) < 1 or min(points.values()) <= 0:
            raise TandemError(f"line {number}: a verify curve needs sizes >= 1 with positive times")
        curves[int(found.group(1))] = CostModel(points)
    if not curves:
        raise TandemError("no 'verify curve at N cached tokens (ms): ...' lines found")
    return curves


def first_pass(requests: list[dict]) -> list[dict]:
    return [r for r in requests if r.get("ok") and "~" not in str(r["id"])]


def check_inputs(results: dict, level: dict, reference: str | None) -> None:
    """What `ceilings` reads besides the curves, checked before they are measured (minutes): the
    answers of `reference` and the prompts file the results name."""
    answers_of(level, reference)
    load_prompts(results["settings"]["prompts_file"])


def answers_of(level: dict, reference: str | None) -> tuple[str, dict[str, str]]:
    configs = level["configs"]
    label = reference or next((c for c in configs if c.startswith("tandem")), next(iter(configs)))
    if label not in configs:
        raise TandemError(f"no config {label!r} in this level; it has {', '.join(configs)}")
    records = configs[label]["request_records"]
    texts = {r["id"]: r.get("text", "") for r in first_pass(records)}
    odd = next((prompt_id for prompt_id, text in texts.items() if not isinstance(text, str)), None)
    if odd is not None:  # a hand-edited file: transformers' ValueError deep in the tokenizer
        raise TandemError(f"the answer of request {odd!r} ({label}) is not a string: these results were edited "
                          "or are not bench-serve's")
    if not any(texts.values()):
        if records and not any(r.get("ok") for r in records):
            raise TandemError(f"all {len(records)} requests of {label} failed in this level (the first: "
                              f"{records[0].get('error')}): nothing to price")
        raise TandemError("these results keep no answer texts: rerun bench-serve with this version")
    return label, texts


@dataclass(frozen=True, slots=True)
class RecordedAnswer:
    """A first-pass answer of a run with its prompt, as the target's token ids."""

    prompt_id: str
    category: str
    prompt: tuple[int, ...]
    answer: list[int]


def recorded_answers(results: dict, level: dict, tokenizer, reference: str | None = None) -> tuple[str, list[RecordedAnswer]]:
    """The reference config's answers (`answers_of`) in the run's order, with their prompts as the
    bench formatted them; answers that are empty or whose prompt the file no longer has are left out."""
    prompts = {p.id: p for p in load_prompts(results["settings"]["prompts_file"])}
    label, texts = answers_of(level, reference)
    gone = [prompt_id for prompt_id in texts if prompt_id not in prompts]
    if gone:  # the table's counts say fewer requests than the run had: said, not silent
        print(f"note: {len(gone)} of the run's {len(texts)} answers are left out: their prompts are no longer in "
              f"{results['settings']['prompts_file']} ({', '.join(gone[:3])}{', ...' if len(gone) > 3 else ''})",
              file=sys.stderr)
    return label, [RecordedAnswer(prompt_id, prompts[prompt_id].category, format_prompt(tokenizer, prompts[prompt_id]),
                                  tokenizer.encode(text))
                   for prompt_id, text in texts.items() if prompt_id in prompts and text]


def ceilings(results: dict, level: dict, tokenizer, cost_ms: CostMs, reference: str | None,
             max_draft: int = MAX_DRAFT, replay: Replay | None = None) -> tuple[str, dict[str, CategoryCeiling]]:
    label, answers = recorded_answers(results, level, tokenizer, reference)
    table: dict[str, CategoryCeiling] = defaultdict(CategoryCeiling)
    pricing = ProgressBar(answers, desc="pricing the answers" + (" and replaying" if replay else ""),
                          unit="answer", file=sys.stderr, leave=False)
    with pricing:
        for recorded in pricing:
            prompt, answer = recorded.prompt, recorded.answer
            row = table[recorded.category]
            row.requests += 1
            row.tokens += max(0, len(answer) - 1)
            row.plain_ms += plain_ms(len(prompt), len(answer), cost_ms)
            row.suffix_ms += rounds_ms(suffix_rounds(prompt, answer, max_draft), cost_ms)
            oracle = oracle_rounds(prompt, answer, max_draft)
            row.oracle_ms += oracle_ms(oracle, cost_ms)
            row.long_ms += long_run_ms(oracle, cost_ms)
            row.oracle_rounds += len(oracle)
            if replay is not None:
                row.replay_ms += replay(prompt, answer)
    for config, run in level["configs"].items():
        for request in first_pass(run["request_records"]):
            category = request.get("category")
            decode_ms = (request.get("e2e_ms") or 0) - (request.get("ttft_ms") or 0)
            if category in table and decode_ms > 0 and request.get("completion_tokens"):
                table[category].measured[config][0] += request["completion_tokens"] - 1
                table[category].measured[config][1] += decode_ms / 1000
    return label, dict(table)


def render(table: dict[str, CategoryCeiling], configs: list[str]) -> list[str]:
    """Markdown: per category, the ceilings, Tandem's drafting replayed where it was (against the
    ceiling), and each config's decode rate against the ceiling (and, in brackets, against the
    long-run ceiling)."""
    replayed = any(row.replay_ms for row in table.values())
    head = (f"| category | requests | answer tokens | plain tok/s | suffix-3 tok/s | ceiling tok/s | tokens/round "
            f"| runs >= {LONG_RUN} only |" + (" drafting replayed tok/s | / ceiling |" if replayed else ""))
    rule = "|---|---:|---:|---:|---:|---:|---:|---:|" + ("---:|---:|" if replayed else "")
    for config in configs:
        head += f" {config} tok/s | / ceiling |"
        rule += "---:|---:|"
    lines = [head, rule]
    total = CategoryCeiling()
    for category, row in sorted(table.items()) + [("all", None)]:
        if row is None:
            row = total
        else:
            for name in ("requests", "tokens", "plain_ms", "suffix_ms", "oracle_ms", "long_ms", "replay_ms",
                         "oracle_rounds"):
                setattr(total, name, getattr(total, name) + getattr(row, name))
            for config, (tokens, seconds) in row.measured.items():
                total.measured[config][0] += tokens
                total.measured[config][1] += seconds
        rate = lambda ms: row.tokens / (ms / 1000) if ms else 0.0  # noqa: E731
        plain, suffix, ceiling, long = rate(row.plain_ms), rate(row.suffix_ms), rate(row.oracle_ms), rate(row.long_ms)
        line = (f"| {category} | {row.requests} | {row.tokens} | {plain:.1f} | {suffix:.1f} ({suffix / plain:.2f}x) "
                f"| {ceiling:.1f} ({ceiling / plain:.2f}x) | {row.tokens / max(1, row.oracle_rounds):.1f} "
                f"| {long:.1f} ({long / plain:.2f}x) |"
                if plain else f"| {category} | {row.requests} | 0 | | | | | |")
        if replayed:
            replay = rate(row.replay_ms)
            shown = replay and ceiling and long
            line += f" {replay:.1f} | {replay / ceiling:.2f} ({replay / long:.2f}) |" if shown else " | |"
        for config in configs:
            tokens, seconds = row.measured.get(config, (0, 0.0))
            measured = tokens / seconds if seconds else 0.0
            line += (f" {measured:.1f} | {measured / ceiling:.2f} ({measured / long:.2f}) |"
                     if ceiling and long and measured else " | |")
        lines.append(line)
    return lines
