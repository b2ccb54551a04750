"""`report.md` of a serving benchmark, built from the `results.json` dict alone."""

from tandem.bench.markdown import markdown_table, number_cell, percent_cell, speedup_cell
from tandem.bench.serve.server_kinds import SERVER_KINDS

DEFINITIONS = (
    "Closed loop: C clients each send their next request as soon as the last one ends. "
    "tok/s = completion tokens / wall time of the run; TTFT = time to the first streamed token; "
    "ITL = gap between streamed token chunks (Tandem streams each round's accepted tokens in one "
    "chunk); TPOT = (last chunk's arrival - first's) / (completion tokens - 1); e2e = whole request. "
    "p50/p99 over requests (ITL: over all gaps), linear between ranks: with fewer than 100 requests "
    "a p99 lies between the two largest. Ratios \"a vs b\" are oriented so that > 1 means a did "
    "better: throughput a/b, latencies b/a; no ITL ratio (—) where the two streamed more than 10% "
    "apart in tokens a chunk."
)


def _levels(results: dict) -> list[dict]:
    return results["levels"]


def _acceptance(summary: dict) -> str:
    return "no drafts" if summary["drafted"] == 0 else percent_cell(summary["acceptance_rate"])


def throughput_table(results: dict) -> list[str]:
    header = ["completion tok/s"] + [f"C={level['concurrency']}" for level in _levels(results)]
    rows = [[label] + [number_cell(level["configs"].get(label, {}).get("throughput_tok_s"))
                       for level in _levels(results)]
            for label in results["configs"]]
    return markdown_table(header, rows)


def level_table(results: dict, level: dict) -> list[str]:
    header = ["config", "requests", "errors", "tok/s", "req/s", "TTFT p50 ms", "TTFT p99 ms", "ITL p50 ms",
              "ITL p99 ms", "tok/chunk", "TPOT p50 ms", "e2e p50 s", "e2e p99 s", "acceptance", "in flight peak/mean"]
    rows = []
    for label in results["configs"]:
        s = level["configs"].get(label)
        if s is None:
            continue
        rows.append([label, str(s["requests"]), str(s["errors"]), number_cell(s["throughput_tok_s"]),
                     number_cell(s["requests_per_s"], 2), number_cell(s["ttft_ms_p50"]), number_cell(s["ttft_ms_p99"]),
                     number_cell(s["itl_ms_p50"]), number_cell(s["itl_ms_p99"]),
                     number_cell(s.get("tokens_per_chunk"), 2), number_cell(s["tpot_ms_p50"]),
                     number_cell(s["e2e_s_p50"], 2), number_cell(s["e2e_s_p99"], 2), _acceptance(s),
                     f"{s['peak_in_flight']}/{number_cell(s['mean_in_flight'], 1)}"])
    return markdown_table(header, rows)


def ratio_table(level: dict) -> list[str]:
    if not level["ratios"]:
        return []
    rows = [[f"{r['a']} vs {r['b']}"] + [speedup_cell(r[key]) for key in ("throughput", "ttft_p50", "itl_p50", "tpot_p50", "e2e_p50")]
            for r in level["ratios"]]
    return [""] + markdown_table(["ratio", "throughput", "TTFT p50", "ITL p50", "TPOT p50", "e2e p50"], rows)


def source_table(level: dict) -> list[str]:
    """Per Tandem config, the draft sources its rounds used (what hybrid chose, and how each did)."""
    rows = []
    for label, s in level["configs"].items():
        for source, counts in (s.get("draft_sources") or {}).items():
            rate = counts["accepted"] / counts["drafted"] if counts["drafted"] else None
            rows.append([label, source, str(counts["rounds"]), str(counts["drafted"]), str(counts["accepted"]),
                         "no drafts" if rate is None else percent_cell(rate)])
    if not rows:
        return []
    return ["", "Draft sources (rounds offered by each source; draft tokens the planner gave it):", ""] + markdown_table(
        ["config", "source", "rounds", "drafted", "accepted", "acceptance"], rows)


def step_table(level: dict) -> list[str]:
    """Per Tandem config, its engine steps against the run's wall time (what is outside the steps
    is the server's own: HTTP, detokenizing, hand-offs, idle waits)."""
    rows = []
    for label, s in level["configs"].items():
        steps = s.get("engine_steps")
        if not steps:
            continue
        rows.append([label, str(steps["steps"]), str(steps["prompt_steps"]), number_cell(steps["step_s"], 1),
                     number_cell(steps["draft_s"], 1), number_cell(steps["verify_s"], 1),
                     number_cell(s["wall_s"] - steps["step_s"], 1)])
    if not rows:
        return []
    return ["", "Engine steps (the server's /metrics; wall time outside them is HTTP, detokenizing, hand-offs, "
            "idle waits):", ""] + markdown_table(["config", "steps", "with prompt tokens", "s in steps", "drafting s",
                                        "verify s", "outside steps s"], rows)


def error_lines(results: dict) -> list[str]:
    lines = []
    for level in _levels(results):
        for label, s in level["configs"].items():
            lines += [f"- C={level['concurrency']} {label}: {error}" for error in s["error_samples"]]
    return ["", "## Errors (first few per run)", ""] + lines if lines else []


def _per_level(settings: dict) -> str:
    return ", ".join(f"{n} at C={c}" for c, n in settings["requests_per_level"].items())


def _spread(settings: dict) -> str:
    spread = settings.get("max_tokens_spread", 0)  # absent from reports made before the option
    return f" ± {spread} (varied per request)" if spread else ""


def render_report(results: dict) -> str:
    settings = results["settings"]
    lines = ["# Tandem serving benchmark", "", f"`{results['command']}`", ""]
    if results.get("interrupted"):
        lines += ["**Interrupted**: only the levels every server finished are here.", ""]
    drafted = any(label in SERVER_KINDS and SERVER_KINDS[label].needs_draft for label in results["configs"])
    draft = f", draft `{settings['draft']}`" if drafted else " (no config drafts with a model)"
    lines += [f"Target `{settings['target']}`{draft}, CPU threads per server: "
              f"{settings['threads']}; up to {settings['max_tokens']}{_spread(settings)} greedy tokens per request; prompts from "
              f"`{settings['prompts_file']}`, requests per level: {_per_level(settings)}.", "",
              DEFINITIONS, ""]
    lines += ["## Servers", ""]
    lines += [f"- **{label}**: {info['notes']}.  \n  `{' '.join(info['command'])}`"
              for label, info in results["servers"].items()]
    lines += ["", "## Throughput (completion tokens/s)", ""] + throughput_table(results)
    for level in _levels(results):
        order = ", ".join(level["order"])
        lines += ["", f"## Concurrency {level['concurrency']}", "",
                  f"Servers took turns request by request, the order rotating each request from: {order}."
                  if level["concurrency"] == 1 else f"Run order: {order}.", ""]
        repeated = settings.get("repeats_per_level", {}).get(str(level["concurrency"]), 0)
        if repeated:
            lines += [f"**{repeated} of the level's requests take a prompt again** (marked, so no cache answers "
                      "them; their greedy answers are the earlier ones, which a server drafting from its "
                      "earlier answers copies).", ""]
        lines += level_table(results, level) + ratio_table(level) + source_table(level) + step_table(level)
    lines += error_lines(results)
    lines += ["", "## Machine", ""] + [f"- {key}: {value}" for key, value in results["machine"].items()]
    return "\n".join(lines) + "\n"
