"""A job cannot fill the node's memory through its MPS directories (issue 26 N6).

The MPS pipe and log directories are the job's user's (the control daemon runs as that user and writes
there), and they live under the run dir, which is tmpfs (``/run``: RAM). Each is a tmpfs of its own, of
``mps_dir_size`` (node.toml, default 64 MiB), mounted by root when the daemon starts and removed when it
stops. The writer is a real unprivileged user (``gpushare-alice``) writing as her job can; the bystander
(``gpushare-bob``) gets his own daemon afterwards.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

import pytest

import slurm_gpushare_dev
from slurm_gpushare.node.mps import MpsDaemon, MpsSettings

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as a test user")

FAKE_CONTROL = Path(slurm_gpushare_dev.__file__).parent / "fake_mps" / "nvidia-cuda-mps-control"


def mounts_below(path: Path) -> list[str]:
    """Mount points at or below ``path`` (``/proc/self/mountinfo``, field 5)."""
    prefix = str(path)
    with open("/proc/self/mountinfo") as f:
        points = [line.split()[4] for line in f]
    return [p for p in points if p == prefix or p.startswith(prefix + "/")]


def write_as(user: str, path: Path, mib: int) -> subprocess.CompletedProcess:
    return subprocess.run(["runuser", "-u", user, "--", "dd", "if=/dev/zero", f"of={path}", "bs=1M",
                           f"count={mib}"], capture_output=True, text=True)


@pytest.fixture
def base():
    d = Path(tempfile.mkdtemp(prefix="gsspace-", dir="/tmp"))
    d.chmod(0o755)
    yield d
    for point in sorted(mounts_below(d), reverse=True):  # what a failing test left
        subprocess.run(["umount", "-l", point], check=False)
    subprocess.run(["rm", "-rf", str(d)], check=False)


def daemon(base: Path, name: str, uid: int, **settings) -> MpsDaemon:
    return MpsDaemon(base / name / "pipe", base / name / "log", visible_devices="GPU-00000000-0000-4000-8000-0000",
                     uid=uid, settings=MpsSettings(control_binary=str(FAKE_CONTROL), quit_timeout_s=2,
                                                   kill_timeout_s=1, **settings))


def test_a_job_cannot_fill_the_node_memory_through_its_mps_directories(users, base):
    alice = daemon(base, "alice", users["gpushare-alice"])
    alice.start()
    try:
        for d in (alice.log_dir, alice.pipe_dir):
            filled = write_as("gpushare-alice", d / "fill", 100)
            assert filled.returncode != 0 and "No space left" in filled.stderr, (d, filled)
            assert (d / "fill").stat().st_size <= 64 << 20
        bob = daemon(base, "bob", users["gpushare-bob"])
        bob.start()  # the bystander's daemon starts: alice filled only her own directories
        assert bob.alive()
        assert not bob.stop().survivors
    finally:
        result = alice.stop()
    assert not result.survivors
    assert mounts_below(base) == []
    assert not (base / "alice" / "log").exists() and not (base / "alice" / "pipe").exists()


def test_the_size_is_the_sites_and_zero_mounts_nothing(users, base):
    small = daemon(base, "small", users["gpushare-alice"], dir_size_mib=2)
    small.start()
    try:
        assert mounts_below(base) == [str(small.pipe_dir), str(small.log_dir)] or \
            sorted(mounts_below(base)) == sorted([str(small.pipe_dir), str(small.log_dir)])
        filled = write_as("gpushare-alice", small.log_dir / "fill", 10)
        assert filled.returncode != 0 and (small.log_dir / "fill").stat().st_size <= 2 << 20
        # the daemon's directories as the Prolog makes them: alice's, 0700
        st = small.log_dir.stat()
        assert (st.st_uid, st.st_mode & 0o777) == (users["gpushare-alice"], 0o700)
    finally:
        small.stop()
    assert mounts_below(base) == []
    unbounded = daemon(base, "none", users["gpushare-alice"], dir_size_mib=0)
    unbounded.start()
    try:
        assert mounts_below(base) == []
    finally:
        unbounded.stop()


def test_a_start_failure_keeps_the_logs_and_the_job_dir_removal_unmounts_them(users, base):
    """A daemon that fails to start keeps its log directory for the administrator (still mounted); removing
    the job directory (the Epilog's cleanup) unmounts it first, so nothing stays mounted or on the disk."""
    from slurm_gpushare.node.mps import MpsError, remove_tree

    broken = base / "broken-control"
    broken.write_text("#!/bin/sh\necho 'cannot start' >&2\nexit 3\n")
    broken.chmod(0o755)
    failing = MpsDaemon(base / "job" / "mps" / "pipe", base / "job" / "mps" / "log", visible_devices="GPU-x",
                        uid=users["gpushare-alice"],
                        settings=MpsSettings(control_binary=str(broken), quit_timeout_s=1, kill_timeout_s=1))
    with pytest.raises(MpsError):
        failing.start()
    assert failing.log_dir.is_dir() and mounts_below(base) == [str(failing.log_dir)]
    remove_tree(base / "job")
    assert mounts_below(base) == [] and not (base / "job").exists()
