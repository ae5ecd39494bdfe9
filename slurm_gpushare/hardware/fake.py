"""A fake NVML that behaves like a whole machine, built from a machine description.

:class:`FakeNvml` implements :class:`~slurm_gpushare.hardware.port.NvmlPort` from a
:class:`~slurm_gpushare.hardware.machine.Machine`: it answers what NVML would answer on that node,
deterministically, and keeps state (MIG instances created and destroyed, processes set over time).
It enforces what the real hardware enforces: NVML must be initialized, MIG GPU instances must fit
the profile's placements without overlap (:func:`~slurm_gpushare.hardware.port.plan_gpu_instance`).
Failures are injected per NVML call and raise exactly the :class:`~slurm_gpushare.errors.NvmlError`
the real port raises for the same failure (same source naming, same code).

How description facts become NVML answers (the rules are chosen so that
``probe_machine(FakeNvml(m), hostname=m.hostname, cpus=m.cpus) == m`` for every description that is
complete the way an NVML probe is complete: every GPU pair listed with a PCIe level, sorted lists,
no NICs, ``source`` ``"nvml"``):

- Empty ``uuid`` / ``pci_bus_id`` / MIG ``uuid`` / MIG ``caps`` are derived: UUIDs are uuid5 of the
  hostname and GPU index (``GPU-...``) or GPU UUID and instance ids (``MIG-...``); bus ids are
  ``0000000D:BB:00.0`` with bus ``0x07 + 0x10 * (index % 16)`` and domain ``index // 16``; caps are
  the driver's ``mig-minors`` numbering (see :func:`~slurm_gpushare.hardware.machine.mig_cap_minors`).
- PCIe level (``nvmlDeviceGetTopologyCommonAncestor``): ``Link.pcie``; ``SYS`` when the pair has no
  link or no known level (``nvidia-smi topo -m`` prints only ``NV#`` for NVLinked pairs): the
  farthest level never makes two GPUs look closer than they are.
- NVLinks (``nvmlDeviceGetNvLink*``): a direct link ``Link(a, b, nvlinks=N)`` gives each GPU N active
  links whose remote is the other GPU (type ``GPU``). ``via_nvswitch`` links give each GPU as many
  links to NVSwitches (type ``SWITCH``, spread over 4 switches) as its largest switched link count;
  the description must then list every pair of switched GPUs with ``nvlinks`` equal to the smaller
  of the two counts, which is how the probe reads switched fabrics back.
- P2P (``nvmlDeviceGetP2PStatus``): NVLink ``OK`` when NVLinked; read ``OK`` when NVLinked or the
  PCIe level is ``PIX``/``PXB``/``PHB``/``NODE``, else ``IOH_TOPOLOGY_NOT_SUPPORTED``.
- MIG: ``nvmlDeviceGetMigMode`` answers NOT_SUPPORTED for a GPU with neither MIG enabled nor profiles
  listed; profiles are reported only while MIG is enabled (as NVML does); new GPU instances get the
  lowest free GPU instance id from 1 and compute instance 0; utilization is NOT_SUPPORTED on MIG GPUs.
- Processes (``nvmlDeviceGetComputeRunningProcesses``): the description's, those set with
  :meth:`FakeNvml.set_processes`, and scheduled ones whose memory and SM utilization change over time
  (:class:`ScheduledProcess`), added in-process (:meth:`FakeNvml.add_process`) or by other processes
  through a :class:`ProcessTable` directory (how jobs on the dev cluster "use" a fake GPU: see
  :mod:`slurm_gpushare.hardware.fakeapp`). A table entry counts only while its pid is alive, as NVML
  forgets a process that exited.
- Memory used: the sum of the processes' memory. Utilization: the sum of the processes' SM
  utilization (at most 100 %), until :meth:`FakeNvml.set_utilization` fixes a value.
- Compute mode: ``DEFAULT`` until :meth:`FakeNvml.set_compute_mode` (any user may set it; the real
  call needs root).
- Per-cgroup memory limits (``nvmlDeviceSetMemoryLimits_v1``, driver R615+): served unless the description
  names a driver below 615 (``FUNCTION_NOT_FOUND`` then) or the GPU has MIG enabled (``NOT_SUPPORTED``: NVML
  takes no MIG handle); a cgroup directory that does not exist is ``INVALID_ARGUMENT``. The limits are kept in
  ``<description>.memlimits.json`` beside the description file (root writes it, as only root may set them;
  everyone reads it), so that every process of the node sees them, as it sees the driver's; a limit whose
  cgroup directory is gone is forgotten (NVIDIA: removing the cgroup clears its limits). The fake GPU app
  (``slurm_gpushare_dev.fakeapp``) fails an allocation that would take its cgroup's processes past the hard
  limit, as the driver does.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import TracebackType

import psutil

from slurm_gpushare.atomicfile import locked, write_atomic
from slurm_gpushare.errors import InputError, MachineDescriptionError, MigPlacementError, NvmlError
from slurm_gpushare.hardware.machine import Gpu, GpuProcess, Link, Machine, MigInstance, MigProfile
from slurm_gpushare.hardware.machine import mig_cap_minors as mig_caps
from slurm_gpushare.hardware.port import (
    NVML_ERROR_FUNCTION_NOT_FOUND,
    NVML_ERROR_INVALID_ARGUMENT,
    NVML_ERROR_NOT_FOUND,
    NVML_ERROR_NOT_SUPPORTED,
    NVML_ERROR_UNINITIALIZED,
    NVML_ERROR_UNKNOWN,
    NVML_NVLINK_MAX_LINKS,
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
from slurm_gpushare.procinfo import pid_alive, process

#: Namespace of the fake's derived UUIDs (uuid5; the module is imported when a UUID is derived: a description
#: that has its UUIDs, as an inventory of a real node has, costs no ``uuid``/``hashlib`` import).
FAKE_UUID_NAMESPACE = "5f0d6a3e-9c1b-4b7e-8a51-2d3c4e5f6a7b"


def _uuid5(name: str) -> str:
    import uuid

    return str(uuid.uuid5(uuid.UUID(FAKE_UUID_NAMESPACE), name))
#: NVSwitches a switched GPU's links are spread over (an HGX H100 baseboard has 4).
FAKE_NVSWITCHES = 4

#: The NVML functions the fake serves, which are the keys accepted for failure injection.
NVML_FUNCTIONS = frozenset({
    "nvmlInit", "nvmlShutdown", "nvmlSystemGetDriverVersion", "nvmlDeviceGetCount",
    "nvmlDeviceGetHandleByIndex", "nvmlDeviceGetName", "nvmlDeviceGetUUID", "nvmlDeviceGetMinorNumber",
    "nvmlDeviceGetPciInfo", "nvmlDeviceGetMemoryInfo", "nvmlDeviceGetCpuAffinity",
    "nvmlDeviceGetMemoryAffinity", "nvmlDeviceGetTopologyCommonAncestor", "nvmlDeviceGetNvLinkState",
    "nvmlDeviceGetNvLinkRemotePciInfo", "nvmlDeviceGetNvLinkRemoteDeviceType", "nvmlDeviceGetP2PStatus",
    "nvmlDeviceGetMigMode", "nvmlDeviceGetGpuInstanceProfileInfo",
    "nvmlDeviceGetGpuInstancePossiblePlacements", "nvmlDeviceGetMaxMigDeviceCount",
    "nvmlDeviceGetMigDeviceHandleByIndex", "nvmlDeviceGetGpuInstanceId", "nvmlDeviceGetComputeInstanceId",
    "nvmlDeviceGetGpuInstanceById", "nvmlGpuInstanceGetInfo", "nvmlDeviceCreateGpuInstance",
    "nvmlDeviceCreateGpuInstanceWithPlacement", "nvmlGpuInstanceCreateComputeInstance",
    "nvmlComputeInstanceDestroy", "nvmlGpuInstanceDestroy", "nvmlDeviceGetComputeRunningProcesses",
    "nvmlDeviceGetUtilizationRates", "nvmlDeviceGetComputeMode", "nvmlDeviceSetComputeMode",
    "nvmlDeviceGetMPSComputeRunningProcesses", "nvmlDeviceSetMemoryLimits_v1", "nvmlDeviceGetMemoryLimits_v1",
})

#: The first driver branch whose NVML has per-cgroup memory limits (``nvmlDeviceSetMemoryLimits_v1``).
MEMORY_LIMITS_DRIVER = 615

#: A failure rule: a code (every call fails), ``(code, times)`` (the next ``times`` calls fail), or a
#: callable given the GPU index (None for system calls) that returns a code or None (no failure).
FailRule = int | tuple[int, int] | Callable[[int | None], int | None]


def fake_gpu_uuid(hostname: str, index: int) -> str:
    """The ``GPU-...`` UUID the fake gives GPU ``index`` of ``hostname`` when the description has none."""
    return f"GPU-{_uuid5(f'{hostname}/gpu{index}')}"


def derived_gpus(machine: Machine, *, source: str | None = None) -> list[Gpu]:
    """The description's GPUs, by index, with what the fake derives where the description is silent: GPU and
    MIG UUIDs (:func:`fake_gpu_uuid`, :func:`fake_mig_uuid`), PCI bus ids (:func:`fake_bus_id`), MIG caps.

    Raises:
        MachineDescriptionError: GPU indices that are not 0..N-1, or two GPUs on one PCI bus id.
    """
    gpus = sorted(machine.gpus, key=lambda g: g.index)
    if [g.index for g in gpus] != list(range(len(gpus))):
        raise MachineDescriptionError(f"GPU indices {[g.index for g in gpus]} are not 0..{len(gpus) - 1}",
                                      hint="NVML numbers GPUs 0..N-1", source=source)
    out = []
    for g in gpus:
        gpu_uuid = g.uuid or fake_gpu_uuid(machine.hostname, g.index)
        insts = []
        for inst in g.mig_instances:
            insts.append(replace(inst, uuid=inst.uuid or fake_mig_uuid(gpu_uuid, inst.gi_id, inst.ci_id),
                                 caps=inst.caps or mig_caps(g.minor, inst.gi_id, inst.ci_id)))
        out.append(replace(g, uuid=gpu_uuid, pci_bus_id=g.pci_bus_id or fake_bus_id(g.index),
                           mig_instances=tuple(insts)))
    buses = [g.pci_bus_id.upper() for g in out]
    if len(set(buses)) != len(buses):
        raise MachineDescriptionError(f"duplicate PCI bus ids {buses}", source=source)
    return out


def fake_bus_id(index: int) -> str:
    """The PCI bus id the fake gives GPU ``index`` when the description has none."""
    return f"{index // 16:08X}:{0x07 + 0x10 * (index % 16):02X}:00.0"


def fake_mig_uuid(gpu_uuid: str, gi_id: int, ci_id: int) -> str:
    """The ``MIG-...`` UUID the fake gives a MIG device when the description has none."""
    return f"MIG-{_uuid5(f'{gpu_uuid}/gi{gi_id}/ci{ci_id}')}"


def _switch_bus_id(switch: int) -> str:
    return f"00000000:{0xC0 + switch:02X}:00.0"


@dataclass
class _GpuState:
    gpu: Gpu
    peers: tuple[NvLinkPeer, ...]
    switch_links: int
    instances: list[MigInstance] = field(default_factory=list)
    processes: list[GpuProcess] = field(default_factory=list)
    utilization: Utilization | None = None
    compute_mode: str = "DEFAULT"


class FakeNvml:
    """:class:`~slurm_gpushare.hardware.port.NvmlPort` served from a machine description.

    Args:
        machine: the node to impersonate. GPU indices must be ``0 .. N-1``.
        fail: failure injection by NVML function name (see :data:`NVML_FUNCTIONS`), e.g.
            ``{"nvmlDeviceGetUUID": NVML_ERROR_GPU_IS_LOST}``, ``{"nvmlDeviceGetName": (3, 1)}``
            (the next call fails with code 3), or ``{"nvmlDeviceGetUUID": lambda gpu: 15 if gpu == 2 else None}``.
        clock: seconds, for scheduled processes (default ``time.time``, the clock a
            :class:`ProcessTable` written by other processes uses).
        process_table: a :class:`ProcessTable` directory whose live entries are processes too.
        path: the description file ``machine`` was read from: MIG changes (:meth:`create_gpu_instance`,
            :meth:`destroy_gpu_instance`) are written back to it whole (``write_atomic``), so that other
            processes opening the fake from that file (the hooks, ``slurmd -G`` stand-ins, a rerun of
            ``mig apply``) see the changed layout, as every process on a real node sees the driver's.
            None: changes live in this object only.

    Raises:
        MachineDescriptionError: the description cannot be served as NVML would (indices not
            ``0..N-1``, duplicate bus ids, too many NVLinks, an inconsistent NVSwitch fabric, MIG
            instances that break the placement rules or profiles without placements).
        InputError: a ``fail`` key that is not an NVML function the fake serves.
    """

    def __init__(self, machine: Machine, *, fail: dict[str, FailRule] | None = None,
                 clock: Callable[[], float] = time.time, process_table: str | Path | None = None,
                 path: str | Path | None = None):
        self._source = f"fake NVML for {machine.hostname}"
        self._machine = machine
        self._path = Path(path) if path is not None else None
        self._clock = clock
        self._scheduled: list[ScheduledProcess] = []
        self._table = ProcessTable(process_table) if process_table else None
        self._driver = machine.driver_version
        gpus = self._fill(machine)
        self._links = {(ln.a, ln.b): ln for ln in machine.links}
        self._state = self._build(gpus)
        self._refcount = 0
        self._fail: dict[str, list] = {}
        self._pending: list[list] = []
        self._limits: dict[str, dict[str, list[int]]] = {}  # without a description file
        for function, rule in (fail or {}).items():
            self._check_function(function)
            self._fail[function] = [rule[0], rule[1]] if isinstance(rule, tuple) else [rule, None]

    # --- construction ------------------------------------------------------------------------------

    def _fill(self, machine: Machine) -> list[Gpu]:
        return derived_gpus(machine, source=self._source)

    def _build(self, gpus: list[Gpu]) -> list[_GpuState]:
        n = len(gpus)
        switched = {i: 0 for i in range(n)}
        for ln in self._links.values():
            if ln.via_nvswitch and ln.nvlinks:
                switched[ln.a] = max(switched[ln.a], ln.nvlinks)
                switched[ln.b] = max(switched[ln.b], ln.nvlinks)
        on_switch = [i for i in range(n) if switched[i]]
        for a in on_switch:
            for b in on_switch:
                if a < b:
                    pair = self._links.get((a, b))
                    want = min(switched[a], switched[b])
                    if pair is None or not pair.via_nvswitch or pair.nvlinks != want:
                        raise MachineDescriptionError(
                            f"GPUs {a} and {b} are both on NVSwitches; link {a}-{b} must be via_nvswitch "
                            f"with nvlinks {want} (the smaller of their switch link counts)",
                            hint="list every pair of switched GPUs", source=self._source)
        peers: dict[int, list[NvLinkPeer]] = {i: [] for i in range(n)}
        for (a, b), ln in sorted(self._links.items()):
            if ln.nvlinks and not ln.via_nvswitch:
                for here, there in ((a, b), (b, a)):
                    for _ in range(ln.nvlinks):
                        peers[here].append(NvLinkPeer(len(peers[here]), gpus[there].pci_bus_id, "GPU"))
        for i in on_switch:
            for k in range(switched[i]):
                peers[i].append(NvLinkPeer(len(peers[i]), _switch_bus_id(k % FAKE_NVSWITCHES), "SWITCH"))
        states = []
        for g in gpus:
            if len(peers[g.index]) > NVML_NVLINK_MAX_LINKS:
                raise MachineDescriptionError(
                    f"GPU {g.index} has {len(peers[g.index])} NVLinks; NVML reports at most {NVML_NVLINK_MAX_LINKS}",
                    source=self._source)
            states.append(_GpuState(gpu=g, peers=tuple(peers[g.index]), switch_links=switched[g.index],
                                    instances=self._check_instances(g), processes=list(g.processes)))
        return states

    def _check_instances(self, g: Gpu) -> list[MigInstance]:
        if g.mig_enabled:
            for p in g.mig_profiles:
                if not p.placements:
                    raise MachineDescriptionError(
                        f"GPU {g.index}: MIG profile {p.name} has no placements; the fake needs them to "
                        "enforce the placement rules", hint="copy them from 'nvidia-smi mig -lgipp'",
                        source=self._source)
        elif g.mig_instances:
            raise MachineDescriptionError(f"GPU {g.index} has MIG instances but MIG is not enabled",
                                          source=self._source)
        placed: list[MigInstance] = []
        seen = set()
        for inst in g.mig_instances:
            if (inst.gi_id, inst.ci_id) in seen:
                raise MachineDescriptionError(f"GPU {g.index}: MIG device gi {inst.gi_id} ci {inst.ci_id} "
                                              "is described twice", source=self._source)
            seen.add((inst.gi_id, inst.ci_id))
            try:
                same_gi = [p for p in placed if p.gi_id == inst.gi_id]
                if same_gi:  # another compute instance of a GPU instance already placed
                    if same_gi[0].profile != inst.profile or same_gi[0].start != inst.start:
                        raise MigPlacementError(f"GPU {g.index}: compute instances of GPU instance "
                                                f"{inst.gi_id} disagree on its profile or start")
                else:
                    profile = next((p for p in g.mig_profiles if p.name == inst.profile), None)
                    if profile is None:
                        raise MigPlacementError(
                            f"GPU {g.index}: GPU instance {inst.gi_id} has unknown profile {inst.profile!r}",
                            hint=f"profiles: {', '.join(p.name for p in g.mig_profiles) or 'none'}")
                    plan_gpu_instance(g.index, mig_enabled=True, profiles=g.mig_profiles, instances=placed,
                                      profile_id=profile.profile_id, start=inst.start)
            except MigPlacementError as e:
                raise MachineDescriptionError(f"invalid live MIG instance: {e.message}", hint=e.hint,
                                              source=self._source) from None
            placed.append(inst)
        return sorted(placed, key=lambda m: (m.gi_id, m.ci_id))

    # --- failure injection -------------------------------------------------------------------------

    def _check_function(self, function: str) -> None:
        if function not in NVML_FUNCTIONS:
            raise InputError(f"unknown NVML function {function!r} for failure injection",
                             hint=f"the fake serves: {', '.join(sorted(NVML_FUNCTIONS))}")

    def fail_next(self, function: str, code: int = NVML_ERROR_UNKNOWN, *, gpu: int | None = None,
                  times: int = 1) -> None:
        """Make the next ``times`` calls of ``function`` (on GPU ``gpu``, or any) fail with ``code``.

        Raises:
            InputError: ``function`` is not an NVML function the fake serves.
        """
        self._check_function(function)
        self._pending.append([function, gpu, code, times])

    def _injected(self, function: str, gpu: int | None) -> int | None:
        for entry in self._pending:
            if entry[0] == function and entry[1] in (None, gpu) and entry[3] > 0:
                entry[3] -= 1
                return entry[2]
        rule = self._fail.get(function)
        if rule is None:
            return None
        value, remaining = rule
        if callable(value):
            return value(gpu)
        if remaining is None:
            return value
        if remaining > 0:
            rule[1] -= 1
            return value
        return None

    def _nvml(self, function: str, gpu: int | None, *where: str) -> None:
        """One NVML call: fail as NVML would (uninitialized, injected failure) or return."""
        source = call_source(function, *where)
        if self._refcount == 0:
            raise nvml_error(source, NVML_ERROR_UNINITIALIZED)
        code = self._injected(function, gpu)
        if code:
            raise nvml_error(source, code)

    def _dev(self, function: str, index: int, *where: str) -> _GpuState:
        """``nvmlDeviceGetHandleByIndex`` then ``function`` on GPU ``index``."""
        self._handle(index)
        self._nvml(function, index, f"gpu {index}", *where)
        return self._state[index]

    def _handle(self, index: int) -> None:
        self._nvml("nvmlDeviceGetHandleByIndex", index, f"gpu {index}")
        if not 0 <= index < len(self._state):
            raise nvml_error(call_source("nvmlDeviceGetHandleByIndex", f"gpu {index}"), NVML_ERROR_INVALID_ARGUMENT)

    # --- lifetime ----------------------------------------------------------------------------------

    def init(self) -> None:
        """``nvmlInit``: reference-counted like NVML's."""
        code = self._injected("nvmlInit", None)
        if code:
            raise nvml_error(call_source("nvmlInit"), code)
        self._refcount += 1

    def shutdown(self) -> None:
        """``nvmlShutdown``: UNINITIALIZED when called more often than :meth:`init`."""
        self._nvml("nvmlShutdown", None)
        self._refcount -= 1

    def __enter__(self) -> FakeNvml:
        self.init()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.shutdown()

    @property
    def initialized(self) -> bool:
        """NVML is open (more :meth:`init` than :meth:`shutdown` calls)."""
        return self._refcount > 0

    # --- identity ----------------------------------------------------------------------------------

    def driver_version(self) -> str:
        """``Machine.driver_version``."""
        self._nvml("nvmlSystemGetDriverVersion", None)
        return self._driver

    def device_count(self) -> int:
        """Number of GPUs in the description."""
        self._nvml("nvmlDeviceGetCount", None)
        return len(self._state)

    def name(self, index: int) -> str:
        """``Gpu.name``."""
        return self._dev("nvmlDeviceGetName", index).gpu.name

    def uuid(self, index: int) -> str:
        """``Gpu.uuid`` or the derived one."""
        return self._dev("nvmlDeviceGetUUID", index).gpu.uuid

    def minor_number(self, index: int) -> int:
        """``Gpu.minor``."""
        return self._dev("nvmlDeviceGetMinorNumber", index).gpu.minor

    def pci_bus_id(self, index: int) -> str:
        """``Gpu.pci_bus_id`` or the derived one."""
        return self._dev("nvmlDeviceGetPciInfo", index).gpu.pci_bus_id

    def memory_total_mib(self, index: int) -> int:
        """``Gpu.memory_mib``."""
        return self._dev("nvmlDeviceGetMemoryInfo", index).gpu.memory_mib

    def memory_used_mib(self, index: int) -> int:
        """Sum of the current processes' ``used_memory_mib``."""
        self._dev("nvmlDeviceGetMemoryInfo", index)
        return sum(p.used_memory_mib for p in self._current(index))

    # --- topology ----------------------------------------------------------------------------------

    def cpu_affinity(self, index: int) -> tuple[int, ...]:
        """``Gpu.cpu_affinity``, sorted."""
        return tuple(sorted(self._dev("nvmlDeviceGetCpuAffinity", index).gpu.cpu_affinity))

    def numa_node(self, index: int) -> int | None:
        """``Gpu.numa_node``."""
        return self._dev("nvmlDeviceGetMemoryAffinity", index).gpu.numa_node

    def _pair(self, function: str, index: int, other: int) -> Link | None:
        self._handle(index)
        self._handle(other)
        self._nvml(function, index, f"gpu {index}", f"gpu {other}")
        if index == other:
            raise nvml_error(call_source(function, f"gpu {index}", f"gpu {other}"), NVML_ERROR_INVALID_ARGUMENT,
                             detail="the two GPUs must differ")
        return self._links.get((min(index, other), max(index, other)))

    def topology_common_ancestor(self, index: int, other: int) -> str:
        """``Link.pcie``, or ``SYS`` when unknown."""
        ln = self._pair("nvmlDeviceGetTopologyCommonAncestor", index, other)
        return ln.pcie if ln is not None and ln.pcie is not None else "SYS"

    def nvlink_peers(self, index: int) -> tuple[NvLinkPeer, ...]:
        """Links derived from the description (see the module docstring), with per-link failure injection."""
        self._handle(index)
        state = self._state[index]
        out = []
        for link in range(NVML_NVLINK_MAX_LINKS):
            where = (f"gpu {index}", f"link {link}")
            try:
                self._nvml("nvmlDeviceGetNvLinkState", index, *where)
            except NvmlError as e:
                if e.code in (NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_INVALID_ARGUMENT, NVML_ERROR_NOT_FOUND):
                    continue  # the real port reads these as "no such link"
                raise
            if link >= len(state.peers):
                continue
            self._nvml("nvmlDeviceGetNvLinkRemotePciInfo", index, *where)
            self._nvml("nvmlDeviceGetNvLinkRemoteDeviceType", index, *where)
            out.append(state.peers[link])
        return tuple(out)

    def p2p_status(self, index: int, other: int) -> P2pStatus:
        """NVLink OK when NVLinked; read OK when NVLinked or PCIe level PIX/PXB/PHB/NODE."""
        ln = self._pair("nvmlDeviceGetP2PStatus", index, other)
        self._nvml("nvmlDeviceGetP2PStatus", index, f"gpu {index}", f"gpu {other}")
        switched = self._state[index].switch_links and self._state[other].switch_links
        nvlinked = bool(switched) or (ln is not None and ln.nvlinks > 0)
        pcie = ln.pcie if ln is not None and ln.pcie is not None else "SYS"
        read = "OK" if nvlinked or pcie in ("PIX", "PXB", "PHB", "NODE") else "IOH_TOPOLOGY_NOT_SUPPORTED"
        return P2pStatus(read=read, nvlink="OK" if nvlinked else "NOT_SUPPORTED")

    # --- MIG ---------------------------------------------------------------------------------------

    def mig_mode(self, index: int) -> MigMode:
        """``Gpu.mig_enabled`` (current and pending); NOT_SUPPORTED for a GPU with no MIG facts."""
        g = self._dev("nvmlDeviceGetMigMode", index).gpu
        if not g.mig_enabled and not g.mig_profiles:
            raise nvml_error(call_source("nvmlDeviceGetMigMode", f"gpu {index}"), NVML_ERROR_NOT_SUPPORTED)
        return MigMode(current=g.mig_enabled, pending=g.mig_enabled)

    def gpu_instance_profiles(self, index: int) -> tuple[MigProfile, ...]:
        """``Gpu.mig_profiles`` in description order while MIG is enabled, else empty."""
        self._handle(index)
        g = self._state[index].gpu
        if not g.mig_enabled:
            return ()
        for k, p in enumerate(g.mig_profiles):
            self._nvml("nvmlDeviceGetGpuInstanceProfileInfo", index, f"gpu {index}", f"profile index {k}")
            self._nvml("nvmlDeviceGetGpuInstancePossiblePlacements", index, f"gpu {index}",
                       f"profile {p.profile_id}")
        return g.mig_profiles

    def gpu_instances(self, index: int) -> tuple[MigInstance, ...]:
        """The live instances (described, then created / destroyed), sorted by ``(gi_id, ci_id)``."""
        state = self._dev("nvmlDeviceGetMaxMigDeviceCount", index)
        if not state.gpu.mig_enabled:
            return ()
        for k, inst in enumerate(state.instances):
            mig = (f"gpu {index}", f"mig {k}")
            for function in ("nvmlDeviceGetMigDeviceHandleByIndex", "nvmlDeviceGetGpuInstanceId",
                             "nvmlDeviceGetComputeInstanceId", "nvmlDeviceGetUUID"):
                self._nvml(function, index, *mig)
            for function in ("nvmlDeviceGetGpuInstanceById", "nvmlGpuInstanceGetInfo"):
                self._nvml(function, index, f"gpu {index}", f"gi {inst.gi_id}")
        if not state.instances:
            return ()
        self.gpu_instance_profiles(index)
        self.minor_number(index)
        return tuple(state.instances)

    def create_gpu_instance(self, index: int, profile_id: int, start: int | None = None) -> MigInstance:
        """Create a GPU instance and its spanning compute instance, enforcing the placement rules.

        Raises:
            MigPlacementError: MIG off, unknown profile, start not allowed, overlap, or no room.
            NvmlError: an injected failure.
        """
        self._handle(index)
        state = self._state[index]
        g = state.gpu
        profile, placement = plan_gpu_instance(index, mig_enabled=g.mig_enabled, profiles=g.mig_profiles,
                                               instances=state.instances, profile_id=profile_id, start=start)
        where = (f"gpu {index}", f"profile {profile_id}")
        if start is None:
            self._nvml("nvmlDeviceCreateGpuInstance", index, *where)
        else:
            self._nvml("nvmlDeviceCreateGpuInstanceWithPlacement", index, *where, f"start {start}")
        used = {inst.gi_id for inst in state.instances}
        gi_id = next(k for k in range(1, len(used) + 2) if k not in used)
        self._nvml("nvmlGpuInstanceGetInfo", index, *where)
        self._nvml("nvmlGpuInstanceCreateComputeInstance", index, f"gpu {index}", f"gi {gi_id}")
        inst = MigInstance(profile=profile.name, gi_id=gi_id, ci_id=0, start=placement[0],
                           uuid=fake_mig_uuid(g.uuid, gi_id, 0), caps=mig_caps(g.minor, gi_id, 0))
        state.instances = sorted([*state.instances, inst], key=lambda m: (m.gi_id, m.ci_id))
        self._persist()
        return inst

    def destroy_gpu_instance(self, index: int, gi_id: int) -> None:
        """Destroy GPU instance ``gi_id`` and its compute instances, freeing its slices.

        Raises:
            NvmlError: ``NVML_ERROR_NOT_FOUND`` when there is no such GPU instance; injected failures.
        """
        self._handle(index)
        state = self._state[index]
        where = (f"gpu {index}", f"gi {gi_id}")
        self._nvml("nvmlDeviceGetGpuInstanceById", index, *where)
        doomed = [inst for inst in state.instances if inst.gi_id == gi_id]
        if not doomed:
            raise nvml_error(call_source("nvmlDeviceGetGpuInstanceById", *where), NVML_ERROR_NOT_FOUND,
                             detail=f"no GPU instance {gi_id}")
        for inst in doomed:
            self._nvml("nvmlComputeInstanceDestroy", index, *where, f"ci {inst.ci_id}")
        self._nvml("nvmlGpuInstanceDestroy", index, *where)
        state.instances = [inst for inst in state.instances if inst.gi_id != gi_id]
        self._persist()

    def _persist(self) -> None:
        """Write the live MIG instances back to the description file (when opened from one): the
        description as read, each GPU's ``mig_instances`` replaced, the file replaced whole."""
        if self._path is None:
            return
        by_index = {s.gpu.index: tuple(s.instances) for s in self._state}
        gpus = tuple(replace(g, mig_instances=by_index.get(g.index, g.mig_instances)) for g in self._machine.gpus)
        self._machine = replace(self._machine, gpus=gpus)
        try:
            mode: int | None = self._path.stat().st_mode & 0o7777  # readers (jobs' users) keep reading it
        except OSError:
            mode = None
        write_atomic(self._path, self._machine.to_json(), mode=mode)

    # --- accounting --------------------------------------------------------------------------------

    def processes(self, index: int) -> tuple[GpuProcess, ...]:
        """The current processes (set, scheduled, and live entries of the process table: the real pids of
        live fake-app processes), sorted by pid. On a GPU with MIG devices the calls are those of the real
        port, one ``nvmlDeviceGetComputeRunningProcesses`` per MIG device handle, and a process reports the
        GPU instance it registered in."""
        self._handle(index)
        state = self._state[index]
        if state.gpu.mig_enabled and state.instances:
            for k in range(len(state.instances)):
                for function in ("nvmlDeviceGetMigDeviceHandleByIndex", "nvmlDeviceGetGpuInstanceId",
                                 "nvmlDeviceGetComputeRunningProcesses"):
                    self._nvml(function, index, f"gpu {index}", f"mig {k}")
        else:
            self._nvml("nvmlDeviceGetComputeRunningProcesses", index, f"gpu {index}")
        return self._current(index)

    def utilization(self, index: int) -> Utilization:
        """The last :meth:`set_utilization` value, else the processes' summed SM utilization (at most
        100 %); NOT_SUPPORTED on a MIG-enabled GPU."""
        state = self._dev("nvmlDeviceGetUtilizationRates", index)
        if state.gpu.mig_enabled:
            raise nvml_error(call_source("nvmlDeviceGetUtilizationRates", f"gpu {index}"), NVML_ERROR_NOT_SUPPORTED)
        if state.utilization is not None:
            return state.utilization
        busy = sum(p.sm_util or 0 for p in self._current(index))
        return Utilization(min(100, round(busy)), 0)

    def mps_client_pids(self, index: int) -> frozenset[int]:
        """The current processes on the GPU but those scheduled with ``mps=False`` (a process set with
        :meth:`set_processes` counts as a client)."""
        self._handle(index)
        self._nvml("nvmlDeviceGetMPSComputeRunningProcesses", index, f"gpu {index}")
        outside = {sp.pid for sp in self._scheduled_now() if sp.gpu == index and sp.mps is False}
        return frozenset(p.pid for p in self._current(index) if p.pid not in outside)

    def _scheduled_now(self) -> list[ScheduledProcess]:
        scheduled = list(self._scheduled)
        if self._table is not None:
            scheduled += self._table.live()
        return scheduled

    def _current(self, index: int) -> tuple[GpuProcess, ...]:
        now = self._clock()
        scheduled = self._scheduled_now()
        out = list(self._state[index].processes)
        for sp in scheduled:
            if sp.gpu == index:
                proc = sp.at(now)
                if proc is not None:
                    out.append(proc)
        return tuple(sorted(out, key=lambda p: p.pid))

    # --- compute mode ------------------------------------------------------------------------------

    def compute_mode(self, index: int) -> str:
        """The last mode set (``DEFAULT`` at first, as after a reboot)."""
        return self._dev("nvmlDeviceGetComputeMode", index).compute_mode

    def set_compute_mode(self, index: int, mode: str) -> None:
        """Remember ``mode`` for :meth:`compute_mode`; an unknown name fails as in the real port."""
        compute_mode_value(index, mode)
        self._handle(index)
        self._nvml("nvmlDeviceSetComputeMode", index, f"gpu {index}", f"mode {mode}")
        self._state[index].compute_mode = mode

    # --- per-cgroup memory limits ----------------------------------------------------------------------

    def limits_path(self) -> Path | None:
        """Where the limits are kept (beside the description file), None for a fake without a file."""
        return self._path.with_name(self._path.name + ".memlimits.json") if self._path is not None else None

    def _read_limits(self) -> dict[str, dict[str, list[int]]]:
        """``{gpu index: {cgroup: [soft MiB, hard MiB]}}`` of the cgroups that still exist."""
        where = self.limits_path()
        if where is None:
            return self._limits
        try:
            data = json.loads(where.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as e:
            raise MachineDescriptionError(f"unreadable fake memory limits: {e}", source=str(where)) from None
        return {gpu: {cg: v for cg, v in by.items() if os.path.isdir(cg)} for gpu, by in data.items()}

    def _limits_call(self, function: str, index: int, cgroup: str) -> None:
        where = (f"gpu {index}", f"cgroup {cgroup}")
        state = self._dev(function, index, where[1])
        major = self._driver.split(".")[0]
        if major.isdigit() and int(major) < MEMORY_LIMITS_DRIVER:
            raise nvml_error(call_source(function, *where), NVML_ERROR_FUNCTION_NOT_FOUND,
                             detail=f"driver {self._driver} has no {function} (R{MEMORY_LIMITS_DRIVER} and later)")
        if state.gpu.mig_enabled:
            raise nvml_error(call_source(function, *where), NVML_ERROR_NOT_SUPPORTED,
                             detail="MIG is enabled on this GPU")
        if not os.path.isdir(cgroup):
            raise nvml_error(call_source(function, *where), NVML_ERROR_INVALID_ARGUMENT,
                             detail=f"no cgroup directory {cgroup}")

    def set_memory_limits(self, index: int, cgroup: str, soft_mib: int, hard_mib: int) -> None:
        """Remember the cgroup's limits on the GPU (see module docstring)."""
        self._limits_call("nvmlDeviceSetMemoryLimits_v1", index, cgroup)
        where = self.limits_path()
        with contextlib.ExitStack() as held:
            if where is not None:  # the Prolog and the monitor may set at once: one read-modify-write at a time
                held.enter_context(locked(where.with_name(where.name + ".lock"), mode=0o644))
            limits = self._read_limits()
            limits.setdefault(str(index), {})[cgroup] = [soft_mib, hard_mib]
            self._limits = limits
            if where is not None:
                write_atomic(where, json.dumps(limits, sort_keys=True), mode=0o644)

    def memory_limits(self, index: int, cgroup: str) -> MemoryLimits:
        """The cgroup's limits (none: ``0``/None), and what the processes in it hold on the GPU."""
        self._limits_call("nvmlDeviceGetMemoryLimits_v1", index, cgroup)
        kept = self._read_limits().get(str(index), {}).get(cgroup)
        soft, hard = (int(kept[0]), int(kept[1])) if kept else (0, None)
        return MemoryLimits(soft_mib=soft, hard_mib=hard, used_mib=self.cgroup_used_mib(index, cgroup))

    def cgroup_used_mib(self, index: int, cgroup: str, *, exclude: int | None = None) -> int:
        """What the current processes on the GPU that are in ``cgroup`` or below it hold, MiB (``exclude``: a pid
        left out). A process is in it when a line of its ``/proc/<pid>/cgroup`` names a path whose leading part
        ends the directory (``.../devices/slurm/uid_1/job_5`` holds ``5:devices:/slurm/uid_1/job_5/step_0``)."""
        total = 0
        for proc in self._current(index):
            if proc.pid != exclude and _in_cgroup(proc.pid, cgroup):
                total += proc.used_memory_mib
        return total

    def set_processes(self, index: int, processes: Iterable[GpuProcess]) -> None:
        """Replace the processes running on GPU ``index`` (what later ``processes()`` calls report).

        Raises:
            MachineDescriptionError: no such GPU.
        """
        self._state_of(index).processes = list(processes)

    def add_process(self, process: ScheduledProcess) -> None:
        """Add a process whose memory and SM utilization follow a schedule (see :class:`ScheduledProcess`).

        Raises:
            MachineDescriptionError: no such GPU.
        """
        self._state_of(process.gpu)
        self._scheduled.append(process)

    def remove_process(self, pid: int) -> None:
        """Forget the scheduled processes of ``pid`` (as NVML does when a process exits)."""
        self._scheduled = [p for p in self._scheduled if p.pid != pid]

    def set_utilization(self, index: int, gpu_percent: int, memory_percent: int = 0) -> None:
        """Set what ``utilization(index)`` reports from now on.

        Raises:
            MachineDescriptionError: no such GPU, or a percentage outside 0-100.
        """
        if not (0 <= gpu_percent <= 100 and 0 <= memory_percent <= 100):
            raise MachineDescriptionError(f"utilization {gpu_percent}%/{memory_percent}% is not a percentage",
                                          source=self._source)
        self._state_of(index).utilization = Utilization(gpu_percent, memory_percent)

    def _state_of(self, index: int) -> _GpuState:
        if not 0 <= index < len(self._state):
            raise MachineDescriptionError(f"no GPU with index {index}", source=self._source)
        return self._state[index]



def _in_cgroup(pid: int, cgroup: str) -> bool:
    """Whether the process ``pid`` is in the cgroup directory ``cgroup`` or below it (see
    :meth:`FakeNvml.cgroup_used_mib`)."""
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            text = f.read()
    except OSError:
        return False
    where = cgroup.rstrip("/")
    for line in text.splitlines():
        parts = line.split(":", 2)[-1].rstrip("/").split("/")
        if any(where.endswith("/".join(parts[:k])) for k in range(len(parts), 1, -1)):
            return True
    return False


# --- processes that change over time ------------------------------------------------------------------

#: Environment variable naming a :class:`ProcessTable` directory for the fake that
#: :func:`~slurm_gpushare.hardware.ports.open_nvml` builds.
PROCESS_TABLE_ENV = "GPUSHARE_FAKE_GPU_PROCESSES"


@dataclass(frozen=True)
class ScheduledProcess:
    """A fake compute process on one GPU whose memory and SM utilization change over time.

    Attributes:
        pid: the process id NVML reports.
        gpu: NVML index of the GPU (the parent GPU of a MIG device).
        start: when the schedule starts, seconds on the fake's clock (epoch seconds for a table).
        steps: ``(seconds after start, used MiB, SM percent or None)``, times ascending from the first;
            each step holds until the next. Before the first step the process is not on the GPU.
        gi_id: the MIG GPU instance the process runs in (MIG-enabled GPUs), else None.
        mps: a client of an MPS server (``nvmlDeviceGetMPSComputeRunningProcesses`` lists it) or not (a CUDA context
            of its own); None, not stated, counts as a client.

    Raises:
        MachineDescriptionError: no steps, times not ascending, negative memory, SM outside 0-100.
    """

    pid: int
    gpu: int
    start: float
    steps: tuple[tuple[float, int, float | None], ...]
    gi_id: int | None = None
    mps: bool | None = None

    def __post_init__(self) -> None:
        where = f"fake process {self.pid} on GPU {self.gpu}"
        if not self.steps:
            raise MachineDescriptionError(f"{where} has no steps", hint="give at least (0, MiB, SM%)")
        last = None
        for step in self.steps:
            if len(step) != 3:
                raise MachineDescriptionError(f"{where}: step {step!r} is not (seconds, MiB, SM%)")
            t, mib, sm = step
            if last is not None and t < last:
                raise MachineDescriptionError(f"{where}: step times {[s[0] for s in self.steps]} are not ascending")
            if not isinstance(mib, int) or mib < 0:
                raise MachineDescriptionError(f"{where}: memory {mib!r} is not a whole number of MiB >= 0")
            if sm is not None and not 0 <= sm <= 100:
                raise MachineDescriptionError(f"{where}: SM utilization {sm} is not a percentage (0-100)")
            last = t

    def at(self, now: float) -> GpuProcess | None:
        """What NVML reports for the process at time ``now``, or None before its first step."""
        elapsed = now - self.start
        current = None
        for t, mib, sm in self.steps:
            if t > elapsed:
                break
            current = GpuProcess(self.pid, mib, None if sm is None else float(sm), self.gi_id)
        return current

    def to_dict(self) -> dict:
        """The process as JSON-ready data (one entry of a process table file)."""
        return {"pid": self.pid, "gpu": self.gpu, "start": self.start, "gi_id": self.gi_id,
                "steps": [list(s) for s in self.steps], "mps": self.mps}

    @classmethod
    def from_dict(cls, data: dict, *, source: str = "") -> ScheduledProcess:
        """Read one entry of a process table file (:meth:`to_dict`).

        Raises:
            InputError: a missing or ill-typed key, naming ``source``.
        """
        try:
            mps = data.get("mps")
            if mps is not None and not isinstance(mps, bool):
                raise TypeError(f"mps must be true, false or null, not {mps!r}"[:120])
            entry = cls(pid=int(data["pid"]), gpu=int(data["gpu"]), start=float(data["start"]),
                        gi_id=None if data.get("gi_id") is None else int(data["gi_id"]),
                        steps=tuple((float(t), int(m), None if s is None else float(s)) for t, m, s in data["steps"]),
                        mps=mps)
            if not all(math.isfinite(x) for x in (entry.start, *(t for t, _m, _s in entry.steps))):
                raise ValueError("a start or step time that is not a finite number")
            return entry
        except (KeyError, TypeError, ValueError, OverflowError) as e:
            raise MachineDescriptionError(f"not a fake process entry ({e!r})", source=source) from None


class ProcessTable:
    """A directory through which processes tell a :class:`FakeNvml` (in another process) that they
    "run" on its GPUs: one ``<pid>.json`` file per process (a list of :class:`ScheduledProcess`, each
    with the registering process's start, ``born``: ``psutil.Process.create_time``, epoch seconds),
    written atomically. An entry counts while its pid is alive and is still the process that registered
    (same start: a pid the kernel gave to another process after the registrant was killed with SIGKILL
    has no CUDA context, which is all real NVML reports); other entries are ignored and removed by
    :meth:`prune`.

    Args:
        path: the directory (created on :meth:`register`; mode 1777 there, so that every job's user can
            register, like ``/tmp``).
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)

    def register(self, processes: Sequence[ScheduledProcess]) -> Path:
        """Write the entry of one pid (all its GPUs). Returns the file.

        Raises:
            InputError: processes of several pids, or none.
        """
        pids = {p.pid for p in processes}
        if len(pids) != 1:
            raise InputError(f"one table entry is one pid, not {sorted(pids) or 'none'}")
        self.path.mkdir(parents=True, exist_ok=True)
        try:
            os.chmod(self.path, 0o1777)
        except PermissionError:
            pass
        pid = pids.pop()
        born = _born(pid)
        target = self.path / f"{pid}.json"
        return write_atomic(target, json.dumps([{**p.to_dict(), "born": born} for p in processes]), fsync=False)

    def unregister(self, pid: int) -> None:
        """Remove the entry of ``pid``."""
        (self.path / f"{pid}.json").unlink(missing_ok=True)

    def live(self) -> list[ScheduledProcess]:
        """Entries of live pids.

        Raises:
            MachineDescriptionError: an entry that is not valid JSON of processes (names the file).
        """
        out: list[ScheduledProcess] = []
        try:
            files = sorted(self.path.glob("*.json"))
        except OSError:
            return out
        for f in files:
            pid = f.stem
            if not pid.isdigit() or not pid_alive(int(pid)):
                continue
            try:
                data = json.loads(f.read_text())
            except FileNotFoundError:
                continue
            except (OSError, ValueError) as e:
                raise MachineDescriptionError(f"unreadable fake process entry: {e}", source=str(f)) from None
            if not isinstance(data, list):
                raise MachineDescriptionError("a fake process entry is a JSON list", source=str(f))
            if not self._same_process(int(pid), data):
                continue
            # a process describes itself only: an entry naming another pid (another user's) is not read
            out.extend(e for e in (ScheduledProcess.from_dict(d, source=str(f)) for d in data) if e.pid == int(pid))
        return out

    @staticmethod
    def _same_process(pid: int, data: list) -> bool:
        """The entry's ``born`` is the start of the process that has ``pid`` now (an entry written without
        one, by hand in a test, counts while the pid lives)."""
        borns = {d.get("born") for d in data if isinstance(d, dict)}
        if borns in (set(), {None}):
            return True
        now = _born(pid)
        return now is not None and all(isinstance(b, (int, float)) and abs(b - now) < BORN_SLACK_S for b in borns)

    def prune(self) -> list[int]:
        """Remove entries of pids that are gone or that now name another process. Returns those pids."""
        gone = []
        for f in self.path.glob("*.json"):
            if not f.stem.isdigit():
                continue
            pid = int(f.stem)
            try:
                data = json.loads(f.read_text())
            except (OSError, ValueError):
                data = []
            if not pid_alive(pid) or not self._same_process(pid, data if isinstance(data, list) else []):
                f.unlink(missing_ok=True)
                gone.append(pid)
        return sorted(gone)


#: Seconds two reads of one process's start may differ by (the kernel counts it in clock ticks, 0.01 s).
BORN_SLACK_S = 0.05


def _born(pid: int) -> float | None:
    """The start of the process ``pid`` (``psutil.Process.create_time``, epoch seconds), None when gone."""
    proc = process(pid)
    if proc is None:
        return None
    try:
        return proc.create_time()
    except psutil.Error:
        return None
