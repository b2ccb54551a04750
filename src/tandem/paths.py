"""Where Tandem keeps models and caches: `$TANDEM_HOME`, default `~/.cache/tandem`."""

import os
from pathlib import Path

from tandem.errors import TandemError


def tandem_home() -> Path:
    """$TANDEM_HOME (its `~` expanded, as a service manager's environment leaves it; a relative
    one taken from the current folder), else ~/.cache/tandem."""
    given = os.environ.get("TANDEM_HOME")
    if not given:
        return Path.home() / ".cache" / "tandem"
    try:
        return Path(given).expanduser().absolute()
    except RuntimeError:  # `~someone` of no such user
        raise TandemError(f"$TANDEM_HOME {given!r}: no home folder is known for that user") from None


def models_dir() -> Path:
    return _under_home("models")


def profiles_dir() -> Path:
    return _under_home("profiles")


def _under_home(name: str) -> Path:
    """A folder of $TANDEM_HOME's; a TandemError where the home is a file (a list of models
    showed none pulled, as if the models were gone)."""
    home = tandem_home()
    if home.exists() and not home.is_dir():
        raise TandemError(f"$TANDEM_HOME ({home}) is a file, not a folder: point it at a folder "
                          "(Tandem keeps models, profiles and caches there)")
    return home / name


def make_dir(folder: Path) -> Path:
    """`folder` and its parents, created where missing; a TandemError naming $TANDEM_HOME where
    that fails (a file in the way, no permission), not an OSError's traceback."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise TandemError(f"cannot create the folder {folder}: {error.strerror or error}; Tandem keeps models, "
                          f"profiles and caches under $TANDEM_HOME (now {tandem_home()}): point it at a "
                          "writable folder") from None
    return folder


def write_text_atomic(path: Path, text: str) -> None:
    """Write `path` whole or not at all: through a temp file of this process's own beside it
    (two processes may write one path at once), renamed into place."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    except OSError as error:  # a full disk: no temp file left, and the error names the file it was for
        tmp.unlink(missing_ok=True)
        raise OSError(error.errno, error.strerror, str(path)) from None
