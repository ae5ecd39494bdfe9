"""slurm_gpushare.procinfo: processes by PID through psutil."""

from __future__ import annotations

import os
import subprocess
import sys

import psutil

from slurm_gpushare.procinfo import pid_alive, process, real_uid, running, session_id
from tests.conftest import wait_until


def test_this_process_is_alive_with_its_uid_and_session():
    me = process(os.getpid())
    assert me is not None and running(me) and pid_alive(os.getpid())
    assert real_uid(me) == os.getuid() and session_id(me) == os.getsid(0)


def test_no_such_pid():
    free = max(psutil.pids()) + 100_000
    assert process(free) is None and not pid_alive(free)
    assert process(0) is None and process(-1) is None and not pid_alive(0)


def test_a_zombie_is_not_alive_and_a_reaped_process_is_gone():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    proc = process(child.pid)
    assert proc is not None
    wait_until(lambda: proc.status() == psutil.STATUS_ZOMBIE, "the child exited, not reaped yet")
    try:
        assert not pid_alive(child.pid) and not running(proc)
    finally:
        child.wait()
    assert not running(proc) and real_uid(proc) is None and session_id(proc) is None
