"""Machine descriptions: a node's GPUs, their interconnect, NICs and CPU layout, as plain data.

A machine description is what the NVML port reports about one node, frozen. It is written by
``slurm-gpushare inventory`` (from NVML on a real node, or parsed from ``nvidia-smi topo -m`` text),
read by the fake NVML, the gres.conf generator, the filter service's cluster inventory and the node
hooks. It is also the file a user attaches to a bug report.

On disk it is JSON with a schema version (``"version": 1``); unknown keys and keys given twice in one
object are errors, so a typo in a hand-edited file is reported instead of ignored. Values are checked
against the ranges real hardware has (:data:`LIMITS`; the hostname must be a Slurm node name), so a
slip such as ``"memory_mib": 81920000000`` is refused with the key and the allowed range named.
Units: memory in MiB, CPU ids are Linux logical CPU numbers, core ids are Slurm's abstract core
indices (socket-major, SMT siblings share one id).

Example (abridged)::

    {"version": 1, "hostname": "node1", "source": "nvml",
     "cpus": {"sockets": 2, "cores_per_socket": 56, "threads_per_core": 2},
     "gpus": [{"index": 0, "minor": 0, "name": "NVIDIA A100 80GB PCIe", "memory_mib": 81920,
               "uuid": "GPU-...", "pci_bus_id": "00000000:07:00.0",
               "cpu_affinity": [0, 1, ...], "numa_node": 0}],
     "links": [{"a": 0, "b": 2, "nvlinks": 12}, {"a": 0, "b": 1, "pcie": "SYS"}],
     "nics": [{"index": 0, "name": "mlx5_0", "paths": ["PIX", "SYS"]}]}
"""

from __future__ import annotations

import functools
import json
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import MISSING, asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

from slurm_gpushare.errors import MachineDescriptionError, ParseError
from slurm_gpushare.memsize import MAX_MEMORY_MIB
from slurm_gpushare.textdoc import parse_json

SCHEMA_VERSION = 1

#: PCIe path levels, nearest first, as ``nvidia-smi topo -m`` prints them. NVML reports the same
#: levels through ``nvmlDeviceGetTopologyCommonAncestor`` (INTERNAL/SINGLE/MULTIPLE/HOSTBRIDGE/
#: NODE/SYSTEM). ``SOC`` is the legacy name of ``SYS`` printed by old drivers.
PCIE_LEVELS = ("PIX", "PXB", "PHB", "NODE", "SYS")

#: Allowed ranges ``(lowest, highest)`` of integer values, by key; ``None`` is "no upper bound". Each
#: with what the range comes from, quoted in the error message.
LIMITS: dict[str, tuple[int, int | None, str]] = {
    "gpu.index": (0, None, "the NVML index, counted from 0"),
    "gpu.minor": (0, 254, "the N of /dev/nvidiaN: the GPU device files are char devices 195:0-254, "
                          "195:255 is /dev/nvidiactl"),
    "gpu.memory_mib": (1, MAX_MEMORY_MIB, "MiB of GPU memory, at most 16 TiB"),
    "gpu.cpu_affinity": (0, None, "Linux logical CPU ids"),
    "gpu.numa_node": (0, 1023, "a Linux NUMA node id"),
    "cpus.sockets": (1, 64, "sockets per node, as slurmd -C reports them"),
    "cpus.cores_per_socket": (1, 1024, "cores per socket, as slurmd -C reports them"),
    "cpus.threads_per_core": (1, 16, "hardware threads per core, as slurmd -C reports them"),
    "link.nvlinks": (0, 64, "NVLink links between two GPUs"),
    "nic.index": (0, None, "the n of NICn, counted from 0"),
    "mig_profile.profile_id": (0, 255, "an NVML GPU instance profile id"),
    "mig_profile.slices": (1, 8, "compute slices of a GPU instance (a GPU has at most 8)"),
    "mig_profile.memory_mib": (1, MAX_MEMORY_MIB, "MiB of memory of one instance"),
    "mig_profile.max_instances": (0, 8, "instances that fit on one GPU"),
    "mig_profile.sm_count": (0, 1024, "streaming multiprocessors of one instance"),
    "mig_profile.placement_start": (0, 7, "first memory slice (a GPU has 8)"),
    "mig_profile.placement_size": (1, 8, "memory slices (a GPU has 8)"),
    "mig_instance.gi_id": (0, 14, "a GPU instance id (the driver numbers 15 per GPU)"),
    "mig_instance.ci_id": (0, 7, "a compute instance id (8 per GPU instance)"),
    "mig_instance.start": (0, 7, "first memory slice (a GPU has 8)"),
    "mig_instance.caps": (0, 2**20 - 1, "nvidia-caps minor numbers (20-bit Linux minors)"),
    "process.pid": (0, None, "a process id"),
    "process.used_memory_mib": (0, MAX_MEMORY_MIB, "MiB of GPU memory"),
}

#: What a Slurm node name may hold, for messages.
NODE_NAME_RULE = "a Slurm node name is letters, digits, '-', '_' and '.', without spaces"


def node_name_problem(name: object) -> str | None:
    """Why ``name`` cannot be a Slurm node name, or None when it can.

    A node name is what slurm.conf ``NodeName=`` and gres.conf ``NodeName=`` hold: letters, digits,
    ``-``, ``_`` and ``.``. White space splits a ``Key=Value`` line, and ``[``, ``]`` and ``,`` make a
    hostlist, so none of them can be part of one name.
    """
    if not isinstance(name, str) or not name:
        return "is empty"
    bad = sorted({ch for ch in name if not (ch.isascii() and (ch.isalnum() or ch in "-_."))})
    if bad:
        return "contains " + ", ".join(repr(ch) for ch in bad)
    return None


def limit_problem(key: str, value: int) -> str | None:
    """Why ``value`` is outside :data:`LIMITS` ``[key]``, as ``"allowed 0-254: <why>"``, or None."""
    lo, hi, why = LIMITS[key]
    if value < lo or (hi is not None and value > hi):
        allowed = f"{lo}-{hi}" if hi is not None else f"{lo} or more"
        return f"allowed {allowed}: {why}"
    return None


#: A MIG profile name as NVIDIA writes it (``nvidia-smi mig -lgip``/``-lcip``, NVML's profile names): an optional
#: compute instance part ``<C>c.``, then ``<G>g.<M>gb`` (GPU slices, memory in GB), then attributes such as
#: ``+me`` (media extensions), ``-me`` (without them) or ``+gfx``. Groups: C, G, M, the attributes.
PROFILE_NAME = r"(?:([0-9]+)c\.)?([1-9][0-9]*)g\.([0-9]+)gb((?:[+-][a-z][a-z.]*)*)"
_PROFILE_NAME = re.compile(PROFILE_NAME)


@dataclass(frozen=True)
class ProfileName:
    """A MIG profile name read (:meth:`parse`) and written (``str()``) by one rule, :data:`PROFILE_NAME`.

    Attributes:
        slices: GPU slices, the ``<G>g`` (compute slices of the GPU instance).
        memory_gb: the ``<M>gb``: NVIDIA's nominal memory, which the instance has a little less of
            (``1g.10gb`` is 9.75 GiB).
        compute_slices: the ``<C>c.`` of a compute instance profile; None for a GPU instance profile.
        attributes: ``+me``, ``-me``, ``+gfx`` ... as written, "" for none.
    """

    slices: int
    memory_gb: int
    compute_slices: int | None = None
    attributes: str = ""

    @classmethod
    def parse(cls, name: str, *, source: str | None = None) -> ProfileName:
        """``"1g.10gb+me"`` -> ``ProfileName(1, 10, None, "+me")`` (lower case; a ``MIG `` prefix is not part
        of it).

        Raises:
            ParseError: a name that is not :data:`PROFILE_NAME`.
        """
        m = _PROFILE_NAME.fullmatch(name)
        if m is None:
            raise ParseError(f"{name!r} is not a MIG profile name", hint="expected <N>g.<M>gb, e.g. 1g.10gb+me",
                             source=source)
        return cls(int(m.group(2)), int(m.group(3)), int(m.group(1)) if m.group(1) is not None else None,
                   m.group(4))

    def __str__(self) -> str:
        head = f"{self.compute_slices}c." if self.compute_slices is not None else ""
        return f"{head}{self.slices}g.{self.memory_gb}gb{self.attributes}"

    @property
    def nominal_mib(self) -> int:
        """The ``<M>gb`` in MiB, as sizes are asked for (``1g.10gb`` -> 10240)."""
        return self.memory_gb * 1024


@dataclass(frozen=True)
class MigProfile:
    """A GPU instance profile (``nvidia-smi mig -lgip``; NVML ``nvmlDeviceGetGpuInstanceProfileInfo``).

    Attributes:
        name: profile name without the ``MIG`` prefix, e.g. ``1g.10gb`` or ``1g.10gb+me``.
        profile_id: NVML GPU instance profile id (``ID`` column), e.g. 19.
        slices: compute slices (the ``Ng`` of the name).
        memory_mib: memory of one instance in MiB (``Memory`` column is GiB: 9.75 GiB = 9984 MiB).
        max_instances: instances of this profile that fit on an empty GPU (``Total``).
        sm_count: streaming multiprocessors per instance.
        placements: allowed ``(start, size)`` placements in memory slices
            (``nvmlDeviceGetGpuInstancePossiblePlacements_v2``). Empty when unknown.
    """

    name: str
    profile_id: int
    slices: int
    memory_mib: int
    max_instances: int
    sm_count: int = 0
    placements: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True)
class MigInstance:
    """A live MIG device: one GPU instance with one compute instance spanning it.

    Attributes:
        profile: the GPU instance profile name, e.g. ``1g.10gb``.
        gi_id: GPU instance id (``nvmlGpuInstanceGetInfo``).
        ci_id: compute instance id.
        start: placement start in memory slices.
        uuid: the MIG device UUID (``MIG-...``, ``nvmlDeviceGetUUID`` on the MIG device handle).
        caps: the ``/dev/nvidia-caps/nvidia-capN`` minors that grant access to the GPU instance
            and the compute instance (from ``/proc/driver/nvidia-caps/mig-minors``).
    """

    profile: str
    gi_id: int
    ci_id: int
    start: int
    uuid: str
    caps: tuple[int, ...] = ()


@dataclass(frozen=True)
class GpuProcess:
    """A process running on a GPU (``nvmlDeviceGetComputeRunningProcesses``), for accounting.

    Attributes:
        pid: process id.
        used_memory_mib: GPU memory used by the process, MiB.
        sm_util: SM utilization attributed to the process, percent of the GPU (0-100), or None when
            unknown (``nvmlDeviceGetProcessUtilization`` ``smUtil``; not supported on MIG GPUs).
        gi_id: on a MIG-enabled GPU, the GPU instance the process runs in (``gpuInstanceId`` of
            ``nvmlProcessInfo_t``); None on a GPU without MIG.
    """

    pid: int
    used_memory_mib: int
    sm_util: float | None = None
    gi_id: int | None = None


@dataclass(frozen=True)
class Gpu:
    """One physical GPU.

    Attributes:
        index: NVML device index (``nvmlDeviceGetIndex``), the ``GPUn`` of ``nvidia-smi``.
        minor: device minor number (``nvmlDeviceGetMinorNumber``), the ``N`` of ``/dev/nvidiaN``.
        name: product name (``nvmlDeviceGetName``), e.g. ``NVIDIA H100 80GB HBM3``.
        memory_mib: total framebuffer memory in MiB (``nvmlDeviceGetMemoryInfo().total``).
        uuid: ``GPU-...`` (``nvmlDeviceGetUUID``).
        pci_bus_id: ``00000000:07:00.0`` form, NVML's 8-digit domain (``nvmlDeviceGetPciInfo().busId``).
        cpu_affinity: logical CPU ids near the GPU (``nvmlDeviceGetCpuAffinity``; the
            ``CPU Affinity`` column of ``nvidia-smi topo -m``). Empty when unknown.
        numa_node: NUMA node of the GPU (``nvmlDeviceGetMemoryAffinity`` with
            ``NVML_AFFINITY_SCOPE_NODE``; the ``NUMA Affinity`` column of ``nvidia-smi topo -m``), or None.
            Parsed from ``topo -m`` output without that column (old drivers), it is derived from the
            CPU layout instead, not reported by NVML: the socket holding all the GPU's affinity CPUs
            (see :func:`slurm_gpushare.hardware.nvidia_smi.parse_topo_matrix`).
        mig_enabled: MIG mode is on (``nvmlDeviceGetMigMode`` current mode).
        mig_profiles: GPU instance profiles this GPU supports (empty when MIG is unsupported).
        mig_instances: live MIG devices.
        processes: processes running on the GPU (accounting; the fake NVML serves them).
    """

    index: int
    minor: int
    name: str
    memory_mib: int
    uuid: str = ""
    pci_bus_id: str = ""
    cpu_affinity: tuple[int, ...] = ()
    numa_node: int | None = None
    mig_enabled: bool = False
    mig_profiles: tuple[MigProfile, ...] = ()
    mig_instances: tuple[MigInstance, ...] = ()
    processes: tuple[GpuProcess, ...] = ()

    @property
    def model(self) -> str:
        """Short lower-case model for Slurm GRES ``Type=``, e.g. ``h100``, ``a100``, ``rtx4090``,
        ``rtx6000ada``: :func:`gpu_model` of :attr:`name` (one name per GPU model)."""
        return gpu_model(self.name)


@dataclass(frozen=True)
class Link:
    """The path between two GPUs (unordered pair, ``a < b``).

    Attributes:
        a, b: GPU indices.
        nvlinks: number of NVLink links in use between them (``nvmlDeviceGetNvLinkState`` +
            ``nvmlDeviceGetNvLinkRemotePciInfo``; the ``NV#`` of ``nvidia-smi topo -m``); 0 if none.
        via_nvswitch: the NVLinks go through an NVSwitch (``nvmlDeviceGetNvLinkRemoteDeviceType``
            is ``NVML_NVLINK_DEVICE_TYPE_SWITCH``).
        pcie: PCIe path level (one of :data:`PCIE_LEVELS`, from
            ``nvmlDeviceGetTopologyCommonAncestor``), or None when unknown (``topo -m`` prints only
            ``NV#`` for NVLinked pairs).
    """

    a: int
    b: int
    nvlinks: int = 0
    via_nvswitch: bool = False
    pcie: str | None = None


@dataclass(frozen=True)
class Nic:
    """A network interface (HCA) as ``nvidia-smi topo -m`` lists it.

    Attributes:
        index: the ``NICn`` number.
        name: device name from the NIC legend (``mlx5_0``), or ``NICn`` when not given.
        paths: PCIe level from this NIC to each GPU, by GPU index (None when unknown).
    """

    index: int
    name: str
    paths: tuple[str | None, ...] = ()


@dataclass(frozen=True)
class CpuLayout:
    """The node's CPU layout, as Slurm counts it (``slurmd -C``).

    Attributes:
        sockets, cores_per_socket, threads_per_core: as in slurm.conf ``NodeName=`` lines.
        core_of_cpu: Slurm core id of each logical CPU id (index = CPU id). Empty means the usual
            Linux enumeration: CPU ``c`` is core ``c % (sockets * cores_per_socket)``.
    """

    sockets: int
    cores_per_socket: int
    threads_per_core: int = 1
    core_of_cpu: tuple[int, ...] = ()

    def validate(self, *, source: str = "machine description", what: str = "cpus") -> None:
        """Check the counts against :data:`LIMITS` and ``core_of_cpu`` against them.

        Args:
            source: where the layout came from, for the message.
            what: how the message names the layout (``cpus`` in a description; ``""`` names only
                the counts).

        Raises:
            MachineDescriptionError: a count outside its range (the key and the range are named), or
                a ``core_of_cpu`` of the wrong length or with core ids outside the layout.
        """
        prefix = f"{what}." if what else ""
        for key in ("sockets", "cores_per_socket", "threads_per_core"):
            _limit(f"cpus.{key}", getattr(self, key), f"{prefix}{key}", source)
        if self.core_of_cpu:
            if len(self.core_of_cpu) != self.cpus:
                raise MachineDescriptionError(
                    f"{prefix}core_of_cpu has {len(self.core_of_cpu)} entries for {self.cpus} logical CPUs",
                    hint="one Slurm core id per logical CPU id, or [] for the usual Linux numbering",
                    source=source)
            bad = [c for c in self.core_of_cpu if not 0 <= c < self.cores]
            if bad:
                raise MachineDescriptionError(f"{prefix}core_of_cpu holds core id {bad[0]}, out of range",
                                              hint=f"allowed 0-{self.cores - 1}: the node's cores", source=source)

    @property
    def cores(self) -> int:
        """Total physical cores."""
        return self.sockets * self.cores_per_socket

    @property
    def cpus(self) -> int:
        """Total logical CPUs."""
        return self.cores * self.threads_per_core

    def core_ids(self, cpu_ids: Sequence[int]) -> tuple[int, ...]:
        """Map logical CPU ids to sorted unique Slurm core ids (SMT siblings collapse to one core).

        Raises:
            MachineDescriptionError: a CPU id outside the layout.
        """
        out = set()
        for c in cpu_ids:
            if c < 0 or c >= self.cpus:
                raise MachineDescriptionError(
                    f"CPU id {c} is outside the CPU layout ({self.cpus} logical CPUs: "
                    f"{self.sockets} sockets x {self.cores_per_socket} cores x {self.threads_per_core} threads)",
                    hint="give the CPU layout with --cpus SOCKETSxCORESxTHREADS")
            out.add(self.core_of_cpu[c] if self.core_of_cpu else c % self.cores)
        return tuple(sorted(out))


@dataclass(frozen=True)
class Machine:
    """A whole node: what one NVML session reports, frozen.

    Attributes:
        hostname: node name (``nvmlSystemGet*`` has none; from the probing host or the CLI).
        gpus: physical GPUs ordered by index.
        links: one entry per GPU pair that has a known path (NVLink and/or PCIe level).
        nics: network interfaces with their PCIe distance to each GPU.
        cpus: CPU layout, or None when unknown.
        source: where the facts came from (``nvml``, ``nvidia-smi topo -m <file>``, ...).
        driver_version: ``nvmlSystemGetDriverVersion``, when known.
        version: schema version of the description.
    """

    hostname: str
    gpus: tuple[Gpu, ...]
    links: tuple[Link, ...] = ()
    nics: tuple[Nic, ...] = ()
    cpus: CpuLayout | None = None
    source: str = ""
    driver_version: str = ""
    version: int = SCHEMA_VERSION

    def with_gpu_uuids(self, uuids: dict[int, str]) -> Machine:
        """The same machine with these GPU UUIDs (NVML index -> ``GPU-...``, as ``nvmlDeviceGetUUID``
        reports them; descriptions made from ``nvidia-smi topo -m`` text have none); GPUs not in
        ``uuids`` keep theirs."""
        return replace(self, gpus=tuple(replace(g, uuid=uuids.get(g.index, g.uuid)) for g in self.gpus))

    def gpu(self, index: int) -> Gpu:
        """The GPU with NVML index ``index``.

        Raises:
            MachineDescriptionError: no such GPU.
        """
        for g in self.gpus:
            if g.index == index:
                return g
        raise MachineDescriptionError(f"no GPU with index {index} on {self.hostname}",
                                      hint=f"indices are {[g.index for g in self.gpus]}")

    def link(self, a: int, b: int) -> Link | None:
        """The path between GPUs ``a`` and ``b`` (either order), or None when not described."""
        lo, hi = min(a, b), max(a, b)
        for ln in self.links:
            if ln.a == lo and ln.b == hi:
                return ln
        return None

    # --- JSON ---------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict (tuples become lists, defaults are kept)."""
        return _jsonable(asdict(self))

    def to_json(self) -> str:
        """Pretty JSON text with a trailing newline."""
        return json.dumps(self.to_dict(), indent=2) + "\n"

    @classmethod
    def from_dict(cls, data: Any, *, source: str = "machine description") -> Machine:
        """Build and validate a Machine from parsed JSON.

        Raises:
            MachineDescriptionError: wrong version, unknown or missing keys, wrong types,
                duplicate indices, links to GPUs that do not exist, unknown PCIe levels.
        """
        if not isinstance(data, dict):
            raise MachineDescriptionError("a machine description must be a JSON object", source=source)
        version = data.get("version")
        if version != SCHEMA_VERSION:
            raise MachineDescriptionError(
                f"unsupported machine description version {version!r}",
                hint=f"this slurm-gpushare reads version {SCHEMA_VERSION}; regenerate it with "
                     "'slurm-gpushare inventory'", source=source)
        m = _build(cls, data, source)
        m.validate(source=source)
        return m

    @classmethod
    def from_json(cls, text: str, *, source: str = "machine description") -> Machine:
        """Parse JSON text; see :meth:`from_dict`.

        Raises:
            MachineDescriptionError: not JSON (line and column named), nested deeper than the parser goes, a key
                given twice in one object (JSON parsers would silently keep the last), or an invalid description.
        """
        data = parse_json(text, source=source, error=MachineDescriptionError,
                          object_pairs_hook=functools.partial(_no_duplicate_keys, source=source))
        return cls.from_dict(data, source=source)

    @classmethod
    def load(cls, path: str | Path) -> Machine:
        """Read a machine description file.

        Raises:
            MachineDescriptionError: unreadable or invalid file (the message names the file).
        """
        p = Path(path)
        try:
            text = p.read_text(encoding="utf-8")
        except OSError as e:
            raise MachineDescriptionError(f"cannot read machine description: {e.strerror or e}",
                                          source=str(p)) from None
        except UnicodeDecodeError:
            raise MachineDescriptionError(f"{p} is not text (UTF-8)",
                                          hint="a machine description is JSON as 'slurm-gpushare inventory' "
                                               "writes it") from None
        return cls.from_json(text, source=str(p))

    def validate(self, *, source: str = "machine description") -> None:
        """Check values and cross-references.

        Values: the hostname is a Slurm node name (:func:`node_name_problem`), GPU names are not
        empty, integers lie in :data:`LIMITS` (the message names the key, e.g. ``gpus[2].minor``, and
        the allowed range). Cross-references: unique GPU indices and minors, links and NIC paths to
        real GPUs, CPU affinity inside the CPU layout.

        Raises:
            MachineDescriptionError: the first inconsistency found.
        """
        problem = node_name_problem(self.hostname)
        if problem is not None:
            raise MachineDescriptionError(f"hostname {self.hostname!r} {problem}", hint=NODE_NAME_RULE,
                                          source=source)
        if self.cpus is not None:
            self.cpus.validate(source=source)
        for i, g in enumerate(self.gpus):
            _validate_gpu(g, f"gpus[{i}]", source)
        for i, ln in enumerate(self.links):
            _limit("link.nvlinks", ln.nvlinks, f"links[{i}].nvlinks", source)
        for i, nic in enumerate(self.nics):
            _limit("nic.index", nic.index, f"nics[{i}].index", source)
        idx = [g.index for g in self.gpus]
        for what, values in (("indices", idx), ("minor numbers", [g.minor for g in self.gpus])):
            if len(set(values)) != len(values):
                raise MachineDescriptionError(
                    f"duplicate GPU {what} {_repeated(values)}", source=source,
                    hint="each GPU has its own; regenerate the description with 'slurm-gpushare inventory'")
        known = set(idx)
        seen = set()
        for ln in self.links:
            if ln.a not in known or ln.b not in known or ln.a >= ln.b:
                raise MachineDescriptionError(
                    f"link {ln.a}-{ln.b} must join two different existing GPUs with a < b", source=source)
            if (ln.a, ln.b) in seen:
                raise MachineDescriptionError(f"link {ln.a}-{ln.b} is described twice", source=source)
            seen.add((ln.a, ln.b))
            if ln.pcie is not None and ln.pcie not in PCIE_LEVELS:
                raise MachineDescriptionError(f"link {ln.a}-{ln.b}: unknown PCIe level {ln.pcie!r}",
                                              hint=f"use one of {', '.join(PCIE_LEVELS)}", source=source)
        for nic in self.nics:
            if nic.paths and len(nic.paths) != len(self.gpus):
                raise MachineDescriptionError(
                    f"NIC {nic.name}: {len(nic.paths)} paths for {len(self.gpus)} GPUs", source=source)
            for p in nic.paths:
                if p is not None and p not in PCIE_LEVELS:
                    raise MachineDescriptionError(f"NIC {nic.name}: unknown PCIe level {p!r}", source=source)
        for g in self.gpus:
            if self.cpus is not None and g.cpu_affinity:
                self.cpus.core_ids(g.cpu_affinity)


def _limit(key: str, value: int, path: str, source: str) -> None:
    problem = limit_problem(key, value)
    if problem is not None:
        raise MachineDescriptionError(f"{path} is {value}, out of range", hint=problem, source=source)


def _validate_gpu(g: Gpu, path: str, source: str) -> None:
    for key in ("index", "minor", "memory_mib"):
        _limit(f"gpu.{key}", getattr(g, key), f"{path}.{key}", source)
    if not g.name.strip():
        raise MachineDescriptionError(f"{path}.name is empty",
                                      hint="give the product name as nvidia-smi prints it, "
                                           "e.g. 'NVIDIA A100 80GB PCIe'", source=source)
    if gpu_model(g.name) == "gpu":  # nothing but brand, memory and packaging words (or no ASCII letters)
        raise MachineDescriptionError(f"{path}.name {g.name!r} names no GPU model: its GRES type would be the "
                                      "bare 'gpu', which any other unnamed model would share",
                                      hint="give the product name as nvidia-smi prints it, "
                                           "e.g. 'NVIDIA A100 80GB PCIe'", source=source)
    for c in g.cpu_affinity:
        _limit("gpu.cpu_affinity", c, f"{path}.cpu_affinity", source)
    if g.numa_node is not None:
        _limit("gpu.numa_node", g.numa_node, f"{path}.numa_node", source)
    for j, p in enumerate(g.mig_profiles):
        where = f"{path}.mig_profiles[{j}]"
        if not p.name.strip():
            raise MachineDescriptionError(f"{where}.name is empty", hint="e.g. 1g.10gb", source=source)
        for key in ("profile_id", "slices", "memory_mib", "max_instances", "sm_count"):
            _limit(f"mig_profile.{key}", getattr(p, key), f"{where}.{key}", source)
        for start, size in p.placements:
            _limit("mig_profile.placement_start", start, f"{where}.placements", source)
            _limit("mig_profile.placement_size", size, f"{where}.placements", source)
            if start + size > 8:
                raise MachineDescriptionError(f"{where}.placements: [{start}, {size}] ends after memory slice 8",
                                              hint="a placement [start, size] lies within the GPU's 8 "
                                                   "memory slices", source=source)
    for j, inst in enumerate(g.mig_instances):
        where = f"{path}.mig_instances[{j}]"
        if not inst.profile.strip():
            raise MachineDescriptionError(f"{where}.profile is empty", hint="e.g. 1g.10gb", source=source)
        for key in ("gi_id", "ci_id", "start"):
            _limit(f"mig_instance.{key}", getattr(inst, key), f"{where}.{key}", source)
        for c in inst.caps:
            _limit("mig_instance.caps", c, f"{where}.caps", source)
    for j, proc in enumerate(g.processes):
        where = f"{path}.processes[{j}]"
        _limit("process.pid", proc.pid, f"{where}.pid", source)
        _limit("process.used_memory_mib", proc.used_memory_mib, f"{where}.used_memory_mib", source)
        if proc.sm_util is not None and not 0 <= proc.sm_util <= 100:
            raise MachineDescriptionError(f"{where}.sm_util is {proc.sm_util}, out of range",
                                          hint="allowed 0-100: percent", source=source)
        if proc.gi_id is not None:
            _limit("mig_instance.gi_id", proc.gi_id, f"{where}.gi_id", source)


def cpu_layout_problem(gpus: Sequence[Gpu], layout: CpuLayout) -> tuple[int, str] | None:
    """Check a given CPU layout (``--cpus``) against the GPUs' CPU and NUMA affinity.

    What must hold, whatever the layout (``CPU Affinity`` and ``NUMA Affinity`` of ``nvidia-smi topo
    -m``, ``nvmlDeviceGetCpuAffinity`` and ``nvmlDeviceGetMemoryAffinity``):

    - every affinity CPU is one of the layout's logical CPUs;
    - an affinity list is the CPUs of one NUMA node, so it holds every hardware thread of each core it
      touches (in the layout's numbering: ``core_of_cpu``, else CPU ``c`` and ``c + cores`` are one
      core's threads);
    - two runs of C CPUs with the second a fixed offset O above the first are Linux's numbering of SMT
      siblings (:func:`slurm_gpushare.hardware.nvidia_smi.infer_cpu_layout`): O cores of 2 threads;
    - GPUs on one NUMA node have the same list, GPUs on two nodes have disjoint lists;
    - where the NUMA column shows more than one node, a node lies within one socket (sub-NUMA
      clustering splits sockets, never joins them; only a one-node host, node interleaving, spans
      sockets), and a higher node never lies on a lower socket than a lower node (Linux numbers
      nodes in firmware (SRAT) order, socket by socket).

    Returns:
        None when the layout fits; else ``(index of the first GPU at fault, message)``, the message
        naming the GPU, its column values and what the layout makes of them.
    """
    what = f"{layout.sockets}x{layout.cores_per_socket}x{layout.threads_per_core}"
    for i, g in enumerate(gpus):
        outside = [c for c in g.cpu_affinity if c < 0 or c >= layout.cpus]
        if outside:
            return i, (f"GPU {g.index}: CPU Affinity holds CPU {outside[0]}, but the CPU layout {what} has "
                       f"{layout.cpus} logical CPUs (0-{layout.cpus - 1})")
    if not layout.core_of_cpu:
        smt = _smt_signature(gpus)
        if smt is not None and (layout.threads_per_core, layout.cores) != (2, smt[1]):
            i, offset = smt[0], smt[1]
            return i, (f"GPU {gpus[i].index}: CPU Affinity is two runs {offset} CPUs apart, Linux's numbering of "
                       f"SMT siblings on {offset} cores x 2 threads; the CPU layout {what} has "
                       f"{layout.cores} cores x {layout.threads_per_core} thread(s)")
    core_of = layout.core_of_cpu or tuple(c % layout.cores for c in range(layout.cpus))
    for i, g in enumerate(gpus):
        cores = {core_of[c] for c in g.cpu_affinity}
        whole = {c for c in range(layout.cpus) if core_of[c] in cores}
        part = sorted(whole - set(g.cpu_affinity))
        if part:
            return i, (f"GPU {g.index}: CPU Affinity holds part of core {core_of[part[0]]} but not its CPU "
                       f"{part[0]} under the CPU layout {what}; a NUMA node's CPU list holds whole cores")
    for i, g in enumerate(gpus):
        for h in gpus[:i]:
            if g.numa_node is None or h.numa_node is None or not g.cpu_affinity or not h.cpu_affinity:
                continue
            same_node, shared = g.numa_node == h.numa_node, set(g.cpu_affinity) & set(h.cpu_affinity)
            if same_node and g.cpu_affinity != h.cpu_affinity or not same_node and shared:
                return i, (f"GPU {g.index} (NUMA node {g.numa_node}) and GPU {h.index} (NUMA node {h.numa_node}) "
                           f"have {'different' if same_node else 'overlapping'} CPU Affinity lists: the "
                           "NUMA and CPU columns disagree")
    nodes = {g.numa_node for g in gpus if g.numa_node is not None}
    if len(nodes) < 2 and not any(n > 0 for n in nodes):
        return None
    socket_of: dict[int, int] = {}
    for i, g in enumerate(gpus):
        if g.numa_node is None or not g.cpu_affinity:
            continue
        sockets = sorted({core_of[c] // layout.cores_per_socket for c in g.cpu_affinity})
        if len(sockets) > 1:
            return i, (f"GPU {g.index} is on NUMA node {g.numa_node}, but the CPU layout {what} puts its CPU "
                       f"Affinity on sockets {', '.join(map(str, sockets))}; a NUMA node lies within one socket")
        socket_of[i] = sockets[0]
    for i, s in socket_of.items():
        for j, t in socket_of.items():
            a, b = gpus[i].numa_node, gpus[j].numa_node
            if a is not None and b is not None and a > b and s < t:
                return i, (f"GPU {gpus[i].index} is on NUMA node {a} and GPU {gpus[j].index} on node {b}, but the "
                           f"CPU layout {what} puts the first on socket {s} and the second on socket {t}")
    return None


def _smt_signature(gpus: Sequence[Gpu]) -> tuple[int, int] | None:
    """``(first GPU, offset)`` when some affinity list is two equal runs ``offset`` apart, else None."""
    for i, g in enumerate(gpus):
        runs: list[list[int]] = []
        for c in g.cpu_affinity:
            if runs and c == runs[-1][1] + 1:
                runs[-1][1] = c
            else:
                runs.append([c, c])
        if len(runs) == 2 and runs[0][1] - runs[0][0] == runs[1][1] - runs[1][0]:
            return i, runs[1][0] - runs[0][0]
    return None


#: MIG capability device minors, as the driver numbers them in ``/proc/driver/nvidia-caps/mig-minors``
#: (NVIDIA MIG user guide, "Device Nodes and Capabilities": the file lists ``config 1``, ``monitor 2``,
#: then ``gpu0/gi0/access 3``, ``gpu0/gi0/ci0/access 4`` ..): per GPU 15 GPU instances (ids 0-14),
#: each its ``access`` minor followed by the ``access`` minors of compute instances 0-7, GPU by GPU.
#: ``gpu<G>`` is the GPU's minor number (``nvmlDeviceGetMinorNumber``, the N of ``/dev/nvidiaN``):
#: Slurm's gpu_nvml.c looks the file up with ``minor_number`` from 22.05 on (21.08 used the NVML
#: index, and logged ``/dev/nvidia1`` next to ``gpu0`` capabilities, NVIDIA/deepops#1214).
#: Checked against every MIG ``Index=`` of the real ``slurmd -G`` print in ``tests/data/slurmd``:
#: 291, 336, 345, 354 (GPU 2: GPU instances 2, 7, 8, 9) and 417, 507, 516, 525 (GPU 3: 1, 11, 12, 13).
MIG_CAPS_FIRST = 3
MIG_CAPS_PER_GI = 9
MIG_CAPS_PER_GPU = 15 * MIG_CAPS_PER_GI


def mig_cap_minors(gpu_minor: int, gi_id: int, ci_id: int) -> tuple[int, int]:
    """The ``nvidia-capN`` minors that grant access to a GPU instance and one of its compute instances.

    The numbering of the driver's ``/proc/driver/nvidia-caps/mig-minors`` table (``gpu<G>/gi<I>/access``
    = ``3 + 135 G + 9 I``, ``gpu<G>/gi<I>/ci<C>/access`` = that + 1 + C; see :data:`MIG_CAPS_FIRST`).
    On a node the product reads the table itself (:mod:`slurm_gpushare.hardware.nvml`), as Slurm and
    NVIDIA's container tools do: the driver documents the table, not the formula. This is for
    descriptions without a node to read it on (recorded ``nvidia-smi mig -lgi``/``-lci``, the fake
    NVML, generated test machines).

    Returns:
        ``(gi_access_minor, ci_access_minor)``.
    """
    gi = MIG_CAPS_FIRST + gpu_minor * MIG_CAPS_PER_GPU + gi_id * MIG_CAPS_PER_GI
    return gi, gi + 1 + ci_id


#: Words of an NVML product name that name the vendor or a brand, not the GPU: dropped from the type.
MODEL_BRAND_WORDS = frozenset({"nvidia", "tesla", "geforce", "quadro", "grid"})
#: Words that name the packaging, the memory or the edition of one GPU model, not another model: dropped.
#: ``PCIe``/``SXM``/``NVL``/``SFF`` are form factors (NVIDIA's H100 NVL and RTX 4000 SFF Ada are the
#: H100 and the RTX 4000 Ada in another board), ``Max-Q`` a power limit, ``HBM3`` the memory kind,
#: ``Generation``, ``Edition``, ``Server``, ``Workstation`` and ``GPU`` fill words of the marketing name.
MODEL_PACKAGING_WORDS = frozenset({"pcie", "sxm", "nvl", "sff", "max-q", "generation", "edition", "server", "ac",
                                   "workstation", "gpu", "dgxs", "fhhl"})
_MEMORY_WORD = re.compile(r"\d+(?:\.\d+)?(?:gb|g|mb|tb)|hbm\d*e?|sxm\d*|pcie\d*|gddr\d*x?", re.IGNORECASE)


def mig_cap_owner(minor: int) -> tuple[int, int, int | None] | None:
    """What a ``nvidia-capN`` minor grants, in the numbering of :func:`mig_cap_minors`.

    Returns:
        ``(gpu_minor, gi_id, None)`` for a GPU instance's access minor, ``(gpu_minor, gi_id, ci_id)``
        for a compute instance's, None for ``config`` (1), ``monitor`` (2) and anything below.
    """
    if minor < MIG_CAPS_FIRST:
        return None
    gpu, rest = divmod(minor - MIG_CAPS_FIRST, MIG_CAPS_PER_GPU)
    gi, slot = divmod(rest, MIG_CAPS_PER_GI)
    return gpu, gi, (slot - 1 if slot else None)


@functools.lru_cache(maxsize=1024)
def nominal_gpu_mib(memory_mib: int) -> int:
    """A whole GPU's nominal memory: its total memory rounded to the nearest GiB, in MiB.

    ``81559`` (H100 80GB, NVML ``nvmlDeviceGetMemoryInfo().total``) -> ``81920`` (80 GiB);
    ``24564`` (RTX 4090) -> ``24576``; ``81920`` (A100 80GB) -> ``81920``.
    """
    gib = int(memory_mib / 1024 + 0.5)
    return gib * 1024 if gib > 0 else memory_mib


def nominal_profile_mib(profile: MigProfile) -> int:
    """A MIG profile's nominal memory, from its name (:class:`ProfileName`): ``1g.10gb`` (9984 MiB) -> ``10240``
    (10 GiB).

    Profiles whose name is not :data:`PROFILE_NAME` give their real memory.
    """
    try:
        return ProfileName.parse(profile.name.lower()).nominal_mib
    except ParseError:
        return profile.memory_mib


@functools.lru_cache(maxsize=4096)  # pure, and asked for every GPU of every node each time a pool is built
def gpu_model(name: str) -> str:
    """Short lower-case GPU model for GRES ``Type=`` from an NVML product name (``nvmlDeviceGetName``).

    The rule (docs/admin-guide.md, "GPU type names"): split the name at white space and ``_``; cut
    each word at its first ``-`` (``A100-SXM4-80GB`` -> ``A100``: what follows is the board and the
    memory); drop the brand words (:data:`MODEL_BRAND_WORDS`), memory sizes (``80GB``, ``144G``),
    memory kinds (``HBM3``) and packaging words (:data:`MODEL_PACKAGING_WORDS`); join what is left in
    lower case. So one GPU model gets one name whatever its board or memory size, and two models get
    two names:

    ``NVIDIA H100 80GB HBM3`` -> ``h100``; ``NVIDIA A100-SXM4-80GB`` and ``NVIDIA A100 80GB PCIe`` ->
    ``a100``; ``NVIDIA GeForce RTX 4090`` -> ``rtx4090``; ``Tesla V100-SXM2-16GB`` -> ``v100``;
    ``NVIDIA L40S`` -> ``l40s``; ``Quadro RTX 6000`` -> ``rtx6000`` but ``NVIDIA RTX 6000 Ada
    Generation`` -> ``rtx6000ada``; ``NVIDIA RTX A6000`` -> ``rtxa6000``; ``NVIDIA GeForce RTX 3090
    Ti`` -> ``rtx3090ti``; ``NVIDIA TITAN V`` -> ``titanv``; ``NVIDIA RTX PRO 6000 Blackwell Server
    Edition`` -> ``rtxpro6000blackwell``.

    Slurm's own names (``AutoDetect=nvml``, ``gpu_common_underscorify_tolower`` in
    ``src/plugins/gpu/common/gpu_common.c``) are the whole product name in lower case with ``_`` for
    spaces (``nvidia_h100_80gb_hbm3``), so they differ by memory size and board as well.
    """
    words = []
    for raw in re.split(r"[\s_]+", name.strip()):
        low = raw.lower()
        if not low or low in MODEL_BRAND_WORDS or low in MODEL_PACKAGING_WORDS:
            continue
        word = low.split("-")[0]
        if not word or word in MODEL_BRAND_WORDS or word in MODEL_PACKAGING_WORDS \
                or _MEMORY_WORD.fullmatch(word):
            continue
        words.append(re.sub(r"[^a-z0-9]", "", word))
    return "".join(w for w in words if w) or "gpu"


def _repeated(values: Sequence[int], shown: int = 10) -> str:
    """The values given more than once, each once, sorted: the first ``shown`` and how many more."""
    twice = sorted(v for v, n in Counter(values).items() if n > 1)
    text = ", ".join(str(v) for v in twice[:shown])
    return text + (f" and {len(twice) - shown} more" if len(twice) > shown else "")


def _no_duplicate_keys(pairs: list[tuple[str, Any]], *, source: str) -> dict[str, Any]:
    """``object_pairs_hook`` of :meth:`Machine.from_json`: a key given twice is an error."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise MachineDescriptionError(f"key {key!r} is given twice in one object",
                                          hint="give each key once; JSON readers would silently keep the last",
                                          source=source)
        out[key] = value
    return out


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    return obj


def _build(cls: type, data: Any, source: str, where: str = "") -> Any:
    """Strictly build dataclass ``cls`` from ``data``: unknown keys and missing required keys are errors."""
    if not isinstance(data, dict):
        raise MachineDescriptionError(f"{where or cls.__name__} must be an object", source=source)
    names = {f.name: f for f in fields(cls)}
    unknown = sorted(set(data) - set(names))
    if unknown:
        raise MachineDescriptionError(f"unknown key(s) {', '.join(unknown)} in {where or cls.__name__}",
                                      hint=f"known keys: {', '.join(names)}", source=source)
    kwargs = {}
    for name, f in names.items():
        if name not in data:
            if f.default is MISSING and f.default_factory is MISSING:
                raise MachineDescriptionError(f"missing key {name!r} in {where or cls.__name__}", source=source)
            continue
        value = data[name]
        sub = _SUBTYPES.get((cls, name))
        path = f"{where or cls.__name__}.{name}"
        if sub is not None and sub[1] == "list":
            if not isinstance(value, list):
                raise MachineDescriptionError(f"{path} must be a list", source=source)
            value = tuple(_build(sub[0], v, source, f"{path}[{i}]") for i, v in enumerate(value))
        elif sub is not None and value is not None:
            value = _build(sub[0], value, source, path)
        else:
            value = _check_scalar(value, _SCALARS.get((cls, name), "any"), path, source)
        kwargs[name] = value
    return cls(**kwargs)


def _check_scalar(value: Any, kind: str, path: str, source: str) -> Any:
    ok = {
        "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "int?": lambda v: v is None or (isinstance(v, int) and not isinstance(v, bool)),
        "str": lambda v: isinstance(v, str),
        "str?": lambda v: v is None or isinstance(v, str),
        "bool": lambda v: isinstance(v, bool),
        "float?": lambda v: v is None or (isinstance(v, (int, float)) and not isinstance(v, bool)),
        "ints": lambda v: isinstance(v, list) and all(isinstance(x, int) and not isinstance(x, bool) for x in v),
        "strs?": lambda v: isinstance(v, list) and all(x is None or isinstance(x, str) for x in v),
        "pairs": lambda v: isinstance(v, list) and all(
            isinstance(x, list) and len(x) == 2 and all(isinstance(y, int) for y in x) for x in v),
        "any": lambda v: True,
    }[kind]
    if not ok(value):
        raise MachineDescriptionError(f"{path} has the wrong type ({type(value).__name__}), expected {kind}",
                                      source=source)
    if kind == "pairs":
        return tuple(tuple(x) for x in value)
    if kind in ("ints", "strs?"):
        return tuple(value)
    return value


_SUBTYPES: dict[tuple[type, str], tuple[type, str]] = {
    (Machine, "gpus"): (Gpu, "list"),
    (Machine, "links"): (Link, "list"),
    (Machine, "nics"): (Nic, "list"),
    (Machine, "cpus"): (CpuLayout, "one"),
    (Gpu, "mig_profiles"): (MigProfile, "list"),
    (Gpu, "mig_instances"): (MigInstance, "list"),
    (Gpu, "processes"): (GpuProcess, "list"),
}

_SCALARS: dict[tuple[type, str], str] = {
    (Machine, "hostname"): "str", (Machine, "source"): "str", (Machine, "driver_version"): "str",
    (Machine, "version"): "int",
    (Gpu, "index"): "int", (Gpu, "minor"): "int", (Gpu, "name"): "str", (Gpu, "memory_mib"): "int",
    (Gpu, "uuid"): "str", (Gpu, "pci_bus_id"): "str", (Gpu, "cpu_affinity"): "ints",
    (Gpu, "numa_node"): "int?", (Gpu, "mig_enabled"): "bool",
    (Link, "a"): "int", (Link, "b"): "int", (Link, "nvlinks"): "int", (Link, "via_nvswitch"): "bool",
    (Link, "pcie"): "str?",
    (Nic, "index"): "int", (Nic, "name"): "str", (Nic, "paths"): "strs?",
    (CpuLayout, "sockets"): "int", (CpuLayout, "cores_per_socket"): "int",
    (CpuLayout, "threads_per_core"): "int", (CpuLayout, "core_of_cpu"): "ints",
    (MigProfile, "name"): "str", (MigProfile, "profile_id"): "int", (MigProfile, "slices"): "int",
    (MigProfile, "memory_mib"): "int", (MigProfile, "max_instances"): "int", (MigProfile, "sm_count"): "int",
    (MigProfile, "placements"): "pairs",
    (MigInstance, "profile"): "str", (MigInstance, "gi_id"): "int", (MigInstance, "ci_id"): "int",
    (MigInstance, "start"): "int", (MigInstance, "uuid"): "str", (MigInstance, "caps"): "ints",
    (GpuProcess, "pid"): "int", (GpuProcess, "used_memory_mib"): "int", (GpuProcess, "sm_util"): "float?",
    (GpuProcess, "gi_id"): "int?",
}
