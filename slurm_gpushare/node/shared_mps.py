"""One MPS control daemon per GPU and user, shared by that user's jobs (``mps_mode = "per-gpu"``).

The daemon lives in ``<run_dir>/shared/gpu<N>-uid<U>/`` (``pipe``, ``log``, and ``jobs.json``: the jobs
it serves with their limits), under a lock of its own. The first job starts it, the last one stops it.
docs/mps.md explains what the shared mode does and does not enforce.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from slurm_gpushare.atomicfile import write_atomic
from slurm_gpushare.node.context import HookContext, JobFault, stuck_reason
from slurm_gpushare.node.jobdir import FILE_MODE, job_lock
from slurm_gpushare.node.mps import MpsDaemon, MpsError, remove_tree
from slurm_gpushare.node.plan import JobPlan


def shared_root(run_dir: Path) -> Path:
    """The directory of the node's shared daemons (one subdirectory each)."""
    return run_dir / "shared"


def shared_dir(ctx: HookContext, gpu: int, uid: int) -> Path:
    """The shared daemon of one GPU and one user (``mps_mode = "per-gpu"``)."""
    return shared_root(ctx.run_dir) / f"gpu{gpu}-uid{uid}"


_SHARED_NAME = re.compile(r"gpu\d+-uid(\d+)")


def shared_user(d: Path) -> int | None:
    """The uid a shared daemon's directory (:func:`shared_dir`) is for, None for a name it does not give."""
    m = _SHARED_NAME.fullmatch(d.name)
    return int(m.group(1)) if m else None


def members(d: Path) -> dict[str, dict]:
    """The jobs a shared daemon serves (``jobs.json``): job id -> its limits; empty when none or unreadable."""
    try:
        return json.loads((d / "jobs.json").read_text())
    except (OSError, ValueError):
        return {}


def _write_members(d: Path, jobs: dict[str, dict]) -> None:
    write_atomic(d / "jobs.json", json.dumps(jobs), mode=FILE_MODE)


def join_shared(ctx: HookContext, plan: JobPlan, d: Path) -> MpsDaemon:
    """Add the job to the GPU's shared daemon of its user, starting the daemon for the first job.

    An MPS control daemon runs one server per user at a time (NVIDIA: a server of another user must
    wait until the first user's clients are done), so a daemon is shared only by one user's jobs on
    one GPU; other users' jobs get their own. The server-side default pinned-memory limit is the
    largest share among the jobs (a running server is raised to it with
    ``set_device_pinned_mem_limit``); each job's own share is in its client environment. docs/mps.md
    explains what that does and does not enforce.

    Raises:
        JobFault: the daemon could not be started or did not take a limit (it runs as the jobs' user, who
            may kill it: the job fails, not the node).
    """
    with job_lock(d):
        d.mkdir(parents=True, exist_ok=True)
        daemon = ctx.mps(plan.job_id, plan, base=d)
        jobs = members(d)
        try:
            if not daemon.alive():
                daemon.stop()
                jobs = {}
                daemon.start()
            jobs[plan.job_id] = {"mem_limit_mib": plan.mem_limit_mib, "sm_percent": plan.sm_percent}
            limits = [m["mem_limit_mib"] for m in jobs.values() if m.get("mem_limit_mib")]
            settings = []
            if limits:
                settings.append(daemon.pinned_mem_limit(0, max(limits)))
                settings += [daemon.server_pinned_mem_limit(server, 0, max(limits)) for server in daemon.server_pids()]
            shares = [m.get("sm_percent") or 100 for m in jobs.values()]
            if max(shares) < 100:
                settings.append(daemon.active_thread_percentage(max(shares)))
            daemon.configure(settings)
        except MpsError as e:
            if not jobs or list(jobs) == [plan.job_id]:
                daemon.stop()
            raise JobFault(f"shared MPS control daemon {d} for job {plan.job_id} failed: {e}",
                            hint=f"check {ctx.config.mps_control} and the driver") from None
        _write_members(d, jobs)
        return daemon


def leave_shared(ctx: HookContext, job_id: str, d: Path) -> str | None:
    """Remove the job from a shared daemon; the last job stops it. Returns a drain reason if stuck."""
    with job_lock(d, remove=False):
        jobs = members(d)
        jobs.pop(job_id, None)
        if jobs:
            _write_members(d, jobs)
            return None
        problem = stuck_reason(ctx, ctx.mps(job_id, base=d).stop(), f"shared MPS daemon {d}")
        if problem:
            return problem
        try:
            remove_tree(d)  # its pipe and log directories are tmpfs mounts
        except OSError:
            shutil.rmtree(d, ignore_errors=True)
        return None
