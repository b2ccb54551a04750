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
    killed = shared / ".hf.tmp-killed"  # a conversion killed on the shared volume: listed, not removed
    killed.mkdir()
    os.utime(killed, (1.0, 1.0))
    entry_dir(NAME).parent.mkdir(parents=True)
    entry_dir(NAME).symlink_to(shared, target_is_directory=True)
    assert main(["models", "rm", NAME]) == 0
    assert capsys.readouterr().out.strip() == f"removed {entry_dir(NAME)} (0 B)"  # a link frees no bytes here
    assert not os.path.lexists(entry_dir(NAME)) and (shared / "model.gguf").is_file()  # the shared files stay
    assert killed.is_dir()
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


def test_rm_of_a_pulled_models_own_file_names_the_model_to_give(tmp_path, monkeypatch, capsys):
    """`rm $TANDEM_HOME/models/NAME/model.gguf` said "no conversions of .../model.gguf are kept ...
    the file itself is yours and stays": it is the pulled NAME, which `rm NAME` removes."""
    monkeypatch.setenv("TANDEM_HOME", str(tmp_path / "home"))
    pulled = entry_dir(NAME)
    pulled.mkdir(parents=True)
    (pulled / "model.gguf").write_bytes(b"GGUF" + bytes(3000))
    (pulled / "manifest.json").write_text("{}")
    assert main(["models", "rm", str(pulled / "model.gguf")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {pulled / 'model.gguf'} is the pulled {NAME}: give the name, `tandem models rm "
                          f"{NAME}`, to remove it and its conversions"), err
    assert err.count("\n") == 1 and (pulled / "model.gguf").is_file()


def test_a_killed_conversions_work_inside_a_model_folder_is_listed_and_removed(tmp_path, monkeypatch, capsys):
    """A conversion killed part-way (`models path NAME --hf`) leaves `models/NAME/.hf.tmp-*`, hundreds
    of MiB, that `models list` did not show (it looked in the models folder only); a local file's
    conversion leaves one in its local-<key> folder. Both are listed as a pull's are, under the
    same ten-minute rule, and go with `rm NAME` or `rm FILE`, as the next conversion's atomic_dir
    removes them once six hours old."""
    import time

    from tandem.models.pull import STALE_WORK_SECONDS, atomic_dir

    monkeypatch.setenv("TANDEM_HOME", str(tmp_path / "home"))
    pulled = entry_dir(NAME)
    pulled.mkdir(parents=True)
    (pulled / "model.gguf").write_bytes(b"GGUF" + bytes(3000))
    mine = tmp_path / "mine.gguf"
    mine.write_bytes(b"GGUF mine")
    local = _cache_dir(mine, mine.resolve())
    killed, live, local_killed = pulled / ".hf.tmp-killed", pulled / ".tokenizer.tmp-live", local / ".hf.tmp-killed"
    for folder in (killed, live, local_killed):
        folder.mkdir()
        (folder / "model.safetensors").write_bytes(bytes(9000))
    an_hour_ago = time.time() - 3600
    for path in (killed / "model.safetensors", killed, local_killed / "model.safetensors", local_killed):
        os.utime(path, (an_hour_ago, an_hour_ago))

    assert main(["models", "list"]) == 0
    listing = capsys.readouterr().out
    assert f"{NAME}: .hf.tmp-killed, idle 1.0 h" in listing, listing
    assert f"{NAME}: .tokenizer.tmp-live, idle 0 min (written to just now: under way?)" in listing
    assert f"{mine.resolve()}: .hf.tmp-killed, idle 1.0 h" in listing

    assert main(["models", "rm", NAME]) == 0
    out = capsys.readouterr().out
    assert f"removed {killed} (8.8 KiB)" in out and f"removed {pulled} " in out and not pulled.exists()
    assert main(["models", "rm", str(mine)]) == 0 and not local.exists() and mine.is_file()

    pulled.mkdir()  # the next conversion of the same destination removes a stale one
    stale = pulled / ".hf.tmp-stale"
    stale.mkdir()
    old = time.time() - STALE_WORK_SECONDS - 60
    os.utime(stale, (old, old))
    with atomic_dir(pulled / "hf"):
        pass
    assert not stale.exists() and (pulled / "hf").is_dir()
