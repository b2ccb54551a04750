"""`tandem models list` shows what each model keeps on disk, and `tandem models rm` frees it: a
catalog model's folder (its .gguf and conversions), or only the conversions of a local .gguf file
(never the file, never another file's)."""

import os

from tandem.cli.main import main
from tandem.models.pull import entry_dir
from tandem.models.resolve import _cache_dir

NAME = "smollm2-135m-instruct"


def test_rm_frees_a_catalog_model_and_a_local_files_conversions_only(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TANDEM_HOME", str(tmp_path / "home"))
    pulled = entry_dir(NAME)
    (pulled / "hf").mkdir(parents=True)
    (pulled / "model.gguf").write_bytes(b"GGUF" + bytes(3000))
    (pulled / "hf" / "model.safetensors").write_bytes(bytes(12000))
    mine, other = tmp_path / "mine.gguf", tmp_path / "other.gguf"
    mine.write_bytes(b"GGUF mine")
    other.write_bytes(b"GGUF other")
    converted, kept = _cache_dir(mine, mine.resolve()), _cache_dir(other, other.resolve())
    (converted / "hf").mkdir()
    (converted / "hf" / "weights").write_bytes(bytes(5000))

    assert main(["models", "list"]) == 0
    listing = capsys.readouterr().out
    assert "15 KiB" in listing  # the catalog model with its conversion: 3,004 + 12,000 bytes
    assert str(mine.resolve()) in listing and str(other.resolve()) in listing

    assert main(["models", "rm", str(mine)]) == 0
    assert not converted.exists() and mine.is_file() and kept.is_dir()
    assert main(["models", "rm", NAME]) == 0
    assert not pulled.exists() and "removed" in capsys.readouterr().out
    assert list((tmp_path / "home" / "models").glob(".*old-*")) == []  # nothing left aside


def test_rm_of_nothing_kept_is_one_error_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TANDEM_HOME", str(tmp_path / "home"))
    file = tmp_path / "never-converted.gguf"
    file.write_bytes(b"GGUF")
    for argv, says in [([NAME], "is not pulled"), ([str(file)], "no conversions of"),
                       (["smollm2-135m-instrct"], f"did you mean '{NAME}'")]:
        assert main(["models", "rm", *argv]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and says in err and err.count("\n") == 1, err
    assert file.is_file()


def test_an_interrupted_pulls_work_is_listed_and_rm_frees_it_unless_under_way(tmp_path, monkeypatch, capsys):
    """A killed pull leaves its temp folder in the models folder: shown by `models list` (it was
    invisible, a GiB perhaps, until the next pull of that model after 6 h) and removed by `models
    rm NAME`, the model pulled or not; work written to in the last 10 minutes may be a live pull
    and stays."""
    import os
    import time

    monkeypatch.setenv("TANDEM_HOME", str(tmp_path / "home"))
    models = entry_dir(NAME).parent
    killed, live = models / f".{NAME}.tmp-killed", models / f".{NAME}.tmp-live"
    for folder in (killed, live):
        folder.mkdir(parents=True)
        (folder / "model.gguf.part").write_bytes(bytes(7000))
    an_hour_ago = time.time() - 3600
    for path in (killed / "model.gguf.part", killed):
        os.utime(path, (an_hour_ago, an_hour_ago))

    assert main(["models", "list"]) == 0
    listing = capsys.readouterr().out
    assert "interrupted pulls" in listing and f"{NAME}: {killed.name}, idle 1.0 h" in listing
    assert f"{live.name}, idle 0 min (written to just now: under way?)" in listing

    assert main(["models", "rm", NAME]) == 0  # not pulled: its unfinished work alone goes
    assert not killed.exists() and live.is_dir()
    assert str(killed) in capsys.readouterr().out
    assert main(["models", "rm", NAME]) == 2  # what is left is under way: nothing to remove
    assert "it may still be running, so it is kept until 10 minutes after its last write" in capsys.readouterr().err


def test_a_linked_model_folder_loses_its_link_and_a_gone_files_conversions_still_go(tmp_path, monkeypatch, capsys):
    """rmtree refuses a link: a model folder linked in from a shared volume was said "removed"
    (its target's size) and stayed, a link left aside that every later rm "removed" again. And the
    conversions of a .gguf deleted since could not be removed at all ("neither a catalog model...")."""
    monkeypatch.setenv("TANDEM_HOME", str(tmp_path / "home"))
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "model.gguf").write_bytes(b"GGUF" + bytes(3000))
    entry_dir(NAME).parent.mkdir(parents=True)
    entry_dir(NAME).symlink_to(shared, target_is_directory=True)
    assert main(["models", "rm", NAME]) == 0
    assert capsys.readouterr().out.strip() == f"removed {entry_dir(NAME)} (0 B)"  # a link frees no bytes here
    assert not os.path.lexists(entry_dir(NAME)) and (shared / "model.gguf").is_file()  # the shared files stay
    assert list(entry_dir(NAME).parent.glob(".*")) == []  # no link left aside
    entry_dir(NAME).symlink_to(tmp_path / "gone-volume", target_is_directory=True)  # its target is gone
    assert main(["models", "rm", NAME]) == 0 and not os.path.lexists(entry_dir(NAME))
    capsys.readouterr()

    gone = tmp_path / "gone.gguf"
    gone.write_bytes(b"GGUF gone")
    converted = _cache_dir(gone, gone.resolve())
    (converted / "hf").mkdir()
    gone.unlink()
    assert main(["models", "rm", str(gone)]) == 0
    assert not converted.exists()
