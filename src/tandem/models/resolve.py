"""Turning what the user typed (a catalog name, a .gguf file, an HF folder) into local paths.

A catalog name always wins over a same-named file in the working directory. Catalog models are
pulled on first use; conversions are cached once per model: `models_dir()/<name>/hf` and
`.../tokenizer` for catalog models, `models_dir()/local-<key>/...` for other .gguf files, where
the key hashes the file's path, size, times and inode (so an edited or replaced file is
converted again, even one copied in with its times kept).
"""

import hashlib
import shutil
import sys
import time
from pathlib import Path

from tandem.errors import ModelNotFoundError, TandemError
from tandem.models import catalog
from tandem.models.convert import convert_to_hf, convert_tokenizer
from tandem.models.pull import DISK_FULL, MANIFEST_FILENAME, catalog_name_of, entry_dir, pull, pulled_state
from tandem.paths import make_dir, models_dir, write_text_atomic

GGUF_MAGIC = b"GGUF"
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")
LOCAL_SOURCE = "source"  # in a local GGUF's conversions folder: the file's path


def gguf_path(name_or_path: str | Path, progress: bool = True) -> Path:
    """The local GGUF for a catalog name (pulled if needed) or an existing GGUF file."""
    name = str(name_or_path)
    path = Path(name).expanduser()
    if name not in catalog.CATALOG:
        if path.is_file():
            check_gguf_file(path)
            pulled_as = catalog_name_of(name)  # the pulled file of a catalog model: checked as its name is
            if pulled_as is not None and pulled_state(pulled_as) == "damaged":
                raise TandemError(f"{path} is the pulled {pulled_as}, and it no longer matches its catalog checksum "
                                  f"(changed since it was pulled): give the name {pulled_as} to pull it again")
            return path.resolve()
        if path.is_dir():
            raise TandemError(f"{path} is a folder: llama.cpp needs a .gguf file or a catalog name; a Hugging Face "
                              "folder runs on torch (--backend torch, or --draft-backend torch for a draft)")
        if path.exists():  # neither a file nor a folder: a device, a pipe
            raise TandemError(f"{path} is not a regular file: a model is a .gguf file, a Hugging Face folder "
                              "or a catalog name")
    check_model_name(name)
    return pull(name, progress=progress)


def check_model_name(name_or_path: str | Path) -> None:
    """ModelNotFoundError unless `name_or_path` is a catalog name or something on disk (what it is
    is told where it is read), without pulling anything: a command checks every model it names
    first (a typo in --draft was said after the target's 1 GiB pull)."""
    name = str(name_or_path)
    path = Path(name).expanduser()
    if name in catalog.CATALOG or path.exists():
        return
    if path.suffix == ".gguf" or "/" in name:
        raise ModelNotFoundError(f"no such model file: {path}")
    catalog.lookup(name)  # ModelNotFoundError, listing the names


def hf_path(name_or_path: str | Path, progress: bool = True) -> Path:
    """A Hugging Face model folder: the given one, or the cached conversion of a name or .gguf file
    (converting first, once, with a note on stderr)."""
    folder = _given_folder(name_or_path)
    if folder is not None:
        if not (folder / "config.json").is_file():
            raise ModelNotFoundError(f"{folder} has no config.json, so it is not a Hugging Face model folder")
        return folder
    gguf = gguf_path(name_or_path, progress)
    dest = _cache_dir(name_or_path, gguf) / "hf"
    if not (dest / "config.json").is_file():
        print(f"converting {name_or_path} to a float32 Hugging Face folder at {dest} (once; about 5-7x the "
              f".gguf's {gguf.stat().st_size / 2**20:.0f} MiB on disk) ...", file=sys.stderr, flush=True)
        started = time.monotonic()
        _convert(convert_to_hf, gguf, dest)
        print(f"converted in {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)
    return dest


def tokenizer_path(name_or_path: str | Path) -> Path:
    """A folder with tokenizer files: the given HF folder, or the cached tokenizer-only conversion."""
    folder = _given_folder(name_or_path)
    if folder is not None:
        if not any((folder / f).is_file() for f in _TOKENIZER_FILES):
            what = "" if (folder / "config.json").is_file() else ": it is not a Hugging Face model folder (no config.json)"
            raise ModelNotFoundError(f"{folder} has no tokenizer files ({', '.join(_TOKENIZER_FILES)}){what}")
        return folder
    gguf = gguf_path(name_or_path)
    dest = _cache_dir(name_or_path, gguf) / "tokenizer"
    if not dest.is_dir():
        print(f"reading {name_or_path}'s tokenizer out of the GGUF into {dest} (once)...", file=sys.stderr)
        _convert(convert_tokenizer, gguf, dest)
    return dest


def tokenizer_digest(name_or_path: str | Path) -> str:
    """A short SHA-256 of the model's tokenizer files: what token ids mean, for stores of token ids
    shared between processes (two models may share one tokenizer, and then its stores)."""
    folder = tokenizer_path(name_or_path)
    digest = hashlib.sha256()
    for name in _TOKENIZER_FILES:
        if (folder / name).is_file():
            digest.update(name.encode() + b"\0" + (folder / name).read_bytes() + b"\0")
    return digest.hexdigest()[:12]


def check_gguf_file(path: Path) -> None:
    """Raise TandemError unless `path` starts with the GGUF magic bytes."""
    with path.open("rb") as f:
        magic = f.read(len(GGUF_MAGIC))
    if magic != GGUF_MAGIC:
        raise TandemError(f"{path} is not a valid GGUF file: it does not start with {GGUF_MAGIC!r}")


def _given_folder(name_or_path: str | Path) -> Path | None:
    """The folder the user named, unless the name is a catalog entry or not a folder at all."""
    if str(name_or_path) in catalog.CATALOG:
        return None
    path = Path(name_or_path).expanduser()
    return path.resolve() if path.is_dir() else None


def _cache_dir(name_or_path: str | Path, gguf: Path) -> Path:
    """Where conversions of `gguf` are cached."""
    name = str(name_or_path)
    if name in catalog.CATALOG:
        return entry_dir(name)
    if gguf.parent.parent == models_dir().resolve() and (gguf.parent / MANIFEST_FILENAME).is_file():
        return gguf.parent  # a pulled catalog model, given by its path
    stat = gguf.stat()  # a file written over this one, even of its size and time, has a new inode or ctime
    version = f"{gguf}|{stat.st_size}|{stat.st_mtime_ns}|{stat.st_ctime_ns}|{stat.st_ino}"
    key = hashlib.sha256(version.encode()).hexdigest()[:16]
    folder = models_dir() / f"local-{key}"
    marker = folder / LOCAL_SOURCE
    if not marker.is_file() or marker.stat().st_size == 0:  # this version's first use (another process may race
        make_dir(folder)  # us: both may), or a marker left empty by a full disk or an interrupt
        write_text_atomic(marker, str(gguf))
        _remove_older_versions(gguf, folder)
    return folder


def _convert(convert, gguf: Path, dest: Path) -> None:
    """convert(gguf, dest); where it fails (a truncated or unreadable file), a local file's
    conversions folder that holds nothing else goes too, leaving no trace of the failed try."""
    try:
        convert(gguf, dest)
    except BaseException as error:
        folder = dest.parent
        if folder.name.startswith("local-") and [p.name for p in folder.iterdir()] == [LOCAL_SOURCE]:
            shutil.rmtree(folder, ignore_errors=True)
        if _is_disk_full(error):
            free = shutil.disk_usage(models_dir()).free
            raise TandemError(f"no space left on the device holding {models_dir()} while converting {gguf.name} "
                              f"({free / 2**30:.2f} GiB free): nothing was kept; free some space (`tandem models "
                              "list` shows what each model keeps) or set TANDEM_HOME to a larger disk") from None
        raise


def _is_disk_full(error: BaseException) -> bool:
    """An OSError of a full disk, or the tokenizers library's plain Exception for one (its Rust
    side says "No space left on device (os error 28)")."""
    if isinstance(error, OSError):
        return error.errno in DISK_FULL
    return type(error) is Exception and any(f"(os error {code})" in str(error) for code in DISK_FULL)


def _remove_older_versions(gguf: Path, current: Path) -> None:
    """Conversions of an earlier version of the same file (rewritten, re-quantized: a new size or
    time) go when a new version is first used: each is a float32 copy of the model, and nothing
    would read it again."""
    for other in models_dir().glob("local-*"):
        source = other / LOCAL_SOURCE
        if other != current and source.is_file() and source.read_text() == str(gguf):
            shutil.rmtree(other, ignore_errors=True)
