"""`report.md`: the results as markdown tables, built from the `results.json` dict alone."""

from tandem.bench.markdown import markdown_table, number_cell, percent_cell, speedup_cell
from tandem.bench.single.results import CATEGORY_REFERENCES

MAX_POSITIONS_SHOWN = 8
MAX_DIVERGENCES_SHOWN = 5


def _acceptance(summary: dict) -> str:
    if summary["drafted"] == 0:
        return "no drafts"
    return percent_cell(summary["acceptance_rate"])


def main_table(results: dict) -> list[str]:
    refs = ["none"] + results["peers"]
    gpu = any(s["peak_gpu_mb"] is not None for s in results["configs"].values())
    header = ["config", "ms/token", "p50", "p90", "p99", "tok/s", "acceptance", "mean acc. len"]
    header += [f"vs {ref}" for ref in refs] + ["process peak RSS MiB"] + (["peak GPU MB"] if gpu else [])
    rows = []
    for label, s in results["configs"].items():
        row = [label, number_cell(s["ms_per_token"]), number_cell(s["p50_ms_per_token"]),
               number_cell(s["p90_ms_per_token"]), number_cell(s["p99_ms_per_token"]), number_cell(s["tokens_per_s"]), _acceptance(s),
               number_cell(s["mean_accepted_len"], 2)]
        row += ["1.00x" if ref == label else speedup_cell(s["speedup"].get(ref)) for ref in refs]
        row += [number_cell(s["peak_rss_mb"], 0)] + ([number_cell(s["peak_gpu_mb"], 0)] if gpu else [])
        rows.append(row)
    return markdown_table(header, rows)


def category_tables(results: dict) -> list[str]:
    labels = list(results["configs"])
    lines = []
    for ref in CATEGORY_REFERENCES:
        if ref not in labels:
            continue
        rows = [[category] + [speedup_cell(cells[label]["speedup"].get(ref, 1.0 if label == ref else None))
                              for label in labels]
                for category, cells in results["categories"].items()]
        lines += ["", f"Speedup vs {ref} by category:", ""] + markdown_table(["category"] + labels, rows)
    rows = [[category] + [number_cell(cells[label]["ms_per_token"]) for label in labels]
            for category, cells in results["categories"].items()]
    return lines + ["", "ms/token by category:", ""] + markdown_table(["category"] + labels, rows)


def time_split_table(results: dict) -> list[str]:
    rows = [[label] + [percent_cell(t[part]) for part in ("prefill", "draft", "verify", "overhead")]
            + [number_cell(t["wall_s"], 2), number_cell(t["decode_ms_per_token"], 1)]
            for label, s in results["configs"].items() if (t := s["time_split"])]
    if not rows:
        return ["(no Tandem config)"]
    return markdown_table(["config", "prefill", "draft", "verify", "overhead", "wall s", "decode ms/token"], rows)


def acceptance_table(results: dict) -> list[str]:
    rows = []
    for label, s in results["configs"].items():
        positions = s["acceptance_by_position"] or []
        if positions:
            cells = [f"{percent_cell(p['rate'])} ({p['accepted']}/{p['drafted']})" for p in positions]
            rows.append([label] + (cells + [""] * MAX_POSITIONS_SHOWN)[:MAX_POSITIONS_SHOWN])
    header = ["config"] + [f"pos {i + 1}" for i in range(MAX_POSITIONS_SHOWN)]
    if not rows:
        return ["(no drafts)"]
    deepest = max(len(s["acceptance_by_position"] or []) for s in results["configs"].values())
    more = (["", f"Positions {MAX_POSITIONS_SHOWN + 1} to {deepest} are left out here; results.json holds them."]
            if deepest > MAX_POSITIONS_SHOWN else [])
    return markdown_table(header, rows) + more


def match_table(results: dict) -> list[str]:
    refs = [ref for ref in ("none", "llamacpp-plain", "hf-generate") if ref in results["configs"]]
    rows = []
    for label, s in results["configs"].items():
        rows.append([label] + [_match_cell(s["match"].get(ref)) for ref in refs])
    return markdown_table(["config"] + [f"= {ref}" for ref in refs], rows) if refs else ["(no reference config)"]


def _match_cell(match: dict | None) -> str:
    if match is None:
        return "—"
    cell = f"{percent_cell(match['rate'])} ({match['matched']}/{match['prompts']})"
    shown = match["divergences"][:MAX_DIVERGENCES_SHOWN]
    if shown:
        more = "…" if len(match["divergences"]) > len(shown) else ""
        cell += "; first diff " + ", ".join(f"{d['id']}@{d['first_diff']}" for d in shown) + more
    return cell


def render_report(results: dict) -> str:
    settings, machine = results["settings"], results["machine"]
    lines = ["# Tandem benchmark", "", f"`{results['command']}`", ""]
    finished = results.get("interrupted_after_prompts")
    if finished is not None:
        lines += [f"**Interrupted**: the first {finished} of {settings['prompts']} prompts, which every "
                  "configuration finished.", ""]
    draft = f"draft `{settings['draft']}`" if settings.get("draft") else "no draft model (no configuration uses one)"
    lines += [f"{settings['prompts']} prompts from `{settings['prompts_file']}`, {settings['max_tokens']} "
              f"greedy tokens max, {settings['warmup']} warm-up prompt(s); target `{settings['target']}`, "
              f"{draft}. ms/token = total time / total new tokens, prompt "
              "processing included; p50/p90/p99 over per-prompt ms/token (with fewer than 100 prompts a p99 "
              "lies between the two largest); mean acc. len = accepted draft tokens per round that drafted, the "
              "bonus token not counted (vLLM's mean acceptance length counts it: add 1).", ""]
    lines += main_table(results)
    lines += ["", "## By category"] + category_tables(results)
    lines += ["", "## Time split (share of wall time)", ""] + time_split_table(results)
    lines += ["", "## Acceptance by draft position", ""] + acceptance_table(results)
    lines += ["", "## Greedy match (same token ids as the reference)", ""] + match_table(results)
    curves = results.get("cost_curves_ms") or {}
    lines += ["", "## Runner cost curves (ms per forward of n tokens, as the depth policy saw them)", ""]
    for role, curve in curves.items():
        lines.append(f"- {role}: " + ", ".join(f"{n}: {ms:.1f}" for n, ms in curve.items()))
    lines += ["", "## Machine", ""] + [f"- {key}: {value}" for key, value in machine.items()]
    return "\n".join(lines) + "\n"
