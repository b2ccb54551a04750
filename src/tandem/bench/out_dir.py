"""Every bench's output folder, created up front: a folder that cannot be made is a clear error
before any model loads, not a traceback after the run."""

from pathlib import Path

from tandem.errors import TandemError


def prepare_out_dir(out_dir: Path) -> None:
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise TandemError(f"cannot create the output folder {out_dir}: {error}") from None
