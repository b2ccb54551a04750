"""What Tandem keeps of a model on disk, and its removal (`tandem models list`, `tandem models rm`).

A pulled catalog model is one folder, `models_dir()/<name>`: its .gguf and every conversion made
of it (the float32 Hugging Face folder a torch load reads is ~4x the .gguf). A local .gguf file's
conversions live in `models_dir()/local-<key>` folders, each naming its file in `source`; the
file itself is the user's and is never removed. A folder goes by being renamed aside first, so a
process that has it open keeps its files, and a process that loads it next finds it gone and
pulls or converts again.
"""

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from tandem.errors import TandemError, did_you_mean
from tandem.models.catalog import CATALOG
from tandem.models.pull import aside_path, entry_dir
from tandem.models.resolve import LOCAL_SOURCE
from tandem.paths import models_dir


@dataclass(frozen=True, slots=True)
class KeptFolder:
    folder: Path
    source: str  # the catalog name, or the local .gguf file its conversions are of
    nbytes: int


def folder_bytes(folder: Path) -> int:
    total = 0
    for root, _, files in os.walk(folder):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:  # removed meanwhile
                pass
    return total


def local_conversions() -> list[KeptFolder]:
    """Every local .gguf file's conversions folder, with its file and size."""
    kept = []
    for folder in sorted(models_dir().glob("local-*")):
        try:
            source = (folder / LOCAL_SOURCE).read_text()
        except OSError:
            continue
        kept.append(KeptFolder(folder, source, folder_bytes(folder)))
    return kept


def remove_model(name_or_path: str) -> list[KeptFolder]:
    """Remove a catalog model's folder, or a local .gguf file's conversions (not the file);
    what went. TandemError where nothing is kept for it."""
    if name_or_path in CATALOG:
        folder = entry_dir(name_or_path)
        if not folder.is_dir():
            raise TandemError(f"{name_or_path} is not pulled: nothing to remove")
        found = [KeptFolder(folder, name_or_path, folder_bytes(folder))]
    else:
        path = Path(name_or_path).expanduser()
        if not path.is_file():
            raise TandemError(f"{name_or_path!r} is neither a catalog model nor a .gguf file"
                              f"{did_you_mean(name_or_path, CATALOG)}")
        resolved = str(path.resolve())
        found = [kept for kept in local_conversions() if kept.source == resolved]
        if not found:
            raise TandemError(f"no conversions of {resolved} are kept: nothing to remove (the file itself "
                              f"is yours and stays)")
    for kept in found:
        aside = aside_path(kept.folder)
        try:
            os.rename(kept.folder, aside)
        except FileNotFoundError:  # another process removed it first
            continue
        except OSError as error:
            raise TandemError(f"cannot remove {kept.folder}: {error.strerror}") from None
        shutil.rmtree(aside, ignore_errors=True)
    return found
