"""What every node hook runs with: the node's settings and name, how to reach Slurm, and the facts it
reads (the job's record, the node's machine, the job's plan). A :class:`NodeFault` is a problem of the
node, not of the job: the hook exits non-zero and the node is drained with a reason that says what to fix.
A :class:`JobFault` is a problem of one job (its record cannot be read or trusted, its user-run MPS daemon
failed): the job is cancelled with the reason in the node log (:func:`log_event`) and the node stays up.
"""

from __future__ import annotations

import os
import sys
import syslog
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from slurm_gpushare.errors import GpushareError, InputError
from slurm_gpushare.hardware.machine import Machine
from slurm_gpushare.hardware.port import read_uuids
from slurm_gpushare.hardware.ports import open_nvml
from slurm_gpushare.node.config import NodeConfig
from slurm_gpushare.node.plan import JobPlan, plan_job
from slurm_gpushare.retry import retry
from slurm_gpushare.slurm import commands
from slurm_gpushare.slurm.job import JobInfo, parse_job_json, with_env_identity
from slurm_gpushare.slurm.nodegres import GresOptions, NodeGres, node_gres

if TYPE_CHECKING:  # the MPS code is imported by the hooks that start or stop a daemon
    from slurm_gpushare.node.mps import MpsDaemon, Setting, StopResult

#: The node log, in the node's run dir: one line per event an administrator should see.
NODE_LOG = "node.log"
#: The syslog identity of the node hooks' lines (facility ``LOG_DAEMON``, like slurmd's).
SYSLOG_IDENT = "slurm-gpushare"

#: Seconds to wait before asking slurmctld again for a job's record (three tries in all).
JOB_RECORD_WAITS = (0.5, 1.0)


class NodeFault(GpushareError):
    """A problem of the node (not of the job): the hook exits non-zero and the node is drained."""


class JobFault(GpushareError):
    """A problem of one job (not of the node): the job is cancelled, the hook exits 0, nothing drains."""


@dataclass(frozen=True)
class HookContext:
    """What a hook runs with: the node's settings and name, and how to reach Slurm (injectable)."""

    config: NodeConfig
    node: str
    job_record: Callable[[str], str] = commands.job_record  # job id -> structured record (squeue --json)
    show_node: Callable[[str], str] = commands.show_node  # node -> text of `scontrol -d show node`
    drain: Callable[[str, str], None] | None = None  # (node, reason); default: scontrol update
    cancel: Callable[[str], None] = commands.cancel_job  # job id -> None; scancel
    requeue: Callable[[str], None] = commands.requeue_job  # job id -> None; scontrol requeue
    # (job id, text) -> None; scontrol update AdminComment= (the user reads it; a user cannot write it)
    set_admin_comment: Callable[[str, str], None] = commands.update_admin_comment
    job_owners: Callable[[str], dict[str, int]] = commands.running_job_owners  # node -> {job id: uid}; squeue
    listpids: Callable[[str], str] = commands.listpids  # node -> `scontrol listpids` text

    @property
    def run_dir(self) -> Path:
        """This node's run dir (job dirs, shared MPS daemons, usage files)."""
        return self.config.run_dir_for(self.node)

    def job_dir(self, job_id: str) -> Path:
        """The directory the Prolog prepares for ``job_id`` (state, env files, MPS dirs)."""
        return self.run_dir / "jobs" / job_id

    def mps(self, job_id: str, plan: JobPlan | None = None, *, base: Path | None = None) -> MpsDaemon:
        """The MPS daemon of a job (``<job dir>/mps``), or the shared one under ``base``."""
        from slurm_gpushare.node.mps import MpsDaemon, MpsSettings

        d = base if base is not None else self.job_dir(job_id) / "mps"
        settings = MpsSettings(control_binary=self.config.mps_control,
                               start_timeout_s=self.config.mps_start_timeout,
                               quit_timeout_s=self.config.mps_quit_timeout,
                               dir_size_mib=self.config.mps_dir_size_mib)
        return MpsDaemon(d / "pipe", d / "log", settings=settings,
                         visible_devices=plan.visible_devices if plan else "",
                         uid=plan.uid if plan and plan.uid >= 0 else None,
                         gid=plan.gid if plan and plan.gid >= 0 else None,
                         extra_env=dict(self.config.mps_env))

    def do_drain(self, reason: str) -> None:
        """Drain this node with ``reason`` (at most 250 characters reach Slurm); if scontrol fails, slurmd drains
        it anyway when the hook exits non-zero."""
        if self.drain is not None:
            self.drain(self.node, reason)
            return
        try:
            commands.drain_node(self.node, reason[:250])
        except GpushareError:
            pass  # slurmd drains the node anyway when the hook fails; the reason is then Slurm's


def job_mps_settings(daemon: MpsDaemon, plan: JobPlan) -> list[Setting]:
    """What a job's own daemon is set to before its first client (the Prolog) and what the node monitor reads
    back while the job runs: the pinned-memory limit on each GPU, the SM share, and the client priority where
    the driver has the command (CUDA 11.8+ MPS; an older driver that refuses it is not a fault: the job's
    environment still asks for it, so it is ``optional`` and never read back as a fault)."""
    settings = []
    if plan.mem_limit_mib is not None:
        settings += [daemon.pinned_mem_limit(i, plan.mem_limit_mib) for i in range(len(plan.gpu_indices))]
    if plan.sm_percent is not None:
        settings.append(daemon.active_thread_percentage(plan.sm_percent))
    if plan.client_priority is not None:
        settings.append(daemon.client_priority(plan.client_priority, optional=True))
    return settings


def log_event(ctx: HookContext, hook: str, message: str, *, level: int = syslog.LOG_WARNING) -> None:
    """Tell the administrator of ``message`` from hook ``hook`` (``prolog``, ``epilog``) where one reads it
    on every Slurm release.

    slurmd captures a Prolog's or Epilog's stdout and stderr together and logs them only when the
    script fails (``error("%s failed: rc:%u output:%s")``) or at ``SlurmdDebug=debug2`` (``prolog success
    rc:0 output:...``): src/plugins/prep/script/prep_script_slurmd.c, ``_run_subpath_command``, at
    slurm-22-05-8-1, slurm-24-11-5-1 and slurm-26-05-3-1. A hook that exits 0 is therefore not heard in
    slurmd's log at the default level, so the line goes to three places:

    1. ``<run_dir>/node.log`` (:data:`NODE_LOG`), appended: ``<ISO time> <node> <hook>: <message>``;
       a line is one ``write`` to an ``O_APPEND`` file, so hooks of concurrent jobs do not interleave;
    2. syslog (``slurm-gpushare[pid]``, facility daemon; on a systemd node ``journalctl -t slurm-gpushare``);
       where no syslog daemon listens, the C library drops it;
    3. stderr, ``slurm-gpushare <hook>: <message>`` (slurmd's log at debug2, or with a failing hook's error).

    A node log that cannot be written (a read-only or missing run dir) is not an error: the other two remain.
    """
    print(f"slurm-gpushare {hook}: {message}", file=sys.stderr)
    line = f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {ctx.node} {hook}: {message}".replace("\n", " ") + "\n"
    try:
        fd = os.open(ctx.run_dir / NODE_LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o640)
        try:
            os.write(fd, line.encode("utf-8", "replace"))
        finally:
            os.close(fd)
    except OSError:
        pass
    syslog.openlog(SYSLOG_IDENT, syslog.LOG_PID, syslog.LOG_DAEMON)
    syslog.syslog(level, f"{ctx.node} {hook}: {message}")


def stuck_reason(ctx: HookContext, result: StopResult, what: str) -> str | None:
    """The drain reason for a daemon that survived SIGKILL (``what`` names it), or None when none did or
    the node is configured not to drain for it (``drain_on_stuck_daemon``)."""
    stuck = list(getattr(result, "survivors", ()) or ())
    if not stuck or not ctx.config.drain_on_stuck_daemon:
        return None
    return (f"gpushare: {what} (pid {', '.join(map(str, stuck))}) survives SIGKILL: "
            "check the GPU and the driver, then run 'slurm-gpushare doctor --repair'")


def job_info(ctx: HookContext, job_id: str, env: dict[str, str] | None = None) -> JobInfo:
    """The job's record from slurmctld (:func:`slurm_gpushare.slurm.commands.job_record`, read by
    :func:`slurm_gpushare.slurm.job.parse_job_json`), asked up to three times, with the owner from slurmd's
    environment ``env`` when given (:func:`slurm_gpushare.slurm.job.with_env_identity`).

    Raises:
        JobFault: slurmctld could not be reached, did not know the job, or printed a record that cannot be
            trusted: the job fails, the node does not drain (a hostile field must not drain a node).
    """
    try:
        info = retry(lambda: parse_job_json(ctx.job_record(job_id), job_id), waits=JOB_RECORD_WAITS,
                     again=lambda e: isinstance(e, GpushareError))
        return with_env_identity(info, env) if env is not None else info
    except GpushareError as e:
        raise JobFault(f"cannot read job {job_id} from slurmctld: {e}",
                       hint="check that this node reaches slurmctld (scontrol ping)") from None


def fail_job(ctx: HookContext, job_id: str, fault: JobFault, hook: str, *, tell: bool = True) -> None:
    """End job ``job_id`` for ``fault`` without draining the node: the reason goes to slurmd's log (the hook's
    stderr), then the job is cancelled (:func:`slurm_gpushare.slurm.commands.cancel_job`). A cancel that fails
    is logged too; the job then runs without its share prepared (its tasks find no MPS environment). Both go
    where :func:`log_event` puts them: the hook exits 0, so slurmd itself keeps them only at debug2."""
    log_event(ctx, hook, f"job {job_id} failed, node kept up: {fault}", level=syslog.LOG_ERR)
    if tell:  # the reason where the user reads it (not when slurmctld itself may be why the hook is late)
        tell_user(ctx, job_id, f"gpushare: cancelled by the {hook.capitalize()} on {ctx.node}: {fault}", hook)
    try:
        ctx.cancel(job_id)
    except GpushareError as e:
        log_event(ctx, hook, f"job {job_id}: scancel failed: {e}", level=syslog.LOG_ERR)


#: The most characters of the note :func:`tell_user` adds to a job's AdminComment.
NOTE_CHARS = 400


def admin_note(note: str) -> str:
    """``note`` as it goes into an AdminComment: one line, printable, at most :data:`NOTE_CHARS`, brackets as
    parentheses (a note may quote the user's own bytes, e.g. control.log, and a bracketed ``[gpushare:...]`` there
    would read as the product's audit or usage segment)."""
    from slurm_gpushare.atomicfile import printable

    return printable(" ".join(note.split()), limit=NOTE_CHARS).replace("[", "(").replace("]", ")")


def tell_user(ctx: HookContext, job_id: str, note: str, hook: str) -> None:
    """Append ``note`` (made printable, brackets as parentheses, cut to :data:`NOTE_CHARS`) to the job's
    AdminComment, after what is there (the gpushare audit), where its user reads it (``scontrol show job``,
    ``sacct -o AdminComment``): the hook's own output reaches only slurmd's log. AdminComment is written by
    root, SlurmUser and administrators only. Nothing here fails the hook: a record that cannot be read or an
    update slurmctld refuses is logged."""
    text = admin_note(note)
    try:
        current = parse_job_json(ctx.job_record(job_id), job_id).admin_comment
    except GpushareError:
        current = ""
    try:
        ctx.set_admin_comment(job_id, f"{current} {text}" if current else text)
    except GpushareError as e:
        log_event(ctx, hook, f"job {job_id}: the reason was not put in its AdminComment: {e}")


def load_machine(ctx: HookContext) -> Machine:
    """The node's machine description (``machine`` of node.toml).

    Raises:
        NodeFault: missing or not valid.
    """
    try:
        return Machine.load(ctx.config.machine_for(ctx.node))
    except GpushareError as e:
        raise NodeFault(f"no usable machine description for {ctx.node}: {e}",
                        hint="write it with 'slurm-gpushare inventory -o' on the node") from None


#: What the node tells of its devices without the job: its description, its gres.conf records, and NVML's
#: GPU and MIG UUIDs (index -> UUID; (GPU index, GPU instance) -> UUID).
NodeDevices = tuple[Machine, NodeGres, dict, dict]


def node_devices(ctx: HookContext) -> NodeDevices:
    """The node's machine description, gres.conf records and NVML UUIDs (``nvmlDeviceGetUUID``), which
    :func:`plan_with_machine` plans a job on: read while slurmctld is asked for the job's record.

    Raises:
        NodeFault: no usable machine description, or NVML failed.
    """
    machine = load_machine(ctx)
    gres = node_gres(machine, ctx.node, GresOptions(device_dir=ctx.config.device_dir_for(ctx.node),
                                                    shard_unit_mib=ctx.config.shard_unit_mib))
    try:
        with open_nvml() as port:
            gpu_uuids, mig_uuids = read_uuids(port, machine.gpus)
    except GpushareError as e:
        raise NodeFault(f"NVML failed on {ctx.node}: {e}", hint="check the driver (nvidia-smi)") from None
    return machine, gres, gpu_uuids, mig_uuids


def plan_with_machine(ctx: HookContext, info: JobInfo,
                      devices: NodeDevices | None = None) -> tuple[JobPlan, Machine, NodeGres]:
    """The job's plan on this node, the machine with NVML's GPU UUIDs, and the node's gres.conf records.

    Args:
        devices: :func:`node_devices`, when already read.

    Raises:
        NodeFault: no usable machine description, NVML failed, or the job holds devices the
            description does not have (a stale description: a node problem).
    """
    machine, gres, gpu_uuids, mig_uuids = devices or node_devices(ctx)
    try:
        plan = plan_job(info, ctx.node, gres, gpu_uuids=gpu_uuids, mig_uuids=mig_uuids,
                        shard_unit_mib=ctx.config.shard_unit_mib,
                        low_priority_partitions=ctx.config.low_priority_partitions,
                        low_priority_qos=ctx.config.low_priority_qos)
    except InputError as e:
        raise NodeFault(e.message, hint=e.hint) from None
    return plan, machine.with_gpu_uuids(gpu_uuids), gres


def record_and_plan(ctx: HookContext, job_id: str,
                    env: dict[str, str]) -> tuple[JobInfo, tuple[JobPlan, Machine, NodeGres]]:
    """The job's record (:func:`job_info`) and its plan (:func:`plan_with_machine`): the record is asked in a
    thread while this one reads the node's devices (:func:`node_devices`), so that the wait for slurmctld
    and the local reading overlap (a Prolog's cost, docs/performance.md).

    Raises:
        JobFault: as :func:`job_info`.
        NodeFault: as :func:`plan_with_machine`; raised without waiting for slurmctld's answer.
    """
    import threading

    got: dict[str, object] = {}

    def ask() -> None:
        try:
            got["info"] = job_info(ctx, job_id, env)
        except BaseException as e:  # handed to the hook's thread, which raises it
            got["error"] = e

    asking = threading.Thread(target=ask, name=f"job-record-{job_id}", daemon=True)
    asking.start()
    devices = node_devices(ctx)  # a NodeFault here leaves the daemon thread: the hook drains and exits
    asking.join()
    if "error" in got:
        raise got["error"]  # type: ignore[misc]
    info = got["info"]
    assert isinstance(info, JobInfo)
    return info, plan_with_machine(ctx, info, devices)


def machine_with_uuids(ctx: HookContext) -> Machine:
    """The node's machine description with NVML's GPU UUIDs (``nvmlDeviceGetUUID``; descriptions made
    from ``nvidia-smi topo -m`` text have none). When NVML fails the description's stand (said on stderr).

    Raises:
        NodeFault: no usable machine description.
    """
    machine = load_machine(ctx)
    try:
        with open_nvml() as port:
            uuids, _mig = read_uuids(port, machine.gpus)
    except GpushareError as e:
        print(f"slurm-gpushare epilog: GPU UUIDs from the machine description: NVML failed ({e})", file=sys.stderr)
        return machine
    return machine.with_gpu_uuids(uuids)
