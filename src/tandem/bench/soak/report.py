"""A soak's outputs: results.json (settings, every sample, the tally, the checks), report.md (the
checks and the sample table) and soak.png (memory, descriptors, threads and KV slots over time)."""

import json
from dataclasses import asdict
from pathlib import Path

from tandem.bench.machine import machine_info, machine_line
from tandem.bench.plotting import DPI, pyplot
from tandem.bench.soak.run import SoakResult
from tandem.bench.soak.verdict import Check

PANELS = (  # sample field, y label, scale
    ("rss_bytes", "resident memory (MiB)", 1 / 2**20),
    ("open_fds", "open file descriptors", 1.0),
    ("threads", "threads", 1.0),
    ("kv_slots_in_use", "KV slots held", 1.0),
)


def results_json(result: SoakResult, checks: list[Check], command: str) -> dict:
    settings = {k: v for k, v in asdict(result.settings).items() if k not in ("prompts", "api_key")}
    tally = asdict(result.tally)
    return {"command": command, "machine": machine_info(), "settings": settings, "prompts": len(result.settings.prompts),
            "load_seconds": round(result.load_seconds, 1),
            "completion_tok_s": round(result.tally.completion_tokens / result.load_seconds, 2),
            "tally": tally, "checks": [asdict(c) for c in checks], "passed": all(c.passed for c in checks),
            "samples": [s.to_json() for s in result.samples]}


def report_markdown(results: dict) -> str:
    s, t = results["settings"], results["tally"]
    lines = [f"# Soak: {s['concurrency']} clients for {s['duration_s'] / 60:g} min", "",
             *([f"**Interrupted** after {results['samples'][-1]['elapsed_s'] / 60:.1f} min: the samples so far, "
                "without the idle phase, so not passed.", ""] if results.get("interrupted") else []),
             *([f"**The server stopped answering**: {t['server_lost']}. The samples before it are below; "
                "its log says why.", ""] if t.get("server_lost") else []),
             f"Command: `{results['command']}`", "",
             *([f"The machine that generated the load (the server's too, unless --url pointed elsewhere): "
                f"{machine_line(results['machine']).removeprefix('machine: ')}.", ""] if results.get("machine") else []),
             f"{t['done']} requests ({t['abandoned']} abandoned after their first token, {t['errors']} failed), "
             f"{t['completion_tokens']} completion tokens, {results['completion_tok_s']} tok/s.", "",
             "| check | passed | figure |", "|---|---|---|"]
    lines += [f"| {c['name']} | {'yes' if c['passed'] else '**no**'} | {c['figure']} |" for c in results["checks"]]
    lines += ["", "| minute | phase | requests | errors | RSS MiB | prompt cache MiB | drafting memory MiB "
              "| fds | threads | KV slots | running |", "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for x in results["samples"]:
        mib = [_mib(x.get(k)) for k in ("rss_bytes", "prompt_cache_bytes", "drafting_memory_bytes")]
        cells = [f"{x['elapsed_s'] / 60:.1f}", x["phase"], x["requests_done"], x["errors"], *mib,
                 *(_count(x[k]) for k in ("open_fds", "threads", "kv_slots_in_use", "running"))]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines) + "\n"


def write_outputs(results: dict, out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / "results.json", out_dir / "report.md", out_dir / "soak.png"]
    paths[0].write_text(json.dumps(results, indent=2) + "\n")
    paths[1].write_text(report_markdown(results))
    _plot(results, paths[2])
    return paths


def _plot(results: dict, path: Path) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(len(PANELS), 1, figsize=(7, 8), sharex=True)
    samples = results["samples"]
    for ax, (field, label, scale) in zip(axes, PANELS):
        points = [(x["elapsed_s"] / 60, x[field] * scale) for x in samples if x[field] is not None]
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", markersize=3)
        ax.set_ylabel(label, fontsize=8)
        ax.grid(alpha=0.3)
        if field != "rss_bytes":
            ax.set_ylim(bottom=0)
    axes[-1].set_xlabel("minutes (the last point: idle, after the clients stopped)")
    s = results["settings"]
    axes[0].set_title(f"tandem soak: {s['concurrency']} clients, {s['duration_s'] / 60:g} min, "
                      f"{results['tally']['done']} requests, {results['tally']['errors']} errors", fontsize=9)
    fig.savefig(path, dpi=DPI, bbox_inches="tight")
    plt.close(fig)


def _count(value) -> str:
    return "" if value is None else f"{value:.0f}"


def _mib(value) -> str:
    return "" if value is None else f"{value / 2**20:.0f}"
