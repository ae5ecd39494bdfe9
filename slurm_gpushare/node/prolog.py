"""The Prolog: prepare each job's GPU share on the node (slurmd runs it as root, ``slurm-gpushare hook
prolog`` from the ``Prolog=`` wrapper ``prolog.sh`` in ``slurm_gpushare/data/site/``).

What it prepares lives in the job's directory (:mod:`slurm_gpushare.node.jobdir`). Decisions come from
trusted inputs only (:mod:`slurm_gpushare.node.plan`). Every step is idempotent and guarded by a per-job
lock (``fcntl.flock``), so concurrent Prologs and Epilogs of different jobs never block each other and
a retried or half-finished one is repaired by the next. The exit status is non-zero (which drains the
node) only for node faults, after setting a drain reason that says what to fix; a user's bad request
was refused at submit time and never gets here.
"""

from __future__ import annotations

import os
import re
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from slurm_gpushare.atomicfile import read_own_file, write_atomic
from slurm_gpushare.errors import ConfigError, GpushareError, InputError, ParseError
from slurm_gpushare.hardware.machine import Machine
from slurm_gpushare.node import claims
from slurm_gpushare.node.config import check_shard_unit
from slurm_gpushare.node.context import (
    HookContext,
    JobFault,
    NodeFault,
    fail_job,
    job_mps_settings,
    log_event,
    plan_with_machine,
    record_and_plan,
)
from slurm_gpushare.node.jobdir import (
    STATE_VERSION,
    job_lock,
    make_job_dir,
    read_state,
    restart_from_env,
    write_devices,
    write_env,
    write_note,
    write_run,
    write_state,
)
from slurm_gpushare.node.plan import JobPlan
from slurm_gpushare.slurm.job import JobInfo
from slurm_gpushare.slurm.nodegres import NodeGres

#: Where the Prolog remembers a shard unit check that passed (see :func:`check_installed_shard_unit`).
SHARD_UNIT_STAMP = "shard-unit.ok"


def check_installed_shard_unit(ctx: HookContext, machine: Machine, env: dict[str, str]) -> None:
    """Refuse to turn shards into an MPS memory limit with a unit gres.conf was not written with.

    A shard job's limit is its shard count times node.toml's ``shard_unit``; Slurm counted the shards
    with the unit of ``gres-conf --shard-unit``. The gres.conf read is the one next to ``SLURM_CONF``
    (slurmd's own, also its configless cache); without one (or without shard lines) there is nothing
    to compare.

    A check that passed is remembered in ``<run_dir>/shard-unit.ok`` (root's, mode 0600): the unit, the node,
    the description file's size and mtime, and gres.conf's whole text. A Prolog that finds the same there
    skips the parse (and the import of the gres.conf reader): gres.conf changes only with a slurmd restart.

    Raises:
        NodeFault: the units differ (the reason names the unit gres.conf implies), or gres.conf cannot
            be read or parsed.
    """
    conf = env.get("SLURM_CONF")
    if not conf:
        return
    path = Path(conf).parent / "gres.conf"
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return
    except OSError as e:
        raise NodeFault(f"cannot read {path}: {e.strerror}") from None
    try:
        st = os.stat(ctx.config.machine_for(ctx.node))
        described = f"{st.st_size}:{st.st_mtime_ns}"
    except OSError:
        described = "-"
    key = f"{ctx.config.shard_unit_mib} {ctx.node} {described} {path}\n{text}"
    stamp = ctx.run_dir / SHARD_UNIT_STAMP
    expected = key.encode()  # as write_atomic writes it
    try:  # a regular file of the key's size only: never a FIFO (an open that blocks) nor a link
        if read_own_file(stamp, max_bytes=len(expected)) == expected:
            return
    except OSError:
        pass
    from slurm_gpushare.slurm.conf import parse_gres_conf

    try:
        check_shard_unit(machine, ctx.node, ctx.config.shard_unit_mib, parse_gres_conf(text, source=str(path)))
    except (ConfigError, ParseError) as e:
        raise NodeFault(str(e), hint=e.hint) from None
    try:
        write_atomic(stamp, key, mode=0o600, fsync=False)
    except OSError:
        pass  # a run dir that cannot be written: the next Prolog checks again


def prolog(ctx: HookContext, env: dict[str, str]) -> int:
    """Prepare the job's share on this node. Returns the exit status (non-zero drains the node).

    Owner (uid, gid, user) from slurmd's environment, the rest from slurmctld's structured record
    (:func:`slurm_gpushare.node.context.job_info`). A :class:`JobFault` (record unreadable, MPS daemon failed)
    cancels the job and returns 0: the node stays up.

    Jobs without GPU GRES on this node (Slurm sets no ``SLURM_JOB_GPUS``/``CUDA_VISIBLE_DEVICES``
    in the Prolog's environment for them) cost nothing: no Slurm call, no file. Jobs whose GPUs on a
    node without shards say all they can need (:func:`plan_from_env`) are prepared without slurmctld.

    Raises:
        InputError: ``SLURM_JOB_ID`` is not set (not run by slurmd).
        NodeFault: a problem of the node; the node's drain reason is set first.
    """
    job_id = env.get("SLURM_JOB_ID", "")
    if not job_id:
        raise InputError("SLURM_JOB_ID is not set: run this as slurmd's Prolog")
    if not (env.get("SLURM_JOB_GPUS") or env.get("CUDA_VISIBLE_DEVICES")):
        return 0
    mark_run(ctx, job_id, env)
    try:
        from_env = plan_from_env(ctx, env)
        if from_env is not None:
            info, (plan, machine, gres) = from_env
        else:
            info, (plan, machine, gres) = record_and_plan(ctx, job_id, env)
        restart = restart_from_env(env)
        if plan.kind != "none" and wait_for_gpus(ctx, job_id, plan, restart=restart):
            return 0
        try:  # this run starts: its tasks may start (earlier runs' refused marks: claims.refuse_run)
            claims.forget_refused(ctx.run_dir, job_id, up_to=restart)
        except OSError as e:
            log_event(ctx, "prolog", f"job {job_id}: its refused marks not removed ({e.strerror}): its tasks fail")
        if plan.kind == "none":
            return 0
        job_dir = ctx.job_dir(job_id)
        with job_lock(job_dir):
            write_run(job_dir, restart=restart, start=info.start_time or int(time.time()),
                      submit=info.submit_time or 0)
        if plan.kind == "gpu" and len(plan.gpu_indices) < 2:
            return 0
        if plan.kind == "mps":
            check_installed_shard_unit(ctx, machine, env)
        with job_lock(job_dir):
            if plan.kind == "gpu":
                _prepare_topology(ctx, info, plan, machine, gres, job_dir)
            else:
                prepare(ctx, plan, job_dir)
    except JobFault as e:
        fail_job(ctx, job_id, e, "prolog")
        return 0
    except NodeFault as e:
        ctx.do_drain(f"gpushare prolog job {job_id}: {e}")
        raise
    return 0


def mark_run(ctx: HookContext, job_id: str, env: dict[str, str]) -> None:
    """Tell the controller that this run of the job holds GPUs here, so its Epilog will spool records: an empty
    file ``<spool_dir>/runs/<job id>.<restart count>.<node>`` (:data:`~slurm_gpushare.accounting.spool.RUNS_DIR`;
    restart count from slurmd's ``SLURM_JOB_RESTART_COUNT``). EpilogSlurmctld waits for the runs so marked and
    starts no Python for the others (epilog_slurmctld.sh); it removes the marks it handled. A mark that cannot
    be made costs the run its AdminComment segment, not the job: one line on stderr (slurmd's log)."""
    from slurm_gpushare.accounting.spool import RUNS_DIR

    runs = Path(ctx.config.spool_dir) / RUNS_DIR
    try:
        runs.mkdir(mode=0o755, parents=True, exist_ok=True)
        (runs / f"{job_id}.{restart_from_env(env)}.{ctx.node}").touch(mode=0o644)
    except OSError as e:
        print(f"slurm-gpushare prolog: job {job_id}: cannot mark its run for the controller's summary: {e}",
              file=sys.stderr)


def wait_for_gpus(ctx: HookContext, job_id: str, plan: JobPlan, *, restart: int = 0) -> bool:
    """Claim the job's GPUs on this node (:mod:`slurm_gpushare.node.claims`), or requeue the job when another
    running job's claim holds one of them in a way this job's cannot share: a GPU given whole while another job's
    MPS share runs on it, or a share of a GPU another job holds whole. Returns whether the job was requeued (or,
    when it cannot be, cancelled): the Prolog then prepares nothing.

    Slurm 22.05.8 resets a GPU's shard bookkeeping when one of its shard jobs ends while others still run there,
    and then gives the GPU whole to the next ``gpu`` job, or a share of it while it is held whole (measured on the
    dev cluster; 24.11.5 and 26.05.3 keep them apart: tests/test_shard_sharing_slurm.py): that job's user would be
    told the whole GPU that the share's MPS limit also promised. The check and the claim are one step under the
    node's claims lock, so two Prologs that start at once see each other. Requeued, the job waits for
    slurmctld's requeue delay (``Reason=BeginTime``, the credential lifetime: 120 s by default) and is tried
    again; its start is never brought forward, since slurmd runs no Prolog for a job id still in its credential
    cache (issue 26 N12). Costs a directory listing and a small file; slurmctld is asked (``squeue``) only when a
    claim conflicts, to skip (and forget) a claim that outlived its job. A job that cannot be requeued
    (``--no-requeue``) is cancelled, the reason in the node log (:func:`~slurm_gpushare.node.context.fail_job`).
    Either way run ``restart`` is marked refused first (:func:`~slurm_gpushare.node.claims.refuse_run`): on 22.05
    slurmd launches its batch script before the requeue lands, and the TaskProlog then stops it. A run that
    starts removes the job's refused marks here (:func:`prolog`).
    A run dir that cannot be written claims nothing and requeues nothing (logged): Slurm's own choice stands.
    """
    if plan.kind not in claims.KINDS or not plan.gpu_indices:
        return False
    try:
        with claims.claims_lock(ctx.run_dir):
            found = claims.conflicting(ctx.run_dir, job_id, plan.kind, plan.gpu_indices)
            if found:
                try:
                    running = ctx.job_owners(ctx.node)
                except GpushareError:
                    running = None  # slurmctld not reached: take the claims as they are (tried again later)
                if running is not None:
                    for stale in set(found) - set(running):
                        claims.drop_claim(ctx.run_dir, stale)
                    found = {j: g for j, g in found.items() if j in running}
            if found:
                _requeue_for(ctx, job_id, plan, found, restart)
                return True
            claims.write_claim(ctx.run_dir, claims.Claim(job_id, plan.kind, plan.gpu_indices))
    except OSError as e:
        log_event(ctx, "prolog", f"job {job_id}: its GPUs not claimed ({e.strerror}: {e.filename}): another job "
                                 "given them at once is not told apart")
    return False


def _requeue_for(ctx: HookContext, job_id: str, plan: JobPlan, found: dict[str, tuple[int, ...]],
                 restart: int = 0) -> None:
    """Requeue ``job_id`` (its run ``restart`` marked refused first); cancel it when it cannot be requeued."""
    on = ", ".join(f"GPU {','.join(map(str, g))} (job {j})" for j, g in sorted(found.items()))
    if plan.kind == "gpu":
        why = f"given whole GPUs that another job's MPS share still uses: {on}; Slurm freed them too early"
    else:
        why = f"given an MPS share of GPUs another job holds whole: {on}; Slurm shared them too early"
    try:
        claims.refuse_run(ctx.run_dir, job_id, restart, f"requeued by the Prolog on {ctx.node}: {why}",
                          by_prolog=True)
    except OSError as e:
        log_event(ctx, "prolog", f"job {job_id}: run {restart} not marked refused ({e.strerror}): its batch script "
                                 "may start before the requeue lands")
    try:
        ctx.requeue(job_id)
    except GpushareError as e:
        fail_job(ctx, job_id, JobFault(f"{why}; requeue failed ({e})"), "prolog")
        return
    log_event(ctx, "prolog", f"job {job_id} requeued: {why}")


#: An ``Include`` line of gres.conf (gres.conf(5)): the file is then not read alone.
_INCLUDE_LINE = re.compile(r"^\s*include\s", re.IGNORECASE | re.MULTILINE)


def plan_from_env(ctx: HookContext, env: dict[str, str]) -> tuple[JobInfo, tuple[JobPlan, Machine, NodeGres]] | None:
    """The job and its plan from slurmd's Prolog environment alone, or None when only slurmctld's record can
    say what the job needs here.

    slurmd's Prolog environment names the job's GPU devices (``SLURM_JOB_GPUS``: the indices of the
    node's gres.conf devices, the ``IDX`` of slurmctld's record) but not their GRES: a ``shard:N`` job
    gets the same variables as a ``gpu:1`` job on the same GPU, and with both kinds only the last GRES
    plugin's values are left (``gres_g_prep_set_env`` calls each plugin's ``prep_set_env``, which
    overwrite ``SLURM_JOB_GPUS``: src/interfaces/gres.c and src/plugins/gres/common/gres_common.c at
    slurm-24-11-5-1 and slurm-26-05-3-1, ``gres_common_epilog_set_env`` at slurm-22-05-8-1; measured
    on the dev cluster of each release, docs/performance.md). The environment therefore says everything
    only on a node whose gres.conf (next to ``SLURM_CONF``, slurmd's own or its configless cache, and
    without ``Include`` lines) configures no ``Name=shard`` line: there a job holds whole GPUs or MIG
    devices. Of those, a job of one whole GPU needs nothing but the record of its run and a MIG job its
    devices' UUIDs; a job of several whole GPUs is audited against slurmctld's view of the node and
    still asks (None). A job of one whole GPU is planned without opening NVML (its plan names no UUID).

    None of these variables is the user's to set: slurmd builds the Prolog's environment itself, and
    what a user's SPANK plugin exports reaches it only with a ``SPANK_`` prefix
    (``valid_spank_job_env`` in src/common/slurm_protocol_defs.c, ``_build_env`` in
    src/plugins/prep/script/prep_script_slurmd.c at slurm-22-05-8-1, slurm-24-11-5-1 and slurm-26-05-3-1).

    The owner comes from ``SLURM_JOB_UID``/``SLURM_JOB_GID``/``SLURM_JOB_USER``, the start from
    ``SLURM_JOB_START_TIME`` where slurmd sets it (24.11 and later), the partition from
    ``SLURM_JOB_PARTITION``.

    Raises:
        NodeFault: no usable machine description, NVML failed, or the job holds a device the description
            does not have (as :func:`~slurm_gpushare.node.context.plan_with_machine`).
    """
    from slurm_gpushare.node.context import load_machine
    from slurm_gpushare.node.plan import plan_job
    from slurm_gpushare.slurm.gres import GresItem
    from slurm_gpushare.slurm.job import with_env_identity
    from slurm_gpushare.slurm.nodegres import GresOptions, node_gres

    conf = env.get("SLURM_CONF")
    listed = env.get("SLURM_JOB_GPUS", "").split(",")  # slurmd writes the indices comma-separated
    if not conf or not all(p.isascii() and p.isdigit() for p in listed):
        return None
    if not configures_no_shards(Path(conf).parent / "gres.conf", ctx.node):
        return None
    indices = sorted({int(p) for p in listed})
    start = env.get("SLURM_JOB_START_TIME", "")
    held = (GresItem("gpu", "", len(indices), "IDX:" + ",".join(map(str, indices))),)
    try:
        info = with_env_identity(JobInfo(job_id=env.get("SLURM_JOB_ID", ""),
                                         partition=env.get("SLURM_JOB_PARTITION", ""),
                                         start_time=int(start) if start.isascii() and start.isdigit() else None,
                                         gres={ctx.node: held}), env)
    except InputError:
        return None
    machine = load_machine(ctx)
    gres = node_gres(machine, ctx.node, GresOptions(shard_unit_mib=ctx.config.shard_unit_mib))
    devices = [r for r in gres.records if r.name == "gpu"]
    if len(indices) == 1 and indices[0] < len(devices) and devices[indices[0]].mig_gi is None:
        # one whole GPU: its plan names no UUID, so NVML is not opened
        plan = plan_job(info, ctx.node, gres, gpu_uuids={}, mig_uuids={}, shard_unit_mib=ctx.config.shard_unit_mib,
                        low_priority_partitions=ctx.config.low_priority_partitions,
                        low_priority_qos=ctx.config.low_priority_qos)
        return info, (plan, machine, gres)
    planned = plan_with_machine(ctx, info)
    if planned[0].kind == "gpu" and len(planned[0].gpu_indices) > 1:
        return None
    return info, planned


#: A gres.conf line naming the ``shard`` GRES (keys are case-insensitive: gres.conf(5)); comments skipped.
_SHARD_LINE = re.compile(r"^[^#\n]*\bname\s*=\s*shard\b", re.IGNORECASE | re.MULTILINE)
#: The ``NodeName=`` value of a gres.conf line.
_NODENAME_VALUE = re.compile(r"\bnodename\s*=\s*(\S+)", re.IGNORECASE)
#: A node name that is no hostlist expression.
_PLAIN_NAME = re.compile(r"[A-Za-z0-9._-]+")


def configures_no_shards(path: Path, node: str) -> bool:
    """Whether the gres.conf at ``path`` certainly configures no ``Name=shard`` line for ``node``.

    Read line by line without the full parser where the answer is plain (no line names shards; a shard
    line without ``NodeName=``, or whose ``NodeName=`` lists ``node``); a shard line whose ``NodeName=``
    is a hostlist expression (``gpu[01-16]``) is decided by :func:`~slurm_gpushare.slurm.conf.parse_gres_conf`.
    Anything that leaves a doubt answers False: the file cannot be read or parsed, or it has ``Include``
    lines (whose files this does not follow).
    """
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
    if _INCLUDE_LINE.search(text):
        return False
    hostlists = False
    for m in _SHARD_LINE.finditer(text):
        names = _NODENAME_VALUE.search(text, m.start(), text.find("\n", m.start()) % (len(text) + 1))
        if names is None:
            return False  # a shard line for every node, this one included
        parts = names.group(1).split(",")
        if node in parts:
            return False
        hostlists = hostlists or not all(_PLAIN_NAME.fullmatch(p) for p in parts)
    if not hostlists:
        return True
    from slurm_gpushare.slurm.conf import parse_gres_conf

    try:  # node[1-4] and the like: Slurm's hostlist grammar decides
        return not any(e.name == "shard" for e in parse_gres_conf(text, source=str(path)).records_for(node))
    except GpushareError:
        return False


def prepare(ctx: HookContext, plan: JobPlan, job_dir: Path) -> None:
    """Start what an ``mps`` or ``mig`` job needs and write its state, its devices table (which the TaskProlog
    applies to each task's own ``CUDA_VISIBLE_DEVICES``) and its MPS environment (under its lock).

    A Prolog that finds the job ready does nothing; one that finds a half-started job replaces it.

    Raises:
        JobFault: the job's MPS daemon (or the shared one) could not be started or configured (it runs as the
            job's user, who can kill it).
    """
    from slurm_gpushare.node.mps import MpsError
    from slurm_gpushare.node.shared_mps import join_shared, shared_dir

    make_job_dir(job_dir)
    state = {"version": STATE_VERSION, "phase": "starting", "plan": asdict(plan)}
    prev = read_state(job_dir)
    if prev and prev.get("phase") == "ready" and (job_dir / "env").exists():
        return  # a retried Prolog: everything is in place
    write_state(job_dir, state)
    env: dict[str, str] = plan.env()
    if plan.kind == "mps" and ctx.config.mps_mode == "per-gpu" and len(plan.gpu_indices) == 1 and plan.uid >= 0:
        shared = shared_dir(ctx, plan.gpu_indices[0], plan.uid)
        state["shared"] = str(shared)
        write_state(job_dir, state)
        env = plan.env(join_shared(ctx, plan, shared).client_env())
    elif plan.kind == "mps":
        daemon = ctx.mps(plan.job_id, plan)
        if prev is not None or os.path.lexists(daemon.pipe_dir):
            daemon.stop()  # leftovers of a Prolog that died half-way (a new job has no state and no pipe dir)
        try:
            daemon.start(job_mps_settings(daemon, plan))
        except MpsError as e:
            daemon.stop()
            # the daemon runs as the job's user, who can kill it: its failure is the job's, not the node's
            raise JobFault(f"MPS control daemon for job {plan.job_id} failed: {e}",
                           hint=f"check {ctx.config.mps_control} and the driver") from None
        env = plan.env(daemon.client_env())
    if plan.kind == "mps":
        _driver_limit(ctx, plan, state)
    if plan.device_files:  # before devices: a TaskProlog that reads devices finds files in place
        write_devices(job_dir / "files", plan.device_files, uid=plan.uid)
    write_devices(job_dir / "devices", plan.devices, uid=plan.uid)
    write_env(job_dir / "env", env, uid=plan.uid)
    state["phase"] = "ready"
    write_state(job_dir, state)


def _driver_limit(ctx: HookContext, plan: JobPlan, state: dict) -> None:
    """The driver's memory limit on the job's cgroup (:mod:`slurm_gpushare.node.gpulimit`), set now where the
    Prolog runs inside that cgroup (``PrologFlags=RunInJob``, 24.11 and later); else the node monitor sets it
    when the job's first step has made the cgroup. Never fails the job: the MPS limit and the monitor stand."""
    from slurm_gpushare.node.gpulimit import apply_limit, job_cgroup_dir, wants_limit
    from slurm_gpushare.node.membership import CgroupFs, read_cgroup

    if not wants_limit(plan, ctx.config.gpu_memory_limit):
        return
    where = job_cgroup_dir(read_cgroup(os.getpid()), plan.job_id, CgroupFs())
    if where is None:
        return
    from slurm_gpushare.hardware.ports import open_nvml

    try:
        with open_nvml() as port:
            result = apply_limit(port, plan, where)
    except GpushareError as e:  # NVML could not be opened: the job keeps its MPS limit and the monitor
        log_event(ctx, "prolog", f"job {plan.job_id}: no driver memory limit ({e})")
        return
    state["gpu_memory_limit"] = {k: v for k, v in asdict(result).items() if k in ("outcome", "cgroup", "gpus", "mib")}
    log_event(ctx, "prolog", result.line(plan.job_id))


def _free_before(ctx: HookContext, gres: NodeGres, plan: JobPlan) -> tuple[int, ...]:
    """NVML indices of the node's whole GPUs that were free when Slurm chose this job's: not in use
    by another job's GPUs or shards (``scontrol -d show node``: ``GresUsed=``, read by
    :func:`~slurm_gpushare.slurm.node.parse_node`, :func:`~slurm_gpushare.slurm.job.used_devices`)."""
    from slurm_gpushare.slurm.job import used_devices
    from slurm_gpushare.slurm.node import parse_node

    devices = [r for r in gres.records if r.name == "gpu"]
    used = used_devices(parse_node(ctx.show_node(ctx.node)).gres_used)
    busy = {devices[i].gpu_index for i in used if i < len(devices)} - set(plan.gpu_indices)
    return tuple(r.gpu_index for r in devices
                 if r.gpu_index is not None and r.mig_gi is None and r.gpu_index not in busy)


#: The most tasks of one step on one node the Prolog writes hints for (one file per task and count).
MAX_HINTED_TASKS = 64


def gpu_order_applies(order: str, info: JobInfo) -> bool:
    """Whether node.toml ``gpu_order`` lets the TaskProlog order this job's GPUs: ``all`` jobs, only
    ``gpushare`` jobs (a gpushare AdminComment segment: job_submit.lua wrote it, users cannot), or ``none``."""
    return order == "all" or (order == "gpushare" and info.audit is not None)


def _prepare_topology(ctx: HookContext, info: JobInfo, plan: JobPlan, machine: Machine, gres: NodeGres,
                      job_dir: Path) -> None:
    """A multi-GPU whole-GPU job: audit Slurm's choice against the best free set, and prepare the ring.

    The audit (:func:`slurm_gpushare.topology.placement.audit`) goes to state.json (accounting reads it) and,
    when the job got a worse set than was free, to the node log and syslog
    (:func:`~slurm_gpushare.node.context.log_event`). Every multi-GPU job is audited.

    Where node.toml ``gpu_order`` lets the product order the job's GPUs (:func:`gpu_order_applies`) and
    NVML knows every UUID, it writes for the TaskProlog (:mod:`slurm_gpushare.topology.binding`):
    ``ring.<k>`` (the ``k`` GPUs as UUIDs in NVLink ring order), ``note`` (what it tells the job when it
    uses them) and, for ``n`` tasks of a step here (1 to ``k``, and the job's own tasks on this node when
    its record fixes them, at most :data:`MAX_HINTED_TASKS`), ``task.<n>.<local id>``: that rank's
    devices, NIC and CPUs. The CPUs come from the job's own cores on this node (``job_resources`` of
    slurmctld's record, :meth:`~slurm_gpushare.slurm.job.JobInfo.core_ids_on`), never from the whole
    node; without them there are no CPU hints. The TaskProlog decides per task whether they apply.
    """
    from slurm_gpushare.topology.binding import bind
    from slurm_gpushare.topology.hops import hop_matrix
    from slurm_gpushare.topology.placement import audit

    make_job_dir(job_dir)
    order = sorted(g.index for g in machine.gpus)
    pos = {g: i for i, g in enumerate(order)}
    numa = [machine.gpu(g).numa_node for g in order]
    hop = hop_matrix(machine)
    placement: dict[str, Any]
    try:
        free = _free_before(ctx, gres, plan)
        result = audit(hop, [pos[g] for g in plan.gpu_indices], [pos[g] for g in free], numa)
        placement = {"given": [order[i] for i in result.allocated], "best": [order[i] for i in result.best.gpus],
                     "cost_given": round(result.cost_given, 4), "cost_best": round(result.cost_best, 4),
                     "excess": round(result.excess, 4), "free_before": list(free)}
    except GpushareError as e:
        placement = {"error": str(e)}
    if placement.get("excess", 0) > 1e-9:
        log_event(ctx, "prolog", f"job {plan.job_id} got GPUs {placement['given']} (cost "
                  f"{placement['cost_given']}) while {placement['best']} (cost {placement['cost_best']}) were free")
    state: dict[str, Any] = {"version": STATE_VERSION, "phase": "ready", "plan": asdict(plan),
                             "placement": placement, "gpu_order": ctx.config.gpu_order}
    k = len(plan.gpu_indices)
    if gpu_order_applies(ctx.config.gpu_order, info) and all(machine.gpu(g).uuid for g in plan.gpu_indices):
        layout = machine.cpus
        cores = info.core_ids_on(ctx.node, layout.cores_per_socket) if layout is not None else None
        here = info.tasks_on(ctx.node)
        counts = sorted(set(range(1, k + 1)) | ({here} if here and here <= MAX_HINTED_TASKS else set()))
        default = here if here in counts else k
        ring = None
        for n in counts:
            b = bind(machine, plan.gpu_indices, ntasks=n, cores=cores if cores is not None else (), ring=ring)
            ring = b.ring
            job_env = b.job_environment()
            for local in range(n):
                write_env(job_dir / f"task.{n}.{local}",
                          {key: v for key, v in b.task_environment(local).items()
                           if key not in ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "GPUSHARE_GPU_RING")},
                          uid=plan.uid)
            if n == default:
                state["binding"] = b.to_dict()
                state["binding"]["ntasks"] = n
                state["cores"] = list(cores) if cores is not None else None
        write_env(job_dir / f"ring.{k}", {key: job_env[key] for key in
                                          ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "GPUSHARE_GPU_RING")},
                  uid=plan.uid)
        if ctx.config.task_notes:  # a line in every step's output: only where the site asks (node.toml)
            shown = ",".join(map(str, ring or ()))
            write_note(job_dir / "note", f"slurm-gpushare: CUDA_VISIBLE_DEVICES names GPUs {shown} of {ctx.node} "
                       "as UUIDs, in ring order along their links, NVLink first (GPUSHARE_KEEP_GPU_ORDER=1 or "
                       "--gpu-bind keeps Slurm's order);", uid=plan.uid)
    write_state(job_dir, state)
