"""GPU processes left behind by a job: found through NVML, killed when they provably belong to a job that
ended, otherwise reported (the Epilog drains the node) with a reason that names pid, user and GPU.

Slurm signals a job's processes before it runs the Epilog: slurmd's ``_rpc_terminate_job`` sends SIGCONT and
SIGTERM to every active step, waits up to ``KillWait`` (at least 5 s) for them, has the rest killed (SIGKILL,
to the processes each step's proctrack plugin tracks), waits for the steps to end, then runs the Epilog
(src/slurmd/slurmd/req.c at slurm-22-05-8-1, slurm-24-11-5-1 and slurm-26-05-3-1; from 24.11
``PrologFlags=RunInJob`` runs the Epilog in the job's extern step instead, which is not tested here).
A process that is still on a GPU then escaped that kill: it left the
tracking (``setsid`` and a double fork leave ``proctrack/linuxproc``'s process tree; under cgroup v1 a user
cannot leave the job's cgroup, whose ``tasks`` files are root's), or it was never the job's (a user's
process started outside any job, another job's). :func:`gpu_holders` lists the compute processes of the
GPUs (``nvmlDeviceGetComputeRunningProcesses`` through the port) with facts only the kernel and Slurm write:
the real uid, the start time, and the job of the process's cgroup (``/proc/<pid>/cgroup``; Slurm's task or
proctrack cgroup plugins create ``.../job_<id>/step_<step>/...`` as root). The process's name, command line
and environment are the user's to write and are never read (``SLURM_JOB_ID`` in ``/proc/<pid>/environ`` is
whatever the user exported).

:func:`judge` decides, for a process on the GPUs of an ended job (the Epilog) or on any GPU (``doctor``):

=====================================================================  =======================================
the process                                                            verdict
=====================================================================  =======================================
a process of a running job's MPS daemon (its pipe directory, its uid)  keep
in the cgroup of a running job, or in Slurm's pid list of one          keep
in the cgroup of the ended job, or of a job not running here           kill
the ended job's user, no other job of theirs here, started after the   kill
job started
the ended job's user with another job running here (no cgroup says     drain: it may be that job's; killing a
which)                                                                 live job's process is worse
the ended job's user, started before the job                           drain (a process outside any job)
another user, or root                                                  drain
squeue (or, for a user with a job here, ``scontrol listpids``) failed  unknown: logged, nothing else
=====================================================================  =======================================

``doctor`` kills only what a cgroup proves (and reports the rest); the Epilog also kills the ended job's
user's processes as the table says. The drain reason holds digits, the passwd name of the uid (characters
other than ``[A-Za-z0-9._-]`` make it ``uid N``), the GPU index and NVML's UUID: no byte a user wrote.
"""

from __future__ import annotations

import pwd
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from slurm_gpushare.errors import GpushareError
from slurm_gpushare.hardware.port import NvmlPort
from slurm_gpushare.node.context import HookContext
from slurm_gpushare.node.jobdir import job_plans
from slurm_gpushare.node.membership import job_of_cgroup, parse_listpids, read_cgroup
from slurm_gpushare.node.shared_mps import members, shared_root, shared_user
from slurm_gpushare.procinfo import kill_and_wait, process, real_uid, running, started_at

#: Seconds a process may predate its job's recorded start and still count as started by the job (Slurm's
#: start time is whole seconds; the kernel's is in clock ticks).
START_SLACK_S = 2.0
#: Seconds to wait for a process to be gone after SIGKILL.
KILL_WAIT_S = 5.0

_SAFE_NAME = re.compile(r"[A-Za-z0-9._-]{1,32}")


def user_label(uid: int | None) -> str:
    """``alice(1001)``: the passwd name of ``uid`` (root's system database) and the uid; ``uid 1001`` when
    the name is unknown or holds characters other than ``[A-Za-z0-9._-]``; ``unknown user`` for None."""
    if uid is None:
        return "unknown user"
    try:
        name = pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"
    return f"{name}({uid})" if _SAFE_NAME.fullmatch(name) else f"uid {uid}"


@dataclass(frozen=True)
class Holder:
    """A live process with a compute context on a GPU (``nvmlDeviceGetComputeRunningProcesses``).

    Attributes:
        pid: the process id NVML reports.
        uid: its real uid (``/proc/<pid>/status``), None when unreadable.
        gpu: NVML index of the GPU (the parent GPU of a MIG device).
        uuid: the GPU's UUID, or the MIG device's when the process runs in one.
        gi_id: the MIG GPU instance it runs in, None on a GPU without MIG.
        used_mib: GPU memory it holds, MiB.
        cgroup_job: the Slurm job of its cgroup (``/proc/<pid>/cgroup``, ``job_<id>``), None when none.
        started: its start, epoch seconds, None when unknown.
    """

    pid: int
    uid: int | None
    gpu: int
    uuid: str
    gi_id: int | None
    used_mib: int
    cgroup_job: str | None
    started: float | None
    proc: psutil.Process | None = field(default=None, compare=False, repr=False)

    def describe(self) -> str:
        """``pid 4242 of alice(1001) on GPU 0 (GPU-...)``: only kernel, passwd and NVML facts."""
        return f"pid {self.pid} of {user_label(self.uid)} on GPU {self.gpu} ({self.uuid})"


@dataclass(frozen=True)
class EndedJob:
    """The job whose Epilog runs: facts from slurmd's environment and the Prolog's ``run.json`` (root's).

    Attributes:
        job_id: ``SLURM_JOB_ID``.
        uid: ``SLURM_JOB_UID``, None when not set.
        start: the job's start, epoch seconds (the Prolog's record of it), None when unknown.
        devices: ``(NVML index, MIG GPU instance id or None)`` of the devices it held here; None: every GPU.
    """

    job_id: str
    uid: int | None = None
    start: float | None = None
    devices: frozenset[tuple[int, int | None]] | None = None

    def holds(self, h: Holder) -> bool:
        """The process runs on one of the job's devices (a whole GPU includes its MIG devices)."""
        if self.devices is None:
            return True
        return (h.gpu, None) in self.devices or (h.gi_id is not None and (h.gpu, h.gi_id) in self.devices)


@dataclass(frozen=True)
class Verdict:
    """What to do with a holder: ``keep``, ``kill`` or ``drain``, and why (in words without user bytes)."""

    holder: Holder
    action: str
    why: str


def gpu_holders(port: NvmlPort, gpus: Iterable[int] | None = None, *,
                cgroup_of: Callable[[int], str] | None = None) -> list[Holder]:
    """The live compute processes on the GPUs ``gpus`` (NVML indices; None: every GPU), by GPU then pid.
    ``port`` must be open. A pid NVML reports but the kernel no longer has is skipped (it exited between
    the two looks). ``cgroup_of``: pid -> ``/proc/<pid>/cgroup`` text (default :func:`read_cgroup`).

    Raises:
        NvmlError: an NVML call failed.
    """
    cgroup_of = cgroup_of or read_cgroup
    indices = list(range(port.device_count())) if gpus is None else sorted(set(gpus))
    out = []
    for index in indices:
        gpu_uuid = port.uuid(index)
        mig = {inst.gi_id: inst.uuid for inst in port.gpu_instances(index)}
        for p in port.processes(index):
            proc = process(p.pid)
            if proc is None or not running(proc):
                continue
            uuid = mig.get(p.gi_id, gpu_uuid) if p.gi_id is not None else gpu_uuid
            out.append(Holder(p.pid, real_uid(proc), index, uuid, p.gi_id, p.used_memory_mib,
                              job_of_cgroup(cgroup_of(p.pid)), started_at(proc), proc))
    return out


def daemon_pids(ctx: HookContext, *, except_job: str | None = None) -> set[int]:
    """Processes of the node's MPS daemons that serve jobs: per-job daemons whose job directory's
    ``state.json`` (root's) names the process's uid, and shared daemons (``shared/gpuN-uidU``) with jobs
    left, run by uid U. A daemon's pipe directory is in its environment, which its user writes: the uid
    check makes a disguised process count only as a daemon of its own user's job (what the verdict for
    "another job of the same user" keeps anyway). ``except_job``: a job whose daemon does not count."""
    pipes: dict[Path, int] = {}
    for _job, d, plan in job_plans(ctx.run_dir, except_job=except_job):
        uid = plan.get("uid")
        if isinstance(uid, int) and uid >= 0:
            pipes[d / "mps" / "pipe"] = uid
    for d in shared_root(ctx.run_dir).glob("*"):
        uid = shared_user(d)
        jobs = set(members(d)) - {except_job}
        if uid is not None and jobs:
            pipes[d / "pipe"] = uid
    if not pipes:
        return set()
    out = set()
    for proc in psutil.process_iter(["environ", "cmdline", "uids"]):
        env, argv, uids = proc.info["environ"], proc.info["cmdline"], proc.info["uids"]
        if not env or not argv or uids is None or "nvidia-cuda-mps" not in "\0".join(argv):
            continue
        pipe = env.get("CUDA_MPS_PIPE_DIRECTORY") or ""
        if pipe and pipes.get(Path(pipe)) == uids.real:
            out.add(proc.pid)
    return out


def judge(h: Holder, *, ended: EndedJob | None, running: Mapping[str, int | None] | None,
          tracked: Mapping[int, str] | None, daemons: set[int]) -> Verdict:
    """The verdict on one holder (see the module's table): ``keep``, ``kill``, ``drain``, or ``unknown``
    when Slurm could not be asked what the verdict needs (logged; neither killed nor drained for).

    Args:
        h: the process.
        ended: the job whose Epilog runs; None for ``doctor`` (then only a cgroup proves a job).
        running: jobs with an allocation on this node, id -> owner uid (None: unknown), without ``ended``;
            None when ``squeue`` failed.
        tracked: pid -> job of Slurm's pid lists (``scontrol listpids``); None when it failed.
        daemons: pids of the running jobs' MPS daemons (:func:`daemon_pids`).
    """
    if h.pid in daemons:
        return Verdict(h, "keep", "a process of a running job's MPS daemon")
    if h.cgroup_job is not None and ended is not None and h.cgroup_job == ended.job_id:
        return Verdict(h, "kill", f"in the cgroup of ended job {h.cgroup_job}")
    if running is None:
        return Verdict(h, "unknown", "squeue failed: which jobs run here is unknown")
    if h.cgroup_job is not None:
        if h.cgroup_job in running:
            return Verdict(h, "keep", f"in the cgroup of running job {h.cgroup_job}")
        return Verdict(h, "kill", f"in the cgroup of job {h.cgroup_job}, which no longer runs here")
    job = (tracked or {}).get(h.pid)
    if job is not None and job in running:
        return Verdict(h, "keep", f"tracked by running job {job}")
    mine = ended is not None and h.uid is not None and h.uid == ended.uid
    if tracked is None and not mine and h.uid is not None and h.uid in running.values():
        return Verdict(h, "unknown", "scontrol listpids failed and a running job of that user may own it")
    if ended is None:
        return Verdict(h, "drain", "no running job here holds it and no cgroup names its job")
    if mine:
        others = sorted(j for j, uid in running.items() if uid == h.uid)
        if others:
            return Verdict(h, "drain", f"no cgroup says whether it is of ended job {ended.job_id} or of the "
                                       f"same user's running job {', '.join(others)}")
        if ended.start is not None and h.started is not None and h.started >= ended.start - START_SLACK_S:
            return Verdict(h, "kill", f"of ended job {ended.job_id}'s user, started while it ran, and no other "
                                      "job of that user runs here")
        return Verdict(h, "drain", f"of ended job {ended.job_id}'s user but started before the job")
    return Verdict(h, "drain", f"not a process of ended job {ended.job_id} (another user) and of no running job")


@dataclass
class Sweep:
    """What :func:`sweep` did: the verdicts, what was killed, what survived SIGKILL."""

    @property
    def unknown(self) -> list[Verdict]:
        """Verdicts Slurm's failure left open."""
        return [v for v in self.verdicts if v.action == "unknown"]

    verdicts: list[Verdict] = field(default_factory=list)
    killed: list[Holder] = field(default_factory=list)
    stuck: list[Holder] = field(default_factory=list)

    @property
    def unresolved(self) -> list[Verdict]:
        """Drain verdicts, then kills that failed."""
        return ([v for v in self.verdicts if v.action == "drain"]
                + [Verdict(h, "drain", "it survives SIGKILL") for h in self.stuck])


def sweep(ctx: HookContext, port: NvmlPort, *, ended: EndedJob | None, running: Mapping[str, int | None] | None,
          kill: bool, cgroup_of: Callable[[int], str] | None = None) -> Sweep:
    """Find the holders (on the ended job's GPUs, or every GPU), judge them, and with ``kill`` kill the
    ``kill`` verdicts (SIGKILL, checked to be gone within :data:`KILL_WAIT_S`). Slurm is asked only when a
    holder needs it: ``scontrol listpids`` and ``squeue`` (``running`` None: asked through ``ctx``).

    Slurm failing makes the verdicts that need it ``unknown`` (see :func:`judge`).

    Raises:
        NvmlError: an NVML call failed.
    """
    gpus = None if ended is None or ended.devices is None else {g for g, _ in ended.devices}
    holders = [h for h in gpu_holders(port, gpus, cgroup_of=cgroup_of) if ended is None or ended.holds(h)]
    out = Sweep()
    if not holders:
        return out
    if running is None:
        try:
            running = dict(ctx.job_owners(ctx.node))
        except GpushareError:
            running = None
    if running is not None:
        running = {j: u for j, u in running.items() if ended is None or j != ended.job_id}
    tracked: dict[int, str] | None = {}
    if any(h.cgroup_job is None for h in holders):
        try:
            tracked = parse_listpids(ctx.listpids(ctx.node))
        except GpushareError:
            tracked = None
    daemons = daemon_pids(ctx, except_job=ended.job_id if ended else None)
    for h in holders:
        v = judge(h, ended=ended, running=running, tracked=tracked, daemons=daemons)
        out.verdicts.append(v)
        if v.action == "kill" and kill and h.proc is not None:
            (out.killed if kill_and_wait(h.proc, KILL_WAIT_S) else out.stuck).append(h)
    return out


def drain_reason(job_id: str | None, unresolved: list[Verdict]) -> str:
    """The node's drain reason for what a sweep could not resolve (at most 250 characters reach Slurm): the
    first holder and its verdict, and how many more."""
    first = unresolved[0]
    who = f"gpushare epilog job {job_id}" if job_id else "gpushare"
    more = f" (+{len(unresolved) - 1} more, see node.log)" if len(unresolved) > 1 else ""
    return (f"{who}: {first.holder.describe()} holds the GPU: {first.why}{more}; "
            "kill it, then resume the node")
