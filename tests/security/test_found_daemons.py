"""Root stops MPS daemons it finds by process (the Epilog of a job whose node config is broken or whose
directory is gone, ``doctor --repair``, ``mig apply``): it never runs a program a user named.

What a found process carries is its user's to choose: its command line (the path of the "control binary")
and ``CUDA_MPS_PIPE_DIRECTORY``; the pid file lies in the job's pipe directory, which the job's user owns.
Root took the control program to send ``quit`` with from that command line and ran it as root: any user
could have root run a program of theirs by starting ``~/x/nvidia-cuda-mps-control`` with their job's pipe
directory in its environment and its pid in the pid file.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from slurm_gpushare.node.daemons import stop_all, stop_found_daemon
from slurm_gpushare.node.jobdir import job_daemons
from slurm_gpushare.node.mps import PID_FILE
from tests.security.conftest import public_tmp


@pytest.fixture
def shared_dir():
    """A directory both root and the test user can reach (pytest's tmp_path is root's alone)."""
    with public_tmp("gps-found-", 0o755) as d:
        yield d


def _script(path: Path, body: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.parent.chmod(0o755)
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return path


def _disguised(users, shared_dir: Path, job: str):
    """Alice's process that looks like her job's MPS control daemon: her own program named
    nvidia-cuda-mps-control on its command line, her job's pipe directory in its environment, and its pid in
    the pid file of that directory (hers)."""
    uid = users["gpushare-alice"]
    run = shared_dir / "run"
    pipe = run / "jobs" / job / "mps" / "pipe"
    pipe.mkdir(parents=True)
    for d in (run, run / "jobs", run / "jobs" / job, run / "jobs" / job / "mps"):
        d.chmod(0o755)
    os.chown(pipe, uid, uid)
    evil_ran = shared_dir / "evil-ran"
    evil = _script(shared_dir / "alice" / "nvidia-cuda-mps-control", f"id -u > {evil_ran}\n")
    os.chown(evil, uid, uid)
    proc = subprocess.Popen(["/bin/bash", "-c", f"exec -a {evil} sleep 120"],
                            env={"PATH": "/usr/bin:/bin", "CUDA_MPS_PIPE_DIRECTORY": str(pipe)},
                            user=uid, group=uid, cwd="/")
    (pipe / PID_FILE).write_text(f"{proc.pid}\n")
    os.chown(pipe / PID_FILE, uid, uid)
    deadline = time.monotonic() + 10
    while not (found := [d for d in job_daemons(run) if d.pid == proc.pid]):
        assert time.monotonic() < deadline, "the disguised process is not found by process"
        time.sleep(0.05)
    return run, proc, found[0], evil_ran


def _configured(shared_dir: Path) -> tuple[Path, Path]:
    """The site's control program (node.toml mps_control): records who ran it, answers quit."""
    ran = shared_dir / "configured-ran"
    ran.touch()
    ran.chmod(0o666)
    return _script(shared_dir / "bin" / "nvidia-cuda-mps-control", f"id -u >> {ran}\ncat > /dev/null\n"), ran


def test_a_daemon_found_by_process_is_stopped_with_the_site_s_binary_as_its_user(users, shared_dir):
    run, proc, found, evil_ran = _disguised(users, shared_dir, "77")
    configured, ran = _configured(shared_dir)
    try:
        assert found.binary.endswith("/alice/nvidia-cuda-mps-control")  # what the process claims
        stop_found_daemon(found, control_binary=str(configured), quit_timeout_s=1.0)
        assert proc.wait(timeout=30) != 0  # signalled
        assert not evil_ran.exists(), f"root ran alice's program: {evil_ran.read_text()!r}"
        assert ran.read_text().split() == [str(users["gpushare-alice"])]  # quit sent as her, by the site's binary
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_mig_apply_s_stop_of_every_daemon_runs_no_user_program(users, shared_dir):
    run, proc, _found, evil_ran = _disguised(users, shared_dir, "78")
    configured, ran = _configured(shared_dir)
    try:
        assert stop_all(run, control_binary=str(configured)) == []
        assert proc.wait(timeout=30) != 0
        assert not evil_ran.exists(), f"root ran alice's program: {evil_ran.read_text()!r}"
        assert ran.read_text().split() == [str(users["gpushare-alice"])]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
