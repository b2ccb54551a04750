"""`tandem models list | pull NAME | path NAME [--hf]`: the catalog at the terminal.

Each handler takes the parsed args and returns an exit code; TandemError is left to the caller
(cli/main.py), which prints it. Paths go to stdout, progress bars and notes to stderr, so
`$(tandem models path NAME)` works in scripts.
"""

import argparse

from tandem.errors import TandemError
from tandem.memory_size import human_size
from tandem.models.catalog import CATALOG, CatalogEntry
from tandem.models.pull import is_pulled, pull
from tandem.models.resolve import gguf_path, hf_path

_COLUMNS = ("NAME", "PARAMS", "QUANT", "SIZE", "PULLED", "ROLE")


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


def list_models(args: argparse.Namespace) -> int:
    rows = [_COLUMNS] + [_row(entry) for entry in CATALOG.values()]
    widths = [max(len(row[i]) for row in rows) for i in range(len(_COLUMNS))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())
    return 0


def pull_model(args: argparse.Namespace) -> int:
    if args.name.endswith(".gguf") or "/" in args.name:
        raise TandemError(f"`tandem models pull` takes a catalog name (see `tandem models list`); a local file or "
                          f"folder such as {args.name} needs no pull: pass it to --target or --draft")
    print(pull(args.name, progress=True))
    return 0


def print_path(args: argparse.Namespace) -> int:
    print(hf_path(args.name) if args.hf else gguf_path(args.name))
    return 0


def _row(entry: CatalogEntry) -> tuple[str, ...]:
    pulled = "yes" if is_pulled(entry.name) else "no"
    return (entry.name, entry.parameters, entry.quantization, human_size(entry.size_bytes),
            pulled, entry.role)
