"""The NVML port: the narrow interface to NVIDIA's management library that slurm-gpushare needs.

Everything above the hardware layer talks to a GPU through :class:`NvmlPort`, in plain Python types
(ints, strings, frozen dataclasses), never through ``pynvml`` objects. Two implementations exist:

- :class:`slurm_gpushare.hardware.nvml.RealNvml`, the only module that imports ``pynvml``
  (distribution ``nvidia-ml-py``);
- :class:`slurm_gpushare.hardware.fake.FakeNvml`, a stateful machine built from a machine
  description, so that everything runs without GPUs.

Both raise the same errors for the same failures: :func:`nvml_error` builds an
:class:`~slurm_gpushare.errors.NvmlError` whose ``source`` names the NVML function and its
arguments (:func:`call_source`, e.g. ``nvmlDeviceGetUUID(gpu 3)``) and whose ``code`` is the NVML
return code. The NVML constants the product needs are copied here (values from
``nvidia-ml-py``'s ``pynvml.py``; a test checks them) so that nothing but the real port imports
``pynvml``.

Devices are addressed by NVML index (``nvmlDeviceGetHandleByIndex``, the ``GPUn`` of ``nvidia-smi``).
Memory is in MiB (NVML reports bytes; the port divides by 2**20, rounding down).

This module also holds the MIG placement rules (:func:`plan_gpu_instance`) that both ports apply
before creating a GPU instance, so that a request the hardware would refuse fails with the same
clear :class:`~slurm_gpushare.errors.MigPlacementError` on a real node and in the fake.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from types import TracebackType
from typing import Protocol, runtime_checkable

from slurm_gpushare.errors import MigPlacementError, NvmlError
from slurm_gpushare.hardware.machine import Gpu, GpuProcess, MigInstance, MigProfile

# --- NVML constants (values as in nvidia-ml-py's pynvml.py / nvml.h) ---------------------------

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_ALREADY_INITIALIZED = 5
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_INSUFFICIENT_SIZE = 7
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_RESET_REQUIRED = 16
NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18
NVML_ERROR_IN_USE = 19
NVML_ERROR_INSUFFICIENT_RESOURCES = 23
NVML_ERROR_UNKNOWN = 999

#: ``nvmlGpuTopologyLevel_t`` values returned by ``nvmlDeviceGetTopologyCommonAncestor``.
NVML_TOPOLOGY_INTERNAL = 0
NVML_TOPOLOGY_SINGLE = 10
NVML_TOPOLOGY_MULTIPLE = 20
NVML_TOPOLOGY_HOSTBRIDGE = 30
NVML_TOPOLOGY_NODE = 40
NVML_TOPOLOGY_SYSTEM = 50

#: Highest NVLink count NVML can report per GPU (link ids are ``0 .. NVML_NVLINK_MAX_LINKS - 1``).
NVML_NVLINK_MAX_LINKS = 36
NVML_NVLINK_DEVICE_TYPE_GPU = 0x00
NVML_NVLINK_DEVICE_TYPE_IBMNPU = 0x01
NVML_NVLINK_DEVICE_TYPE_SWITCH = 0x02
NVML_NVLINK_DEVICE_TYPE_UNKNOWN = 0xFF

#: ``hardLimit`` of ``nvmlSetMemoryLimits_v1_t`` that means "no limit" (with ``softLimit`` 0): NVML's
#: ``NVML_DEVICE_MEMORY_LIMIT_MAX``.
NVML_DEVICE_MEMORY_LIMIT_MAX = 0xFFFFFFFFFFFFFFFF

#: ``nvmlGpuP2PCapsIndex_t``. (pynvml defines ``NVML_P2P_CAPS_INDEX_READ = 0,`` -- a tuple, by a
#: stray comma -- so the real port uses these values, not pynvml's.)
NVML_P2P_CAPS_INDEX_READ = 0
NVML_P2P_CAPS_INDEX_NVLINK = 2

#: ``nvmlGpuP2PStatus_t`` values, by name.
NVML_P2P_STATUS = {
    0: "OK",
    1: "CHIPSET_NOT_SUPPORTED",
    2: "GPU_NOT_SUPPORTED",
    3: "IOH_TOPOLOGY_NOT_SUPPORTED",
    4: "DISABLED_BY_REGKEY",
    5: "NOT_SUPPORTED",
    6: "UNKNOWN",
}

#: NVML topology level -> PCIe level as ``nvidia-smi topo -m`` prints it. ``INTERNAL`` (two GPUs
#: on one board, e.g. a K80) is reported as ``PIX``: the GPUs sit behind the board's own PCIe switch.
TOPOLOGY_LEVELS = {
    NVML_TOPOLOGY_INTERNAL: "PIX",
    NVML_TOPOLOGY_SINGLE: "PIX",
    NVML_TOPOLOGY_MULTIPLE: "PXB",
    NVML_TOPOLOGY_HOSTBRIDGE: "PHB",
    NVML_TOPOLOGY_NODE: "NODE",
    NVML_TOPOLOGY_SYSTEM: "SYS",
}

#: NVLink remote device types, by name (``nvmlDeviceGetNvLinkRemoteDeviceType``).
NVLINK_DEVICE_TYPES = {
    NVML_NVLINK_DEVICE_TYPE_GPU: "GPU",
    NVML_NVLINK_DEVICE_TYPE_IBMNPU: "IBMNPU",
    NVML_NVLINK_DEVICE_TYPE_SWITCH: "SWITCH",
    NVML_NVLINK_DEVICE_TYPE_UNKNOWN: "UNKNOWN",
}

#: ``nvmlComputeMode_t`` values (``nvmlDeviceGetComputeMode`` / ``nvmlDeviceSetComputeMode``).
NVML_COMPUTEMODE_DEFAULT = 0
NVML_COMPUTEMODE_EXCLUSIVE_THREAD = 1  # deprecated by NVIDIA; never set, only reported by old drivers
NVML_COMPUTEMODE_PROHIBITED = 2
NVML_COMPUTEMODE_EXCLUSIVE_PROCESS = 3

#: Compute modes by name, as ``nvidia-smi -c`` takes them and ``--query-gpu=compute_mode`` prints them
#: (``Default``, ``Exclusive_Process``, ``Prohibited``), upper-cased.
COMPUTE_MODES = {
    NVML_COMPUTEMODE_DEFAULT: "DEFAULT",
    NVML_COMPUTEMODE_EXCLUSIVE_THREAD: "EXCLUSIVE_THREAD",
    NVML_COMPUTEMODE_PROHIBITED: "PROHIBITED",
    NVML_COMPUTEMODE_EXCLUSIVE_PROCESS: "EXCLUSIVE_PROCESS",
}
#: The modes :meth:`NvmlPort.set_compute_mode` accepts.
SETTABLE_COMPUTE_MODES = ("DEFAULT", "EXCLUSIVE_PROCESS", "PROHIBITED")


_ERROR_TEXT = {
    NVML_ERROR_UNINITIALIZED: ("UNINITIALIZED", "NVML is not initialized"),
    NVML_ERROR_INVALID_ARGUMENT: ("INVALID_ARGUMENT", "invalid argument"),
    NVML_ERROR_NOT_SUPPORTED: ("NOT_SUPPORTED", "not supported by this GPU"),
    NVML_ERROR_NO_PERMISSION: ("NO_PERMISSION", "insufficient permissions"),
    NVML_ERROR_ALREADY_INITIALIZED: ("ALREADY_INITIALIZED", "NVML is already initialized"),
    NVML_ERROR_NOT_FOUND: ("NOT_FOUND", "not found"),
    NVML_ERROR_INSUFFICIENT_SIZE: ("INSUFFICIENT_SIZE", "buffer too small"),
    8: ("INSUFFICIENT_POWER", "insufficient external power"),
    NVML_ERROR_DRIVER_NOT_LOADED: ("DRIVER_NOT_LOADED", "the NVIDIA driver is not loaded"),
    NVML_ERROR_TIMEOUT: ("TIMEOUT", "timeout"),
    11: ("IRQ_ISSUE", "interrupt request issue"),
    NVML_ERROR_LIBRARY_NOT_FOUND: ("LIBRARY_NOT_FOUND", "libnvidia-ml.so.1 not found"),
    NVML_ERROR_FUNCTION_NOT_FOUND: ("FUNCTION_NOT_FOUND", "function not found in this NVML"),
    14: ("CORRUPTED_INFOROM", "corrupted infoROM"),
    NVML_ERROR_GPU_IS_LOST: ("GPU_IS_LOST", "GPU is lost"),
    NVML_ERROR_RESET_REQUIRED: ("RESET_REQUIRED", "GPU requires a reset"),
    17: ("OPERATING_SYSTEM", "the operating system blocked the request"),
    NVML_ERROR_LIB_RM_VERSION_MISMATCH: ("LIB_RM_VERSION_MISMATCH",
                                         "libnvidia-ml and the kernel module versions differ"),
    NVML_ERROR_IN_USE: ("IN_USE", "in use"),
    20: ("MEMORY", "insufficient memory"),
    21: ("NO_DATA", "no data"),
    NVML_ERROR_INSUFFICIENT_RESOURCES: ("INSUFFICIENT_RESOURCES", "insufficient resources"),
    27: ("NOT_READY", "not ready"),
    28: ("GPU_NOT_FOUND", "GPU not found"),
    29: ("INVALID_STATE", "invalid state"),
    NVML_ERROR_UNKNOWN: ("UNKNOWN", "unknown error"),
}

_ERROR_HINTS = {
    NVML_ERROR_LIBRARY_NOT_FOUND: "no NVIDIA driver on this host; use --from-topo FILE or a machine description",
    NVML_ERROR_DRIVER_NOT_LOADED: "the nvidia kernel module is not loaded; check 'lsmod | grep nvidia' and dmesg",
    NVML_ERROR_UNINITIALIZED: "call init() first, or use the port as a context manager",
    NVML_ERROR_NO_PERMISSION: "run as root (MIG changes and some queries need it)",
    NVML_ERROR_GPU_IS_LOST: "the GPU fell off the bus; drain the node and look for Xid errors in dmesg",
    NVML_ERROR_LIB_RM_VERSION_MISMATCH: "the driver was upgraded without a reboot; reboot or reload the driver",
    NVML_ERROR_FUNCTION_NOT_FOUND: "the driver or nvidia-ml-py is too old for this call",
}


def error_name(code: int | None) -> str:
    """``NVML_ERROR_*`` name of an NVML return code, e.g. ``NVML_ERROR_GPU_IS_LOST`` for 15."""
    if code is None:
        return "NVML_ERROR_(none)"
    entry = _ERROR_TEXT.get(code)
    return f"NVML_ERROR_{entry[0]}" if entry else f"NVML_ERROR_{code}"


def call_source(function: str, *args: str) -> str:
    """How an NVML call is named in errors: ``nvmlDeviceGetUUID(gpu 3)``.

    Args:
        function: the NVML function name as nvidia-ml-py spells it.
        args: the arguments that identify the call, already formatted (``"gpu 3"``, ``"link 5"``).
    """
    return f"{function}({', '.join(args)})"


def nvml_error(source: str, code: int | None, *, detail: str | None = None) -> NvmlError:
    """The :class:`NvmlError` for a failed NVML call; the real and the fake port both use this.

    Args:
        source: the call, from :func:`call_source`.
        code: the NVML return code (``NVML_ERROR_*``), or None when NVML answered something unusable.
        detail: message text to use instead of the code's description.

    Returns:
        An error whose ``str`` reads ``nvmlDeviceGetUUID(gpu 3): GPU is lost [NVML_ERROR_GPU_IS_LOST]
        (hint)``.
    """
    if detail is None:
        entry = _ERROR_TEXT.get(code) if code is not None else None
        detail = entry[1] if entry else f"NVML error code {code}"
    message = f"{detail} [{error_name(code)}]" if code is not None else detail
    return NvmlError(message, hint=_ERROR_HINTS.get(code) if code is not None else None,
                     source=source, code=code)


def compute_mode_value(index: int, mode: str) -> int:
    """The ``NVML_COMPUTEMODE_*`` value of a mode name that :meth:`NvmlPort.set_compute_mode` accepts.

    Both ports check the name with this before calling NVML, so both refuse a bad one alike.

    Raises:
        NvmlError: ``NVML_ERROR_INVALID_ARGUMENT`` naming ``nvmlDeviceSetComputeMode(gpu N, mode M)``
            when ``mode`` is not ``DEFAULT``, ``EXCLUSIVE_PROCESS`` or ``PROHIBITED``.
    """
    if mode not in SETTABLE_COMPUTE_MODES:
        raise nvml_error(call_source("nvmlDeviceSetComputeMode", f"gpu {index}", f"mode {mode}"),
                         NVML_ERROR_INVALID_ARGUMENT,
                         detail=f"unknown compute mode {mode!r}; use {', '.join(SETTABLE_COMPUTE_MODES)}")
    return next(value for value, name in COMPUTE_MODES.items() if name == mode)


# --- values the port returns ---------------------------------------------------------------------


@dataclass(frozen=True)
class MigMode:
    """MIG mode of a GPU (``nvmlDeviceGetMigMode``; ``nvidia-smi --query-gpu=mig.mode.current,mig.mode.pending``).

    Attributes:
        current: MIG is enabled now.
        pending: MIG will be enabled after the next GPU reset.
    """

    current: bool
    pending: bool


@dataclass(frozen=True)
class NvLinkPeer:
    """One active NVLink of a GPU and what is at its other end.

    Attributes:
        link: NVLink id on this GPU (``0 .. NVML_NVLINK_MAX_LINKS - 1``).
        remote_bus_id: PCI bus id of the remote device (``nvmlDeviceGetNvLinkRemotePciInfo().busId``),
            ``00000000:07:00.0`` form.
        remote_type: ``GPU``, ``SWITCH`` (an NVSwitch), ``IBMNPU`` (a POWER9 CPU) or ``UNKNOWN``
            (``nvmlDeviceGetNvLinkRemoteDeviceType``).
    """

    link: int
    remote_bus_id: str
    remote_type: str


@dataclass(frozen=True)
class P2pStatus:
    """Peer-to-peer capability between two GPUs (``nvmlDeviceGetP2PStatus``; ``nvidia-smi topo -p2p r|n``).

    Values are ``NVML_P2P_STATUS_*`` names without the prefix: ``OK``, ``CHIPSET_NOT_SUPPORTED``,
    ``GPU_NOT_SUPPORTED``, ``IOH_TOPOLOGY_NOT_SUPPORTED``, ``DISABLED_BY_REGKEY``, ``NOT_SUPPORTED``,
    ``UNKNOWN``.

    Attributes:
        read: P2P reads (``NVML_P2P_CAPS_INDEX_READ``).
        nvlink: P2P over NVLink (``NVML_P2P_CAPS_INDEX_NVLINK``).
    """

    read: str
    nvlink: str

    @property
    def read_ok(self) -> bool:
        """P2P reads work."""
        return self.read == "OK"

    @property
    def nvlink_ok(self) -> bool:
        """P2P over NVLink works."""
        return self.nvlink == "OK"


@dataclass(frozen=True)
class Utilization:
    """GPU utilization over NVML's last sample period (``nvmlDeviceGetUtilizationRates``).

    Attributes:
        gpu_percent: percent of time a kernel was running (0-100).
        memory_percent: percent of time device memory was read or written (0-100).
    """

    gpu_percent: int
    memory_percent: int


# --- the port ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MemoryLimits:
    """A cgroup's device-memory limits on one GPU (``nvmlGetMemoryLimits_v1_t``), MiB.

    Attributes:
        soft_mib: memory guaranteed before allocations may fail under pressure (0: none).
        hard_mib: the most the cgroup's processes may allocate on the GPU; None: no limit
            (:data:`NVML_DEVICE_MEMORY_LIMIT_MAX`).
        used_mib: what the cgroup's processes hold on the GPU now.
    """

    soft_mib: int
    hard_mib: int | None
    used_mib: int


@runtime_checkable
class NvmlPort(Protocol):
    """What slurm-gpushare asks of NVML. Implemented by ``RealNvml`` and ``FakeNvml``.

    Open it with :meth:`init` (or ``with port:``) before any other call. Every method raises
    :class:`~slurm_gpushare.errors.NvmlError` naming the NVML call when NVML fails; nothing answers
    "N/A" silently. GPU arguments are NVML indices ``0 .. device_count() - 1``.
    """

    def init(self) -> None:
        """Open NVML (``nvmlInit``; every ``nvidia-smi`` run does this). Reference-counted."""
        ...

    def shutdown(self) -> None:
        """Close NVML (``nvmlShutdown``), balancing one :meth:`init`."""
        ...

    def __enter__(self) -> NvmlPort:
        ...

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        ...

    def driver_version(self) -> str:
        """Driver version, e.g. ``550.54.15`` (``nvmlSystemGetDriverVersion``;
        ``nvidia-smi --query-gpu=driver_version --format=csv``)."""
        ...

    def device_count(self) -> int:
        """Number of GPUs NVML sees (``nvmlDeviceGetCount``; ``nvidia-smi -L``)."""
        ...

    def name(self, index: int) -> str:
        """Product name, e.g. ``NVIDIA H100 80GB HBM3`` (``nvmlDeviceGetName``; ``--query-gpu=name``)."""
        ...

    def uuid(self, index: int) -> str:
        """``GPU-...`` UUID (``nvmlDeviceGetUUID``; ``--query-gpu=uuid``)."""
        ...

    def minor_number(self, index: int) -> int:
        """The ``N`` of ``/dev/nvidiaN`` (``nvmlDeviceGetMinorNumber``; ``nvidia-smi -q``, "Minor Number")."""
        ...

    def pci_bus_id(self, index: int) -> str:
        """PCI bus id, ``00000000:07:00.0`` form (``nvmlDeviceGetPciInfo().busId``; ``--query-gpu=pci.bus_id``)."""
        ...

    def memory_total_mib(self, index: int) -> int:
        """Total framebuffer memory, MiB (``nvmlDeviceGetMemoryInfo().total``; ``--query-gpu=memory.total``)."""
        ...

    def memory_used_mib(self, index: int) -> int:
        """Used framebuffer memory, MiB (``nvmlDeviceGetMemoryInfo().used``; ``--query-gpu=memory.used``)."""
        ...

    def cpu_affinity(self, index: int) -> tuple[int, ...]:
        """Sorted logical CPU ids near the GPU (``nvmlDeviceGetCpuAffinity``; ``nvidia-smi topo -m``,
        "CPU Affinity"). Empty when NVML reports an empty mask."""
        ...

    def numa_node(self, index: int) -> int | None:
        """The NUMA node nearest the GPU (``nvmlDeviceGetMemoryAffinity`` with
        ``NVML_AFFINITY_SCOPE_NODE``; ``nvidia-smi topo -m``, "NUMA Affinity"), or None when NVML names
        no single node (no NUMA, or the GPU is equally near several nodes)."""
        ...

    def topology_common_ancestor(self, index: int, other: int) -> str:
        """PCIe path level between two different GPUs: one of ``PIX PXB PHB NODE SYS``
        (``nvmlDeviceGetTopologyCommonAncestor``; a cell of ``nvidia-smi topo -m`` without NVLink).

        NVML levels map as INTERNAL (two GPUs on one board) -> PIX, SINGLE -> PIX, MULTIPLE -> PXB,
        HOSTBRIDGE -> PHB, NODE -> NODE, SYSTEM -> SYS. See :data:`TOPOLOGY_LEVELS`.
        """
        ...

    def nvlink_peers(self, index: int) -> tuple[NvLinkPeer, ...]:
        """The GPU's active NVLinks, by link id.

        For each link id below :data:`NVML_NVLINK_MAX_LINKS`: ``nvmlDeviceGetNvLinkState`` (link ids
        the GPU does not have answer ``NOT_SUPPORTED`` or ``INVALID_ARGUMENT`` and are skipped;
        inactive links are skipped), then ``nvmlDeviceGetNvLinkRemotePciInfo`` (C
        ``nvmlDeviceGetNvLinkRemotePciInfo_v2``) and ``nvmlDeviceGetNvLinkRemoteDeviceType``.
        ``nvidia-smi nvlink --status``; the ``NV#`` cells of ``nvidia-smi topo -m``.
        """
        ...

    def p2p_status(self, index: int, other: int) -> P2pStatus:
        """P2P read and NVLink capability between two GPUs (``nvmlDeviceGetP2PStatus`` with
        ``NVML_P2P_CAPS_INDEX_READ`` and ``NVML_P2P_CAPS_INDEX_NVLINK``; ``nvidia-smi topo -p2p r|n``)."""
        ...

    def mig_mode(self, index: int) -> MigMode:
        """Current and pending MIG mode (``nvmlDeviceGetMigMode``; ``--query-gpu=mig.mode.current``).

        Raises:
            NvmlError: with code ``NVML_ERROR_NOT_SUPPORTED`` on a GPU without MIG.
        """
        ...

    def gpu_instance_profiles(self, index: int) -> tuple[MigProfile, ...]:
        """GPU instance profiles with their possible placements, in NVML profile order
        (``nvmlDeviceGetGpuInstanceProfileInfo`` for each ``NVML_GPU_INSTANCE_PROFILE_*`` index, then
        ``nvmlDeviceGetGpuInstancePossiblePlacements``; ``nvidia-smi mig -lgip`` and ``mig -lgipp``).

        Empty while MIG mode is disabled: NVML reports profiles only with MIG enabled.
        """
        ...

    def gpu_instances(self, index: int) -> tuple[MigInstance, ...]:
        """Live MIG devices sorted by ``(gi_id, ci_id)``, with MIG device UUIDs and ``nvidia-caps``
        minors (``nvmlDeviceGetMaxMigDeviceCount``, ``nvmlDeviceGetMigDeviceHandleByIndex``,
        ``nvmlDeviceGetGpuInstanceId``, ``nvmlDeviceGetComputeInstanceId``, ``nvmlDeviceGetUUID``,
        ``nvmlDeviceGetGpuInstanceById``, ``nvmlGpuInstanceGetInfo``; caps from
        ``/proc/driver/nvidia-caps/mig-minors``; ``nvidia-smi mig -lgi``, ``mig -lci``, ``nvidia-smi -L``).

        A GPU instance without a compute instance is not a MIG device and is not listed.
        """
        ...

    def create_gpu_instance(self, index: int, profile_id: int, start: int | None = None) -> MigInstance:
        """Create a GPU instance of ``profile_id`` and one compute instance spanning it.

        ``nvmlDeviceCreateGpuInstance`` (or ``nvmlDeviceCreateGpuInstanceWithPlacement`` when
        ``start`` is given), then ``nvmlGpuInstanceCreateComputeInstance``; ``nvidia-smi mig -cgi ID -C``.
        The request is first checked with :func:`plan_gpu_instance`.

        Raises:
            MigPlacementError: MIG off, unknown profile, start not allowed, overlap, or no room.
            NvmlError: NVML refused anyway.
        """
        ...

    def destroy_gpu_instance(self, index: int, gi_id: int) -> None:
        """Destroy GPU instance ``gi_id`` and its compute instances (``nvmlDeviceGetGpuInstanceById``,
        ``nvmlGpuInstanceGetComputeInstanceById``, ``nvmlComputeInstanceDestroy``,
        ``nvmlGpuInstanceDestroy``; ``nvidia-smi mig -dci -gi N`` then ``mig -dgi -gi N``).

        Raises:
            NvmlError: no such GPU instance (``NVML_ERROR_NOT_FOUND``) or it is in use.
        """
        ...

    def processes(self, index: int) -> tuple[GpuProcess, ...]:
        """Compute processes on the GPU, sorted by pid (``nvmlDeviceGetComputeRunningProcesses``;
        ``nvidia-smi --query-compute-apps=pid,used_memory``). ``sm_util`` is None from the real port."""
        ...

    def mps_client_pids(self, index: int) -> frozenset[int]:
        """PIDs of the processes with an MPS compute context on the GPU: clients of an MPS server
        (``nvmlDeviceGetMPSComputeRunningProcesses``). A compute process of :meth:`processes` that is not among
        them runs a CUDA context of its own, outside MPS.

        Raises:
            NvmlError: NVML refused (``NOT_SUPPORTED`` on drivers or GPUs without it).
        """
        ...

    def utilization(self, index: int) -> Utilization:
        """GPU and memory utilization, percent (``nvmlDeviceGetUtilizationRates``;
        ``--query-gpu=utilization.gpu,utilization.memory``). NVML refuses it on MIG-enabled GPUs."""
        ...

    def compute_mode(self, index: int) -> str:
        """Compute mode: ``DEFAULT``, ``EXCLUSIVE_PROCESS``, ``PROHIBITED`` (or ``EXCLUSIVE_THREAD`` from
        old drivers) (``nvmlDeviceGetComputeMode``; ``nvidia-smi --query-gpu=compute_mode``)."""
        ...

    def set_compute_mode(self, index: int, mode: str) -> None:
        """Set the compute mode to ``DEFAULT``, ``EXCLUSIVE_PROCESS`` or ``PROHIBITED``
        (``nvmlDeviceSetComputeMode``; ``nvidia-smi -i N -c MODE``). Needs root; takes effect at once;
        on Linux it does not survive a reboot (the GPU comes back ``DEFAULT``). NVIDIA's MPS
        documentation sets ``EXCLUSIVE_PROCESS`` before starting the control daemon, so that only the
        MPS server opens a context on the GPU. (With MIG enabled NVML wants a MIG device handle, which
        this port does not take: MIG jobs do not use MPS.)

        Raises:
            NvmlError: an unknown mode (``NVML_ERROR_INVALID_ARGUMENT``, checked before NVML is
                called), no permission, or another NVML failure.
        """
        ...

    def set_memory_limits(self, index: int, cgroup: str, soft_mib: int, hard_mib: int) -> None:
        """Limit the GPU memory the processes of one cgroup may allocate on GPU ``index``
        (``nvmlDeviceSetMemoryLimits_v1``: NVML of driver R615 and later, Linux, root only; not on MIG
        device handles). ``cgroup`` is the cgroup's directory under the cgroup mount (NVML's
        ``nameSpace``, "full path to sysfs cgroup"); the limits hold until changed or the cgroup is removed.

        Raises:
            NvmlError: ``NVML_ERROR_FUNCTION_NOT_FOUND`` where the driver or nvidia-ml-py lacks the call,
                ``NOT_SUPPORTED``, ``NO_PERMISSION``, ``INVALID_ARGUMENT`` (no such cgroup) as NVML answers.
        """
        ...

    def memory_limits(self, index: int, cgroup: str) -> MemoryLimits:
        """The cgroup's limits and use on GPU ``index`` (``nvmlDeviceGetMemoryLimits_v1``).

        Raises:
            NvmlError: as :meth:`set_memory_limits`.
        """
        ...


# --- MIG placement rules ------------------------------------------------------------------------


def read_uuids(port: NvmlPort, gpus: Iterable[Gpu]) -> tuple[dict[int, str], dict[tuple[int, int], str]]:
    """The UUIDs of these GPUs (``nvmlDeviceGetUUID``) and of the MIG devices of those with MIG enabled
    (``gpu_instances``): ``({NVML index: GPU-...}, {(NVML index, GPU instance id): MIG-...})``.
    ``port`` must be open.

    Raises:
        NvmlError: a call failed.
    """
    gpu_uuids: dict[int, str] = {}
    mig_uuids: dict[tuple[int, int], str] = {}
    for g in gpus:
        gpu_uuids[g.index] = port.uuid(g.index)
        if g.mig_enabled:
            for inst in port.gpu_instances(g.index):
                mig_uuids[(g.index, inst.gi_id)] = inst.uuid
    return gpu_uuids, mig_uuids


def instance_span(gpu: int, profiles: tuple[MigProfile, ...] | list[MigProfile],
                  instance: MigInstance) -> tuple[int, int]:
    """The ``(start, size)`` memory-slice span of a live GPU instance.

    Raises:
        MigPlacementError: the instance's profile is unknown or its start is not a placement of it.
    """
    for p in profiles:
        if p.name == instance.profile:
            for start, size in p.placements:
                if start == instance.start:
                    return start, size
            raise MigPlacementError(
                f"GPU {gpu}: GPU instance {instance.gi_id} ({p.name}) starts at slice {instance.start}, "
                f"which is not a placement of {p.name}",
                hint=f"allowed starts: {', '.join(str(s) for s, _ in p.placements) or 'none known'}")
    raise MigPlacementError(f"GPU {gpu}: GPU instance {instance.gi_id} has unknown profile {instance.profile!r}",
                            hint=f"profiles: {', '.join(p.name for p in profiles) or 'none'}")


def describe_occupancy(gpu: int, profiles: tuple[MigProfile, ...] | list[MigProfile],
                       instances: tuple[MigInstance, ...] | list[MigInstance]) -> str:
    """Occupied memory slices in words: ``slices 0-3 4g.40gb (GI 1), 4 1g.10gb (GI 11)`` or ``none``."""
    spans: dict[int, tuple[tuple[int, int], str]] = {}
    for inst in instances:
        spans.setdefault(inst.gi_id, (instance_span(gpu, profiles, inst), inst.profile))
    parts = []
    for gi, ((start, size), name) in sorted(spans.items(), key=lambda kv: kv[1][0]):
        where = f"{start}" if size == 1 else f"{start}-{start + size - 1}"
        parts.append(f"{where} {name} (GI {gi})")
    return "slices " + ", ".join(parts) if parts else "none"


def plan_gpu_instance(gpu: int, *, mig_enabled: bool, profiles: tuple[MigProfile, ...] | list[MigProfile],
                      instances: tuple[MigInstance, ...] | list[MigInstance], profile_id: int,
                      start: int | None = None) -> tuple[MigProfile, tuple[int, int]]:
    """Check a GPU instance request against the MIG placement rules, NVML's own.

    The rules: MIG mode must be on; the profile id must be one the GPU offers; fewer than
    ``max_instances`` instances of the profile may exist; the placement must be one of the profile's
    possible placements (``nvmlDeviceGetGpuInstancePossiblePlacements``) and must not overlap the
    memory slices of a live GPU instance. Without ``start``, the free placement with the lowest
    start is chosen (the real driver, asked without a placement, may choose another).

    Args:
        gpu: NVML index, for messages.
        mig_enabled: current MIG mode.
        profiles: the GPU's profiles (with placements).
        instances: live MIG devices (compute instances of one GPU instance share its span).
        profile_id: the requested GPU instance profile id (``nvidia-smi mig -lgip`` ``ID``).
        start: requested placement start in memory slices, or None for any free placement.

    Returns:
        The profile and the ``(start, size)`` placement to use.

    Raises:
        MigPlacementError: the message names the GPU, the profile and the occupied slices.
    """
    if not mig_enabled:
        raise MigPlacementError(
            f"GPU {gpu}: MIG mode is not enabled; cannot create GPU instance profile {profile_id}",
            hint=f"on a MIG-capable GPU, enable it first: nvidia-smi -i {gpu} -mig 1")
    profile = next((p for p in profiles if p.profile_id == profile_id), None)
    if profile is None:
        known = ", ".join(f"{p.profile_id} ({p.name})" for p in profiles) or "none"
        raise MigPlacementError(f"GPU {gpu}: unknown GPU instance profile id {profile_id}",
                                hint=f"profiles on this GPU: {known}")
    label = f"MIG {profile.name} (profile {profile.profile_id})"
    occupied = describe_occupancy(gpu, profiles, instances)
    same = {inst.gi_id for inst in instances if inst.profile == profile.name}
    if len(same) >= profile.max_instances:
        raise MigPlacementError(
            f"GPU {gpu}: cannot create {label}: {len(same)} of at most {profile.max_instances} already exist",
            hint=f"occupied {occupied}")
    taken: dict[int, int] = {}
    for inst in instances:
        s, size = instance_span(gpu, profiles, inst)
        for sl in range(s, s + size):
            taken[sl] = inst.gi_id

    def clashes(placement: tuple[int, int]) -> list[int]:
        return sorted({taken[sl] for sl in range(placement[0], placement[0] + placement[1]) if sl in taken})

    if start is None:
        for placement in sorted(profile.placements):
            if not clashes(placement):
                return profile, placement
        raise MigPlacementError(f"GPU {gpu}: no free placement for {label}; occupied {occupied}",
                                hint="destroy a GPU instance first (nvidia-smi mig -dci; mig -dgi)")
    wanted = next((pl for pl in profile.placements if pl[0] == start), None)
    if wanted is None:
        allowed = ", ".join(str(s) for s, _ in sorted(profile.placements)) or "none"
        raise MigPlacementError(f"GPU {gpu}: {label} cannot start at memory slice {start}",
                                hint=f"allowed starts for {profile.name}: {allowed}")
    placement = wanted
    gis = clashes(placement)
    if gis:
        end = placement[0] + placement[1] - 1
        free = [str(pl[0]) for pl in sorted(profile.placements) if not clashes(pl)]
        raise MigPlacementError(
            f"GPU {gpu}: {label} at slices {placement[0]}-{end} overlaps GPU instance(s) "
            f"{', '.join(str(g) for g in gis)}; occupied {occupied}",
            hint=f"free starts for {profile.name}: {', '.join(free) or 'none'}")
    return profile, placement
