"""The node hooks' cache of the Slurm release (``cached_local_release``): asked once per sinfo binary."""

from __future__ import annotations

import os

import pytest

from slurm_gpushare.slurm.commands import cached_local_release, local_release
from slurm_gpushare.slurm.release import Release


@pytest.fixture
def sinfo(tmp_path, monkeypatch):
    """A ``sinfo`` on PATH that prints the version written into it and counts its runs."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    runs = tmp_path / "runs"

    def install(version: str) -> None:
        script = bin_dir / "sinfo"
        new = bin_dir / "sinfo.new"  # replaced, as a package upgrade does: a new inode
        new.write_text(f"#!/bin/sh\necho run >> {runs}\necho 'slurm {version}'\n")
        new.chmod(0o755)
        os.replace(new, script)
        local_release.cache_clear()

    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    local_release.cache_clear()
    yield install, lambda: len(runs.read_text().splitlines()) if runs.exists() else 0
    local_release.cache_clear()


def test_the_release_is_asked_once_per_sinfo_binary(sinfo, tmp_path):
    install, runs = sinfo
    cache = tmp_path / "slurm-release"
    install("24.11.5")
    assert cached_local_release(cache) == Release(24, 11) and runs() == 1
    local_release.cache_clear()  # a new hook process
    assert cached_local_release(cache) == Release(24, 11) and runs() == 1
    install("26.05.3")  # Slurm upgraded
    assert cached_local_release(cache) == Release(26, 5) and runs() == 2


def test_a_damaged_or_foreign_cache_is_asked_again(sinfo, tmp_path):
    install, runs = sinfo
    cache = tmp_path / "slurm-release"
    install("22.05.8")
    cache.write_text("/usr/bin/sinfo 1 2 3\n26.05\n")  # another binary's key
    assert cached_local_release(cache) == Release(22, 5) and runs() == 1
    local_release.cache_clear()
    key = cache.read_text().split("\n")[0]
    cache.write_text(f"{key}\nnot a version\n")
    assert cached_local_release(cache) == Release(22, 5) and runs() == 2


def test_an_unwritable_cache_is_no_error(sinfo, tmp_path):
    install, runs = sinfo
    install("24.11.5")
    assert cached_local_release(tmp_path / "missing-dir" / "slurm-release") == Release(24, 11)


def _within(seconds: int, fn):
    """``fn()``, failing the test instead of hanging when it takes longer than ``seconds``."""
    import signal

    class Hung(BaseException):  # not an OSError (TimeoutError is one, and the code under test catches those)
        pass

    def expire(*_):
        raise Hung(f"still running after {seconds} s")

    old = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        return fn()
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


@pytest.mark.parametrize("kind", ["fifo", "link-to-fifo", "directory"])
def test_a_cache_that_is_no_small_regular_file_is_asked_again_without_hanging(sinfo, tmp_path, kind):
    """A FIFO at the cache's name (or a link to one) would block the Prolog's open(2) for ever: the cache is read
    only when it is a small regular file of its own, not through a link."""
    install, runs = sinfo
    install("24.11.5")
    cache = tmp_path / "slurm-release"
    if kind == "fifo":
        os.mkfifo(cache)
    elif kind == "link-to-fifo":
        os.mkfifo(tmp_path / "fifo")
        cache.symlink_to(tmp_path / "fifo")
    else:
        cache.mkdir()
    assert _within(5, lambda: cached_local_release(cache)) == Release(24, 11) and runs() == 1
