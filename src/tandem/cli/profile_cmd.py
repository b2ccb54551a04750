"""`tandem profile`: measure cost curves of a model on a device and save a `DeviceProfile`.

`--model/--backend/--device` profiles one (model, backend, device); `--cluster FILE` profiles
every distinct (model, backend, device, dtype, threads) its workers run, skipping workers with a
public-spec hardware class or a profile file named in the cluster file, and profiles already
saved (unless --force). Profiles go to $TANDEM_HOME/profiles/devices/ unless --out is given,
which is where `tandem plan` looks. The progress bar goes to stderr, the saved paths to stdout.
"""

import argparse
import sys
from pathlib import Path

from tandem.cli.given import StoreGiven, given_options
from tandem.cli.int_list import int_list, thread_count, whole_number
from tandem.cluster.profiles.measure import ProfileGrid, measure_profile
from tandem.cluster.profiles.profile import load_profile, save_profile
from tandem.cluster.profiles.profile_store import default_profile_path, worker_models
from tandem.cluster.profiles.public_profiles import DEVICE_CLASSES
from tandem.cluster.config.load import load_cluster
from tandem.errors import InterruptSaid, TandemError
from tandem.models.backends import RunnerSpec

_GRID = ProfileGrid()


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "profile", help="measure a model's cost curves on a device",
        description="Measure the ms one forward call takes to score n new tokens per sequence, at several context "
                    "lengths and batch sizes, plus memory, and save the device profile (by default under "
                    "$TANDEM_HOME/profiles/devices/, where `tandem plan` looks). --cluster profiles every distinct "
                    "worker of a cluster file. A Ctrl-C keeps nothing: a profile is written whole or not at all.")
    parser.register("action", None, StoreGiven)  # --cluster refuses the one-model options given, defaults or not
    parser.add_argument("--model", help="catalog name, .gguf file or HF folder")
    parser.add_argument("--backend", default="llamacpp", help="llamacpp | torch (default llamacpp)")
    parser.add_argument("--device", default="cpu", help="cpu, cuda:0, npu:0, ... (default cpu)")
    parser.add_argument("--dtype", default="fp32", help="torch dtype: fp32 | bf16 | fp16 (default fp32)")
    parser.add_argument("--threads", type=thread_count, default=None, help="CPU threads (default: all)")
    parser.add_argument("--cluster", help="profile every (model, backend, device, dtype, threads) of this cluster file")
    parser.add_argument("--out", help="profile file to write (single profile only)")
    parser.add_argument("--force", action="store_true", help="with --cluster: re-measure saved profiles")
    parser.add_argument("--sizes", type=int_list(), default=_csv(_GRID.sizes),
                        help="new tokens per sequence, comma-separated (default %(default)s)")
    parser.add_argument("--contexts", type=int_list(), default=_csv(_GRID.contexts),
                        help="context lengths, comma-separated (default %(default)s)")
    parser.add_argument("--batches", type=int_list(), default=_csv(_GRID.batches),
                        help="batch sizes, comma-separated (default %(default)s)")
    parser.add_argument("--repeats", type=whole_number(1), default=_GRID.repeats,
                        help="timed calls per point, the fastest kept (default %(default)s)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if (args.model is None) == (args.cluster is None):
        raise TandemError("give either --model (with --backend/--device) or --cluster FILE")
    if args.force and not args.cluster:
        raise TandemError("--force re-measures a cluster's saved profiles; with --model a profile is always measured")
    if args.cluster and args.out:
        raise TandemError("--out names one file; with --cluster profiles go to their default paths")
    given = [option for option in ("backend", "device", "dtype", "threads") if option in given_options(args)]
    if args.cluster and given:  # each worker is profiled as its file line says; these were ignored
        raise TandemError(f"{', '.join('--' + o for o in given)}: {'apply' if len(given) > 1 else 'applies'} only with "
                          "--model; with --cluster each worker is profiled with its own backend, device, dtype and "
                          "threads from the file (edit them there)")
    if args.model and args.backend == "llamacpp" and "dtype" in given_options(args):  # it was ignored
        raise TandemError(f"--dtype {args.dtype} is for --backend torch: llama.cpp reads the GGUF file's own precision")
    if args.out:
        from tandem.bench.out_dir import check_out_file

        check_out_file(Path(args.out))  # before measuring, not after it
    grid = ProfileGrid(args.sizes, args.contexts, args.batches, args.repeats)
    specs = [RunnerSpec(args.model, args.backend, args.device, args.dtype, args.threads)] if args.model \
        else _cluster_specs(args.cluster, args.force)
    if not specs:
        print("nothing to profile: every worker has a saved, listed or public-spec profile (--force re-measures)",
              file=sys.stderr)
    saved = 0
    try:
        for spec in specs:
            path = args.out or default_profile_path(spec.model, spec.backend, spec.device, spec.dtype, spec.threads)
            print(save_profile(_measure(spec, grid), path))
            saved += 1
    except KeyboardInterrupt:  # a profile is written whole or not at all: say which were kept
        kept = ("nothing was saved" if not saved else "the profile measured before it was saved" if saved == 1
                else f"the {saved} profiles measured before it were saved")
        print(f"\ninterrupted: the profile being measured is not written; {kept}", file=sys.stderr)
        raise InterruptSaid() from None
    return 0


def _cluster_specs(path: str, force: bool) -> list[RunnerSpec]:
    cluster = load_cluster(path)
    specs = {}
    for worker in cluster.workers:
        if worker.hardware in DEVICE_CLASSES or worker.name in cluster.profiles or worker.hardware in cluster.profiles:
            continue
        for model in worker_models(worker):
            spec = RunnerSpec(model, worker.backend, worker.device, worker.dtype, worker.threads)
            saved = default_profile_path(model, worker.backend, worker.device, worker.dtype, worker.threads)
            if force or not _readable(saved):
                specs[saved] = spec
    return list(specs.values())


def _readable(saved: Path) -> bool:
    """A saved profile that loads; one that does not (cut short, edited, unreadable) is measured
    again, saying why."""
    if not saved.exists():
        return False
    try:
        load_profile(saved)
        return True
    except TandemError as error:
        print(f"note: {error}: measuring it again now", file=sys.stderr)
        return False


def _measure(spec: RunnerSpec, grid: ProfileGrid):
    try:
        return measure_profile(spec, grid)
    except (RuntimeError, OSError, ValueError) as error:
        raise TandemError(f"cannot profile {spec.model} on {spec.device} ({spec.backend}): {error}") from None


def _csv(values: tuple[int, ...]) -> str:
    return ",".join(str(v) for v in values)
