"""The CPU layout of the host, from Linux sysfs, in Slurm's core numbering.

Slurm numbers cores socket-major (socket 0's cores first) and gives SMT siblings one core id; Linux
numbers logical CPUs its own way (siblings usually come after all first threads). gres.conf
``Cores=`` needs Slurm's numbers, so the mapping is read here once per probe.
"""

from __future__ import annotations

from pathlib import Path

from slurm_gpushare.errors import HardwareError
from slurm_gpushare.hardware.machine import CpuLayout

SYSFS_CPU = Path("/sys/devices/system/cpu")


def read_cpu_layout(root: str | Path = SYSFS_CPU) -> CpuLayout:
    """Read sockets, cores and threads, and the Slurm core id of every logical CPU.

    Sources: ``cpuN/topology/physical_package_id`` and ``cpuN/topology/core_id`` under
    ``/sys/devices/system/cpu`` (what hwloc, and so slurmd, reads).

    Raises:
        HardwareError: sysfs has no CPU topology, or sockets differ in core or thread counts
            (Slurm's ``Sockets``/``CoresPerSocket``/``ThreadsPerCore`` cannot describe them).
    """
    root = Path(root)
    cpus: dict[int, tuple[int, int]] = {}
    for d in root.glob("cpu[0-9]*"):
        try:
            cpu = int(d.name[3:])
            pkg = int((d / "topology" / "physical_package_id").read_text())
            core = int((d / "topology" / "core_id").read_text())
        except (OSError, ValueError):
            continue
        cpus[cpu] = (pkg, core)
    if not cpus:
        raise HardwareError(f"no CPU topology under {root}", hint="pass the layout with --cpus SOCKETSxCORESxTHREADS")
    sockets = sorted({p for p, _c in cpus.values()})
    cores_of = {s: sorted({c for p, c in cpus.values() if p == s}) for s in sockets}
    per_socket = {len(v) for v in cores_of.values()}
    if len(per_socket) != 1:
        raise HardwareError(f"sockets have different core counts {sorted(per_socket)}",
                            hint="pass the layout with --cpus SOCKETSxCORESxTHREADS")
    cps = per_socket.pop()
    slurm_core = {(s, c): i * cps + j for i, s in enumerate(sockets) for j, c in enumerate(cores_of[s])}
    threads = {sum(1 for v in cpus.values() if v == key) for key in slurm_core}
    if len(threads) != 1:
        raise HardwareError(f"cores have different thread counts {sorted(threads)}",
                            hint="pass the layout with --cpus SOCKETSxCORESxTHREADS")
    n = max(cpus) + 1
    if set(cpus) != set(range(n)):
        raise HardwareError(f"logical CPU ids are not contiguous (0..{n - 1}); some CPUs are offline",
                            hint="bring all CPUs online or pass --cpus SOCKETSxCORESxTHREADS")
    core_of_cpu = tuple(slurm_core[cpus[c]] for c in range(n))
    layout = CpuLayout(len(sockets), cps, threads.pop())
    default = tuple(c % layout.cores for c in range(n))
    return layout if core_of_cpu == default else CpuLayout(layout.sockets, cps, layout.threads_per_core, core_of_cpu)
