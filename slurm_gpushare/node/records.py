"""The accounting records of one job on this node, built from what the node hooks already hold (pure).

The Epilog (and the monitor, for its AdminComment summary) hands :func:`records_for_job` the job as
slurmctld recorded it, the :class:`~slurm_gpushare.node.plan.JobPlan` the Prolog prepared, the node's
machine description and what the monitor measured; out come
:class:`~slurm_gpushare.accounting.record.UsageRecord` values, one per GPU device the job held.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from slurm_gpushare.accounting.record import MODES, Usage, UsageRecord
from slurm_gpushare.errors import InputError
from slurm_gpushare.hardware.machine import Gpu, Machine
from slurm_gpushare.node.jobdir import restart_from_env  # noqa: F401  (the Epilog's and the tests' name)
from slurm_gpushare.node.plan import JobPlan
from slurm_gpushare.slurm.job import JobInfo


def _audit_mem(text: str | None) -> tuple[int | None, int | None]:
    """``10240/10240MiB`` -> ``(10240, 10240)``; ``-/81559MiB`` -> ``(None, 81559)``."""
    if not text:
        return None, None
    asked, _, granted = text.removesuffix("MiB").partition("/")
    return (int(asked) if asked.isdigit() else None), (int(granted) if granted.isdigit() else None)


def _gpu(machine: Machine, index: int, job_id: str) -> Gpu:
    for g in machine.gpus:
        if g.index == index:
            return g
    raise InputError(f"job {job_id} used GPU {index}, which the machine description of {machine.hostname} "
                     "does not have", hint="regenerate it with 'slurm-gpushare inventory'")


def records_for_job(info: JobInfo, plan: JobPlan, machine: Machine, *, node: str, start: int, end: int,
                    exit_state: str = "", exit_code: str = "",
                    usage: Mapping[int | str, Usage] | None = None,
                    gpu_uuids: Mapping[int, str] | None = None, account: str | None = None,
                    array_job_id: str | None = None, array_task_id: int | None = None, step: str = "",
                    placement_cost: float | None = None, restart: int = 0,
                    submit: int = 0) -> tuple[UsageRecord, ...]:
    """The records of one finished job on this node, one per GPU device it held (pure).

    Args:
        info: the job as slurmctld recorded it (``scontrol -d show job``): user, partition, GRES
            detail (MIG GRES types) and the AdminComment audit (``mem=<asked>/<granted>MiB``, ``sm=``).
        plan: what the Prolog prepared (:func:`~slurm_gpushare.node.plan.plan_job`): kind, GPU indices,
            MIG UUIDs (``visible_devices``), the MPS memory limit and thread percentage.
        machine: the node's machine description (GPU names, memory, MIG profiles and instances).
        node: this node's Slurm name.
        start, end: the job's start and end, epoch seconds (``end`` is clamped to ``start``).
        exit_state, exit_code: see :func:`exit_from_env`.
        usage: what the monitor measured, keyed by MIG device UUID or GPU index
            (:meth:`UsageTracker.pop`); a device with no entry gets "no data" (None), never 0; its
            memory series becomes the record's (none when empty).
        gpu_uuids: NVML index -> GPU UUID (``nvmlDeviceGetUUID``); default: the machine description's.
        account: the job's account (``Account=`` of ``scontrol show job``); default ``info.account``
            when JobInfo has it, else ``""``.
        array_job_id, array_task_id, step: for array tasks and per-step records.
        placement_cost: the topology placement's cost, when known.
        restart: the run's restart count (``SLURM_JOB_RESTART_COUNT``, :func:`restart_from_env`).
        submit: slurmctld's submit time of the run (epoch s, as the Prolog recorded it); 0 unknown.

    Returns:
        One record per GPU device, in the plan's order; empty for a job without GPUs here.

    Raises:
        InputError: the plan names a GPU the machine description lacks.
    """
    if plan.kind not in MODES or not plan.gpu_indices:
        return ()
    usage = usage or {}
    uuids = dict(gpu_uuids or {})
    audit = info.audit or {}
    asked, granted_audit = _audit_mem(audit.get("mem"))
    sm_asked = plan.sm_percent
    if sm_asked is None and audit.get("sm", "").isdigit():
        sm_asked = int(audit["sm"])
    if account is None:
        account = getattr(info, "account", "") or ""
    allocs = info.gres_on(node)
    end = max(end, start)
    common: dict[str, Any] = dict(
        job_id=str(info.job_id or plan.job_id), user=info.user, account=account, partition=info.partition,
        node=node, mem_asked_mib=asked, sm_asked_percent=sm_asked, start=int(start), end=int(end),
        exit_state=exit_state, exit_code=exit_code, array_job_id=array_job_id, array_task_id=array_task_id,
        step=step, placement_cost=placement_cost, restart=restart, submit=submit)

    def measured(*keys: int | str) -> dict[str, Any]:
        u = next((usage[k] for k in keys if k != "" and k in usage), None)
        if u is None:
            return {}
        series = dict(mem_series_mib=u.series_mib, mem_series_width=u.series_width) if u.series_mib else {}
        return dict(mem_peak_mib=u.peak_mib, sm_mean_percent=u.sm_mean, sm_peak_percent=u.sm_peak,
                    samples=u.samples, **series)

    out: list[UsageRecord] = []
    if plan.kind == "mig":
        types = [a.type for a in allocs if a.name == "gpu" for _ in a.indices]
        mig_uuids = plan.visible_devices.split(",") if plan.visible_devices else []
        for n, index in enumerate(plan.gpu_indices):
            gpu = _gpu(machine, index, common["job_id"])
            uuid = mig_uuids[n] if n < len(mig_uuids) else ""
            inst = next((i for i in gpu.mig_instances if uuid and i.uuid == uuid), None)
            profile = inst.profile if inst else (types[n].partition("_")[2] if n < len(types) else "")
            mem = next((p.memory_mib for p in gpu.mig_profiles if p.name == profile), None)
            if mem is None:
                mem = granted_audit or 0
            # NVML indexes MIG devices by UUID; an index key is ambiguous with two slices of one GPU
            only_one = plan.gpu_indices.count(index) == 1
            out.append(UsageRecord(**common, gpu_index=index, gpu_uuid=uuid, gpu_model=gpu.model,
                                   gpu_memory_mib=gpu.memory_mib, mode="mig", share=profile,
                                   mem_granted_mib=mem,
                                   **measured(*((uuid, index) if only_one else (uuid,)))))
        return tuple(out)
    share = ""
    if plan.kind == "mps":
        shards = sum(a.amount for a in allocs if a.name == "shard")
        share = f"shard:{shards}" if shards else ""
    for index in plan.gpu_indices:
        gpu = _gpu(machine, index, common["job_id"])
        uuid = uuids.get(index) or gpu.uuid
        granted = plan.mem_limit_mib if plan.kind == "mps" and plan.mem_limit_mib is not None else gpu.memory_mib
        out.append(UsageRecord(**common, gpu_index=index, gpu_uuid=uuid, gpu_model=gpu.model,
                               gpu_memory_mib=gpu.memory_mib, mode=plan.kind, share=share,
                               mem_granted_mib=min(granted, gpu.memory_mib), **measured(uuid, index)))
    return tuple(out)
