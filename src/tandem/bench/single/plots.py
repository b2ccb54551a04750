"""PNG plots of a results dict: speedup, acceptance by draft position, per-prompt latency."""

from pathlib import Path

import numpy as np

from tandem.bench.plotting import DPI, pyplot

def write_plots(results: dict, out_dir: Path) -> list[Path]:
    plt = pyplot()
    written = []
    for name, draw in (("speedup.png", plot_speedup), ("acceptance_by_position.png", plot_acceptance),
                       ("latency.png", plot_latency)):
        fig = draw(plt, results)
        path = out_dir / name
        fig.savefig(path, dpi=DPI, bbox_inches="tight")
        plt.close(fig)
        written.append(path)
    return written


def _baseline(results: dict) -> str:
    return results["baseline"] or next(iter(results["configs"]))


def plot_speedup(plt, results: dict):
    """Grouped bars: speedup vs the baseline, overall and per category, one bar per config."""
    base = _baseline(results)
    labels = [label for label in results["configs"] if label != base]
    groups = ["all"] + list(results["categories"])
    base_ms = [results["configs"][base]["ms_per_token"]] + [
        results["categories"][c][base]["ms_per_token"] for c in groups[1:]]
    fig, ax = plt.subplots(figsize=(max(6.0, 0.25 * len(groups) * len(labels) + 3), 4.5))
    width = 0.8 / max(1, len(labels))
    x = np.arange(len(groups))
    highest = 1.0
    for i, label in enumerate(labels):
        ms = [results["configs"][label]["ms_per_token"]] + [
            results["categories"][c][label]["ms_per_token"] for c in groups[1:]]
        values = [b / m if b and m else 0.0 for b, m in zip(base_ms, ms)]
        highest = max([highest] + values)
        bars = ax.bar(x + (i - (len(labels) - 1) / 2) * width, values, width, label=label)
        ax.bar_label(bars, fmt="%.2f", fontsize=7, padding=1)
    ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
    ax.set_xticks(x, groups, rotation=20, ha="right")
    ax.set_ylim(0, highest * 1.12)
    ax.set_ylabel(f"speedup vs {base} (ms/token ratio)")
    ax.set_title(f"Speedup vs {base}: overall and by category")
    if labels:  # one config alone has nothing to compare (matplotlib warned of an empty legend)
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    else:
        ax.text(0.5, 0.5, f"only {base}: nothing to compare", ha="center", transform=ax.transAxes)
    return fig


def plot_acceptance(plt, results: dict):
    fig, ax = plt.subplots(figsize=(7, 4.5))
    plotted = False
    for label, summary in results["configs"].items():
        points = [p for p in summary["acceptance_by_position"] or [] if p["rate"] is not None]
        if points:
            ax.plot([p["position"] + 1 for p in points], [p["rate"] for p in points], marker="o", label=label)
            plotted = True
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_xlabel("draft position (1 = first draft token)")
    ax.set_ylabel("acceptance rate (rounds accepting / rounds drafting)")
    ax.set_ylim(0, 1.05)
    ax.set_title("Acceptance by draft position")
    if plotted:
        ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, "no draft tokens in this run", ha="center", transform=ax.transAxes)
    return fig


def plot_latency(plt, results: dict):
    labels = list(results["configs"])
    data = [[1000 * p["seconds"] / p["new_tokens"] for p in results["configs"][label]["prompts"]
             if p["new_tokens"]] for label in labels]
    fig, ax = plt.subplots(figsize=(max(6.0, 1.1 * len(labels) + 2), 4.5))
    ax.boxplot(data, showmeans=True)
    ax.set_xticks(range(1, len(labels) + 1), labels, rotation=20, ha="right")
    ax.set_ylabel("ms per new token (per prompt)")
    ax.set_title("Per-prompt latency (box: quartiles, triangle: mean)")
    ax.grid(axis="y", alpha=0.3)
    return fig
