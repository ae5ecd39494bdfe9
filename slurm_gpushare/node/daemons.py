"""MPS control daemons of a node found by process, whatever directory they were started from, and stopped.

A per-job daemon lives in ``<run_dir>/jobs/<job>/mps/pipe`` (:mod:`slurm_gpushare.node.jobdir` finds it by
process, :func:`~slurm_gpushare.node.jobdir.job_daemons`); a shared one in ``<run_dir>/shared/gpu<N>-uid<U>/``
(:mod:`slurm_gpushare.node.shared_mps`). The Epilog, ``doctor --repair`` and ``mig apply`` (which must stop
every daemon of a drained node before it changes MIG) stop them through here.
"""

from __future__ import annotations

import pwd
from pathlib import Path

from slurm_gpushare.node.jobdir import JobDaemon, job_daemons
from slurm_gpushare.node.mps import MpsDaemon, MpsSettings
from slurm_gpushare.node.shared_mps import shared_root, shared_user


def by_pipe_dir(found: list[JobDaemon]) -> list[JobDaemon]:
    """One entry per pipe directory and user (a daemon and its servers share one; a process of another user
    that names the same directory is stopped as that user, so it can stop only what that user could)."""
    out: dict[tuple[Path, int], JobDaemon] = {}
    for d in found:
        out.setdefault((d.pipe_dir, d.uid), d)
    return list(out.values())


def stop_found_daemon(found: JobDaemon, *, control_binary: str, quit_timeout_s: float = 10.0) -> str | None:
    """Stop a daemon found by process, and what it started. Returns a problem (a process that survived
    SIGKILL) or None.

    Everything the process carries is its user's to choose (its command line, its environment, the pid file
    in the pipe directory it names), so root never runs a program it names: ``quit`` is sent with the site's
    ``control_binary`` (node.toml ``mps_control``), run as the process's user, and the rest is signals.
    """
    settings = MpsSettings(control_binary=control_binary, quit_timeout_s=quit_timeout_s, kill_timeout_s=2.0)
    daemon = MpsDaemon(found.pipe_dir, found.pipe_dir.parent / "log", visible_devices="", uid=found.uid,
                       gid=found.gid if found.gid >= 0 else _primary_gid(found.uid), settings=settings)
    result = daemon.stop()
    if result.survivors:
        return f"MPS daemon {found.pipe_dir}: processes survived SIGKILL"
    return None


def _primary_gid(uid: int) -> int:
    """The user's primary group (passwd), or the uid itself for a user the node does not know."""
    try:
        return pwd.getpwuid(uid).pw_gid
    except KeyError:
        return uid


def stop_all(run_dir: Path, *, control_binary: str) -> list[str]:
    """Stop every MPS daemon of the node: those found by process (per job, each as its user) and the shared
    ones under ``run_dir`` (as the user their directory names), ``quit`` sent with the site's
    ``control_binary``. Returns the problems (processes that survived SIGKILL), empty when all stopped."""
    problems = [p for p in (stop_found_daemon(found, control_binary=control_binary)
                            for found in by_pipe_dir(job_daemons(run_dir))) if p]
    for d in sorted(p for p in shared_root(run_dir).glob("*") if (p / "pipe").is_dir()):
        uid = shared_user(d)
        result = MpsDaemon(d / "pipe", d / "log", visible_devices="", uid=uid,
                           gid=_primary_gid(uid) if uid is not None else None,
                           settings=MpsSettings(control_binary=control_binary, kill_timeout_s=2.0)).stop()
        if result.survivors:
            problems.append(f"MPS daemon {d}: processes survived SIGKILL")
    return problems
