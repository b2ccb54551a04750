"""Every bench's output folder (or file), checked up front: one that cannot be written is a
clear error before any model loads, not a traceback after the run."""

import os
from pathlib import Path

from tandem.errors import TandemError


def prepare_out_dir(out_dir: Path) -> None:
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise TandemError(f"cannot create the output folder {out_dir}: {error}") from None


def check_out_file(path: Path) -> None:
    """A file the run will write at its end: not a folder, and in a writable folder (created
    here where missing)."""
    if path.is_dir():
        raise TandemError(f"{path} is a folder; give a file name to write")
    prepare_out_dir(path.parent)
    if not os.access(path.parent, os.W_OK):
        raise TandemError(f"cannot write {path}: its folder is not writable")
