"""PNG plots of a serving results dict: throughput, TTFT and ITL against concurrency, per config."""

from pathlib import Path

from tandem.bench.plotting import DPI, pyplot

PLOTS = (
    # file name, figure key prefix (None = throughput), y label, title
    ("throughput.png", None, "completion tokens / s", "Throughput vs concurrency"),
    ("ttft.png", "ttft_ms", "time to first token (ms)", "TTFT vs concurrency (solid p50, dashed p99)"),
    ("itl.png", "itl_ms", "inter-token latency (ms)", "ITL vs concurrency (solid p50, dashed p99)"),
)


def write_plots(results: dict, out_dir: Path) -> list[Path]:
    plt = pyplot()
    written = []
    for name, key, ylabel, title in PLOTS:
        fig = plot_throughput(plt, results) if key is None else plot_percentiles(plt, results, key)
        _finish(fig.axes[0], ylabel, title, results)
        path = out_dir / name
        fig.savefig(path, dpi=DPI, bbox_inches="tight")
        plt.close(fig)
        written.append(path)
    return written


def _series(results: dict, label: str, key: str) -> tuple[list[int], list[float]]:
    points = [(level["concurrency"], level["configs"][label].get(key)) for level in results["levels"]
              if label in level["configs"]]
    points = [(c, v) for c, v in points if v is not None]
    return [c for c, _ in points], [v for _, v in points]


def plot_throughput(plt, results: dict):
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label in results["configs"]:
        ax.plot(*_series(results, label, "throughput_tok_s"), marker="o", label=label)
    return fig


def plot_percentiles(plt, results: dict, key: str):
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for index, label in enumerate(results["configs"]):
        color = f"C{index}"
        ax.plot(*_series(results, label, f"{key}_p50"), marker="o", color=color, label=f"{label} p50")
        ax.plot(*_series(results, label, f"{key}_p99"), marker="x", color=color, linestyle="--",
                label=f"{label} p99")
    return fig


def _finish(ax, ylabel: str, title: str, results: dict) -> None:
    levels = [level["concurrency"] for level in results["levels"]]
    ax.set_xscale("log", base=2)
    ax.set_xticks(levels, [str(c) for c in levels])
    ax.minorticks_off()
    ax.set_xlabel("concurrent clients")
    ax.set_ylabel(ylabel)
    ax.set_ylim(bottom=0)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
