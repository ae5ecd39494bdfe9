"""Facts about local processes, through psutil, for every layer (the MPS daemon's process tree, the fake
NVML's process table, the dev cluster's daemons).

A process is held as a :class:`psutil.Process`: it remembers the start time of the PID it was made for,
so a PID the kernel gave to another process since is never taken for it (psutil compares the start
time in ``is_running`` and before sending a signal).
"""

from __future__ import annotations

import os

import psutil

#: States of a process that has exited (a zombie waits only for its parent to reap it).
_GONE = (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)


def process(pid: int) -> psutil.Process | None:
    """The process with this PID now, or None when there is none (or ``pid`` is not positive)."""
    if isinstance(pid, bool) or not isinstance(pid, int) or pid < 1:
        return None
    try:
        return psutil.Process(pid)
    except psutil.NoSuchProcess:
        return None


def running(proc: psutil.Process) -> bool:
    """The same process (PID and start time) still exists and has not exited (not a zombie)."""
    try:
        return proc.is_running() and proc.status() not in _GONE
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return True  # another user's process that we may not inspect: it exists


def stopped(proc: psutil.Process) -> bool:
    """The process is stopped by a signal (SIGSTOP, SIGTSTP: state ``T``) or under a tracer (``t``), so it runs no
    code until SIGCONT or the tracer lets it go (``/proc/<pid>/stat`` field 3, through psutil); False when it is
    gone or may not be inspected."""
    try:
        return proc.status() in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP)
    except psutil.Error:
        return False


def pid_alive(pid: int) -> bool:
    """A process with this PID exists and is not a zombie."""
    proc = process(pid)
    return proc is not None and running(proc)


def session_id(proc: psutil.Process) -> int | None:
    """The session id of a process (``getsid(2)``), or None when it is gone."""
    try:
        return os.getsid(proc.pid)
    except OSError:
        return None


def real_uid(proc: psutil.Process) -> int | None:
    """The real uid of a process, or None when it is gone or cannot be read."""
    try:
        return proc.uids().real
    except psutil.Error:
        return None


def started_at(proc: psutil.Process) -> float | None:
    """When the process started, epoch seconds (the kernel's start time in ``/proc/<pid>/stat`` plus the
    boot time, as psutil computes it), or None when it is gone."""
    try:
        return proc.create_time()
    except psutil.Error:
        return None


def kill_and_wait(proc: psutil.Process, timeout_s: float) -> bool:
    """Send SIGKILL to the process (psutil checks first that the PID still names the same process) and
    wait up to ``timeout_s`` seconds for it to be gone. Returns True when it is gone (or already was),
    False when it outlived SIGKILL (a process stuck in the kernel, state ``D``)."""
    try:
        proc.kill()
    except psutil.NoSuchProcess:
        return True
    except psutil.AccessDenied:
        return not running(proc)
    _gone, alive = psutil.wait_procs([proc], timeout=timeout_s)
    return not alive or not running(proc)
