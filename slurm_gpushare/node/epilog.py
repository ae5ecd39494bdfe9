"""The Epilog: tear down what the Prolog prepared (or half-prepared) and write the job's accounting
records (slurmd runs it as root, ``slurm-gpushare hook epilog`` from the ``Epilog=`` wrapper in ``etc/``).

Last it looks for GPU processes the job left behind (:mod:`slurm_gpushare.node.leftovers`): a process
that provably belongs to the ended job is killed and logged; one it cannot attribute (another user's,
root's, or one that may be a running job's) drains the node with a reason naming pid, user and GPU.

The exit status is non-zero (which drains the node) only when a process of the job's MPS daemon
survives SIGKILL, when a GPU process is left that the Epilog may not kill or that survives SIGKILL, or
when the node config cannot be read (:func:`epilog_without_config`: the job's daemon is stopped all the
same); accounting never fails the Epilog.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from slurm_gpushare.errors import GpushareError, InputError
from slurm_gpushare.hardware.ports import open_nvml
from slurm_gpushare.node import claims
from slurm_gpushare.node.config import NodeConfig
from slurm_gpushare.node.context import (
    HookContext,
    JobFault,
    job_info,
    load_machine,
    log_event,
    machine_with_uuids,
    plan_with_machine,
    stuck_reason,
)
from slurm_gpushare.node.daemons import by_pipe_dir, stop_found_daemon
from slurm_gpushare.node.jobdir import job_daemons, job_lock, read_run, read_state, restart_from_env
from slurm_gpushare.node.leftovers import EndedJob, drain_reason, sweep
from slurm_gpushare.node.mps import remove_tree
from slurm_gpushare.node.plan import JobPlan
from slurm_gpushare.node.shared_mps import leave_shared
from slurm_gpushare.slurm.job import JobInfo, job_from_env


def epilog(ctx: HookContext, env: dict[str, str]) -> int:
    """Tear down what the Prolog prepared (or half-prepared). Returns the exit status.

    Raises:
        InputError: ``SLURM_JOB_ID`` is not set (not run by slurmd).
    """
    job_id = env.get("SLURM_JOB_ID", "")
    if not job_id:
        raise InputError("SLURM_JOB_ID is not set: run this as slurmd's Epilog")
    job_dir = ctx.job_dir(job_id)
    gpu_job = bool(env.get("SLURM_JOB_GPUS") or env.get("CUDA_VISIBLE_DEVICES"))
    run = read_run(job_dir)
    served = any((job_dir / name).exists() for name in ("env", "devices"))  # an MPS share, MIG devices
    released = release_claim(ctx, job_id, restart_from_env(env), gpu_job=gpu_job, run=run.restart if run else None,
                             served=served)
    if gpu_job or job_dir.exists():
        record_usage(ctx, env, read_state(job_dir) or {}, refused=released)
    problem = None
    if job_dir.exists():
        with job_lock(job_dir, remove=True):
            problem = cleanup_job(ctx, job_id)
    elif gpu_job:  # removed while the job ran (an administrator, a cleaner of the run dir): found by process
        problem = stop_homeless(ctx, job_id)
    if not problem and gpu_job:
        problem = sweep_leftovers(ctx, env, start=run.start if run else None)
    if gpu_job:  # this node's old run marks (the controller's worker, as SlurmUser, may not remove them)
        from slurm_gpushare.accounting.spool import prune_marks

        prune_marks(ctx.config.spool_dir, ctx.node)
    if problem:
        ctx.do_drain(problem)
        return 1
    return 0


def release_claim(ctx: HookContext, job_id: str, restart: int = 0, *, gpu_job: bool = True,
                  run: int | None = None, served: bool = False) -> int | None:
    """Forget ``job_id``'s claim on its GPUs (:mod:`slurm_gpushare.node.claims`) and keep a rerun from starting
    without its Prolog (issue 26 N12): slurmd runs no Prolog for a job id still in its credential cache
    (``first_job_run`` in src/slurmd/slurmd/req.c, every supported release; the cache keeps an ended job's id for
    the credential lifetime, 120 s by default), so a requeued job whose start is brought forward (its user may
    ``scontrol update StartTime=now``) runs without one.

    * This run had a Prolog (``run``: its restart count from run.json), the product prepared it (``served``: an
      MPS share or MIG devices) and slurmctld has requeued it (``restart``, slurmd's count, is higher): it is
      marked refused, so the next run's tasks start only after a Prolog.
    * This run of a job with GPUs here had no Prolog (``run`` is None), an earlier run is marked refused here,
      and this is not the Epilog of the run the Prolog refused: its tasks failed in the TaskProlog; the job is
      requeued (the next run comes after slurmctld's requeue delay, with its Prolog) and this run marked refused.

    Refused marks older than :data:`~slurm_gpushare.node.claims.REFUSED_KEEP_S` are removed. Nothing here fails
    the Epilog: a job that cannot be requeued, slurmctld not reached, or a run dir that cannot be written is
    logged.

    Returns:
        the restart count of this run when it did not get its GPUs here (the run the Prolog refused, or one
        requeued here for starting without its Prolog: its record says REQUEUED), else None.
    """
    try:
        with claims.claims_lock(ctx.run_dir):
            claims.drop_claim(ctx.run_dir, job_id)
            refused = claims.refused_runs(ctx.run_dir, job_id, prune_before=time.time() - claims.REFUSED_KEEP_S)
            if run is not None:
                if served and restart > run:
                    claims.refuse_run(ctx.run_dir, job_id, run, f"run {run} was requeued on {ctx.node}")
                return None
            by_prolog = claims.epilog_of_refused(ctx.run_dir, job_id)
            if by_prolog is not None:
                return by_prolog
            if not gpu_job or not refused:
                return None
            why = (f"run {restart} started without its Prolog on {ctx.node}, after run {refused[-1]} was requeued "
                   "there; slurmd skips the Prolog of a job id it ran within its credential lifetime")
            claims.refuse_run(ctx.run_dir, job_id, restart, f"requeued by the Epilog on {ctx.node}: {why}")
    except OSError as e:
        log_event(ctx, "epilog", f"job {job_id}: claims not updated ({e.strerror}: {e.filename})")
        return None
    try:
        ctx.requeue(job_id)
    except GpushareError as e:
        log_event(ctx, "epilog", f"job {job_id}: {why}; not requeued: {e}")
        return None
    log_event(ctx, "epilog", f"job {job_id} requeued: {why}")
    return restart


def ended_job(ctx: HookContext, env: dict[str, str], start: float | None) -> EndedJob:
    """The ended job as the leftover sweep sees it: id and owner from slurmd's environment (``SLURM_JOB_ID``,
    ``SLURM_JOB_UID``), its start from the Prolog's ``run.json``, its devices from ``SLURM_JOB_GPUS`` (slurmd's
    GRES device indices, mapped to NVML indices and MIG instances through the node's gres.conf records in
    slurmd's order, as :func:`~slurm_gpushare.node.plan.plan_job` maps them). Devices None (every GPU) when
    the indices cannot be mapped."""
    from slurm_gpushare.slurm.hostlist import parse_id_list
    from slurm_gpushare.slurm.nodegres import GresOptions, node_gres

    uid_text = env.get("SLURM_JOB_UID", "")
    devices = None
    try:
        records = [r for r in node_gres(load_machine(ctx), ctx.node,
                                        GresOptions(shard_unit_mib=ctx.config.shard_unit_mib)).records
                   if r.name == "gpu"]
        indices = parse_id_list(env.get("SLURM_JOB_GPUS", ""))
        if indices and all(i < len(records) and records[i].gpu_index is not None for i in indices):
            devices = frozenset((int(records[i].gpu_index or 0), records[i].mig_gi) for i in indices)
    except GpushareError:
        devices = None
    return EndedJob(env.get("SLURM_JOB_ID", ""), int(uid_text) if uid_text.isdigit() else None, start, devices)


def sweep_leftovers(ctx: HookContext, env: dict[str, str], *, start: float | None) -> str | None:
    """Kill what the ended job left on its GPUs and return a drain reason for what cannot be resolved
    (:mod:`slurm_gpushare.node.leftovers`); each kill and each unresolved process goes to the node log.
    NVML or Slurm failing is logged and drains nothing (the next Epilog and ``doctor`` look again)."""
    job = ended_job(ctx, env, start)
    try:
        with open_nvml() as port:
            result = sweep(ctx, port, ended=job, running=None, kill=True)
    except GpushareError as e:
        log_event(ctx, "epilog", f"job {job.job_id}: leftover GPU processes not checked: {e}")
        return None
    for h in result.killed:
        why = next(v.why for v in result.verdicts if v.holder == h)
        log_event(ctx, "epilog", f"job {job.job_id}: killed {h.describe()}, {h.used_mib} MiB: {why}")
    for v in result.unknown:
        log_event(ctx, "epilog", f"job {job.job_id}: {v.holder.describe()} holds the GPU, left alone: {v.why}")
    unresolved = result.unresolved
    for v in unresolved:
        log_event(ctx, "epilog", f"job {job.job_id}: {v.holder.describe()} holds the GPU: {v.why}")
    return drain_reason(job.job_id, unresolved) if unresolved else None


def epilog_without_config(env: dict[str, str], config_path: str | Path | None, error: GpushareError, *,
                          context: Callable[[NodeConfig, str], HookContext] = HookContext) -> int:
    """The Epilog when the node config cannot be used (an admin's typo in node.toml): stop the job's
    MPS daemon anyway, found by process (:func:`~slurm_gpushare.node.jobdir.job_daemons`), write the
    job's accounting record with the settings that still read (:func:`~slurm_gpushare.node.config.
    lenient_node_config`: every key valid on its own, the defaults for the rest), and remove the job
    directory. Drains the node with a reason naming the config fault (``gpushare epilog: node config: ...``;
    slurmctld keeps it when slurmd's "Epilog error" follows) and returns 1.

    Args:
        env: slurmd's Epilog environment.
        config_path: the node config given (None: the default path).
        error: why it could not be used (said on stderr).
        context: builds the hook context from a config and the node name (tests inject Slurm calls).
    """
    from slurm_gpushare.node.config import DEFAULT_PATH, NodeConfig, lenient_node_config

    job_id = env.get("SLURM_JOB_ID", "")
    node = env.get("SLURMD_NODENAME", "")
    try:
        config = lenient_node_config(Path(config_path or DEFAULT_PATH).read_text())
    except (OSError, UnicodeDecodeError):
        config = NodeConfig()
    ctx = context(config, node)
    print(f"slurm-gpushare epilog: job {job_id}: node config not usable ({error}); stopping the job's "
          "MPS daemon by process and recording the job with the settings that still read", file=sys.stderr)
    problems = [p for p in (stop_found_daemon(d, control_binary=ctx.config.mps_control)
                            for d in by_pipe_dir(job_daemons(ctx.run_dir))
                            if d.job_id == job_id) if p]
    job_dir = ctx.job_dir(job_id)
    if job_id:
        record_usage(ctx, env, read_state(job_dir) or {})
    if job_id and job_dir.is_dir():
        _remove(job_dir)
    for p in problems:
        print(f"slurm-gpushare epilog: job {job_id}: {p}", file=sys.stderr)
    ctx.do_drain(" ".join(f"gpushare epilog: node config: {error}".split()))
    return 1


def _remove(job_dir: Path) -> None:
    """Remove a job directory, its MPS directories' tmpfs mounts first; what cannot go is left to doctor."""
    try:
        remove_tree(job_dir)
    except OSError:
        shutil.rmtree(job_dir, ignore_errors=True)


def stop_homeless(ctx: HookContext, job_id: str) -> str | None:
    """Stop the MPS daemons of ``job_id`` found by process (:func:`~slurm_gpushare.node.jobdir.job_daemons`)
    when its job directory is gone. Returns a drain reason for a process that survives SIGKILL."""
    found = [d for d in by_pipe_dir(job_daemons(ctx.run_dir)) if d.job_id == job_id]
    problems = [p for p in (stop_found_daemon(d, control_binary=ctx.config.mps_control,
                                              quit_timeout_s=ctx.config.mps_quit_timeout) for d in found) if p]
    for p in problems:
        log_event(ctx, "epilog", f"job {job_id}: {p}")
    return f"gpushare epilog job {job_id}: {problems[0]}" if problems else None


def cleanup_job(ctx: HookContext, job_id: str) -> str | None:
    """Stop the job's MPS daemon, where one was started, and remove its directory (under its lock). Returns a drain
    reason when a process is stuck."""
    job_dir = ctx.job_dir(job_id)
    shared = (read_state(job_dir) or {}).get("shared")
    if shared:
        problem = leave_shared(ctx, job_id, Path(shared))
        if problem:
            return problem
    # <job dir>/mps is root's (made by the Prolog before the daemon's own directories): without it no MPS daemon
    # was ever started for the job, and every process's environment need not be read for its orphans
    if os.path.lexists(job_dir / "mps"):
        problem = stuck_reason(ctx, ctx.mps(job_id).stop(), f"MPS daemon of job {job_id}")
        if problem:
            return problem
    _remove(job_dir)
    return None


def record_usage(ctx: HookContext, env: dict[str, str], state: dict, *, refused: int | None = None) -> int:
    """Append the finished job's per-GPU records to the node's accounting spool (docs/accounting.md).
    ``refused``: this run (that restart count) did not get its GPUs here (:func:`release_claim`): REQUEUED.

    Never fails the Epilog: a record that cannot be built or written is reported on stderr (slurmd's
    log) with the job id, and the node stays up. Peak memory and SM utilization come from the node
    monitor's usage file (``<run_dir>/usage/<job>.json``, :mod:`slurm_gpushare.accounting.live`),
    removed once the records are spooled; without one (no monitor ran) they are "no data".

    Returns:
        the number of records written.
    """
    from slurm_gpushare.accounting import Spool, exit_from_env
    from slurm_gpushare.accounting.live import load_usage, remove_usage
    from slurm_gpushare.accounting.record import exit_from_code
    from slurm_gpushare.node.records import records_for_job, restart_from_env

    job_id = env.get("SLURM_JOB_ID", "")
    try:
        usage = load_usage(ctx.run_dir, job_id)
    except GpushareError as e:
        print(f"slurm-gpushare epilog: job {job_id}: monitor usage not used: {e}", file=sys.stderr)
        usage = None
    try:
        try:
            info = job_info(ctx, job_id, env)  # owner from slurmd's environment, the rest from structured output
        except JobFault as e:
            if read_run(ctx.job_dir(job_id)) is None:
                # no Prolog run of this job here to pair with (an Epilog run again after its job directory went,
                # or for a job whose Prolog never ran): nothing to build a record of that another would not hold
                raise
            # slurmctld down or slow: the record is kept with what slurmd's environment and the Prolog's plan
            # and run say (no account where the release does not set it, no AdminComment audit, slurmd's exit code)
            print(f"slurm-gpushare epilog: job {job_id}: slurmctld not reached ({e}); the accounting record "
                  "from slurmd's environment", file=sys.stderr)
            info = job_from_env(job_id, env)
        if not info.gres_on(ctx.node):
            # slurmctld drops the per-node GRES detail once the job completes (``GRES=`` is empty in
            # the Epilog): take the devices from slurmd's own environment, SLURM_JOB_GPUS
            info = replace(info, gres={**info.gres, ctx.node: _gres_from_env(info, env)})
        if (state.get("plan") or {}).get("kind") in ("mps", "mig", "gpu"):
            plan = JobPlan.from_dict(state["plan"])
            machine = machine_with_uuids(ctx)
        else:
            plan, machine, _gres = plan_with_machine(ctx, info)
        placement = state.get("placement") or {}
        exit_state, exit_code = exit_from_env(env)
        if info.exit_code and info.exit_code != "0:0":
            # scancel and time limits reach the Epilog as 0:0; slurmctld already holds the signal (0:15)
            exit_state, exit_code = exit_from_code(info.exit_code)
        end = int(time.time())
        # the Prolog's record of this run: after a requeue slurmctld has already raised the restart count
        # and reset the start and submit time when this Epilog runs
        restart, start, submit = read_run(ctx.job_dir(job_id)) or (restart_from_env(env), info.start_time or end, 0)
        if refused is not None:
            restart = refused
        if not submit and restart_from_env(env) == restart:
            # the Prolog planned from slurmd's environment, which has no submit time: slurmctld's is this run's
            # while it has not requeued the job (then it is the next run's: left 0, not known)
            submit = info.submit_time or 0
        if restart_from_env(env) > restart or refused is not None:
            exit_state = "REQUEUED"  # this run was requeued: sacct says REQUEUED of it, not how it ended
        records = records_for_job(
            info, plan, machine, node=ctx.node, start=start, end=end,
            exit_state=exit_state, exit_code=exit_code, gpu_uuids={g.index: g.uuid for g in machine.gpus},
            account=info.account, array_job_id=info.array_job_id, array_task_id=info.array_task_id,
            placement_cost=placement.get("cost_given"), usage=usage, restart=restart, submit=submit)
        if records:
            Spool(ctx.config.spool_dir, node=ctx.node).append(records)
        if usage is not None:
            remove_usage(ctx.run_dir, job_id)
        return len(records)
    except GpushareError as e:
        print(f"slurm-gpushare epilog: job {job_id}: accounting record not written: {e}", file=sys.stderr)
        return 0


def _gres_from_env(info: JobInfo, env: dict[str, str]):
    """The job's GPU devices on this node from slurmd's Epilog environment (``SLURM_JOB_GPUS=0,2``),
    typed as the job's TresPerNode says (``gres:gpu:a100:2`` -> ``gpu:a100``)."""
    from slurm_gpushare.slurm.gres import GresItem, parse
    from slurm_gpushare.slurm.hostlist import format_ranges, parse_id_list

    job_gpus = env.get("SLURM_JOB_GPUS", "")
    if not job_gpus:
        return ()
    indices = parse_id_list(job_gpus)
    tres = info.tres_per_node if info.tres_per_node != "(null)" else ""
    held = [it for it in parse(tres) if it.name in ("gpu", "shard")]
    name, gtype = (held[-1].name, held[-1].type) if held else ("gpu", "")
    count = len(indices) if name == "gpu" else held[-1].amount
    return (GresItem(name, gtype, count, f"IDX:{format_ranges(indices)}"),)
