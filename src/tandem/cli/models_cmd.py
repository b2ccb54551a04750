"""`tandem models list | pull NAME | path NAME [--hf] | rm NAME|FILE`: the catalog at the terminal.

Each handler takes the parsed args and returns an exit code; TandemError is left to the caller
(cli/main.py), which prints it. Paths go to stdout, progress bars and notes to stderr, so
`$(tandem models path NAME)` works in scripts.
"""

import argparse

from tandem.errors import ModelNotFoundError, TandemError
from tandem.memory_size import human_size
from tandem.models.catalog import CATALOG, PATHS_ACCEPTED, CatalogEntry
from tandem.models.pull import entry_dir, pull, pulled_state
from tandem.models.remove import UNDER_WAY_SECONDS, folder_bytes, local_conversions, remove_model, unfinished_work
from tandem.models.resolve import gguf_path, hf_path
from tandem.paths import models_dir

_COLUMNS = ("NAME", "PARAMS", "QUANT", "SIZE", "PULLED", "ON DISK", "ROLE")


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `models` command and its subcommands to the top-level `subparsers`."""
    models = subparsers.add_parser("models", help="list, pull and locate models")
    commands = models.add_subparsers(dest="models_command", metavar="COMMAND", required=True)

    listing = commands.add_parser("list", help="show the catalog and which models are pulled")
    listing.set_defaults(func=list_models)

    pulling = commands.add_parser("pull", help="download and verify a catalog model")
    pulling.add_argument("name", help="catalog name (see `tandem models list`)")
    pulling.set_defaults(func=pull_model)

    locating = commands.add_parser("path", help="print the local path of a model, pulling if needed")
    locating.add_argument("name", help="catalog name or a local .gguf file")
    locating.add_argument("--hf", action="store_true",
                          help="print the converted Hugging Face folder instead (converting once)")
    locating.set_defaults(func=print_path)

    removing = commands.add_parser("rm", help="remove a pulled model, or a local .gguf file's conversions, to free disk")
    removing.add_argument("name", help="catalog name (its .gguf and conversions go), or a local .gguf file "
                                       "(only the conversions Tandem made of it go)")
    removing.set_defaults(func=remove)


def list_models(args: argparse.Namespace) -> int:
    rows = [_COLUMNS] + [_row(entry) for entry in CATALOG.values()]
    widths = [max(len(row[i]) for row in rows) for i in range(len(_COLUMNS))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())
    conversions = local_conversions()
    if conversions:
        print("\nconversions of local .gguf files (`tandem models rm FILE` removes them):")
        for kept in conversions:
            print(f"  {human_size(kept.nbytes):>9}  {kept.source}")
    unfinished = unfinished_work()
    if unfinished:
        print("\nleft by interrupted pulls or conversions (`tandem models rm NAME|FILE` removes them, the next "
              "pull or conversion of the same model after 6 h):")
        for work in unfinished:
            under_way = " (written to just now: under way?)" if work.idle_seconds < UNDER_WAY_SECONDS else ""
            print(f"  {human_size(work.nbytes):>9}  {work.name}: {work.folder.name}, idle "
                  f"{_duration(work.idle_seconds)}{under_way}")
    print(f"\nin {models_dir()}")
    return 0


def _duration(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds / 60:.0f} min"


def remove(args: argparse.Namespace) -> int:
    for kept in remove_model(args.name):
        print(f"removed {kept.folder} ({human_size(kept.nbytes)})")
    return 0


def pull_model(args: argparse.Namespace) -> int:
    if args.name.endswith(".gguf") or "/" in args.name:
        raise TandemError(f"`tandem models pull` takes a catalog name (see `tandem models list`); a local file or "
                          f"folder such as {args.name} needs no pull: pass it to --target or --draft")
    try:
        path = pull(args.name, progress=True)
    except ModelNotFoundError as error:  # its "a local file is also accepted" is for --target, not pull
        raise ModelNotFoundError(str(error).replace(PATHS_ACCEPTED, "").rstrip()) from None
    print(path)
    return 0


def print_path(args: argparse.Namespace) -> int:
    print(hf_path(args.name) if args.hf else gguf_path(args.name))
    return 0


def _row(entry: CatalogEntry) -> tuple[str, ...]:
    pulled = pulled_state(entry.name)  # yes, no or damaged (the file changed since its pull verified it)
    folder = entry_dir(entry.name)
    on_disk = human_size(folder_bytes(folder)) if folder.is_dir() else "-"  # with its conversions
    return (entry.name, entry.parameters, entry.quantization, human_size(entry.size_bytes),
            pulled, on_disk, entry.role)
