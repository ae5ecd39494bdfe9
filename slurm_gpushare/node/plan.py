"""What the node hooks must prepare for one job on one node (pure).

Inputs are trusted facts only: what slurmctld recorded for the job (its GRES with device indices,
its AdminComment audit), the node's machine description and the gres.conf records generated from it
(their order is slurmd's device numbering), and the UUIDs NVML reports. Output: a :class:`JobPlan`
saying which kind of share the job holds and the environment its tasks get.

Kinds:
    ``mps``: the job holds ``shard:N`` (N shards of ``shard_unit`` MiB): one MPS control daemon for
        the job, the pinned-memory limit N x unit per device and, when the audit says ``sm=P``, the
        active thread percentage P.
    ``mig``: the job holds MIG devices (``gpu:<model>_<profile>``): each task's ``CUDA_VISIBLE_DEVICES``
        names its MIG devices by UUID (CUDA cannot name one by index); no MPS.
    ``gpu``: whole GPUs: Slurm's own ``CUDA_VISIBLE_DEVICES`` stands; nothing to prepare.

Slurm's per-task binding is the input, never replaced: the plan's :attr:`JobPlan.devices` is the table of
the job's devices that the TaskProlog translates entry by entry in the ``CUDA_VISIBLE_DEVICES`` slurmstepd
set for each task (docs/placement.md, "What each job and step sees").
    ``none``: no GPU GRES on this node.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from slurm_gpushare.errors import InputError
from slurm_gpushare.memsize import format_mib
from slurm_gpushare.slurm.job import JobInfo
from slurm_gpushare.slurm.nodegres import GresRecord, NodeGres


@dataclass(frozen=True)
class JobPlan:
    """What to prepare (see module docstring).

    Attributes:
        kind: ``mps``, ``mig``, ``gpu`` or ``none``.
        job_id, uid, gid: the job and its owner (from slurmctld).
        gpu_indices: NVML indices of the GPUs (parents of MIG devices) the job holds here.
        visible_devices: the UUIDs of the job's devices here (the MPS daemon's ``CUDA_VISIBLE_DEVICES``; a
            MIG job's devices, whole GPUs among them, for its record), ``""`` for ``gpu``/``none``.
        devices: ``(Slurm device index, UUID)`` of each device whose ``CUDA_VISIBLE_DEVICES`` entry the
            TaskProlog translates: MIG devices (``mig``) and the GPUs of an MPS share (``mps``: a client
            names devices relative to its daemon, which runs on UUIDs). The index is the gres.conf device
            index, slurmctld's ``IDX`` and slurmstepd's ``SLURM_STEP_GPUS``/``SLURM_JOB_GPUS`` entries.
        device_files: ``(Slurm device index, device file)`` of each of a ``mig`` job's devices here, whole GPUs
            among them: the file that is the device's own, a whole GPU's ``nvidiaN``, a MIG device's GPU
            instance ``nvidia-capM`` (gres.conf ``File=``; the second of ``MultipleFiles=``). Under task/cgroup
            with ``ConstrainDevices=yes`` the TaskProlog finds a task's own devices by which of these it may
            open, where slurmstepd names the step's first device in every task's ``SLURM_STEP_GPUS``
            (``--gpus-per-task``; 22.05 to 26.05).
        mem_limit_mib: MPS pinned-memory limit per device, MiB (``mps`` only).
        sm_percent: MPS active thread percentage (``mps`` with ``sm=`` only).
        note: a remark for the log (e.g. shards spread over several GPUs).
        client_priority: MPS client priority, 0 normal or 1 below normal (``CUDA_MPS_CLIENT_PRIORITY``),
            or None to leave the driver's default.
    """

    kind: str
    job_id: str
    uid: int = -1
    gid: int = -1
    gpu_indices: tuple[int, ...] = ()
    visible_devices: str = ""
    mem_limit_mib: int | None = None
    sm_percent: int | None = None
    note: str = ""
    client_priority: int | None = None
    devices: tuple[tuple[int, str], ...] = ()
    device_files: tuple[tuple[int, str], ...] = ()

    @classmethod
    def from_dict(cls, fields: dict) -> JobPlan:
        """The plan written with :func:`dataclasses.asdict` (a job's state.json; JSON makes the tuple a list)."""
        return cls(**{**fields, "gpu_indices": tuple(fields.get("gpu_indices", ())),
                      "devices": tuple((int(i), str(u)) for i, u in fields.get("devices", ())),
                      "device_files": tuple((int(i), str(f)) for i, f in fields.get("device_files", ()))})

    def env(self, mps_client: Mapping[str, str] | None = None) -> dict[str, str]:
        """The variables the TaskProlog exports to each task that holds a device of :attr:`devices` (ordered):
        the MPS client's, nothing for ``mig`` (``CUDA_VISIBLE_DEVICES`` is translated per task instead).

        Args:
            mps_client: for ``mps``, what a client of the job's daemon needs to find it
                (:meth:`slurm_gpushare.node.mps.MpsDaemon.client_env`: ``CUDA_MPS_PIPE_DIRECTORY``,
                ``CUDA_MPS_LOG_DIRECTORY``); the job's limits follow it.
        """
        out: dict[str, str] = {}
        if self.kind == "mps":
            out.update(mps_client or {})
            if self.mem_limit_mib is not None:
                limit = format_mib(self.mem_limit_mib)
                out["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = ",".join(
                    f"{i}={limit}" for i in range(len(self.gpu_indices)))
            if self.sm_percent is not None:
                out["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(self.sm_percent)
            if self.client_priority is not None:
                out["CUDA_MPS_CLIENT_PRIORITY"] = str(self.client_priority)
        return out


def plan_job(info: JobInfo, node: str, gres: NodeGres, *, gpu_uuids: dict[int, str],
             mig_uuids: dict[tuple[int, int], str], shard_unit_mib: int,
             low_priority_partitions: tuple[str, ...] = (), low_priority_qos: tuple[str, ...] = ()) -> JobPlan:
    """Decide what the job needs on ``node``.

    Args:
        info: the job as slurmctld recorded it (``scontrol -d show job``).
        node: this node's Slurm name.
        gres: the node's generated gres.conf records (device order = slurmd's IDX).
        gpu_uuids: NVML index -> GPU UUID (``nvmlDeviceGetUUID``) for the node's GPUs.
        mig_uuids: (NVML index, GPU instance id) -> MIG device UUID.
        shard_unit_mib: GPU memory per shard, MiB.
        low_priority_partitions: jobs of these partitions get MPS client priority 1 (below normal).
        low_priority_qos: so do jobs of these QOS (``info.qos``, slurmctld's; compared without case: sacctmgr
            stores QOS names lower-cased).

    Raises:
        InputError: the job holds a device index the node's description does not have (stale
            description or gres.conf: a node problem), or a MIG device NVML does not know.
    """
    devices = [r for r in gres.records if r.name == "gpu"]
    base = JobPlan("none", info.job_id, info.uid, info.gid)
    allocs = info.gres_on(node)

    def record(i: int):
        if i >= len(devices):
            raise InputError(f"job {info.job_id} holds GPU index {i} on {node}, but its machine description "
                             f"gives {len(devices)} GPU device(s)",
                             hint="the description or gres.conf is stale: regenerate them with "
                                  "'slurm-gpushare inventory' and 'slurm-gpushare gres-conf'")
        return devices[i]

    shards = [a for a in allocs if a.name == "shard"]
    if shards:
        idx = sorted({i for a in shards for i in a.indices})
        if not idx:
            raise InputError(f"job {info.job_id} holds shards on {node} without device indices",
                             source="scontrol -d show job")
        gpus = tuple(dict.fromkeys(record(i).gpu_index for i in idx))
        count = sum(a.amount for a in shards)
        audit = info.audit or {}
        sm = audit.get("sm")
        note = ""
        if len(gpus) > 1:
            note = (f"{count} shards spread over GPUs {', '.join(map(str, gpus))}: each device's limit is the "
                    "whole share (Slurm does not say how many shards come from each GPU)")
        low = bool(set(info.partition.split(",")) & set(low_priority_partitions)) or \
            bool(info.qos and info.qos.casefold() in {q.casefold() for q in low_priority_qos})
        return JobPlan("mps", info.job_id, info.uid, info.gid, gpus,
                       ",".join(gpu_uuids[g] for g in gpus), count * shard_unit_mib,
                       int(sm) if sm and sm.isdigit() else None, note, 1 if low else None,
                       tuple((i, gpu_uuids[record(i).gpu_index]) for i in idx))
    gpu_allocs = [a for a in allocs if a.name == "gpu"]
    if not gpu_allocs:
        return base
    held = [i for a in gpu_allocs for i in a.indices]
    recs = [record(i) for i in held]
    if any(r.mig_gi is not None for r in recs):
        uuids = []
        for r in recs:
            if r.mig_gi is None:  # a whole GPU next to MIG devices in one job: name it by its UUID
                uuids.append(gpu_uuids[r.gpu_index])
                continue
            key = (r.gpu_index, r.mig_gi)
            if key not in mig_uuids:
                raise InputError(f"job {info.job_id}: MIG device GPU {r.gpu_index} instance {r.mig_gi} ({r.type}) "
                                 "is not known to NVML on this node",
                                 hint="the MIG layout changed: regenerate the machine description and gres.conf")
            uuids.append(mig_uuids[key])
        return JobPlan("mig", info.job_id, info.uid, info.gid, tuple(r.gpu_index for r in recs), ",".join(uuids),
                       devices=tuple((i, u) for i, r, u in zip(held, recs, uuids, strict=True) if r.mig_gi is not None),
                       device_files=tuple(sorted((i, _own_file(r)) for i, r in zip(held, recs, strict=True)
                                                 if r.files)))
    return JobPlan("gpu", info.job_id, info.uid, info.gid, tuple(r.gpu_index for r in recs))


def _own_file(record: GresRecord) -> str:
    """The device file that is this device's alone: ``File=``, or of a MIG device's ``MultipleFiles=`` (parent
    ``nvidiaN``, GPU instance cap, compute instance cap; :mod:`slurm_gpushare.gresconf.render`) the GPU
    instance's cap, which the ``File=`` form names too."""
    return record.files[1] if record.multiple_files and len(record.files) > 1 else record.files[0]
