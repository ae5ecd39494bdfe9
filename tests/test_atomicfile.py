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


def _plant(tmp_path, name):
    """A symlink at the temporary name this process would use for ``name``, to a file of someone else's."""
    victim = tmp_path / "victim"
    victim.write_text("secret")
    victim.chmod(0o600)
    os.symlink(victim, tmp_path / f".{name}.tmp{os.getpid()}")
    return victim


def test_write_atomic_never_follows_a_symlink_planted_at_its_temporary_name(tmp_path):
    # a directory another user can write (a scratch --prefix, a job's directory) may hold a link at the
    # predictable temporary name: following it would overwrite and chmod the file it points to as root
    victim = _plant(tmp_path, "prolog.sh")
    write_atomic(tmp_path / "prolog.sh", "#!/bin/sh\n", mode=0o755)
    assert victim.read_text() == "secret" and os.stat(victim).st_mode & 0o777 == 0o600
    target = tmp_path / "prolog.sh"
    assert not target.is_symlink() and target.read_text() == "#!/bin/sh\n"
    assert os.stat(target).st_mode & 0o777 == 0o755


def test_write_all_atomic_never_follows_a_symlink_planted_at_its_temporary_name(tmp_path):
    victim = _plant(tmp_path, "epilog.sh")
    write_all_atomic({tmp_path / "epilog.sh": "x\n", tmp_path / "a.lua": "y\n"}, mode=0o755)
    assert victim.read_text() == "secret" and os.stat(victim).st_mode & 0o777 == 0o600
    assert not (tmp_path / "epilog.sh").is_symlink() and (tmp_path / "epilog.sh").read_text() == "x\n"


def test_write_all_atomic_gives_each_file_its_own_mode_in_one_all_or_nothing_write(tmp_path):
    a, b = tmp_path / "prolog.sh", tmp_path / "job_submit.lua"
    write_all_atomic({a: "a", b: "b"}, mode={a: 0o755, b: 0o644})
    assert (os.stat(a).st_mode & 0o777, os.stat(b).st_mode & 0o777) == (0o755, 0o644)


def test_locked_holds_flock_and_says_when_another_holds_it(tmp_path):
    """One lock-file helper for the product (claims, the store's ingest, mig apply, the fake NVML's limits):
    exclusive or shared, waiting or not, a link refused where asked, the file made with its mode."""
    import os

    from slurm_gpushare.atomicfile import locked

    path = tmp_path / "x.lock"
    with locked(path, mode=0o640) as fd:
        assert fd is not None and (os.stat(path).st_mode & 0o777) == 0o640
        with locked(path, wait=False) as other:
            assert other is None  # another open file description: flock(2) refuses it now
        with locked(path, shared=True, wait=False) as other:
            assert other is None
    with locked(path, shared=True) as first, locked(path, shared=True, wait=False) as second:
        assert first is not None and second is not None  # readers share
    with locked(path, wait=False) as fd:
        assert fd is not None  # released when the block ended
    (tmp_path / "link.lock").symlink_to(path)
    with pytest.raises(OSError):
        with locked(tmp_path / "link.lock", nofollow=True):
            pass
