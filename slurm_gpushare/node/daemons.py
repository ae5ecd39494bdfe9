"""MPS control daemons of a node found by process, whatever directory they were started from, and stopped.

A per-job daemon lives in ``<run_dir>/jobs/<job>/mps/pipe`` (:mod:`slurm_gpushare.node.jobdir` finds it by
process, :func:`~slurm_gpushare.node.jobdir.job_daemons`); a shared one in ``<run_dir>/shared/gpu<N>-uid<U>/``
(:mod:`slurm_gpushare.node.shared_mps`). The Epilog, ``doctor --repair`` and ``mig apply`` (which must stop
every daemon of a drained node before it changes MIG) stop them through here.
"""

from __future__ import annotations

from pathlib import Path

from slurm_gpushare.node.jobdir import JobDaemon, job_daemons
from slurm_gpushare.node.mps import MpsDaemon, MpsSettings
from slurm_gpushare.node.shared_mps import shared_root


def by_pipe_dir(found: list[JobDaemon]) -> list[JobDaemon]:
    """One entry per pipe directory (a daemon and its servers share one)."""
    out: dict[Path, JobDaemon] = {}
    for d in found:
        if d.pipe_dir not in out or d.binary != "nvidia-cuda-mps-control":  # the control's own path
            out[d.pipe_dir] = d
    return list(out.values())


def stop_found_daemon(found: JobDaemon, quit_timeout_s: float = 10.0) -> str | None:
    """Stop a daemon found by process (its pipe directory and binary; any owner), and what it started.
    Returns a problem (a process that survived SIGKILL) or None."""
    daemon = MpsDaemon(found.pipe_dir, found.pipe_dir.parent / "log", visible_devices="",
                       settings=MpsSettings(control_binary=found.binary, quit_timeout_s=quit_timeout_s,
                                            kill_timeout_s=2.0))
    result = daemon.stop()
    if result.survivors:
        return f"MPS daemon {found.pipe_dir}: processes survived SIGKILL"
    return None





def stop_all(run_dir: Path) -> list[str]:
    """Stop every MPS daemon of the node: those found by process (per-job, any owner) and the shared ones
    under ``run_dir``. Returns the problems (processes that survived SIGKILL), empty when all stopped."""
    problems = [p for p in (stop_found_daemon(found) for found in by_pipe_dir(job_daemons(run_dir))) if p]
    for d in sorted(p for p in shared_root(run_dir).glob("*") if (p / "pipe").is_dir()):
        result = MpsDaemon(d / "pipe", d / "log", visible_devices="",
                           settings=MpsSettings(kill_timeout_s=2.0)).stop()
        if result.survivors:
            problems.append(f"MPS daemon {d}: processes survived SIGKILL")
    return problems
