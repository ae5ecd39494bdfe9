"""The real NVML port: the only module of slurm-gpushare that imports ``pynvml`` (``nvidia-ml-py``).

``pynvml`` is imported when a :class:`RealNvml` is constructed, never at import time, so that the
controller side and the TaskProlog path can import the hardware package on hosts without a driver.
Every ``pynvml.NVMLError`` becomes an :class:`~slurm_gpushare.errors.NvmlError` whose source names the
call (``nvmlDeviceGetUUID(gpu 3)``) and whose code is the NVML return code; a missing
``libnvidia-ml.so.1`` says so with a hint. The only NVML errors the port absorbs are the ones NVML
uses to answer "there is nothing here" while enumerating (a link id the GPU does not have, an empty
MIG device slot, a profile index the GPU does not offer); each is documented where it happens.

Usage::

    with RealNvml() as nvml:
        machine = probe_machine(nvml, hostname=socket.gethostname())
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path
from types import TracebackType
from typing import Any

from slurm_gpushare.errors import HardwareError, MigPlacementError, NvmlError
from slurm_gpushare.hardware.machine import GpuProcess, MigInstance, MigProfile
from slurm_gpushare.hardware.port import (
    COMPUTE_MODES,
    NVLINK_DEVICE_TYPES,
    NVML_DEVICE_MEMORY_LIMIT_MAX,
    NVML_ERROR_FUNCTION_NOT_FOUND,
    NVML_ERROR_INVALID_ARGUMENT,
    NVML_ERROR_NOT_FOUND,
    NVML_ERROR_NOT_SUPPORTED,
    NVML_NVLINK_MAX_LINKS,
    NVML_P2P_CAPS_INDEX_NVLINK,
    NVML_P2P_CAPS_INDEX_READ,
    NVML_P2P_STATUS,
    TOPOLOGY_LEVELS,
    MemoryLimits,
    MigMode,
    NvLinkPeer,
    P2pStatus,
    Utilization,
    call_source,
    compute_mode_value,
    nvml_error,
    plan_gpu_instance,
)

MIB = 1 << 20
#: ``gpuInstanceId`` of a process on a GPU without MIG (``0xFFFFFFFF``).
NO_INSTANCE = 0xFFFFFFFF

#: Where the driver lists the ``/dev/nvidia-caps`` minors of every MIG GPU/compute instance.
MIG_MINORS_PATH = "/proc/driver/nvidia-caps/mig-minors"

#: ``NVML_GPU_INSTANCE_PROFILE_COUNT`` / ``NVML_COMPUTE_INSTANCE_PROFILE_COUNT`` when the binding
#: does not define them (profile *indices* are enumerated below these; profile *ids* are what
#: ``nvidia-smi mig -lgip`` prints).
_GI_PROFILE_COUNT = 0x12
_CI_PROFILE_COUNT = 0x9
#: Compute instance ids a GPU instance can hold (``mig-minors`` has ``ci0`` .. ``ci7``).
_MAX_CI_PER_GI = 8
#: NVML answers these while enumerating ids the device does not have.
_ABSENT = (NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_INVALID_ARGUMENT, NVML_ERROR_NOT_FOUND)


def _text(value: Any) -> str:
    """NVML strings arrive as ``bytes`` from ctypes fields and as ``str`` from pynvml wrappers."""
    return value.decode() if isinstance(value, bytes) else str(value)


def _bits(words: Any) -> tuple[int, ...]:
    """Set bit numbers of an NVML bitmask array of 64-bit words (``unsigned long`` on Linux)."""
    out = []
    for w, word in enumerate(words):
        word = int(word)
        for b in range(64):
            if word >> b & 1:
                out.append(w * 64 + b)
    return tuple(out)


class RealNvml:
    """:class:`~slurm_gpushare.hardware.port.NvmlPort` backed by NVML through ``pynvml``.

    Args:
        lib: a ``pynvml``-like module (tests inject one); None imports ``pynvml``.
        mig_minors_path: the driver's MIG capability minor list (``/proc/driver/nvidia-caps/mig-minors``).

    Raises:
        HardwareError: ``nvidia-ml-py`` is not installed (only when ``lib`` is None).
    """

    def __init__(self, *, lib: Any = None, mig_minors_path: str | Path = MIG_MINORS_PATH):
        if lib is None:
            try:
                import pynvml
            except ImportError:
                raise HardwareError("the nvidia-ml-py package (module pynvml) is not installed",
                                    hint="pip install nvidia-ml-py, or use a machine description") from None
            lib = pynvml
        self._lib = lib
        self._mig_minors_path = Path(mig_minors_path)

    # --- plumbing -------------------------------------------------------------------------------

    def _call_present(self, function: str, where: tuple[str, ...], *args: Any) -> Any:
        """:meth:`_call`, or None where NVML answers that the thing asked about does not exist (``_ABSENT``)."""
        try:
            return self._call(function, where, *args)
        except NvmlError as e:
            if e.code in _ABSENT:
                return None
            raise

    def _call(self, function: str, where: tuple[str, ...], *args: Any) -> Any:
        """Call ``lib.<function>(*args)``; NVML errors become NvmlError naming ``function(where)``."""
        source = call_source(function, *where)
        fn = getattr(self._lib, function, None)
        if fn is None:
            raise nvml_error(source, NVML_ERROR_FUNCTION_NOT_FOUND,
                             detail=f"{function} is missing from the installed nvidia-ml-py")
        try:
            return fn(*args)
        except self._lib.NVMLError as e:
            raise nvml_error(source, getattr(e, "value", None)) from e

    def _handle(self, index: int) -> Any:
        return self._call("nvmlDeviceGetHandleByIndex", (f"gpu {index}",), index)

    def _dev(self, function: str, index: int, *args: Any) -> Any:
        return self._call(function, (f"gpu {index}",), self._handle(index), *args)

    def _const(self, name: str, default: int) -> int:
        value = getattr(self._lib, name, default)
        return value if isinstance(value, int) else default

    # --- lifetime --------------------------------------------------------------------------------

    def init(self) -> None:
        """``nvmlInit``. Raises NvmlError (``NVML_ERROR_LIBRARY_NOT_FOUND`` with a hint when no driver)."""
        self._call("nvmlInit", ())

    def shutdown(self) -> None:
        """``nvmlShutdown``."""
        self._call("nvmlShutdown", ())

    def __enter__(self) -> RealNvml:
        self.init()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.shutdown()

    # --- identity --------------------------------------------------------------------------------

    def driver_version(self) -> str:
        """``nvmlSystemGetDriverVersion``."""
        return _text(self._call("nvmlSystemGetDriverVersion", ()))

    def device_count(self) -> int:
        """``nvmlDeviceGetCount``."""
        return int(self._call("nvmlDeviceGetCount", ()))

    def name(self, index: int) -> str:
        """``nvmlDeviceGetName``."""
        return _text(self._dev("nvmlDeviceGetName", index))

    def uuid(self, index: int) -> str:
        """``nvmlDeviceGetUUID``."""
        return _text(self._dev("nvmlDeviceGetUUID", index))

    def minor_number(self, index: int) -> int:
        """``nvmlDeviceGetMinorNumber``."""
        return int(self._dev("nvmlDeviceGetMinorNumber", index))

    def pci_bus_id(self, index: int) -> str:
        """``nvmlDeviceGetPciInfo().busId`` (``nvmlPciInfo_t.busId``, 8-digit domain)."""
        return _text(self._dev("nvmlDeviceGetPciInfo", index).busId)

    def memory_total_mib(self, index: int) -> int:
        """``nvmlDeviceGetMemoryInfo().total`` // MiB."""
        return int(self._dev("nvmlDeviceGetMemoryInfo", index).total) // MIB

    def memory_used_mib(self, index: int) -> int:
        """``nvmlDeviceGetMemoryInfo().used`` // MiB."""
        return int(self._dev("nvmlDeviceGetMemoryInfo", index).used) // MIB

    # --- topology --------------------------------------------------------------------------------

    def cpu_affinity(self, index: int) -> tuple[int, ...]:
        """``nvmlDeviceGetCpuAffinity`` with a mask wide enough for this host's CPUs (at least 1024)."""
        words = max(16, ((os.cpu_count() or 1) + 63) // 64)
        return _bits(self._dev("nvmlDeviceGetCpuAffinity", index, words))

    def numa_node(self, index: int) -> int | None:
        """``nvmlDeviceGetMemoryAffinity(NVML_AFFINITY_SCOPE_NODE)``: the single nearest NUMA node or None.

        (``nvmlDeviceGetNumaNodeId`` is a different fact: the NUMA node *of* GPU memory on platforms
        where the GPU is a NUMA node, the ``GPU NUMA ID`` column; it is ``N/A`` on PCIe hosts.)
        """
        nodes = _bits(self._dev("nvmlDeviceGetMemoryAffinity", index, 4, 0))  # 0 = NVML_AFFINITY_SCOPE_NODE
        return nodes[0] if len(nodes) == 1 else None

    def topology_common_ancestor(self, index: int, other: int) -> str:
        """``nvmlDeviceGetTopologyCommonAncestor``, mapped by :data:`~.port.TOPOLOGY_LEVELS`."""
        where = (f"gpu {index}", f"gpu {other}")
        level = self._call("nvmlDeviceGetTopologyCommonAncestor", where, self._handle(index), self._handle(other))
        try:
            return TOPOLOGY_LEVELS[int(level)]
        except KeyError:
            raise nvml_error(call_source("nvmlDeviceGetTopologyCommonAncestor", *where), None,
                             detail=f"unknown topology level {level}") from None

    def nvlink_peers(self, index: int) -> tuple[NvLinkPeer, ...]:
        """Active NVLinks; link ids answering NOT_SUPPORTED / INVALID_ARGUMENT / NOT_FOUND do not exist."""
        handle = self._handle(index)
        peers = []
        for link in range(NVML_NVLINK_MAX_LINKS):
            where = (f"gpu {index}", f"link {link}")
            state = self._call_present("nvmlDeviceGetNvLinkState", where, handle, link)
            if state is None or int(state) != 1:  # NVML_FEATURE_ENABLED: the link is up
                continue
            pci = self._call("nvmlDeviceGetNvLinkRemotePciInfo", where, handle, link)
            kind = int(self._call("nvmlDeviceGetNvLinkRemoteDeviceType", where, handle, link))
            peers.append(NvLinkPeer(link, _text(pci.busId), NVLINK_DEVICE_TYPES.get(kind, "UNKNOWN")))
        return tuple(peers)

    def p2p_status(self, index: int, other: int) -> P2pStatus:
        """``nvmlDeviceGetP2PStatus`` for READ and NVLINK."""
        where = (f"gpu {index}", f"gpu {other}")
        a, b = self._handle(index), self._handle(other)
        read = int(self._call("nvmlDeviceGetP2PStatus", where, a, b, NVML_P2P_CAPS_INDEX_READ))
        nvlink = int(self._call("nvmlDeviceGetP2PStatus", where, a, b, NVML_P2P_CAPS_INDEX_NVLINK))
        return P2pStatus(NVML_P2P_STATUS.get(read, "UNKNOWN"), NVML_P2P_STATUS.get(nvlink, "UNKNOWN"))

    # --- MIG -------------------------------------------------------------------------------------

    def mig_mode(self, index: int) -> MigMode:
        """``nvmlDeviceGetMigMode`` -> (current, pending)."""
        current, pending = self._dev("nvmlDeviceGetMigMode", index)
        return MigMode(current=int(current) == 1, pending=int(pending) == 1)

    def _profile_infos(self, index: int) -> list[Any]:
        """``nvmlDeviceGetGpuInstanceProfileInfo`` (v2, with names) for every profile index the GPU offers."""
        handle = self._handle(index)
        infos = []
        for pidx in range(self._const("NVML_GPU_INSTANCE_PROFILE_COUNT", _GI_PROFILE_COUNT)):
            try:
                info = self._call("nvmlDeviceGetGpuInstanceProfileInfo", (f"gpu {index}", f"profile index {pidx}"),
                                  handle, pidx)
            except NvmlError as e:
                if e.code in _ABSENT:  # the GPU does not offer this profile, or MIG is off
                    continue
                raise
            infos.append(info)
        return infos

    def gpu_instance_profiles(self, index: int) -> tuple[MigProfile, ...]:
        """Profiles from ``nvmlDeviceGetGpuInstanceProfileInfo`` + ``nvmlDeviceGetGpuInstancePossiblePlacements``."""
        handle = self._handle(index)
        out = []
        for info in self._profile_infos(index):
            pid = int(info.id)
            where = (f"gpu {index}", f"profile {pid}")
            name = _text(getattr(info, "name", b"")).strip()
            if not name:
                raise nvml_error(call_source("nvmlDeviceGetGpuInstanceProfileInfo", *where), None,
                                 detail="NVML gave no profile name (driver older than R470?)")
            name = name.removeprefix("MIG ").strip()
            count = ctypes.c_uint(0)
            self._call("nvmlDeviceGetGpuInstancePossiblePlacements", where, handle, pid, None, ctypes.byref(count))
            array = (self._lib.c_nvmlGpuInstancePlacement_t * max(1, count.value))()
            self._call("nvmlDeviceGetGpuInstancePossiblePlacements", where, handle, pid, array, ctypes.byref(count))
            placements = tuple((int(array[k].start), int(array[k].size)) for k in range(count.value))
            out.append(MigProfile(name=name, profile_id=pid, slices=int(info.sliceCount),
                                  memory_mib=int(info.memorySizeMB), max_instances=int(info.instanceCount),
                                  sm_count=int(info.multiprocessorCount), placements=placements))
        return tuple(out)

    def _mig_minors(self) -> dict[str, int]:
        try:
            text = self._mig_minors_path.read_text()
        except OSError as e:
            raise HardwareError(f"cannot read the MIG capability minors: {e.strerror}",
                                hint="is the NVIDIA driver loaded with MIG support?",
                                source=str(self._mig_minors_path)) from None
        minors = {}
        for line in text.splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[1].isdigit():
                minors[parts[0]] = int(parts[1])
        return minors

    def gpu_instances(self, index: int) -> tuple[MigInstance, ...]:
        """Live MIG devices, by walking the MIG device handles.

        A GPU without MIG answers NOT_SUPPORTED to ``nvmlDeviceGetMaxMigDeviceCount`` and empty MIG
        device slots answer NOT_FOUND: both mean "no MIG device here".
        """
        handle = self._handle(index)
        found = []
        for k, mig, gi_id in self._mig_handles(index, handle, no_mig=(NVML_ERROR_NOT_SUPPORTED,)):
            where = (f"gpu {index}", f"mig {k}")
            ci_id = int(self._call("nvmlDeviceGetComputeInstanceId", where, mig))
            mig_uuid = _text(self._call("nvmlDeviceGetUUID", where, mig))
            gi_where = (f"gpu {index}", f"gi {gi_id}")
            gi = self._call("nvmlDeviceGetGpuInstanceById", gi_where, handle, gi_id)
            info = self._call("nvmlGpuInstanceGetInfo", gi_where, gi)
            found.append((gi_id, ci_id, int(info.profileId), int(info.placement.start), mig_uuid))
        if not found:
            return ()
        names = {p.profile_id: p.name for p in self.gpu_instance_profiles(index)}
        gpu_minor = self.minor_number(index)
        minors = self._mig_minors()
        out = []
        for gi_id, ci_id, pid, start, mig_uuid in sorted(found):
            if pid not in names:
                raise nvml_error(call_source("nvmlGpuInstanceGetInfo", f"gpu {index}", f"gi {gi_id}"), None,
                                 detail=f"GPU instance {gi_id} has profile id {pid}, which the GPU does not list")
            keys = (f"gpu{gpu_minor}/gi{gi_id}/access", f"gpu{gpu_minor}/gi{gi_id}/ci{ci_id}/access")
            missing = [k for k in keys if k not in minors]
            if missing:
                raise HardwareError(f"no capability minor for {', '.join(missing)}",
                                    source=str(self._mig_minors_path))
            out.append(MigInstance(profile=names[pid], gi_id=gi_id, ci_id=ci_id, start=start, uuid=mig_uuid,
                                   caps=tuple(minors[k] for k in keys)))
        return tuple(out)

    def create_gpu_instance(self, index: int, profile_id: int, start: int | None = None) -> MigInstance:
        """Checked with :func:`~.port.plan_gpu_instance`, then created with a spanning compute instance.

        If the compute instance cannot be created the GPU instance is destroyed again.
        """
        try:
            enabled = self.mig_mode(index).current
        except NvmlError as e:
            if e.code != NVML_ERROR_NOT_SUPPORTED:
                raise
            enabled = False  # a GPU without MIG: plan_gpu_instance says so
        profiles = self.gpu_instance_profiles(index) if enabled else ()
        profile, placement = plan_gpu_instance(index, mig_enabled=enabled, profiles=profiles,
                                               instances=self.gpu_instances(index) if enabled else (),
                                               profile_id=profile_id,
                                               start=start)
        handle = self._handle(index)
        where = (f"gpu {index}", f"profile {profile_id}")
        if start is None:
            gi = self._call("nvmlDeviceCreateGpuInstance", where, handle, profile_id)
        else:
            c_placement = self._lib.c_nvmlGpuInstancePlacement_t()
            c_placement.start, c_placement.size = placement
            gi = self._call("nvmlDeviceCreateGpuInstanceWithPlacement", (*where, f"start {start}"),
                            handle, profile_id, ctypes.byref(c_placement))
        gi_id = int(self._call("nvmlGpuInstanceGetInfo", where, gi).id)
        try:
            self._create_spanning_ci(index, gi, gi_id, profile.slices)
        except NvmlError:
            self._call("nvmlGpuInstanceDestroy", (f"gpu {index}", f"gi {gi_id}"), gi)
            raise
        for inst in self.gpu_instances(index):
            if inst.gi_id == gi_id:
                return inst
        raise MigPlacementError(f"GPU {index}: GPU instance {gi_id} was created but shows no MIG device")

    def _create_spanning_ci(self, index: int, gi: Any, gi_id: int, slices: int) -> None:
        where = (f"gpu {index}", f"gi {gi_id}")
        for cidx in range(self._const("NVML_COMPUTE_INSTANCE_PROFILE_COUNT", _CI_PROFILE_COUNT)):
            try:
                info = self._call("nvmlGpuInstanceGetComputeInstanceProfileInfo", (*where, f"profile index {cidx}"),
                                  gi, cidx, 0)  # 0 = NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
            except NvmlError as e:
                if e.code in _ABSENT:
                    continue
                raise
            if int(info.sliceCount) == slices:
                self._call("nvmlGpuInstanceCreateComputeInstance", where, gi, int(info.id))
                return
        raise nvml_error(call_source("nvmlGpuInstanceGetComputeInstanceProfileInfo", *where), NVML_ERROR_NOT_FOUND,
                         detail=f"no compute instance profile spans {slices} slice(s)")

    def destroy_gpu_instance(self, index: int, gi_id: int) -> None:
        """Destroy the compute instances of GPU instance ``gi_id``, then the GPU instance."""
        where = (f"gpu {index}", f"gi {gi_id}")
        gi = self._call("nvmlDeviceGetGpuInstanceById", where, self._handle(index), gi_id)
        for ci_id in range(_MAX_CI_PER_GI):
            try:
                ci = self._call("nvmlGpuInstanceGetComputeInstanceById", (*where, f"ci {ci_id}"), gi, ci_id)
            except NvmlError as e:
                if e.code in _ABSENT:  # no compute instance with this id
                    continue
                raise
            self._call("nvmlComputeInstanceDestroy", (*where, f"ci {ci_id}"), ci)
        self._call("nvmlGpuInstanceDestroy", where, gi)

    # --- accounting ------------------------------------------------------------------------------

    def processes(self, index: int) -> tuple[GpuProcess, ...]:
        """``nvmlDeviceGetComputeRunningProcesses``; a process whose memory NVML cannot report raises.

        On a GPU with MIG devices the call is made on each MIG device handle
        (``nvmlDeviceGetMaxMigDeviceCount``, ``nvmlDeviceGetMigDeviceHandleByIndex``,
        ``nvmlDeviceGetGpuInstanceId``), and ``gi_id`` is that device's GPU instance: NVML answers the
        parent handle of a GPU in MIG mode with the aggregate only for a privileged caller ("Per-instance
        information can be queried by using specific MIG device handles", nvml.h), the MIG handle for
        every caller. Otherwise the parent handle; ``gi_id`` is then ``gpuInstanceId`` where NVML sets one.

        ``sm_util`` comes from ``nvmlDeviceGetProcessUtilization`` (the latest sample NVML holds for
        the pid, ``smUtil``), None where NVML has no sample or does not support it (MIG GPUs, older
        GPUs).
        """
        out = []
        sm = self._process_sm(index)
        handle = self._handle(index)
        migs = self._mig_handles(index, handle)
        queried = [((f"gpu {index}", f"mig {k}"), mig, gi) for k, mig, gi in migs] if migs else \
            [((f"gpu {index}",), handle, None)]
        for where, handle, mig_gi in queried:
            for p in self._call("nvmlDeviceGetComputeRunningProcesses", where, handle):
                if p.usedGpuMemory is None:
                    raise nvml_error(call_source("nvmlDeviceGetComputeRunningProcesses", *where),
                                     NVML_ERROR_NOT_SUPPORTED, detail=f"no used-memory figure for pid {p.pid}")
                gi = mig_gi if mig_gi is not None else getattr(p, "gpuInstanceId", None)
                out.append(GpuProcess(pid=int(p.pid), used_memory_mib=int(p.usedGpuMemory) // MIB,
                                      sm_util=sm.get(int(p.pid)),
                                      gi_id=int(gi) if gi is not None and int(gi) < NO_INSTANCE else None))
        return tuple(sorted(out, key=lambda p: p.pid))

    def mps_client_pids(self, index: int) -> frozenset[int]:
        """``nvmlDeviceGetMPSComputeRunningProcesses`` on the GPU's handle: the pids of its MPS clients."""
        where = (f"gpu {index}",)
        return frozenset(int(p.pid) for p in self._call("nvmlDeviceGetMPSComputeRunningProcesses", where,
                                                        self._handle(index)))

    def _mig_handles(self, index: int, handle: Any,
                     no_mig: tuple[int, ...] = (NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_FUNCTION_NOT_FOUND),
                     ) -> list[tuple[int, Any, int]]:
        """``(slot, MIG device handle, GPU instance id)`` of the GPU's live MIG devices; empty without MIG
        (``nvmlDeviceGetMaxMigDeviceCount`` answers one of the codes ``no_mig``, by default NOT_SUPPORTED or
        FUNCTION_NOT_FOUND from an nvidia-ml-py without the MIG calls; or 0; or every slot NOT_FOUND)."""
        try:
            count = int(self._call("nvmlDeviceGetMaxMigDeviceCount", (f"gpu {index}",), handle))
        except NvmlError as e:
            if e.code in no_mig:
                return []
            raise
        out = []
        for k in range(count):
            where = (f"gpu {index}", f"mig {k}")
            mig = self._call_present("nvmlDeviceGetMigDeviceHandleByIndex", where, handle, k)
            if mig is None:
                continue
            out.append((k, mig, int(self._call("nvmlDeviceGetGpuInstanceId", where, mig))))
        return out

    def _process_sm(self, index: int) -> dict[int, float]:
        """pid -> latest ``smUtil`` sample (``nvmlDeviceGetProcessUtilization`` with timestamp 0: every
        sample the driver buffers); empty when NVML has none or does not support it."""
        try:
            samples = self._dev("nvmlDeviceGetProcessUtilization", index, 0)
        except NvmlError:
            return {}
        latest: dict[int, tuple[int, float]] = {}
        for s in samples or ():
            pid, ts = int(s.pid), int(s.timeStamp)
            if pid not in latest or ts >= latest[pid][0]:
                latest[pid] = (ts, float(min(100, max(0, int(s.smUtil)))))
        return {pid: v for pid, (_, v) in latest.items()}

    def utilization(self, index: int) -> Utilization:
        """``nvmlDeviceGetUtilizationRates``."""
        u = self._dev("nvmlDeviceGetUtilizationRates", index)
        return Utilization(gpu_percent=int(u.gpu), memory_percent=int(u.memory))

    # --- compute mode --------------------------------------------------------------------------------

    def compute_mode(self, index: int) -> str:
        """``nvmlDeviceGetComputeMode``, by name (:data:`~.port.COMPUTE_MODES`); an unknown value raises."""
        value = int(self._dev("nvmlDeviceGetComputeMode", index))
        try:
            return COMPUTE_MODES[value]
        except KeyError:
            raise nvml_error(call_source("nvmlDeviceGetComputeMode", f"gpu {index}"), None,
                             detail=f"unknown compute mode {value}") from None

    def set_compute_mode(self, index: int, mode: str) -> None:
        """``nvmlDeviceSetComputeMode`` with the ``NVML_COMPUTEMODE_*`` value of ``mode``."""
        value = compute_mode_value(index, mode)
        self._call("nvmlDeviceSetComputeMode", (f"gpu {index}", f"mode {mode}"), self._handle(index), value)

    # --- per-cgroup memory limits (driver R615+) -----------------------------------------------------

    def _limits_struct(self, name: str, function: str, where: tuple[str, ...]) -> Any:
        struct = getattr(self._lib, name, None)
        if struct is None:
            raise nvml_error(call_source(function, *where), NVML_ERROR_FUNCTION_NOT_FOUND,
                             detail=f"{function} is missing from the installed nvidia-ml-py (13.615 or later has it)")
        return struct()

    def set_memory_limits(self, index: int, cgroup: str, soft_mib: int, hard_mib: int) -> None:
        """``nvmlDeviceSetMemoryLimits_v1`` with ``nvmlSetMemoryLimits_v1_t`` (``nameSpace`` the cgroup's
        directory, limits in bytes)."""
        function = "nvmlDeviceSetMemoryLimits_v1"
        where = (f"gpu {index}", f"cgroup {cgroup}")
        limits = self._limits_struct("c_nvmlSetMemoryLimits_v1_t", function, where)
        limits.nameSpace = cgroup.encode()
        limits.softLimit = soft_mib * MIB
        limits.hardLimit = hard_mib * MIB
        self._call(function, where, self._handle(index), limits)

    def memory_limits(self, index: int, cgroup: str) -> MemoryLimits:
        """``nvmlDeviceGetMemoryLimits_v1`` with ``nvmlGetMemoryLimits_v1_t``."""
        function = "nvmlDeviceGetMemoryLimits_v1"
        where = (f"gpu {index}", f"cgroup {cgroup}")
        limits = self._limits_struct("c_nvmlGetMemoryLimits_v1_t", function, where)
        limits.nameSpace = cgroup.encode()
        self._call(function, where, self._handle(index), limits)
        hard = int(limits.hardLimit)
        return MemoryLimits(soft_mib=int(limits.softLimit) // MIB,
                            hard_mib=None if hard >= NVML_DEVICE_MEMORY_LIMIT_MAX else hard // MIB,
                            used_mib=int(limits.currentUsed) // MIB)
