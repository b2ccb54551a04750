"""`scaling.json`, `scaling.md` and `scaling.png` of a sweep (scaling.py), from its dict alone."""

import json
from pathlib import Path

from tandem.bench.plotting import DPI, pyplot

LABELS = {"independent": "simulated, each replica an engine behind the router"}


def write_scaling(result: dict, out_dir: str | Path) -> list[Path]:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / "scaling.json", out_dir / "scaling.md", out_dir / "scaling.png"]
    paths[0].write_text(json.dumps(result, indent=1))
    paths[1].write_text(scaling_markdown(result))
    _plot(result, paths[2])
    return paths


def scaling_markdown(result: dict) -> str:
    options = result["options"]
    intro = ("Simulated by `tandem simulate --scaling` (a discrete-event simulation, not a measurement) on "
             f"{profile_note(result)}. Closed loop at the planned load: one client per planned batch slot, "
             f"{options['waves']} requests each, {options['output_tokens']} output tokens, prompts "
             f"{options['prompt_tokens']}; k from the {options['k']}; fused batches on accelerators: "
             f"{options['fused']}; seed {options['seed']}.")
    header = ("| devices | workers | plan | mode | planned tok/s | steady tok/s | whole-run tok/s | p50 latency ms "
              "| p99 latency ms | p50 ITL ms | mean k | utilisation |")
    rule = "|---:|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|"
    lines = [f"# Scaling: {result['cluster']}", "", intro, "", header, rule]
    lines += [_row(row) for row in result["rows"]]
    lines += ["", ("Planned tok/s is the planner's analytic prediction at saturation (cluster/planning/prediction.py); "
                   "the simulation adds prefill, admission, ramp-up and the router's placement. Steady tok/s counts "
                   "tokens until the last request was sent (full load); whole-run tok/s divides all tokens by the "
                   "whole run, as `tandem bench-serve` does, so it also pays for the tail in which slow replicas "
                   "finish their last requests while fast ones idle."),
              "", "## Profiles", ""]
    for key, profile in result["profiles"].items():
        note = f": {profile['citation']}" if profile["citation"] else ""
        lines.append(f"- `{key}`: {profile['source']}{note}")
    return "\n".join(lines) + "\n"


def profile_note(result: dict) -> str:
    sources = {p["source"] for p in result["profiles"].values()}
    if sources == {"public-spec"}:
        return "public-spec profiles (DERIVED by roofline from published peak numbers, not measured)"
    if sources == {"measured"}:
        return "measured profiles"
    return "measured and public-spec (DERIVED, not measured) profiles"


def steady(row: dict) -> float:
    """Throughput under full load; the whole run's where the run never was at full load."""
    return row["steady_tok_s"] if row["steady_tok_s"] is not None else row["throughput_tok_s"]


def _row(row: dict) -> str:
    workers = ", ".join(f"{n} {name}" for name, n in row["workers"].items())
    busy = ", ".join(f"{name} {u:.0%}" for name, u in row["utilisation"].items())
    cells = [str(row["devices"]), workers, row["plan"]["drafter"], row["mode"],
             f"{row['plan']['predicted_tok_s']:,.0f}", f"{steady(row):,.0f}", f"{row['throughput_tok_s']:,.0f}",
             f"{row['latency_ms']['p50']:,.0f}", f"{row['latency_ms']['p99']:,.0f}", f"{row['itl_ms']['p50']:.1f}",
             f"{row['mean_k']:.2f}", busy]
    return "| " + " | ".join(cells) + " |"


def _plot(result: dict, path: Path) -> None:
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.5))
    modes = list(dict.fromkeys(row["mode"] for row in result["rows"]))
    for mode in modes:
        rows = [r for r in result["rows"] if r["mode"] == mode]
        devices = [r["devices"] for r in rows]
        left.plot(devices, [steady(r) for r in rows], marker="o", label=LABELS.get(mode, mode))
        right.plot(devices, [r["latency_ms"]["p50"] for r in rows], marker="o", label=LABELS.get(mode, mode))
    planned = [r for r in result["rows"] if r["mode"] == modes[0]]
    left.plot([r["devices"] for r in planned], [r["plan"]["predicted_tok_s"] for r in planned],
              linestyle="--", color="grey", label="planner's prediction")
    for ax, ylabel in ((left, "output tokens / s under full load"), (right, "p50 request latency (ms)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("devices")
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
    left.set_yscale("log")
    left.legend(fontsize=8)
    left.set_title("Throughput vs devices (simulated)")
    right.set_title("p50 latency vs devices (simulated)")
    fig.suptitle(f"{result['cluster']}: simulated on {profile_note(result)}", fontsize=9)
    fig.savefig(path, dpi=DPI, bbox_inches="tight")
    plt.close(fig)
