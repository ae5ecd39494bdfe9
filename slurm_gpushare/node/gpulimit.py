"""The driver's own limit on a share job's GPU memory: one limit for all the job's processes, set on its cgroup.

An MPS share is held by its MPS server's per-client limit and by the node monitor, after the fact
(docs/mps.md, section 2). NVIDIA drivers of branch R615 and later add a limit the driver itself keeps, per
cgroup: ``nvmlDeviceSetMemoryLimits_v1`` takes a cgroup's directory and a soft and a hard limit in bytes for
one GPU; the processes of that cgroup (and, the product assumes, of its descendants, where a job's steps and
tasks are) together cannot allocate past the hard limit on that GPU, inside MPS or outside it. It needs
root; NVML takes no MIG device handle for it; NVIDIA: removing the cgroup clears the limits.

Where the node has it (node.toml ``gpu_memory_limit = "auto"``, the default), a share job gets its share as
the hard limit on each of its share's GPUs, and as the soft limit (what NVIDIA calls guaranteed) where the share
is on one GPU, on the job's cgroup (``job_<id>`` in Slurm's layout, root's, the directory
:class:`~slurm_gpushare.node.membership.CgroupFs` finds for one of its processes). slurmstepd makes that
directory when the job's first step starts, after the Prolog on 22.05 (``_rpc_prolog`` in
src/slurmd/slurmd/req.c at slurm-22-05-8-1 runs the Prolog, then spawns the extern step). So:

- the Prolog sets it when it runs inside the job's cgroup already (``PrologFlags=RunInJob``, 24.11 and later);
- else the node monitor sets it on its first sample that sees a process of the job (Slurm's pid list of the
  node's steps, every ``monitor_steps_interval``, or a GPU process), and the job's processes are held by the
  MPS limit and the monitor until then. The monitor sets it again when the job's cgroup is made anew (a
  requeued run) and tries a failed set up to :data:`TRIES` times.

Which cgroup versions the driver accepts is not stated by NVIDIA's documentation; where the job has a v1
directory (v1 or hybrid nodes) the directory passed is the job's in the first hierarchy that has one, of
``memory``, ``devices``, ``cpuset``, ``freezer``; on a v2-only node its one directory. A driver that refuses (an
older branch: ``FUNCTION_NOT_FOUND``; ``NOT_SUPPORTED``; another error) is logged and counted; the job keeps the
MPS limit and the monitor's enforcement, which stay on in every case. ``gpu_memory_limit = "off"`` sets no new
limit and clears none already set (the job's cgroup goes with the job, and its limits with it).
"""

from __future__ import annotations

from dataclasses import dataclass

from slurm_gpushare.errors import GpushareError
from slurm_gpushare.hardware.port import NVML_ERROR_FUNCTION_NOT_FOUND, NVML_ERROR_NOT_SUPPORTED, NvmlPort
from slurm_gpushare.node.membership import CgroupFs, CgroupJob, cgroup_jobs
from slurm_gpushare.node.plan import JobPlan

#: v1 hierarchies whose job directory is passed to NVML, in this order of preference.
V1_ORDER = ("memory", "devices", "cpuset", "freezer")
#: How many times the monitor tries to set a job's limit that failed (not: that the driver does not have).
TRIES = 3
#: Outcomes (the monitor's metric label): set on every GPU; the driver has no such call; it refused.
OUTCOMES = ("set", "unsupported", "failed")


@dataclass(frozen=True)
class LimitResult:
    """What setting a job's limits came to.

    Attributes:
        outcome: one of :data:`OUTCOMES`.
        cgroup: the cgroup directory given to NVML ("" when none was found).
        gpus: the NVML indices limited (``set``), each to ``mib``.
        mib: the limit, MiB.
        detail: the driver's answer when it refused.
        code: its NVML return code (None when set).
    """

    outcome: str
    cgroup: str
    gpus: tuple[int, ...]
    mib: int
    detail: str = ""
    code: int | None = None

    @property
    def no_call(self) -> bool:
        """The driver (or nvidia-ml-py) has no such call at all: asking again for another job is pointless."""
        return self.code == NVML_ERROR_FUNCTION_NOT_FOUND

    def line(self, job_id: str) -> str:
        """One line for the node log."""
        if self.outcome == "set":
            gpus = ",".join(str(g) for g in self.gpus)
            return (f"job {job_id}: the driver holds its processes to {self.mib} MiB on GPU {gpus} "
                    f"(cgroup {self.cgroup}, nvmlDeviceSetMemoryLimits_v1)")
        return (f"job {job_id}: no driver memory limit ({self.detail}); its MPS limit and the monitor's "
                f"enforcement hold it")


def wants_limit(plan: JobPlan, mode: str) -> bool:
    """Whether a job gets the driver's limit: a share (``mps`` plan with a memory limit) with
    ``gpu_memory_limit = "auto"``. MIG slices have their own memory; whole GPUs are the job's."""
    return mode == "auto" and plan.kind == "mps" and bool(plan.mem_limit_mib) and bool(plan.gpu_indices)


def job_cgroup_dir(cgroup_text: str, job_id: str, fs: CgroupFs) -> str | None:
    """The directory of job ``job_id``'s cgroup, from the ``/proc/<pid>/cgroup`` text of one of its processes, or
    None when the text names no such cgroup that root made (slurmstepd makes the job's directory as root; a
    directory of the same name that the job's user made, in a subtree delegated to them, is not it), or no mount
    here shows it.

    Where any v1 line names the job (cgroup v1, or a hybrid node whose unified hierarchy a user's systemd
    manager may hold) the v1 directory is taken, in the order of :data:`V1_ORDER`; on a v2-only node its one
    directory."""
    v1: dict[str, CgroupJob] = {}
    v2: CgroupJob | None = None
    for cg in cgroup_jobs(cgroup_text):
        if cg.job_id != job_id:
            continue
        if cg.hierarchy == "":
            v2 = v2 or cg
        else:
            for controller in cg.hierarchy.split(","):
                v1.setdefault(controller, cg)
    candidates = [v1[c] for c in V1_ORDER if c in v1] if v1 else ([v2] if v2 is not None else [])
    for cg in candidates:
        where = fs.directory(cg)
        if where is not None and fs.owner(cg) == 0:
            return where
    return None


def apply_limit(port: NvmlPort, plan: JobPlan, cgroup: str) -> LimitResult:
    """Set the job's share as the hard limit of ``cgroup`` on each GPU of the share, and as the soft limit on a
    share's one GPU (``nvmlDeviceSetMemoryLimits_v1``; the port must be open). Never raises: a refusal is the result's
    ``outcome`` (a GPU already limited keeps its limit when a later one is refused)."""
    mib = plan.mem_limit_mib or 0
    # the soft limit is what NVIDIA calls guaranteed: the share, on its one GPU; a share Slurm spread over several
    # GPUs (it does not say how much is on each) gets the whole share as the most on each, and no guarantee
    soft = mib if len(plan.gpu_indices) == 1 else 0
    done: list[int] = []
    for gpu in plan.gpu_indices:
        try:
            port.set_memory_limits(gpu, cgroup, soft, mib)
        except GpushareError as e:
            code = getattr(e, "code", None)
            outcome = "unsupported" if code in (NVML_ERROR_FUNCTION_NOT_FOUND, NVML_ERROR_NOT_SUPPORTED) else "failed"
            return LimitResult(outcome, cgroup, tuple(done), mib, detail=str(e), code=code)
        done.append(gpu)
    return LimitResult("set", cgroup, tuple(done), mib)
