"""What Tandem keeps of a model on disk, and its removal (`tandem models list`, `tandem models rm`).

A pulled catalog model is one folder, `models_dir()/<name>`: its .gguf and every conversion made
of it (the float32 Hugging Face folder a torch load reads is ~4x the .gguf). A local .gguf file's
conversions live in `models_dir()/local-<key>` folders, each naming its file in `source`; the
file itself is the user's and is never removed. A folder goes by being renamed aside first, so a
process that has it open keeps its files, and a process that loads it next finds it gone and
pulls or converts again.
"""

import contextlib
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from tandem.errors import TandemError, did_you_mean
from tandem.models.catalog import CATALOG
from tandem.models.pull import aside_path, catalog_name_of, entry_dir, newest_write
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


UNFINISHED = re.compile(r"^\.(?P<name>.+)\.(?:tmp|old)-")  # pull.atomic_dir's work, aside_path's leftovers
UNDER_WAY_SECONDS = 600  # unfinished work written to this recently may be a pull still running: rm keeps it


@dataclass(frozen=True, slots=True)
class UnfinishedWork:
    folder: Path
    name: str  # the catalog model (or local-<key> folder) it was for
    nbytes: int
    idle_seconds: float  # since anything in it was last written


def unfinished_work() -> list[UnfinishedWork]:
    """Folders a pull or conversion left when it was killed (or is still writing): a pull's in
    models_dir(), a conversion's in its model's folder (`<name>/.hf.tmp-*`, `local-<key>/...`);
    invisible otherwise until the next pull or conversion of the same destination, which removes
    them after pull.STALE_WORK_SECONDS."""
    found = []
    for parent, name in _work_places():
        for folder in sorted(parent.glob(".*")):
            match = UNFINISHED.match(folder.name)
            if match and folder.is_dir():
                found.append(UnfinishedWork(folder, name or match["name"], folder_bytes(folder),
                                            time.time() - newest_write(folder)))
    return found


def _work_places() -> list[tuple[Path, str | None]]:
    """Where atomic_dir works, each with what its leftovers are for: models_dir() (None: the name
    in each leftover's own), each model's folder (its name) and each local-<key> one (its file,
    which `rm FILE` takes)."""
    places: list[tuple[Path, str | None]] = [(models_dir(), None)]
    for folder in sorted(models_dir().glob("[!.]*")):
        if folder.is_dir():
            places.append((folder, _local_source(folder) or folder.name))
    return places


def _local_source(folder: Path) -> str | None:
    try:
        return (folder / LOCAL_SOURCE).read_text() if folder.name.startswith("local-") else None
    except OSError:
        return None


def _remove_unfinished(name: str) -> list[KeptFolder]:
    """name's unfinished work idle for UNDER_WAY_SECONDS or more, removed; what went. Work inside
    a model folder linked in from a shared volume stays (the link goes, the files stay)."""
    gone = []
    for work in unfinished_work():
        if work.folder.parent.is_symlink():
            continue
        if work.name == name and work.idle_seconds >= UNDER_WAY_SECONDS and _delete(work.folder):
            gone.append(KeptFolder(work.folder, name, work.nbytes))
    return gone


def _delete(folder: Path) -> bool:
    """Remove a folder, or the link that stands for one (rmtree refuses links: a model folder
    linked in from a shared volume was said removed and stayed); whether it is gone."""
    if folder.is_symlink():
        with contextlib.suppress(FileNotFoundError):
            folder.unlink()
    else:
        shutil.rmtree(folder, ignore_errors=True)
    return not os.path.lexists(folder)


def _nothing_kept_of(path: str, resolved: str) -> TandemError:
    """The error for a file with no conversions kept: a pulled catalog model's own file (its
    conversions sit beside it, in its folder) goes by its name."""
    pulled_as = catalog_name_of(path)
    if pulled_as is not None:
        return TandemError(f"{path} is the pulled {pulled_as}: give the name, `tandem models rm {pulled_as}`, to "
                           "remove it and its conversions")
    return TandemError(f"no conversions of {resolved} are kept: nothing to remove (the file itself is yours and stays)")


def remove_model(name_or_path: str) -> list[KeptFolder]:
    """Remove a catalog model's folder and what an interrupted pull or conversion of it left, or a
    local .gguf file's conversions (not the file); what went. TandemError where nothing is kept for
    it, or where it is a pulled model's own file (its name removes it)."""
    if name_or_path in CATALOG:
        folder = entry_dir(name_or_path)
        unfinished = _remove_unfinished(name_or_path)
        if not folder.is_dir() and not folder.is_symlink():  # a link whose target is gone still goes
            if unfinished:
                return unfinished
            live = [work for work in unfinished_work() if work.name == name_or_path]
            if live:  # too fresh to tell from a pull still running
                raise TandemError(f"{name_or_path} is not pulled, and its unfinished pull ({live[0].folder}) was "
                                  f"written {live[0].idle_seconds:.0f} s ago: it may still be running, so it is kept "
                                  f"until {UNDER_WAY_SECONDS // 60} minutes after its last write")
            raise TandemError(f"{name_or_path} is not pulled: nothing to remove")
        linked = folder.is_symlink()  # a link to a shared volume: the link goes, the files stay
        found = unfinished + [KeptFolder(folder, name_or_path, 0 if linked else folder_bytes(folder))]
    else:
        path = Path(name_or_path).expanduser()
        resolved = str(path.resolve())
        found = [kept for kept in local_conversions() if kept.source == resolved]  # the file may be gone since
        if not found and not path.is_file():
            if path.suffix == ".gguf":  # it said "neither a catalog model nor a .gguf file" of nope.gguf
                raise TandemError(f"no such model file: {name_or_path} (nor a conversion kept for it)")
            raise TandemError(f"{name_or_path!r} is neither a catalog model nor a .gguf file"
                              f"{did_you_mean(name_or_path, CATALOG)}")
        if not found:
            raise _nothing_kept_of(name_or_path, resolved)
    gone = []
    for kept in found:
        if not os.path.lexists(kept.folder):  # unfinished work, already removed
            gone.append(kept)
            continue
        aside = aside_path(kept.folder)
        try:
            os.rename(kept.folder, aside)
        except FileNotFoundError:  # another process removed it first
            continue
        except OSError as error:
            raise TandemError(f"cannot remove {kept.folder}: {error.strerror}") from None
        if not _delete(aside):
            raise TandemError(f"cannot remove {aside} (moved aside from {kept.folder}): remove it by hand")
        gone.append(kept)
    return gone
