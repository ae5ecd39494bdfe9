"""The node monitor: samples NVML, attributes GPU processes to Slurm jobs, keeps each job's peaks and
hands the usage to the Epilog; :mod:`slurm_gpushare.node.metrics` serves its Prometheus metrics.

``slurm-gpushare monitor`` runs on each GPU node as root (a systemd service next to slurmd). Every
``monitor_interval`` seconds (node.toml) one :meth:`Monitor.sample`:

1. brings its job table up to date without loading slurmctld: the jobs whose slurmstepds run on
   the node come from ``scontrol listpids '*' <node>`` (local: it asks the stepds, not slurmctld) every
   ``monitor_steps_interval`` seconds (default 10), and ``squeue -w <node>`` is asked every
   ``monitor_jobs_interval`` seconds (default 60; at each listpids when listpids fails) for jobs without
   steps (an idle ``salloc``) and to remove usage files of jobs that have left. A job whose steps all ended
   (its job cgroup is gone, or listpids no longer lists it) leaves the metrics at once but keeps its usage
   file for its Epilog; a job seen again (an allocation between two steps) takes its peaks back from
   that file. Each new job's record is read once with ``scontrol -d show job`` and planned like the
   Prolog plans it (which GPUs or MIG devices, which memory share,
   :func:`~slurm_gpushare.node.plan.plan_job`);
2. reads every GPU's compute processes (``nvmlDeviceGetComputeRunningProcesses``, with per-process
   SM utilization from ``nvmlDeviceGetProcessUtilization`` where NVML has it) and the GPU's
   utilization (``nvmlDeviceGetUtilizationRates``; not supported on MIG-enabled GPUs);
3. attributes each process to a job from root's data only (:mod:`slurm_gpushare.node.membership`): its
   cgroup (``/proc/<pid>/cgroup`` in Slurm's ``.../job_<id>/...`` layout, cgroup v1 or v2, whose
   ``job_<id>`` directory is root's: made by slurmstepd), read every sample at no Slurm cost; else
   Slurm's pid lists (``scontrol listpids``: what each slurmstepd tracks, for proctrack/linuxproc or pgid),
   asked once when a process appears that no cgroup places (at most one call a second) and kept for
   the process's life (pid and start time). Either way the job must be in the table (slurmctld or the
   local stepds have it on this node; a job only a cgroup names is looked up once and must be running
   here) and the job's user must be the process's real owner (``/proc/<pid>/status``): a process of
   another user in a job's cgroup (22.05's step cgroups are the user's, who can open them to others) is
   not charged to that job, and is counted (``gpushare_monitor_refused_attributions_total``) and logged;
4. adds one sample per job and device to a :class:`~slurm_gpushare.accounting.record.UsageTracker`:
   memory = the sum over the job's processes on that device (0 when it holds the device and runs
   nothing there: reserved and unused); SM = the sum of its processes' SM utilization, or the GPU's
   utilization for a job that holds the whole GPU, or no data (MIG devices, MPS shares without
   per-process figures): never a made-up 0;
5. flags a job whose processes on a device together hold more memory than its share there (an MPS
   limit is per client process, so two processes can each stay under it and together exceed it; a
   process on a device the job does not hold is over a share of 0), logs the start of each such
   episode once, and counts it;
6. writes each job's running totals to ``<run_dir>/usage/<job>.json``
   (:mod:`slurm_gpushare.accounting.live`) every ``monitor_save_interval`` seconds (default 1), at once when a
   job's first sample or a new peak comes (a job that ends within the interval keeps its peaks), and once
   more when the job's steps end, which the Epilog turns into the job's records, and the
   metrics to a node_exporter textfile when configured.

``monitor_interval`` may be as short as 0.01 s: per sample the monitor makes only the NVML calls, reads
``/proc/<pid>/{cgroup,stat,status}`` and stats the job cgroups of the GPU processes (benchmarks/monitor
measures the CPU it costs per GPU, docs/performance.md).

Metrics: :mod:`slurm_gpushare.node.metrics` (the collector of a monitor's last sample).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace

import psutil

from slurm_gpushare import procinfo
from slurm_gpushare.accounting.live import load_state, remove_usage, restore_all, save_usage, usage_files
from slurm_gpushare.accounting.record import UsageRecord, UsageTracker
from slurm_gpushare.errors import GpushareError, InputError
from slurm_gpushare.hardware.machine import GpuProcess, Machine
from slurm_gpushare.hardware.port import NvmlPort, read_uuids
from slurm_gpushare.node.config import NodeConfig
from slurm_gpushare.node.context import HookContext, admin_note, job_mps_settings
from slurm_gpushare.node.gpulimit import TRIES as LIMIT_TRIES
from slurm_gpushare.node.gpulimit import LimitResult, apply_limit, job_cgroup_dir, wants_limit
from slurm_gpushare.node.jobdir import job_lock_nowait, read_state
from slurm_gpushare.node.membership import (
    CgroupFs,
    CgroupJob,
    ProcFacts,
    ProcReader,
    cgroup_jobs,
    parse_listpids,
)
from slurm_gpushare.node.plan import JobPlan, plan_job
from slurm_gpushare.node.records import records_for_job
from slurm_gpushare.slurm import commands
from slurm_gpushare.slurm.job import JobInfo, parse_job_json
from slurm_gpushare.slurm.nodegres import GresOptions, node_gres

MIB = 1 << 20
#: Least seconds between two ``scontrol listpids`` calls made because a GPU process appeared that no job
#: cgroup holds (the calls every ``monitor_steps_interval`` aside).
LOOKUP_GAP_S = 1.0
#: Seconds the front end may take to read back a share job's MPS daemon settings (:meth:`Monitor.check_mps`): a
#: job's own daemon that hangs delays the monitor's samples by at most this much per check.
MPS_CHECK_TIMEOUT_S = 3.0
#: Job states in which a job's processes may run on its nodes.
RUNNING_STATES = frozenset({"RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED"})

JobKey = int | str  # NVML index of a GPU, or MIG device UUID
#: The read-back's finding for a job's daemon stopped by the job (:meth:`Monitor.check_mps`).
_STOPPED = "its MPS control daemon is stopped (a stop signal or a tracer: it answers no client)"

@dataclass
class _Job:
    info: JobInfo
    plan: JobPlan
    # device key -> provisional record: what the Epilog would write now (reserved, asked)
    devices: dict[JobKey, UsageRecord]
    over: set[JobKey] = field(default_factory=set)
    over_samples: dict[JobKey, int] = field(default_factory=dict)  # consecutive samples over the share
    enforced: set[JobKey] = field(default_factory=set)  # acted on in this episode
    mps_checked: float = float("-inf")  # when its MPS daemon's settings were last read back
    mps_drift: int = 0  # consecutive read-backs that found them changed (or the daemon gone)
    mps_enforced: bool = False  # acted on in this episode of drift
    outside_samples: dict[JobKey, int] = field(default_factory=dict)  # consecutive samples with a process outside MPS
    outside_enforced: set[JobKey] = field(default_factory=set)  # acted on in this episode
    limit: LimitResult | None = None  # the driver's memory limit on its cgroup, once tried (node/gpulimit.py)
    limit_dir: tuple[int, int] | None = None  # (st_dev, st_ino) of the cgroup directory it was set on
    limit_tries: int = 0  # sets that failed


@dataclass(frozen=True)
class Enforcement:
    """An action the monitor takes on a job whose processes on a device held more than its share for
    ``enforce_grace`` samples (:meth:`Monitor.enforce`).

    Attributes:
        job_id, user, partition: the job.
        key: the device (NVML index of a GPU).
        action: ``kill``, ``requeue`` or ``warn`` (node.toml ``enforce``/``enforce_partitions``).
        used_mib, share_mib: what its processes held together, and its share (MiB).
        processes: ``(pid, start)`` of the job's processes on the device (``/proc/<pid>/stat`` start).
        reason: what the job did, when it is not memory: its MPS daemon's settings changed or the daemon gone
            (:meth:`Monitor.check_mps`); the daemon is then set back (``restore``, its settings).
    """

    job_id: str
    user: str
    partition: str
    key: JobKey
    action: str
    used_mib: int
    share_mib: int
    processes: tuple[tuple[int, int], ...]
    reason: str = ""
    restore: Callable[[], str] | None = None


def device_key(record: UsageRecord) -> JobKey:
    """How the monitor keys a device: the MIG device UUID, else the GPU's NVML index."""
    return record.gpu_uuid if record.mode == "mig" else record.gpu_index


@dataclass(frozen=True)
class DeviceSample:
    """One job on one device in one sample (what the metrics show as "now")."""

    job_id: str
    key: JobKey
    gpu_index: int
    used_mib: int
    sm_percent: float | None
    processes: int


@dataclass(frozen=True)
class GpuSample:
    """One GPU in one sample."""

    index: int
    uuid: str
    model: str
    total_mib: int
    used_mib: int | None
    utilization_percent: int | None
    unattributed_mib: int
    unattributed_processes: int


@dataclass
class Snapshot:
    """The last sample: per job and device, per GPU, when, how long it took."""

    time: float = 0.0
    duration_s: float = 0.0
    devices: list[DeviceSample] = field(default_factory=list)
    gpus: list[GpuSample] = field(default_factory=list)


class Monitor:
    """Samples one node (see module docstring). Everything it reaches outside is injectable.

    Args:
        config: node settings (``run_dir``, ``shard_unit``, ``monitor_*``).
        node: the Slurm node name.
        machine: the node's machine description (GPU names, MIG profiles).
        port: an NVML port (opened by the monitor for its lifetime: :meth:`open` / :meth:`close`).
        running_jobs: callable(node) -> job ids on the node (default ``squeue``); it raises
            :class:`~slurm_gpushare.errors.SlurmError` when slurmctld does not answer.
        job_record: callable(job id) -> the structured job record (:func:`slurm_gpushare.slurm.commands.job_record`).
        listpids: callable(node) -> ``scontrol listpids`` text, for processes outside a job cgroup.
        cgroup_of: callable(pid) -> ``/proc/<pid>/cgroup`` text (default: :class:`ProcReader`'s, from the
            process's ``/proc`` directory held open).
        cgroup_owner: callable(:class:`~slurm_gpushare.node.membership.CgroupJob`) -> the uid owning that job
            cgroup's directory, None when there is none (default :meth:`CgroupFs.owner`).
        proc_of: callable(pid) -> :class:`~slurm_gpushare.node.membership.ProcFacts` (real uid, start), None
            when the process is gone (default :class:`~slurm_gpushare.node.membership.ProcReader`'s).
        log: callable(str) for one-line events (over-limit episodes, errors); default stderr.
        clock: seconds since the epoch.
        update_admin_comment: callable(job id, text) that sets a job's AdminComment (default
            ``scontrol update jobid=ID AdminComment=TEXT``).
        requeue: callable(job id) that requeues a job (default ``scontrol requeue``), for ``enforce = "requeue"``.
        kill: callable(pid, signal) (default :func:`os.kill`), for ``enforce = "kill"``.
        cgroup_fs: where the cgroup hierarchies are mounted (default: this host's), to find a share job's cgroup
            directory for the driver's memory limit (:mod:`slurm_gpushare.node.gpulimit`).
    """

    def __init__(self, config: NodeConfig, node: str, machine: Machine, port: NvmlPort, *,
                 running_jobs: Callable[[str], Iterable[str]] | None = None,
                 job_record: Callable[[str], str] = commands.job_record,
                 listpids: Callable[[str], str] | None = None,
                 cgroup_of: Callable[[int], str] | None = None,
                 cgroup_owner: Callable[[CgroupJob], int | None] | None = None,
                 proc_of: Callable[[int], ProcFacts | None] | None = None,
                 log: Callable[[str], None] | None = None,
                 clock: Callable[[], float] = time.time,
                 update_admin_comment: Callable[[str, str], None] | None = None,
                 requeue: Callable[[str], None] | None = None,
                 kill: Callable[[int, int], None] = os.kill,
                 cgroup_fs: CgroupFs | None = None):
        self.config = config
        self.node = node
        self.machine = machine
        self.port = port
        self.run_dir = config.run_dir_for(node)
        self.tracker = UsageTracker()
        self.snapshot = Snapshot()
        self.samples_total = 0
        self.errors_total: dict[str, int] = {}
        self._no_mps_list: set[int] = set()  # GPUs whose NVML does not list MPS clients
        self.over_limit_total = 0
        self._running_jobs = running_jobs or commands.running_jobs
        self._job_record = job_record
        self._listpids = listpids or commands.listpids
        self._reader = ProcReader()
        self._cgroup_of = cgroup_of or self._reader.cgroup
        self._cgroup_fs = cgroup_fs or CgroupFs()
        self._cgroup_owner = cgroup_owner or self._cgroup_fs.owner
        self.limits_total: dict[str, int] = {}  # the driver's memory limits tried, by outcome
        self._no_limits: LimitResult | None = None  # the driver's answer that it has no per-cgroup limits
        self._proc_of = proc_of or self._reader.facts
        self._log = log or (lambda line: print(f"slurm-gpushare monitor: {line}", file=sys.stderr, flush=True))
        self._clock = clock
        self._update_admin_comment = update_admin_comment or commands.update_admin_comment
        self._requeue = requeue or commands.requeue_job
        self._kill = kill
        self._enforcements: list[Enforcement] = []
        self._last_pids: dict[str, dict[JobKey, list[int]]] = {}  # last sample: job -> device -> its pids there
        self.enforced_total: dict[str, int] = {}
        self._jobs: dict[str, _Job] = {}
        self._gres = node_gres(machine, node, GresOptions(shard_unit_mib=config.shard_unit_mib))
        self._gpu_uuids: dict[int, str] = {}
        self._mig_uuids: dict[tuple[int, int], str] = {}
        self._open = False
        self._lock = threading.Lock()  # sample() and collect() (the HTTP server's thread)
        self._pushed: dict[str, tuple[float, str]] = {}  # job -> (when, summary) last put in AdminComment
        self._last_squeue = float("-inf")
        self._last_listpids = float("-inf")
        self._last_save = float("-inf")
        self._had_steps: set[str] = set()  # jobs seen with steps on this node
        # (pid, start) -> job id (None: in no job) as the last scontrol listpids said, for GPU processes
        # that no job cgroup holds: asked once per process, not every sample
        self._pid_jobs: dict[tuple[int, int], str | None] = {}
        self._job_cgroups: dict[str, set[CgroupJob]] = {}  # job -> its cgroups seen (gone: its steps ended)
        self._not_here: dict[str, float] = {}  # job named by a cgroup whose record says not running here -> when
        self._refused: set[tuple[int, int, str]] = set()  # (pid, start, job) logged as refused
        self.refused_total = 0
        self.calls_total: dict[str, int] = {}  # Slurm command -> calls
        self.attributed: dict[str, int] = {"cgroup": 0, "slurm": 0}  # last sample: processes by source

    # --- lifetime -----------------------------------------------------------------------------------

    def open(self) -> None:
        """``nvmlInit``, read the GPUs' and MIG devices' UUIDs, take back the usage files of a previous run.

        Raises:
            NvmlError: NVML cannot be opened or read.
        """
        if self._open:
            return
        self.port.init()
        self._open = True
        try:
            self._check_machine()
        except BaseException:
            self.close()
            raise
        self._gpu_uuids, self._mig_uuids = read_uuids(self.port, self.machine.gpus)
        self.machine = self.machine.with_gpu_uuids(self._gpu_uuids)
        restored, problems = restore_all(self.run_dir, self.tracker)
        for p in problems:
            self.note_error("usage-file", p)
        if restored:
            self._log(f"took back the usage of job(s) {', '.join(restored)} from {self.run_dir / 'usage'}")

    def _check_machine(self) -> None:
        """The machine description must be this node's: as many GPUs as NVML sees, each with the memory
        NVML reports (``nvmlDeviceGetCount``, ``nvmlDeviceGetMemoryInfo``).

        Raises:
            InputError: they differ (naming the description and what NVML sees).
        """
        hint = "regenerate it on this node with 'slurm-gpushare inventory -o FILE', or fix machine= in node.toml"
        count = self.port.device_count()
        source = self.config.machine_for(self.node)
        if count != len(self.machine.gpus):
            raise InputError(f"the machine description of {self.node} has {len(self.machine.gpus)} GPU(s); "
                             f"NVML sees {count}", hint=hint, source=str(source))
        for g in self.machine.gpus:
            total = self.port.memory_total_mib(g.index)
            if total != g.memory_mib:
                raise InputError(f"GPU {g.index} has {g.memory_mib} MiB in the machine description of {self.node}; "
                                 f"NVML reports {total} MiB", hint=hint, source=str(source))

    def close(self) -> None:
        """Shut the NVML port down (``nvmlShutdown``) if this monitor opened it."""
        if self._open:
            self.port.shutdown()
            self._open = False

    def __enter__(self) -> Monitor:
        self.open()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- one sample -------------------------------------------------------------------------------------

    def note_error(self, kind: str, message: str) -> None:
        """Count a failure of ``kind`` (``gpushare_monitor_errors_total``) and log it."""
        self.errors_total[kind] = self.errors_total.get(kind, 0) + 1
        self._log(f"{kind}: {message}")

    def _count(self, command: str) -> None:
        self.calls_total[command] = self.calls_total.get(command, 0) + 1

    def _local_pids(self) -> dict[int, str] | None:
        """``scontrol listpids '*' NODE``: pid -> job of every process the node's slurmstepds track (no
        slurmctld call). None when it failed (counted and logged)."""
        self._last_listpids = self._clock()
        self._count("listpids")
        try:
            return parse_listpids(self._listpids(self.node))
        except GpushareError as e:
            self.note_error("slurm", f"scontrol listpids: {e}")
            return None

    def _add_job(self, job_id: str, *, here: bool = False) -> bool:
        """Read the job's record and plan it; True when it is in the table. ``here``: only if the record says
        it runs on this node (a job named by a cgroup, not by Slurm's lists of this node)."""
        self._count("job")
        try:
            info = parse_job_json(self._job_record(job_id), job_id)
            if here and (self.node not in info.nodes or info.state not in RUNNING_STATES):
                self._not_here[job_id] = self._clock()
                self.note_error("job", f"job {job_id}: a cgroup names it, but slurmctld has it {info.state or '?'} "
                                       f"on {','.join(info.nodes) or 'no node'}, not running on {self.node}")
                return False
            plan = plan_job(info, self.node, self._gres, gpu_uuids=self._gpu_uuids, mig_uuids=self._mig_uuids,
                            shard_unit_mib=self.config.shard_unit_mib,
                            low_priority_partitions=self.config.low_priority_partitions,
                            low_priority_qos=self.config.low_priority_qos)
        except GpushareError as e:
            self.note_error("job", f"job {job_id}: {e}")
            if here:
                self._not_here[job_id] = self._clock()
            return False
        self._jobs[job_id] = _Job(info, plan, {device_key(r): r for r in self._records(info, plan)})
        if job_id not in self.tracker.jobs():  # a job seen again after a gap keeps its peaks
            try:
                rows = load_state(self.run_dir, job_id)
            except InputError as e:
                self.note_error("usage-file", str(e))
                rows = None
            if rows:
                self.tracker.restore(job_id, rows)
        return True

    def _drop(self, job_id: str) -> None:
        """A job whose steps here ended (or that left): out of the metrics; its usage file, written one last
        time, waits for its Epilog (or for the next squeue to say it left)."""
        if job_id in self.tracker.jobs():
            self._save(job_id)
        self._jobs.pop(job_id, None)
        self.tracker.pop(job_id)
        self._had_steps.discard(job_id)
        self._job_cgroups.pop(job_id, None)

    def _refresh_jobs(self, local: dict[int, str] | None, *, asked: bool) -> None:
        """Bring the job table up to date (see :meth:`sample`). ``local``: the listpids answer of this sample,
        ``asked``: listpids was asked (None then: it failed). Nothing is dropped when Slurm does not answer."""
        now = self._clock()
        stepd_jobs = set(local.values()) if local is not None else None
        ask = (asked and local is None) or now - self._last_squeue >= self.config.monitor_jobs_interval
        listed: set[str] | None = None
        if ask:
            self._count("squeue")
            try:
                listed = {str(j) for j in self._running_jobs(self.node)}
                self._last_squeue = now
                self._not_here.clear()
            except GpushareError as e:
                self.note_error("slurm", f"cannot list the jobs on {self.node}: {e}")
        current = set(self._jobs)
        if listed is not None:
            gone = current - listed - (stepd_jobs or set())
        elif stepd_jobs is not None:
            # a job that had steps here and has none now has ended (or is between steps: it comes back,
            # with its peaks, from its usage file); jobs only squeue knew wait for the next squeue
            gone = {j for j in current - stepd_jobs if j in self._had_steps}
        else:
            gone = set()
        for job_id in sorted(gone):
            self._drop(job_id)
        for job_id in sorted(((stepd_jobs or set()) | (listed or set())) - set(self._jobs)):
            self._add_job(job_id)
        if stepd_jobs:
            self._had_steps |= stepd_jobs & set(self._jobs)
        if listed is not None:
            # usage files of jobs that left (their Epilog has run) or that a previous monitor left behind
            keep = listed | (stepd_jobs or set())
            for job_id in usage_files(self.run_dir):
                if job_id not in keep:
                    self.tracker.pop(job_id)
                    try:
                        remove_usage(self.run_dir, job_id)
                    except (OSError, InputError) as e:
                        self.note_error("usage-file", f"cannot remove the usage file of job {job_id}: {e}")

    def _ended_cgroups(self) -> None:
        """Jobs whose every cgroup seen is gone (slurmstepd removes a job's cgroup when its last step here
        ends) leave the table now, not at the next listpids."""
        for job_id, cgs in list(self._job_cgroups.items()):
            if job_id in self._jobs and all(self._cgroup_owner(c) is None for c in cgs):
                self._drop(job_id)

    def _records(self, info: JobInfo, plan: JobPlan, usage=None) -> tuple[UsageRecord, ...]:
        now = int(self._clock())
        try:
            return records_for_job(info, plan, self.machine, node=self.node, start=info.start_time or now, end=now,
                                   usage=usage, gpu_uuids=self._gpu_uuids, account=info.account)
        except GpushareError as e:
            self.note_error("job", f"job {info.job_id}: {e}")
            return ()

    def _owner_ok(self, pid: int, facts: ProcFacts, job_id: str, source: str) -> bool:
        """The job is in the table and its user is the process's owner; a process of another user is
        counted (``gpushare_monitor_refused_attributions_total``) and logged once."""
        job = self._jobs.get(job_id)
        if job is None:
            return False
        if job.info.uid == facts.uid:
            return True
        if (pid, facts.start, job_id) not in self._refused:
            self._refused.add((pid, facts.start, job_id))
            self.refused_total += 1
            self._log(f"not charged: pid {pid} (uid {facts.uid}) is in the {source} of job {job_id}, whose user "
                      f"is {job.info.user}({job.info.uid})")
        return False

    def _cgroup_job(self, pid: int, facts: ProcFacts) -> str | None:
        """The job whose root-owned cgroup holds the process and whose user owns it, else None."""
        named = cgroup_jobs(self._cgroup_of(pid))
        if not named:
            return None
        mine = [c for c in named if self._cgroup_owner(c) == 0]
        jobs = {c.job_id for c in mine}
        if len(jobs) != 1:
            return None  # none of Slurm's making, or hierarchies that disagree: no answer from cgroups
        job_id = jobs.pop()
        if job_id not in self._jobs:
            seen = self._not_here.get(job_id)
            if seen is not None and self._clock() - seen < self.config.monitor_jobs_interval:
                return None
            if not self._add_job(job_id, here=True):
                return None
        if not self._owner_ok(pid, facts, job_id, "cgroup"):
            return None
        self._job_cgroups.setdefault(job_id, set()).update(mine)
        return job_id

    def _attribute(self, pids: Iterable[int], local: dict[int, str] | None) -> dict[int, str]:
        """pid -> job id: the process's cgroup first, then Slurm's pid lists (``local`` when asked this sample,
        else the answer kept per process, else one ``scontrol listpids`` now); always a job of the process's
        owner that runs on this node."""
        out: dict[int, str] = {}
        by = {"cgroup": 0, "slurm": 0}
        pending: list[tuple[int, ProcFacts]] = []
        keys: set[tuple[int, int]] = set()
        for pid in sorted(pids):
            facts = self._proc_of(pid)
            if facts is None:
                continue  # gone, or not readable: no owner to check
            job = self._cgroup_job(pid, facts)
            if job is not None:
                out[pid] = job
                by["cgroup"] += 1
                continue
            key = (pid, facts.start)
            keys.add(key)
            if local is None and key not in self._pid_jobs:
                pending.append((pid, facts))
                continue
            if local is not None:
                self._pid_jobs[key] = local.get(pid)
            job = self._pid_jobs[key]
            if job is not None and self._owner_ok(pid, facts, job, "slurmstepd pid list"):
                out[pid] = job
                by["slurm"] += 1
        if pending and self._clock() - self._last_listpids >= LOOKUP_GAP_S:
            local = self._local_pids()
            if local is not None:
                self._refresh_jobs(local, asked=True)
                for pid, facts in pending:
                    job = self._pid_jobs[(pid, facts.start)] = local.get(pid)
                    if job is not None and self._owner_ok(pid, facts, job, "slurmstepd pid list"):
                        out[pid] = job
                        by["slurm"] += 1
        for key in set(self._pid_jobs) - keys:
            del self._pid_jobs[key]  # processes gone from the GPUs
        self._reader.keep(set(pids))
        self.attributed = by
        return out

    def _save(self, job_id: str) -> None:
        try:
            save_usage(self.run_dir, job_id, self.node, self.tracker)
        except (OSError, InputError) as e:
            root = " (the monitor runs as root on GPU nodes)" if isinstance(e, PermissionError) and \
                os.geteuid() != 0 else ""
            self.note_error("usage-file", f"cannot write the usage of job {job_id}: {e}{root}")

    def _key(self, index: int, proc: GpuProcess) -> JobKey:
        if proc.gi_id is not None and (index, proc.gi_id) in self._mig_uuids:
            return self._mig_uuids[(index, proc.gi_id)]
        return index

    def sample(self) -> Snapshot:
        """Take one sample (see module docstring) and return it, then act on the jobs over their share for
        ``enforce_grace`` samples (:meth:`enforce`). Never raises for a failing NVML call or Slurm command: the
        failure is counted (``gpushare_monitor_errors_total``) and logged."""
        with self._lock:
            snapshot = self._sample()
            checks = self._due_mps_checks()
        for job_id, job, pids in checks:  # front-end runs (subprocesses): outside the lock the HTTP thread takes
            self.check_mps(job_id, job, pids)
        with self._lock:
            due, self._enforcements = self._enforcements, []
        for e in due:
            self.enforce(e)
        return snapshot

    def _due_mps_checks(self) -> list[tuple[str, _Job, tuple[tuple[int, int], ...]]]:
        """The MPS share jobs (a daemon of their own: ``mps_mode = "per-job"``) whose daemon is due a read-back
        (``mps_check_interval``), with their processes on the share's GPUs in the last sample."""
        interval = self.config.mps_check_interval
        if interval <= 0 or self.config.mps_mode != "per-job":
            return []
        now = self._clock()
        due = []
        for job_id, job in self._jobs.items():
            if job.plan.kind != "mps" or now - job.mps_checked < interval:
                continue
            job.mps_checked = now
            mine = self._last_pids.get(job_id, {})
            pids = tuple(sorted({(pid, f.start) for key in job.plan.gpu_indices for pid in mine.get(key, ())
                                 if (f := self._proc_of(pid)) is not None}))
            due.append((job_id, job, pids))
        return due

    def check_mps(self, job_id: str, job: _Job, pids: tuple[tuple[int, int], ...]) -> None:
        """Read back the settings of the job's own MPS daemon (issue (c) of docs/mps.md section 2: the daemon runs
        as the job's user, who can send it ``set_device_pinned_mem_limit <server> <dev> 80G`` or ``quit``): the
        default pinned-memory limit on each GPU and the SM share the Prolog set
        (:func:`~slurm_gpushare.node.context.job_mps_settings`), each running server's own pinned-memory limit
        (``get_device_pinned_mem_limit PID DEV``), and that the daemon still runs. Only while no hook holds the
        job's lock and its directory says the Prolog is done (a Prolog configuring or an Epilog stopping the
        daemon is not the job's doing). Found in two read-backs in a row, the job gets the ``enforce`` action
        (:meth:`enforce`, with ``reason``), and its daemon is set back where it still runs. The answers come
        from the job's own daemon (its user owns the pipe directory), so they show what the job did through
        the front end, not more: the memory its processes hold (:meth:`sample`) is what stops any way past
        the share. A daemon stopped by a signal or a tracer (it answers no client) is a finding; a front end that
        does not answer in time while the daemon runs is a busy node, not the job's doing: logged and counted
        (``gpushare_monitor_errors_total``), that read-back counts neither way. Never raises."""
        from slurm_gpushare.node.mps import MpsError

        job_dir = self.run_dir / "jobs" / job_id
        plan = job.plan
        found: list[str] = []
        unanswered = ""
        live = None  # the daemon to set back: one that runs and answers
        with job_lock_nowait(job_dir) as held:
            state = read_state(job_dir) if held else None
            if not state or state.get("phase") != "ready" or state.get("shared"):
                return  # a hook at work, the job gone, a Prolog not done, or a shared daemon (per-gpu mode)
            try:
                daemon = HookContext(self.config, self.node).mps(job_id, plan)
                settings = job_mps_settings(daemon, plan)
            except GpushareError as e:  # the plan cannot make a daemon: nothing the job did
                self.note_error("mps-check", f"job {job_id}: {e}")
                return
            pid = daemon.pid()
            proc = procinfo.process(pid) if pid is not None else None
            try:
                if proc is None:
                    found.append("its MPS control daemon is not running (quit by the job?)")
                elif procinfo.stopped(proc):
                    found.append(_STOPPED)
                else:
                    servers = daemon.server_pids(timeout=MPS_CHECK_TIMEOUT_S)
                    if plan.mem_limit_mib is not None:
                        settings += [daemon.server_pinned_mem_limit(server, i, plan.mem_limit_mib)
                                     for server in servers for i in range(len(plan.gpu_indices))]
                    found += daemon.read_back(settings, timeout=MPS_CHECK_TIMEOUT_S)
                    live = daemon
            except MpsError as e:
                if proc is not None and procinfo.stopped(proc):  # stopped between the two looks
                    found.append(_STOPPED)
                else:  # a busy node, not the job's doing: this read-back counts neither way
                    unanswered = str(e)
            except GpushareError as e:  # a server list the plan cannot use: nothing the job did
                self.note_error("mps-check", f"job {job_id}: {e}")
                return
        if unanswered:
            self.note_error("mps-check", f"job {job_id}: its MPS daemon's settings not read back: {unanswered}")
            return
        with self._lock:
            if not found:
                job.mps_drift, job.mps_enforced = 0, False
                return
            job.mps_drift += 1
            if job.mps_drift < 2 or job.mps_enforced:
                return
            job.mps_enforced = True

            def restore() -> str:
                if live is None:
                    return ""
                with job_lock_nowait(job_dir) as free:  # as the read-back: never beside a hook at work
                    if not free or (read_state(job_dir) or {}).get("phase") != "ready":
                        return "; its MPS daemon was not set back (a hook of the job is at work)"
                    try:
                        live.configure(settings)
                        return "; its MPS daemon's settings were set back"
                    except GpushareError as err:
                        return f"; its MPS daemon's settings could not be set back: {err}"

            key = plan.gpu_indices[0] if plan.gpu_indices else 0
            self._enforcements.append(Enforcement(
                job_id, job.info.user, job.info.partition, key, self.config.enforce_for(job.info.partition),
                0, plan.mem_limit_mib or 0, pids, reason="; ".join(found), restore=restore))

    def enforce(self, e: Enforcement) -> None:
        """Act on an MPS share job whose processes on a GPU held more than its share (its MPS limit is per
        client process: several processes, or one outside MPS, get past it) for ``enforce_grace`` samples, by
        node.toml's ``enforce`` (``enforce_partitions``): ``kill`` sends SIGKILL, as root, to the job's processes
        on that GPU only (those the monitor attributed to the job from its cgroup or Slurm's pid list; a pid whose
        start time changed is another process and is left alone), ``requeue`` asks slurmctld to requeue the job
        (``scontrol requeue``; a job that cannot be requeued is killed instead), ``warn`` does neither. Every
        action is logged, counted (``gpushare_monitor_enforcements_total``) and told to the job's user in its
        AdminComment (root's; ``scontrol show job``). Other jobs on the GPU are never touched."""
        where = f"GPU {e.key} of {self.node}"
        over = e.reason or (f"its {len(e.processes)} process(es) there held {e.used_mib} MiB together, its share "
                            f"is {e.share_mib} MiB")
        action = e.action
        if action == "requeue":
            try:
                self._requeue(e.job_id)
                done = "requeued the job"
            except GpushareError as err:
                self.note_error("slurm", f"job {e.job_id}: requeue failed: {err}")
                action = "kill"
        targets = []
        if action == "kill":
            for pid, start in e.processes:
                facts = self._proc_of(pid)
                if facts is not None and facts.start == start:  # else ended, or the pid is another process now
                    targets.append(pid)
            done = f"killed {len(targets)} of its process(es) there (pid {', '.join(map(str, targets)) or '-'})"
        elif action == "warn":
            done = "warned (node.toml enforce = \"warn\")"
        if e.restore is not None:
            done += e.restore()
        self.enforced_total[action] = self.enforced_total.get(action, 0) + 1
        self._log(f"enforce: job {e.job_id} ({e.user}, partition {e.partition}) on {where}: {over}: {done}")
        # told first: slurmctld refuses an AdminComment update once the job has ended
        note = f"gpushare: {where}: {over}; the monitor {done}."
        try:
            current = parse_job_json(self._job_record(e.job_id), e.job_id).admin_comment
            text = admin_note(note)
            self._update_admin_comment(e.job_id, f"{current} {text}" if current else text)
        except GpushareError as err:
            self.note_error("admin-comment", f"job {e.job_id}: {err}")
        for pid in targets:
            try:
                self._kill(pid, signal.SIGKILL)
            except OSError:
                continue

    def _sample(self) -> Snapshot:
        t0 = time.monotonic()
        now = self._clock()
        asked = now - self._last_listpids >= self.config.monitor_steps_interval
        local = self._local_pids() if asked else None
        self._refresh_jobs(local, asked=asked)
        self._ended_cgroups()
        per_gpu: dict[int, tuple[GpuProcess, ...]] = {}
        gpu_util: dict[int, int | None] = {}
        gpu_used: dict[int, int | None] = {}
        unread: set[int] = set()  # GPUs whose processes NVML did not give: no sample there, not a made-up 0
        for g in self.machine.gpus:
            # GpushareError, not only NvmlError: a fake port's table can fail otherwise; never fatal
            try:
                per_gpu[g.index] = self.port.processes(g.index)
            except GpushareError as e:
                self.note_error("nvml", str(e))
                per_gpu[g.index] = ()
                unread.add(g.index)
            try:
                gpu_used[g.index] = self.port.memory_used_mib(g.index)
            except GpushareError as e:
                self.note_error("nvml", str(e))
                gpu_used[g.index] = None
            gpu_util[g.index] = None
            if not g.mig_enabled:
                try:
                    gpu_util[g.index] = self.port.utilization(g.index).gpu_percent
                except GpushareError:
                    pass  # not supported on this GPU: no data
        owner = self._attribute({p.pid for procs in per_gpu.values() for p in procs}, local)
        self._driver_limits(local, owner)

        # (job, key) -> [used MiB, sm sum, all processes had sm, processes, gpu index, pids]
        acc: dict[tuple[str, JobKey], list] = {}
        for job_id, job in self._jobs.items():
            for key, r in job.devices.items():
                acc[(job_id, key)] = [0, 0.0, True, 0, r.gpu_index, []]
        unattributed: dict[int, list[int]] = {g.index: [0, 0] for g in self.machine.gpus}
        for index, procs in per_gpu.items():
            for p in procs:
                owner_job = owner.get(p.pid)
                if owner_job is None or owner_job not in self._jobs:
                    unattributed[index][0] += p.used_memory_mib
                    unattributed[index][1] += 1
                    continue
                a = acc.setdefault((owner_job, self._key(index, p)), [0, 0.0, True, 0, index, []])
                a[0] += p.used_memory_mib
                a[5].append(p.pid)
                if p.sm_util is None:
                    a[2] = False
                else:
                    a[1] += p.sm_util
                a[3] += 1

        self._last_pids = {}
        for (job_id, key), a in acc.items():
            self._last_pids.setdefault(job_id, {})[key] = list(a[5])
        devices: list[DeviceSample] = []
        rose: set[str] = set()
        mps_clients: dict[int, frozenset[int] | None] = {}  # per GPU, asked of NVML once per sample where needed
        for (job_id, key), (used, sm_sum, sm_all, nproc, index, pids) in sorted(acc.items(),
                                                                               key=lambda kv: str(kv[0])):
            if index in unread:
                continue
            job = self._jobs[job_id]
            mig = isinstance(key, str)
            sm: float | None
            if mig:
                sm = None  # NVML has no utilization of a MIG device
            elif nproc == 0 and self._reserved(job, key) > 0:
                sm = 0.0  # it holds the share and runs nothing there: idle, as a whole GPU would read
            elif nproc and sm_all:
                sm = min(100.0, sm_sum)
            elif job.plan.kind == "gpu":
                sm = gpu_util.get(index)  # the job holds the whole GPU: the GPU's utilization is its
            else:
                sm = None
            if self.tracker.add(job_id, key, used_mib=used, sm_percent=sm):
                rose.add(job_id)
            devices.append(DeviceSample(job_id, key, index, used, sm, nproc))
            reserved = self._reserved(job, key)
            if used > reserved:
                if key not in job.over:
                    job.over.add(key)
                    self.over_limit_total += 1
                    self._log(f"over limit: job {job_id} ({job.info.user}) holds {used} MiB on "
                              f"{f'MIG device {key}' if mig else f'GPU {key}'}, its share is {reserved} MiB "
                              f"({nproc} process(es))")
                job.over_samples[key] = job.over_samples.get(key, 0) + 1
                if (job.plan.kind == "mps" and not mig and key not in job.enforced
                        and job.over_samples[key] >= self.config.enforce_grace):
                    job.enforced.add(key)
                    held = tuple((pid, f.start) for pid in sorted(pids) if (f := self._proc_of(pid)) is not None)
                    self._enforcements.append(Enforcement(
                        job_id, job.info.user, job.info.partition, key,
                        self.config.enforce_for(job.info.partition), used, reserved, held))
            else:
                job.over.discard(key)
                job.over_samples.pop(key, None)
                job.enforced.discard(key)
            if job.plan.kind == "mps" and not mig:
                self._check_outside(job_id, job, key, index, pids, used, reserved, mps_clients)
        if now - self._last_save >= self.config.monitor_save_interval:
            self._last_save = now
            measured = set(self.tracker.jobs())
            for job_id in self._jobs:
                if job_id in measured:  # else a job without GPUs here, or not sampled yet: no file to write
                    self._save(job_id)
        else:  # a first sample or a new peak goes out at once: a job that ends before the next save keeps it
            for job_id in sorted(rose):
                self._save(job_id)
        gpus = [GpuSample(g.index, self._gpu_uuids.get(g.index, g.uuid), g.model, g.memory_mib, gpu_used[g.index],
                          gpu_util[g.index], unattributed[g.index][0], unattributed[g.index][1])
                for g in self.machine.gpus]
        self.samples_total += 1
        self.snapshot = Snapshot(now, time.monotonic() - t0, devices, gpus)
        return self.snapshot

    def _driver_limits(self, local: dict[int, str] | None, owner: dict[int, str]) -> None:
        """Set the driver's memory limit (:mod:`slurm_gpushare.node.gpulimit`) on the cgroup of each share job
        not yet limited, found through one of its processes: its GPU processes (``owner``) or Slurm's pid list
        of the node's steps (``local``, on samples that asked it). A job whose Prolog set it on that cgroup is not
        set again; a job whose cgroup was made anew (its directory's inode changed: a requeued run) is; a failed
        set is tried up to ``TRIES`` times. Logged and counted."""
        if self.config.gpu_memory_limit == "off":
            return
        for job in self._jobs.values():
            if job.limit is None:
                continue
            if job.limit.outcome == "set" and _dir_id(job.limit.cgroup) != job.limit_dir:
                job.limit = None  # the cgroup is gone, or another one has its name now
            elif job.limit.outcome == "failed" and job.limit_tries < LIMIT_TRIES:
                job.limit = None
        pending = {j for j, job in self._jobs.items() if job.limit is None and wants_limit(job.plan, "auto")}
        if not pending:
            return
        found: dict[str, str] = {}
        for pid, job_id in sorted(owner.items()) + sorted((local or {}).items()):
            if job_id in pending and job_id not in found:
                where = job_cgroup_dir(self._cgroup_of(pid), job_id, self._cgroup_fs)
                if where is not None:
                    found[job_id] = where
        for job_id, where in sorted(found.items()):
            job = self._jobs[job_id]
            job.limit_dir = _dir_id(where)
            state = read_state(self.run_dir / "jobs" / job_id)  # root's, in root's job directory
            by_prolog = state.get("gpu_memory_limit") if isinstance(state, dict) else None
            if isinstance(by_prolog, dict) and by_prolog.get("outcome") == "set" and by_prolog.get("cgroup") == where:
                job.limit = LimitResult("set", where, tuple(by_prolog.get("gpus") or ()), job.plan.mem_limit_mib or 0)
                continue  # its Prolog, inside the cgroup (PrologFlags=RunInJob), set it and said so
            if self._no_limits is not None:  # the driver has no such call: asked once, not per job
                job.limit = replace(self._no_limits, cgroup=where, mib=job.plan.mem_limit_mib or 0)
            else:
                job.limit = apply_limit(self.port, job.plan, where)
                if job.limit.no_call:
                    self._no_limits = job.limit
                job.limit_tries += job.limit.outcome == "failed"
                self._log(job.limit.line(job_id))
            self.limits_total[job.limit.outcome] = self.limits_total.get(job.limit.outcome, 0) + 1

    def _check_outside(self, job_id: str, job: _Job, key: JobKey, index: int, pids: list[int], used: int,
                       reserved: int, mps_clients: dict[int, frozenset[int] | None]) -> None:
        """Way (a) of docs/mps.md section 2: a process of an MPS share job on the share's GPU that is not an MPS
        client (``nvmlDeviceGetMPSComputeRunningProcesses`` does not list it) runs a CUDA context of its own, with
        no MPS memory or SM limit. Found in ``enforce_grace`` samples in a row, those processes (only they) get the
        job's ``enforce`` action. The job's own MPS daemon and its servers are not the job's doing and never
        count. Only with ``mps_mode = "per-job"``: a daemon per GPU and user (``per-gpu``) serves several jobs, and
        its servers cannot be told from the job's own processes. A GPU whose NVML cannot tell (``NOT_SUPPORTED``,
        or a function the library lacks) is not judged, logged once; another NVML failure skips that sample."""
        from slurm_gpushare.hardware.port import NVML_ERROR_FUNCTION_NOT_FOUND, NVML_ERROR_NOT_SUPPORTED

        outside: list[int] = []
        if pids and index not in self._no_mps_list and self.config.mps_mode == "per-job":
            if index not in mps_clients:
                try:
                    mps_clients[index] = self.port.mps_client_pids(index)
                except GpushareError as e:
                    mps_clients[index] = None
                    if getattr(e, "code", None) in (NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_FUNCTION_NOT_FOUND):
                        self._no_mps_list.add(index)  # for good: logged once
                        self.note_error("nvml", f"GPU {index}: MPS clients not known, processes outside MPS not "
                                                f"looked for: {e}")
                    else:  # a failure of this sample: the next one asks again
                        self.note_error("nvml", str(e))
            clients = mps_clients[index]
            if clients is not None:
                outside = [pid for pid in pids if pid not in clients]
                if outside:
                    daemon = self._daemon_tree(job_id, job)
                    outside = [pid for pid in outside if pid not in daemon]
        if not outside:
            job.outside_samples.pop(key, None)
            job.outside_enforced.discard(key)
            return
        job.outside_samples[key] = job.outside_samples.get(key, 0) + 1
        if job.outside_samples[key] < self.config.enforce_grace or key in job.outside_enforced:
            return
        job.outside_enforced.add(key)
        held = tuple((pid, f.start) for pid in sorted(outside) if (f := self._proc_of(pid)) is not None)
        self._enforcements.append(Enforcement(
            job_id, job.info.user, job.info.partition, key, self.config.enforce_for(job.info.partition), used,
            reserved, held, reason=f"its process(es) {', '.join(map(str, sorted(outside)))} ran outside MPS there "
                                   "(a CUDA context of their own: no MPS memory or SM limit)"))

    def _daemon_tree(self, job_id: str, job: _Job) -> set[int]:
        """PIDs of the job's own MPS control daemon and of every process under it (its servers); empty when it has
        none running."""
        try:
            pid = HookContext(self.config, self.node).mps(job_id, job.plan).pid()
        except GpushareError:
            return set()
        proc = procinfo.process(pid) if pid is not None else None
        if proc is None:
            return set()
        try:
            return {proc.pid} | {c.pid for c in proc.children(recursive=True)}
        except psutil.Error:
            return {proc.pid}

    def push_summaries(self, *, force: bool = False) -> list[str]:
        """Put each running job's usage summary into its AdminComment (``admin_comment_summary`` in
        node.toml), at most every ``admin_comment_interval`` seconds per job and only when it changed.
        slurmctld refuses AdminComment updates once a job ends (the Epilog runs too late; measured on 22.05.8),
        so the summary is the usage as of the last update while the job ran. Returns the jobs updated.
        """
        if not self.config.admin_comment_summary:
            return []
        from slurm_gpushare.accounting.record import merge_summary, summary_segment

        done = []
        now = self._clock()
        with self._lock:
            jobs = {j: (job.info, job.plan) for j, job in self._jobs.items()}
        for job_id, (info, plan) in sorted(jobs.items()):
            last_time, last_text = self._pushed.get(job_id, (0.0, ""))
            if not force and now - last_time < self.config.admin_comment_interval:
                continue
            records = self._records(info, plan, self.tracker.usage(job_id))
            if not records:
                continue
            segment = summary_segment(records)
            if segment == last_text:
                continue
            try:
                current = parse_job_json(self._job_record(job_id), job_id).admin_comment
                self._update_admin_comment(job_id, merge_summary(current, segment))
            except GpushareError as e:
                self.note_error("admin-comment", f"job {job_id}: {e}")
                continue
            self._pushed[job_id] = (now, segment)
            done.append(job_id)
        for job_id in set(self._pushed) - set(jobs):
            self._pushed.pop(job_id, None)
        return done

    @staticmethod
    def _reserved(job: _Job, key: JobKey) -> int:
        """The job's memory share on a device, MiB (0 on a device it does not hold)."""
        r = job.devices.get(key)
        return r.mem_granted_mib if r is not None else 0

    # --- metrics -------------------------------------------------------------------------------------------

    @property
    def lock(self) -> threading.Lock:
        """Held by :meth:`sample` and while the metrics are read (the HTTP server's thread)."""
        return self._lock


def _dir_id(path: str) -> tuple[int, int] | None:
    """``(st_dev, st_ino)`` of a directory, None when it is gone."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)
