"""Output paths are checked before the work, and written without following links or overwriting."""

import os

import pytest

from trnopt.optimizer.commands.output import check_output, write_output
from trnopt.optimizer.errors import InputError


def refused(path: str, force: bool = False) -> str:
    with pytest.raises(InputError) as err:
        check_output(path, "--json", force)
    assert err.value.key == "--json"
    return err.value.rule


def test_paths_that_cannot_be_written(tmp_path):
    (tmp_path / "file").write_text("x")
    (tmp_path / "link").symlink_to(tmp_path / "target.json")
    assert refused(str(tmp_path)).startswith("is a directory")
    assert "does not exist" in refused(str(tmp_path / "no" / "x.json"))
    assert "is not a folder" in refused(str(tmp_path / "file" / "x.json"))
    assert refused("/proc/trnopt.json").startswith("cannot write in /proc")
    assert refused(str(tmp_path / "link"), force=True).startswith("a symbolic link")
    assert refused(str(tmp_path / "file")).startswith("file exists")
    assert refused("").startswith("an empty path")
    assert refused("/dev/null", force=True).startswith("not a regular file")
    assert not (tmp_path / "target.json").exists()


def test_write_creates_and_replaces_only_when_forced(tmp_path):
    path = str(tmp_path / "out.json")
    write_output(path, {"a": 1})
    assert open(path).read() == '{\n  "a": 1\n}\n'
    with pytest.raises(InputError, match="file exists"):
        write_output(path, {"a": 2})
    write_output(path, {"a": 2}, force=True)
    assert '"a": 2' in open(path).read()
    assert oct(os.stat(path).st_mode & 0o777) == "0o644"
    assert sorted(os.listdir(tmp_path)) == ["out.json"]  # no temporary file left
    check_output(None)
    check_output("-")
