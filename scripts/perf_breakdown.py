"""Where a server's CPU time went, by kind of work, from `perf record` files (`serve_ab.py --perf`).

Each sample goes to what its call stack was doing: the weights' matrix products (Q4_K and
Q6_K), attention, quantizing activations; else, by its innermost library, OpenMP's barriers,
Python, the kernel, the rest of ggml, and everything else. Files whose names differ only in a
last `-N` (the repeat) are summed into one column: `tandem-spec-0.data` and `tandem-spec-1.data`
make `tandem-spec`.

    .venv/bin/python scripts/perf_breakdown.py serve-ab-results/perf/*.data

Samples are CPU time (perf's cpu-clock, where a VM has no hardware counters), so a column
shrinks or grows with the machine's speed during its run as much as with its work: compare
shares, and the ratio of a kind of work the two sides do the same amount of (the weights'
matrix products, for the same tokens scored) to the rest.
"""

import argparse
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path

KINDS = (  # (kind, words any of which in a frame's symbol or library puts a sample there), first match wins
    ("matmul Q4_K, 4+ rows (gemm)", ("gemm_q4",)),
    ("matmul Q4_K, row by row (gemv)", ("gemv_q4",)),
    ("matmul Q6_K", ("q6_k",)),
    ("attention", ("flash_attn", "tiled_run_micro", "tiled_unpack", "vec_dot_f16", "soft_max")),
    ("quantizing activations", ("quantize",)),
)
FALLBACKS = (  # where no frame of a sample names one of KINDS: by the library of its innermost frame
    ("OpenMP barriers (libgomp)", "libgomp"),
    ("Python", "python"),
    ("kernel", "[kernel"),
    ("other ggml", "ggml"),
)
OTHER = "other"


def kind_of(frames: list[tuple[str, str]]) -> str:
    """A sample's kind from its call stack [(symbol, library)], innermost first: the innermost frame
    that names one of KINDS (a stripped library's unnamed helper counts for the named function that
    called it; libc's memcpy under attention counts as attention), else by the innermost library."""
    for symbol, _ in frames:
        text = symbol.lower()
        kind = next((kind for kind, words in KINDS if any(word in text for word in words)), None)
        if kind:
            return kind
    library = frames[0][1].lower() if frames else ""
    return next((kind for kind, word in FALLBACKS if word in library), OTHER)


def _frames(sample: list[str]) -> list[tuple[str, str]]:
    """`perf script` lines of one sample's stack ("ip symbol+offset (library)") as (symbol, library)."""
    frames = []
    for line in sample:
        parts = line.strip().split(" ", 1)
        if len(parts) < 2:
            continue
        symbol, _, library = parts[1].rpartition(" (")
        library = Path(library.rstrip(")")).name  # its file name: a venv's path says "python"
        frames.append(("" if symbol == "[unknown]" else symbol.split("+0x")[0], library))
    return frames


def samples_by_kind(data: Path) -> Counter:
    """Samples of one perf.data file, by kind."""
    return count_kinds(subprocess.run(["perf", "script", "-i", str(data)], capture_output=True, text=True,
                                      check=True).stdout)


def count_kinds(script: str) -> Counter:
    """Samples by kind in `perf script` text: per sample a header line, then its stack, one
    indented frame a line, innermost first."""
    counts: Counter = Counter()
    sample: list[str] = []
    for line in [*script.splitlines(), ""]:
        if line.startswith(("\t", " ")):
            sample.append(line)
        elif sample or not line:
            if sample:
                counts[kind_of(_frames(sample))] += 1
            sample = []
    return counts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+", type=Path, help="perf.data files, named <server>-<repeat>.data")
    args = parser.parse_args()
    columns: dict[str, Counter] = defaultdict(Counter)
    for data in args.files:
        if not data.is_file():
            print(f"error: no file {data}", file=sys.stderr)
            return 2
        server, _, repeat = data.stem.rpartition("-")
        columns[server if server and repeat.isdigit() else data.stem] += samples_by_kind(data)
    names = list(columns)
    totals = {name: sum(columns[name].values()) for name in names}
    kinds = [kind for kind, _ in KINDS] + [kind for kind, _ in FALLBACKS] + [OTHER]
    print(f"| kind | {' | '.join(names)} |")
    print(f"|---|{'---:|' * len(names)}")
    for kind in kinds:
        if any(columns[name][kind] for name in names):
            cells = (f"{columns[name][kind]:,} ({100 * columns[name][kind] / totals[name]:.1f}%)" for name in names)
            print(f"| {kind} | {' | '.join(cells)} |")
    print(f"| **all** | {' | '.join(f'{totals[name]:,}' for name in names)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
