"""A model's identity by content: the SHA-256 of what it is loaded from, so that state computed by
one model (the prompt cache's disk tier) is never given to another, even one at the same path.

A catalog model is its catalog checksum (pulling it checked the assembled file against it); a
GGUF file is its bytes' digest; a Hugging Face folder hashes every file in it, by relative path.
Computed once per file version in a process (path, size, times and inode: a file written over
another one of the same size, its time kept, has a new inode or change time).
"""

import hashlib
from functools import lru_cache
from pathlib import Path

from tandem.errors import ModelNotFoundError
from tandem.models import catalog

CHUNK = 1 << 22


def model_checksum(name_or_path: str | Path) -> str:
    name = str(name_or_path)
    if name in catalog.CATALOG:
        return catalog.CATALOG[name].sha256
    path = Path(name).expanduser().resolve()
    if path.is_file():
        return _file_checksum(path, *_version(path))
    if path.is_dir():
        digest = hashlib.sha256()
        for file in sorted(p for p in path.rglob("*") if p.is_file()):
            digest.update(f"{file.relative_to(path)}\0{_file_checksum(file, *_version(file))}\0".encode())
        return digest.hexdigest()
    raise ModelNotFoundError(f"no such model file or folder: {path}")


def model_version(name_or_path: str | Path) -> str:
    """A model's identity without reading it: a catalog model's checksum, else the path with its
    files' size and time (another file written at the path is another version). For keys that
    must be cheap at every start (the response cache); the disk tier, whose states outlive such
    doubts, uses model_checksum."""
    name = str(name_or_path)
    if name in catalog.CATALOG:
        return catalog.CATALOG[name].sha256
    path = Path(name).expanduser().resolve()
    if path.is_file():
        files = [path]
    else:  # a folder's files (none where nothing is there)
        files = [p for p in path.rglob("*") if p.is_file()] if path.is_dir() else []
    if not files:
        raise ModelNotFoundError(f"no such model file or folder: {path}")
    stats = [f.stat() for f in files]
    return f"{path}|{sum(s.st_size for s in stats)}|{max(s.st_mtime_ns for s in stats)}"


def _version(path: Path) -> tuple[int, int, int, int]:
    """What tells one version of a file from another without reading it."""
    stat = path.stat()
    return stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_ino


@lru_cache(maxsize=256)
def _file_checksum(path: Path, size: int, mtime_ns: int, ctime_ns: int, inode: int) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()
