"""Every bench's output folder (or file), checked up front: one that cannot be written is a
clear error before any model loads, not a traceback after the run. An earlier run's files there
are named before they are replaced, never replaced without a word."""

import sys
import tempfile
from pathlib import Path

from tandem.errors import TandemError


def prepare_out_dir(out_dir: Path) -> None:
    if out_dir.is_dir() and any(out_dir.iterdir()):
        print(f"note: the output folder {out_dir} is not empty; files of the same name are replaced (give --out "
              "another folder to keep them)", file=sys.stderr)
    if out_dir.is_file():
        raise TandemError(f"{out_dir} is a file, not a folder: give --out a folder to write the outputs in")
    _make_folder(out_dir)
    refused = _write_refused(out_dir)  # an existing folder was found only by the run's last write
    if refused:
        raise TandemError(f"cannot write in the output folder {out_dir}: {refused}; give --out another folder")


def _make_folder(out_dir: Path) -> None:
    blocking = next((p for p in (out_dir, *out_dir.parents) if p.exists() and not p.is_dir()), None)
    if blocking is not None:
        raise TandemError(f"cannot create the output folder {out_dir}: {blocking} is a file")
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise TandemError(f"cannot create the output folder {out_dir}: {error.strerror or error}") from None


def check_out_file(path: Path) -> None:
    """A file the run will write at its end: not a folder, and in a writable folder (created
    here where missing)."""
    if path.is_dir():
        raise TandemError(f"{path} is a folder; give a file name to write")
    _make_folder(path.parent)
    refused = _write_refused(path.parent)
    if refused:
        raise TandemError(f"cannot write {path}: {refused}")
    if path.exists():
        print(f"note: {path} exists; this run replaces it (give --out another name to keep it)", file=sys.stderr)


def _write_refused(folder: Path) -> str | None:
    """Why a file cannot be made in `folder`, found by making one (permission bits say yes to root,
    and to /proc); None where it can."""
    try:
        with tempfile.TemporaryFile(dir=folder):
            return None
    except OSError as error:
        return error.strerror or str(error)
