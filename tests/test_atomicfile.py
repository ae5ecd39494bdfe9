"""slurm_gpushare.atomicfile: files replaced whole or not at all, no temporary file left behind."""

from __future__ import annotations

import os

import pytest

from slurm_gpushare.atomicfile import write_all_atomic, write_atomic


def test_write_atomic_replaces_the_file_with_the_given_mode(tmp_path):
    target = tmp_path / "state.json"
    target.write_text("old")
    assert write_atomic(target, "new", mode=0o644) == target
    assert target.read_text() == "new" and os.stat(target).st_mode & 0o777 == 0o644
    write_atomic(target, b"\x00bytes", fsync=False)
    assert target.read_bytes() == b"\x00bytes"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json"]


def test_write_atomic_into_a_missing_directory_leaves_nothing(tmp_path):
    with pytest.raises(FileNotFoundError):
        write_atomic(tmp_path / "missing" / "f", "x")
    assert list(tmp_path.iterdir()) == []


def test_write_all_atomic_changes_no_file_unless_all_are_written(tmp_path):
    a, b = tmp_path / "gres.conf", tmp_path / "slurm.conf"
    a.write_text("old a")
    with pytest.raises(OSError) as err:
        write_all_atomic({a: "new a", tmp_path / "missing" / "x": "new x"})
    assert err.value.filename == str(tmp_path / "missing" / "x")
    assert a.read_text() == "old a" and [p.name for p in tmp_path.iterdir()] == ["gres.conf"]
    write_all_atomic({a: "new a", b: "new b"}, mode=0o600)
    assert (a.read_text(), b.read_text()) == ("new a", "new b") and os.stat(b).st_mode & 0o777 == 0o600
