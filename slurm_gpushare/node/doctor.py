"""``doctor``: find what the hooks left on a node (job directories and MPS daemons of jobs gone, shared
daemons listing such jobs, dead daemons of running jobs, GPUs in a non-DEFAULT compute mode, GPU processes
of no running job) and, with ``repair``, clean up and restart what can be."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from slurm_gpushare.errors import GpushareError
from slurm_gpushare.hardware.machine import Machine
from slurm_gpushare.hardware.ports import open_nvml
from slurm_gpushare.node.context import HookContext
from slurm_gpushare.node.daemons import by_pipe_dir, stop_found_daemon
from slurm_gpushare.node.epilog import cleanup_job
from slurm_gpushare.node.jobdir import job_daemons, job_lock, read_state
from slurm_gpushare.node.leftovers import sweep
from slurm_gpushare.node.plan import JobPlan
from slurm_gpushare.node.prolog import prepare
from slurm_gpushare.node.shared_mps import leave_shared, members, shared_root
from slurm_gpushare.slurm import commands


@dataclass(frozen=True)
class Finding:
    """One thing ``doctor`` found: what, and what it did or would do."""

    job_id: str
    problem: str
    action: str


def _compute_modes(ctx: HookContext, repair: bool, port=None) -> list[Finding]:
    """GPUs left in a compute mode other than DEFAULT (nothing of ours sets one: several jobs' MPS
    servers share a GPU, which EXCLUSIVE_PROCESS would forbid). ``nvmlDeviceGetComputeMode``."""
    try:
        machine = Machine.load(ctx.config.machine_for(ctx.node))
    except GpushareError:
        return []
    out = []
    try:
        with (port or open_nvml()) as p:
            for g in machine.gpus:
                mode = p.compute_mode(g.index)
                if mode != "DEFAULT":
                    action = "would set it to DEFAULT"
                    if repair:
                        p.set_compute_mode(g.index, "DEFAULT")
                        action = "set it to DEFAULT"
                    out.append(Finding("-", f"GPU {g.index} is in compute mode {mode}", action))
    except GpushareError as e:
        out.append(Finding("-", f"compute modes not checked: NVML failed ({e})", "nothing done"))
    return out


def _gpu_processes(ctx: HookContext, repair: bool, running_jobs: set[str] | None, port=None) -> list[Finding]:
    """GPU processes of no running job (:func:`slurm_gpushare.node.leftovers.sweep` with no ended job): one
    in the cgroup of a job that no longer runs here is killed with ``repair``; any other is reported and
    left alone (only its user or an administrator knows whose it is)."""
    try:
        with (port or open_nvml()) as p:
            running = None if running_jobs is None else dict.fromkeys(running_jobs)
            result = sweep(ctx, p, ended=None, running=running, kill=repair)
    except GpushareError as e:
        return [Finding("-", f"GPU processes not checked: {e}", "nothing done")]
    out = []
    for v in result.verdicts:
        h = v.holder
        if v.action == "kill":
            action = "would kill it"
            if repair:
                action = "killed it" if h in result.killed else f"{LEFT_ALONE}: it survives SIGKILL"
            out.append(Finding(h.cgroup_job or "-", f"{h.describe()} holds the GPU, {v.why}", action))
        elif v.action == "unknown":
            out.append(Finding("-", f"{h.describe()} holds the GPU: {v.why}", "nothing done"))
        elif v.action == "drain":
            out.append(Finding("-", f"{h.describe()} holds the GPU, {v.why}",
                               f"{LEFT_ALONE}: not provably a job's; kill it or ask its user"))
    return out


#: How a finding that ``--repair`` does not repair begins its action (the command then exits 1).
LEFT_ALONE = "left alone"


def doctor_within(ctx: HookContext, *, repair: bool, limit: float, **kw) -> tuple[list[Finding], bool]:
    """:func:`doctor` within ``limit`` seconds (SIGALRM, as the hooks' own limit:
    :func:`slurm_gpushare.node.hook.time_limit`): something it waits on may never answer (slurmctld, NVML, an
    MPS daemon that ignores ``quit``). Keyword arguments as :func:`doctor`.

    Returns:
        the findings (those made before the limit when it ran out) and whether it finished.
    """
    from slurm_gpushare.node.hook import HookTimeout, time_limit

    findings: list[Finding] = []
    try:
        with time_limit(limit):
            doctor(ctx, repair=repair, findings=findings, **kw)
    except HookTimeout:
        return findings, False
    return findings, True


def doctor(ctx: HookContext, *, repair: bool, running_jobs: set[str] | None = None, port=None,
           findings: list[Finding] | None = None) -> list[Finding]:
    """Find leftovers on this node: job directories and MPS daemons of jobs no longer running here,
    shared daemons listing such jobs, dead daemons of running jobs, GPUs left in a non-DEFAULT
    compute mode, GPU processes of no running job (:mod:`slurm_gpushare.node.leftovers`). With
    ``repair``, clean up and restart what can be: a GPU process is killed only when its cgroup names a
    job that no longer runs here.

    Args:
        running_jobs: ids of jobs running on this node (default: asks slurmctld with ``squeue``).
        port: the NVML port for the compute modes and the GPU processes (default: :func:`open_nvml`).
        findings: the list to add the findings to as they are made (returned).

    Raises:
        SlurmError: squeue failed (when ``running_jobs`` is not given).
    """
    jobs_dir = ctx.run_dir / "jobs"
    shared = shared_root(ctx.run_dir)
    findings = [] if findings is None else findings
    findings += _compute_modes(ctx, repair, port)
    findings += _gpu_processes(ctx, repair, running_jobs, port)
    # found by process: a daemon whose job directory was removed has no other trace
    homeless = [d for d in by_pipe_dir(job_daemons(ctx.run_dir)) if not ctx.job_dir(d.job_id).is_dir()]
    if not jobs_dir.is_dir() and not shared.is_dir() and not homeless:
        return findings
    if running_jobs is None:
        running_jobs = set(commands.running_jobs(ctx.node))
    for found in homeless:
        if found.job_id in running_jobs:
            continue  # its Prolog is creating the directory right now, or ran with another run_dir
        action = "would stop it"
        if repair:
            action = stop_found_daemon(found, control_binary=ctx.config.mps_control,
                                       quit_timeout_s=ctx.config.mps_quit_timeout) or "stopped it"
        findings.append(Finding(found.job_id, f"MPS daemon {found.pipe_dir} (pid {found.pid}, uid {found.uid}) "
                                f"runs without its job directory", action))
    for d in sorted(p for p in shared.glob("*") if p.is_dir()):
        gone = sorted(set(members(d)) - running_jobs)
        if gone or not members(d):
            action = "would remove them (and stop the daemon when none is left)"
            if repair:
                problem = None
                for job_id in gone or ["-"]:
                    problem = leave_shared(ctx, job_id, d) or problem
                action = problem or "removed them; the daemon stops with its last job"
            findings.append(Finding(",".join(gone) or "-",
                                    f"shared MPS daemon {d.name} lists jobs not running here", action))
    for d in sorted(p for p in jobs_dir.glob("*") if p.is_dir()):
        job_id = d.name
        state = read_state(d)
        if job_id not in running_jobs:
            action = "stopped its MPS daemon and removed its directory" if repair else "would clean up"
            problem = None
            if repair:
                with job_lock(d, remove=True):
                    problem = cleanup_job(ctx, job_id)
            findings.append(Finding(job_id, f"job {job_id} is not running here but left {d}",
                                    problem or action))
            continue
        plan = (state or {}).get("plan") or {}
        if plan.get("kind") == "mps" and not ctx.mps(job_id).alive():
            action = "would restart it"
            if repair:
                with job_lock(d):
                    _restart(ctx, plan, d)
                action = "restarted it with the job's limits"
            findings.append(Finding(job_id, f"MPS daemon of running job {job_id} is not running", action))
    return findings


def _restart(ctx: HookContext, plan_fields: dict, job_dir: Path) -> None:
    (job_dir / "state.json").unlink(missing_ok=True)
    prepare(ctx, JobPlan.from_dict(plan_fields), job_dir)
