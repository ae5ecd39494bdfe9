"""Task binding: rank order of a job's GPUs along NVLink, and each task's GPU, NIC and cores.

A decisions-layer module: a pure function (:func:`bind`) of a machine description and the GPUs Slurm
allocated, no I/O. The Prolog computes it once per job and writes the environment it implies; the
TaskProlog prints the lines of the task it runs before (``SLURM_LOCALID``). See docs/placement.md.

What is decided, in order
    1. Rank order (:func:`gpu_ring`): the allocated GPUs as a ring, the order that minimizes the
       largest hop between ring neighbours (the bottleneck link of a ring all-reduce), then the sum
       of hops around the ring: the placement engine's ring (:func:`slurm_gpushare.topology.placement.ring_order`,
       exact up to 16 GPUs). A caller that holds another order passes it as ``ring``.
    2. Task -> GPUs: rank ``r`` (``SLURM_LOCALID``) gets the ``r``-th GPU of the ring; with fewer
       tasks than GPUs each task gets a run of consecutive ring GPUs, with more tasks than GPUs
       consecutive ranks share one GPU. The tasks are alike, so the ring order *is* the assignment.
    3. Task -> NIC: a minimum-cost assignment (the Hungarian method as
       ``scipy.optimize.linear_sum_assignment`` solves it, :mod:`slurm_gpushare.topology.assignment`) of
       tasks to NIC slots. The cost of a NIC for a task is the PCIe level from
       it to the task's GPUs (``nvidia-smi topo -m`` NIC rows: PIX 0 < PXB 1 < PHB 2 < NODE 3 < SYS 4,
       unknown 5), weighted so that it always comes first; each NIC has one slot per task and the
       ``s``-th task on a NIC pays ``s`` more, so tasks spread over NICs that are equally near. Every
       task gets a NIC at its nearest level; ties go to ranks in NIC order.
    4. Task -> cores: a minimum-cost assignment of the core pool (the job's cores, or the cores near
       its GPUs) to ``pool // tasks`` slots per task; a core costs 1 when it is outside the task's
       GPU's ``CPU Affinity`` (``nvmlDeviceGetCpuAffinity``, mapped to Slurm core ids through the
       node's :class:`~slurm_gpushare.hardware.machine.CpuLayout`), 0 inside. Cores that are equally
       near the same tasks are then dealt out in ascending order, rank by rank, so each task gets
       contiguous cores.

The environment (:meth:`Binding.job_environment`, :meth:`Binding.task_environment`)
    - ``CUDA_VISIBLE_DEVICES``: every allocated GPU in ring order, as ``GPU-...`` UUIDs when all are
      known (valid with and without ``ConstrainDevices``, which renumbers GPUs from 0 inside the
      job's cgroup; measured with task/cgroup on the dev cluster), else as indices. CUDA numbers the
      visible devices in the order listed, so the task with local rank ``r``
      (``LOCAL_RANK``/``SLURM_LOCALID``) uses device ``r``, which is what torchrun, Megatron and
      DeepSpeed do (``torch.cuda.set_device(local_rank)``), and neighbouring ranks are NVLink
      neighbours. The list is the same for every task: NCCL needs to see its peers' GPUs for CUDA
      IPC / NVLink P2P. The node hooks hand it only to tasks that Slurm gave every one of these GPUs
      and that asked for no GPU binding of their own (docs/placement.md, "Which jobs and tasks get it").
    - ``CUDA_DEVICE_ORDER=PCI_BUS_ID``: index fallbacks mean bus order, as NVML and Slurm count.
    - ``NCCL_IB_HCA=={nic}:{port}`` (per task): NCCL's exact-match form (a leading ``=``; without it
      ``mlx5_1`` would also match ``mlx5_10``..). ``UCX_NET_DEVICES={nic}:{port}`` (per task), UCX's
      ``device:port`` form. Port 1 unless told (a ``topo -m`` matrix does not show ports). Only for
      NICs named by their RDMA device (``mlx5_0``); a bare ``NIC0`` title names nothing NCCL knows.
    - ``GPUSHARE_CPU_BIND=mask_cpu:0x..,0x..`` (job): one mask of logical CPU ids per local rank, to
      pass as ``srun --cpu-bind=$GPUSHARE_CPU_BIND``. A hint, not ``SLURM_CPU_BIND``: srun(1) 22.05
      honours explicit masks "only when the job step has been allocated every available CPU on the
      node", and exporting ``SLURM_CPU_BIND`` would force it on every step. ``GPUSHARE_TASK_CPUS``
      (per task) is the same task's CPUs as a kernel cpulist (``0-5,48-53``) for ``taskset -c`` /
      ``numactl --physcpubind`` inside a partial-node allocation.
    - ``GPUSHARE_GPU_RING`` (job: GPU indices in ring order), ``GPUSHARE_TASK_DEVICES`` (per task:
      its CUDA device ordinals), ``GPUSHARE_TASK_NIC`` (per task): for scripts and logs.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from slurm_gpushare.errors import InputError, MachineDescriptionError
from slurm_gpushare.hardware.machine import PCIE_LEVELS, CpuLayout, Machine
from slurm_gpushare.topology.assignment import assign
from slurm_gpushare.topology.hops import hop_matrix
from slurm_gpushare.topology.placement import ring_order

#: Rings of up to this many GPUs are found by trying every cycle (``(k-1)!/2``: 2520 for 8).
#: NIC port used in ``NCCL_IB_HCA`` / ``UCX_NET_DEVICES`` when none is given.
DEFAULT_NIC_PORT = 1
#: Cost of a NIC whose PCIe level to a GPU is unknown: after ``SYS``.
UNKNOWN_LEVEL = len(PCIE_LEVELS)
#: Schema version of :meth:`Binding.to_dict`.
BINDING_JSON_VERSION = 1

_TOL = 1e-9
# A NIC column titled NICn without a NIC Legend names no RDMA device.
_PLACEHOLDER_NIC = re.compile(r"NIC\d+")


@dataclass(frozen=True)
class TaskBinding:
    """What one task (local rank) gets.

    Attributes:
        local_id: the task's local rank on the node (``SLURM_LOCALID``).
        gpus: its GPU indices (NVML), in ring order.
        devices: their CUDA device ordinals within :attr:`Binding.ring` (``CUDA_VISIBLE_DEVICES``).
        gpu_uuids: their ``GPU-...`` UUIDs, ``""`` where unknown.
        nic: the NIC's device name (``mlx5_0``), or None when the node has no NIC with known paths.
        nic_path: the PCIe level from the NIC to the task's farthest GPU (``PIX``..``SYS``), or None.
        cores: Slurm core ids (gres.conf ``Cores=`` numbering), ascending.
        cpus: logical CPU ids of those cores (every hardware thread), ascending.
    """

    local_id: int
    gpus: tuple[int, ...]
    devices: tuple[int, ...]
    gpu_uuids: tuple[str, ...]
    nic: str | None
    nic_path: str | None
    cores: tuple[int, ...]
    cpus: tuple[int, ...]


@dataclass(frozen=True)
class Binding:
    """A job's binding on one node (module docstring).

    Attributes:
        ring: the allocated GPU indices in ring (rank) order.
        uuids: their UUIDs in the same order, ``""`` where unknown.
        ring_bottleneck: the largest hop between ring neighbours (0 for one GPU).
        ring_sum: the sum of hops around the ring.
        tasks: one entry per local rank.
    """

    ring: tuple[int, ...]
    uuids: tuple[str, ...]
    ring_bottleneck: float
    ring_sum: float
    tasks: tuple[TaskBinding, ...]

    def cuda_visible_devices(self, *, local_numbers: bool = False) -> str:
        """``CUDA_VISIBLE_DEVICES`` in ring order: UUIDs when all are known, else GPU indices.

        Args:
            local_numbers: for the index fallback inside a job whose devices are confined
                (``ConstrainDevices=yes``): number the job's GPUs ``0..k-1`` in index order, as the
                job sees them, instead of the node's NVML indices.
        """
        if all(self.uuids):
            return ",".join(self.uuids)
        if local_numbers:
            local = {g: i for i, g in enumerate(sorted(self.ring))}
            return ",".join(str(local[g]) for g in self.ring)
        return ",".join(str(g) for g in self.ring)

    def cpu_bind(self) -> str | None:
        """``mask_cpu:0x..,0x..`` for ``srun --cpu-bind``, one mask per local rank; None when any
        task has no CPUs (unknown CPU layout or affinity)."""
        if not self.tasks or any(not t.cpus for t in self.tasks):
            return None
        return "mask_cpu:" + ",".join(hex(sum(1 << c for c in t.cpus)) for t in self.tasks)

    def job_environment(self, *, local_numbers: bool = False) -> dict[str, str]:
        """The variables every task of the job gets (module docstring).

        Keys: ``CUDA_VISIBLE_DEVICES``, ``CUDA_DEVICE_ORDER``, ``GPUSHARE_GPU_RING`` and, when every
        task has CPUs, ``GPUSHARE_CPU_BIND``.
        """
        env = {
            "CUDA_VISIBLE_DEVICES": self.cuda_visible_devices(local_numbers=local_numbers),
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
            "GPUSHARE_GPU_RING": ",".join(str(g) for g in self.ring),
        }
        bind = self.cpu_bind()
        if bind is not None:
            env["GPUSHARE_CPU_BIND"] = bind
        return env

    def task_environment(self, local_id: int, *, port: int = DEFAULT_NIC_PORT,
                         local_numbers: bool = False) -> dict[str, str]:
        """The job's variables plus those of local rank ``local_id`` (module docstring).

        Adds ``GPUSHARE_TASK_DEVICES``, and when known ``GPUSHARE_TASK_CPUS``, ``GPUSHARE_TASK_NIC``,
        ``NCCL_IB_HCA`` and ``UCX_NET_DEVICES``.

        Raises:
            InputError: no such local rank, or a port below 1.
        """
        if not 0 <= local_id < len(self.tasks):
            raise InputError(f"no task with local id {local_id}", hint=f"the job has {len(self.tasks)} task(s) here")
        if port < 1:
            raise InputError(f"NIC port {port} must be 1 or more")
        t = self.tasks[local_id]
        env = self.job_environment(local_numbers=local_numbers)
        env["GPUSHARE_TASK_DEVICES"] = ",".join(str(d) for d in t.devices)
        if t.cpus:
            env["GPUSHARE_TASK_CPUS"] = cpu_list(t.cpus)
        if t.nic is not None:
            env["GPUSHARE_TASK_NIC"] = t.nic
            if not _PLACEHOLDER_NIC.fullmatch(t.nic):
                env["NCCL_IB_HCA"] = f"={t.nic}:{port}"
                env["UCX_NET_DEVICES"] = f"{t.nic}:{port}"
        return env

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (``version``, ``ring``, ``uuids``, ``ring_bottleneck``, ``ring_sum``, ``tasks``)."""
        return {
            "version": BINDING_JSON_VERSION,
            "ring": list(self.ring),
            "uuids": list(self.uuids),
            "ring_bottleneck": round(self.ring_bottleneck, 6),
            "ring_sum": round(self.ring_sum, 6),
            "tasks": [{"local_id": t.local_id, "gpus": list(t.gpus), "devices": list(t.devices),
                       "gpu_uuids": list(t.gpu_uuids), "nic": t.nic, "nic_path": t.nic_path,
                       "cores": list(t.cores), "cpus": list(t.cpus)} for t in self.tasks],
        }


def bind(machine: Machine, gpus: Iterable[int], ntasks: int | None = None, *,
         cores: Iterable[int] | None = None, ring: Sequence[int] | None = None) -> Binding:
    """Bind a job's tasks on one node to GPUs, NICs and cores (module docstring).

    Args:
        machine: the node's description.
        gpus: the GPU indices Slurm allocated (``SLURM_JOB_GPUS``: NVML indices), any order.
        ntasks: tasks of the job on this node (default: one per GPU).
        cores: the job's Slurm core ids on this node (``scontrol -d show job``: ``CPU_IDs``), the pool
            the tasks' cores come from. Default: the cores near the job's GPUs (all cores when no GPU
            affinity is known).
        ring: the rank order to use (the same GPUs), instead of computing one.

    Returns:
        The binding.

    Raises:
        InputError: no GPUs, a GPU given twice, ``ntasks`` below 1, cores outside the CPU layout, a
            ``ring`` that is not a permutation of ``gpus``.
        MachineDescriptionError: a GPU the machine does not have, a contradictory description.
    """
    chosen = [int(g) for g in gpus]
    if not chosen:
        raise InputError("a binding needs at least one GPU")
    if len(set(chosen)) != len(chosen):
        raise InputError(f"GPU list {chosen} names a GPU twice")
    for g in chosen:
        machine.gpu(g)
    n_tasks = len(chosen) if ntasks is None else int(ntasks)
    if n_tasks < 1:
        raise InputError(f"a job needs at least one task, got ntasks={ntasks}")
    order = sorted(g.index for g in machine.gpus)
    pos = {g: i for i, g in enumerate(order)}
    hop = hop_matrix(machine)
    sub = hop[np.ix_([pos[g] for g in sorted(chosen)], [pos[g] for g in sorted(chosen)])]
    labels = sorted(chosen)
    if ring is not None:
        given = [int(g) for g in ring]
        if sorted(given) != labels:
            raise InputError(f"ring {given} is not an order of the allocated GPUs {labels}")
        local = [labels.index(g) for g in given]
    else:
        local = list(gpu_ring(sub))
    ring_gpus = tuple(labels[i] for i in local)
    edges = [float(sub[local[i], local[(i + 1) % len(local)]]) for i in range(len(local))] if len(local) > 1 else []
    uuids = tuple(machine.gpu(g).uuid for g in ring_gpus)

    per_task = _split_ring(len(ring_gpus), n_tasks)
    task_gpus = [tuple(ring_gpus[d] for d in devs) for devs in per_task]
    nics = _assign_nics(machine, [[pos[g] for g in tg] for tg in task_gpus])
    layout = machine.cpus
    near = [_near_cores(machine, tg) for tg in task_gpus]
    pool = _core_pool(layout, near, cores)
    task_cores = _assign_cores(near, pool)
    tasks = tuple(
        TaskBinding(local_id=t, gpus=task_gpus[t], devices=tuple(per_task[t]),
                    gpu_uuids=tuple(machine.gpu(g).uuid for g in task_gpus[t]),
                    nic=nics[t][0], nic_path=nics[t][1], cores=task_cores[t],
                    cpus=_cpus_of(layout, task_cores[t]))
        for t in range(n_tasks))
    return Binding(ring=ring_gpus, uuids=uuids, ring_bottleneck=max(edges, default=0.0),
                   ring_sum=sum(edges), tasks=tasks)


def gpu_ring(hop: Any) -> tuple[int, ...]:
    """The ring order of every position of a (sub) hop matrix (module docstring, step 1).

    The ring starts at position 0 and goes towards the smaller of its two neighbours; among rings
    with equal bottleneck and sum (within 1e-9) the lexicographically smallest wins.

    Args:
        hop: ``(k, k)`` hops between the GPUs to order.

    Returns:
        Positions ``0..k-1`` in ring order.

    Raises:
        InputError: a matrix that is not square.
    """
    h = np.asarray(hop, dtype=np.float64)
    if h.ndim != 2 or h.shape[0] != h.shape[1] or h.shape[0] == 0:
        raise InputError(f"a hop matrix must be square and not empty, got shape {h.shape}")
    return ring_order(h, range(h.shape[0]))


def cpu_list(cpus: Iterable[int]) -> str:
    """Logical CPU ids as a kernel cpulist (``0-5,48-53``), the form ``taskset -c`` reads."""
    ids = sorted(set(cpus))
    runs: list[str] = []
    for _, grp in itertools.groupby(enumerate(ids), key=lambda p: p[1] - p[0]):
        run = [c for _, c in grp]
        runs.append(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}")
    return ",".join(runs)


# --- tasks --------------------------------------------------------------------------------------


def _split_ring(n_gpus: int, n_tasks: int) -> list[tuple[int, ...]]:
    """CUDA device ordinals (positions in the ring) per task."""
    if n_tasks <= n_gpus:
        return [tuple(int(d) for d in part) for part in np.array_split(np.arange(n_gpus), n_tasks)]
    return [(t * n_gpus // n_tasks,) for t in range(n_tasks)]


def _hungarian(cost: np.ndarray) -> np.ndarray:
    """Column assigned to each row by a minimum-cost assignment, as ``scipy.optimize.linear_sum_assignment``
    assigns it (rows <= columns; :func:`~slurm_gpushare.topology.assignment.assign`, which spares the Prolog
    the import of SciPy)."""
    return np.array(assign(cost.tolist()), dtype=np.intp)


def _level(level: str | None) -> int:
    if level is None:
        return UNKNOWN_LEVEL
    return PCIE_LEVELS.index(level)


def _assign_nics(machine: Machine, task_positions: list[list[int]]) -> list[tuple[str | None, str | None]]:
    """Per task: (NIC name, PCIe level to its farthest GPU), by a balanced nearest assignment."""
    nics = []
    for nic in machine.nics:
        if not nic.paths:
            continue
        if len(nic.paths) != len(machine.gpus):
            raise MachineDescriptionError(f"NIC {nic.name}: {len(nic.paths)} paths for {len(machine.gpus)} GPUs",
                                          source=machine.source or machine.hostname)
        nics.append(nic)
    n_tasks = len(task_positions)
    if not nics:
        return [(None, None)] * n_tasks
    levels = np.array([[sum(_level(nic.paths[p]) for p in tp) for nic in nics] for tp in task_positions])
    weight = n_tasks * n_tasks + 1  # one level more outweighs any spreading
    slots = np.arange(n_tasks)
    cost = (levels[:, :, None] * weight + slots[None, None, :]).reshape(n_tasks, len(nics) * n_tasks)
    picked = _hungarian(cost) // n_tasks
    # tasks with the same costs take their NICs in rank order, NICs in node order
    for row in {tuple(r) for r in levels.tolist()}:
        same = [t for t in range(n_tasks) if tuple(levels[t]) == row]
        for t, nic in zip(same, sorted(picked[same]), strict=True):
            picked[t] = nic
    out: list[tuple[str | None, str | None]] = []
    for t, tp in enumerate(task_positions):
        nic = nics[int(picked[t])]
        known = [nic.paths[p] for p in tp if nic.paths[p] is not None]
        if not known:
            out.append((None, None))
            continue
        worst = max(known, key=_level)
        out.append((nic.name, worst))
    return out


def _near_cores(machine: Machine, gpus: Sequence[int]) -> frozenset[int]:
    layout = machine.cpus
    if layout is None:
        return frozenset()
    out: set[int] = set()
    for g in gpus:
        out.update(layout.core_ids(machine.gpu(g).cpu_affinity))
    return frozenset(out)


def _core_pool(layout: CpuLayout | None, near: list[frozenset[int]], cores: Iterable[int] | None) -> list[int]:
    if layout is None:
        if cores is not None and list(cores):
            raise InputError("cores were given, but the machine description has no CPU layout",
                             hint="regenerate it with 'slurm-gpushare inventory', or give --cpus")
        return []
    if cores is not None:
        pool = sorted({int(c) for c in cores})
        bad = [c for c in pool if not 0 <= c < layout.cores]
        if bad:
            raise InputError(f"core id(s) {bad} outside the node's {layout.cores} cores",
                             hint="give Slurm core ids (gres.conf Cores= numbering)")
        return pool
    union = sorted(set().union(*near))
    return union or list(range(layout.cores))


def _assign_cores(near: list[frozenset[int]], pool: list[int]) -> list[tuple[int, ...]]:
    n_tasks = len(near)
    if not pool:
        return [()] * n_tasks
    wanted = [nr if nr else frozenset(pool) for nr in near]  # unknown affinity: any core is near
    per = len(pool) // n_tasks
    if per == 0:  # fewer cores than tasks: tasks share their near cores
        return [tuple(c for c in pool if c in wanted[t]) or tuple(pool) for t in range(n_tasks)]
    slots = np.repeat(np.arange(n_tasks), per)
    far = np.array([[0 if c in wanted[t] else 1 for c in pool] for t in slots])
    weight = len(slots) * len(pool) + 1  # one far core more outweighs any preference for low ids
    cost = far * weight + np.arange(len(pool))[None, :]
    picked = _hungarian(cost)
    got: list[list[int]] = [[] for _ in range(n_tasks)]
    for slot, col in enumerate(picked):
        got[int(slots[slot])].append(pool[int(col)])
    # deal cores that are near the same tasks out again in ascending order, rank by rank: same cost,
    # contiguous blocks
    by_sig: dict[tuple[int, ...], list[tuple[int, int]]] = {}
    for t in range(n_tasks):
        for c in got[t]:
            sig = tuple(u for u in range(n_tasks) if c in wanted[u])
            by_sig.setdefault(sig, []).append((t, c))
    out: list[list[int]] = [[] for _ in range(n_tasks)]
    for pairs in by_sig.values():
        owners = sorted(t for t, _ in pairs)
        for t, c in zip(owners, sorted(c for _, c in pairs), strict=True):
            out[t].append(c)
    return [tuple(sorted(c)) for c in out]


def _cpus_of(layout: CpuLayout | None, cores: tuple[int, ...]) -> tuple[int, ...]:
    if layout is None or not cores:
        return ()
    wanted = set(cores)
    if layout.core_of_cpu:
        return tuple(cpu for cpu, core in enumerate(layout.core_of_cpu) if core in wanted)
    return tuple(cpu for cpu in range(layout.cpus) if cpu % layout.cores in wanted)
