"""Build a machine description from an NVML port, real or fake.

:func:`probe_machine` is the one code path from NVML facts to a
:class:`~slurm_gpushare.hardware.machine.Machine`; ``slurm-gpushare inventory`` runs it on a real
node and the tests run it against :class:`~slurm_gpushare.hardware.fake.FakeNvml`, whose round trip
``probe_machine(FakeNvml(m), hostname=m.hostname, cpus=m.cpus) == m`` checks both.

NICs are not NVML facts (they come from ``nvidia-smi topo -m`` or sysfs), so a probed machine has
none; nor is the CPU layout, which the caller passes in.
"""

from __future__ import annotations

import re

from slurm_gpushare.errors import NvmlError
from slurm_gpushare.hardware.machine import CpuLayout, Gpu, Link, Machine
from slurm_gpushare.hardware.port import NVML_ERROR_NOT_SUPPORTED, NvLinkPeer, NvmlPort

_BUS_ID = re.compile(r"^(?:([0-9A-Fa-f]{1,8}):)?([0-9A-Fa-f]{1,2}):([0-9A-Fa-f]{1,2})\.([0-7])$")


def normalize_bus_id(bus_id: str) -> str:
    """A PCI bus id in NVML's form (``00000000:07:00.0``, upper case), whatever its domain width.

    ``0000:07:00.0`` (sysfs), ``07:00.0`` and ``00000000:07:00.0`` name the same device. Text that is
    not a bus id is returned upper-cased, so that it still compares equal to itself.
    """
    m = _BUS_ID.match(bus_id.strip())
    if not m:
        return bus_id.strip().upper()
    domain, bus, dev, fn = m.groups()
    return f"{int(domain or '0', 16):08X}:{int(bus, 16):02X}:{int(dev, 16):02X}.{fn}"


def probe_machine(port: NvmlPort, *, hostname: str, cpus: CpuLayout | None = None) -> Machine:
    """Describe the node behind ``port``: GPUs, GPU-pair links, MIG profiles and instances, processes.

    The port must be open (``with port: ...``). Facts and their NVML sources:

    - GPU identity, memory, CPU affinity, NUMA node: one port call each (see :class:`NvmlPort`).
    - MIG: ``mig_mode``; a GPU answering ``NVML_ERROR_NOT_SUPPORTED`` has no MIG. Profiles and live
      instances are read only while MIG is enabled (NVML reports none otherwise).
    - Links: one :class:`~slurm_gpushare.hardware.machine.Link` per GPU pair, with the PCIe level
      from ``topology_common_ancestor``. NVLinks are counted from ``nvlink_peers``: a direct link
      counts when its remote bus id is the other GPU's, and a pair's count is the smaller of the two
      ends' counts (a link counts when both ends report it up). NVSwitch fabrics: NVML shows a
      switched GPU's links ending at switches, not at GPUs, so every pair of GPUs that both have
      switch links gets ``via_nvswitch=True`` and ``nvlinks`` = the smaller of their switch link
      counts (all-to-all through the fabric, as ``nvidia-smi topo -m`` prints ``NV18`` on a DGX H100).
      Direct links take precedence when a pair has both. Links to IBM NPUs (POWER9 CPUs) are ignored.

    Args:
        port: an open NVML port.
        hostname: the node name (NVML does not know it).
        cpus: the CPU layout (``slurmd -C``), or None when unknown.

    Returns:
        The description, with ``source`` ``"nvml"``, validated.

    Raises:
        NvmlError: an NVML call failed; the source is prefixed with the GPU or GPU pair being probed.
        MachineDescriptionError: NVML answered facts that do not make a valid description (e.g. a CPU
            affinity outside the given CPU layout).
    """
    try:
        driver = port.driver_version()
        count = port.device_count()
    except NvmlError as e:
        raise e.with_context(f"probing {hostname}") from e
    gpus = tuple(_probe_gpu(port, i) for i in range(count))
    peers = {}
    for g in gpus:
        try:
            peers[g.index] = port.nvlink_peers(g.index)
        except NvmlError as e:
            raise e.with_context(f"probing NVLinks of GPU {g.index}") from e
    links = []
    for a in range(count):
        for b in range(a + 1, count):
            try:
                pcie = port.topology_common_ancestor(a, b)
            except NvmlError as e:
                raise e.with_context(f"probing the path GPU {a} - GPU {b}") from e
            links.append(_link(gpus, peers, a, b, pcie))
    machine = Machine(hostname=hostname, gpus=gpus, links=tuple(links), cpus=cpus, source="nvml",
                      driver_version=driver)
    machine.validate(source=f"NVML on {hostname}")
    return machine


def _probe_gpu(port: NvmlPort, i: int) -> Gpu:
    try:
        try:
            mig = port.mig_mode(i)
        except NvmlError as e:
            if e.code != NVML_ERROR_NOT_SUPPORTED:
                raise
            mig = None
        enabled = bool(mig and mig.current)
        return Gpu(
            index=i,
            minor=port.minor_number(i),
            name=port.name(i),
            memory_mib=port.memory_total_mib(i),
            uuid=port.uuid(i),
            pci_bus_id=port.pci_bus_id(i),
            cpu_affinity=tuple(port.cpu_affinity(i)),
            numa_node=port.numa_node(i),
            mig_enabled=enabled,
            mig_profiles=port.gpu_instance_profiles(i) if enabled else (),
            mig_instances=port.gpu_instances(i) if enabled else (),
            processes=port.processes(i),
        )
    except NvmlError as e:
        raise e.with_context(f"probing GPU {i}") from e


def _link(gpus: tuple[Gpu, ...], peers: dict[int, tuple[NvLinkPeer, ...]], a: int, b: int, pcie: str) -> Link:
    def direct(here: int, there: int) -> int:
        bus = normalize_bus_id(gpus[there].pci_bus_id)
        return sum(1 for p in peers[here] if p.remote_type == "GPU" and normalize_bus_id(p.remote_bus_id) == bus)

    def switched(here: int) -> int:
        return sum(1 for p in peers[here] if p.remote_type == "SWITCH")

    n = min(direct(a, b), direct(b, a))
    if n:
        return Link(a=a, b=b, nvlinks=n, pcie=pcie)
    n = min(switched(a), switched(b))
    if n:
        return Link(a=a, b=b, nvlinks=n, via_nvswitch=True, pcie=pcie)
    return Link(a=a, b=b, pcie=pcie)
