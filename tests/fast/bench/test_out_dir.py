"""Output folders and files: an earlier run's files are named before this run replaces them."""

from pathlib import Path

from tandem.bench.out_dir import check_out_file, prepare_out_dir


def test_a_folder_holding_files_is_named_before_it_is_written(tmp_path, capsys):
    fresh = tmp_path / "fresh"
    prepare_out_dir(fresh)
    assert fresh.is_dir() and capsys.readouterr().err == ""
    (fresh / "results.json").write_text("{}")
    prepare_out_dir(fresh)
    assert "fresh is not empty; files of the same name are replaced" in capsys.readouterr().err


def test_a_file_that_exists_is_named_but_not_its_folder(tmp_path, capsys):
    (tmp_path / "other.txt").write_text("x")  # the folder holds files: no note for it
    check_out_file(tmp_path / "steps.json")
    assert capsys.readouterr().err == ""
    (tmp_path / "steps.json").write_text("{}")
    check_out_file(tmp_path / "steps.json")
    assert "steps.json exists; this run replaces it" in capsys.readouterr().err


def test_an_out_folder_that_is_a_file_is_said_to_be_one(tmp_path):
    import pytest

    from tandem.errors import TandemError

    (tmp_path / "afile").write_text("x")
    with pytest.raises(TandemError, match="afile is a file, not a folder"):  # it said "File exists"
        prepare_out_dir(tmp_path / "afile")
    assert (tmp_path / "afile").read_text() == "x"


def test_an_existing_folder_that_cannot_be_written_is_refused_before_the_run(tmp_path, monkeypatch):
    """A read-only folder that existed passed: the whole bench ran, then its results were lost
    ("Read-only file system: romnt/results.json"); so did /proc, where permission bits said yes
    (a traceback after the run). A file on the way is named as one."""
    import tempfile

    import pytest

    from tandem.errors import TandemError

    folder = tmp_path / "ro"
    folder.mkdir()
    real_file = tempfile.TemporaryFile

    def read_only_in_folder(*args, dir=None, **kwargs):
        if str(dir) == str(folder):
            raise OSError(30, "Read-only file system")
        return real_file(*args, dir=dir, **kwargs)

    monkeypatch.setattr(tempfile, "TemporaryFile", read_only_in_folder)
    with pytest.raises(TandemError, match="ro: Read-only file system"):
        prepare_out_dir(folder)
    with pytest.raises(TandemError, match="cannot write .*x.json: Read-only file system"):
        check_out_file(folder / "x.json")
    (tmp_path / "afile").write_text("x")
    with pytest.raises(TandemError, match="afile is a file"):  # it said "[Errno 17] File exists"
        check_out_file(tmp_path / "afile" / "x.json")
    with pytest.raises(TandemError, match="cannot write /proc/x.json"):
        check_out_file(Path("/proc/x.json"))  # as root, os.access said yes
