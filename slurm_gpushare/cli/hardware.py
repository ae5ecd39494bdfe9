"""``inventory`` and ``topology``: read a node's hardware into a machine description and show it.

A machine comes from one of three sources, the same for every command that takes one:
a machine description file (``MACHINE.json``), ``--from-topo FILE`` (``nvidia-smi topo -m`` text,
with ``--gpu-name``/``--memory`` because the matrix does not show them), or NVML on this host.
"""

from __future__ import annotations

import functools
import json
import os
import socket
import sys
from dataclasses import replace
from pathlib import Path

import click

from slurm_gpushare.cli import main
from slurm_gpushare.errors import InputError
from slurm_gpushare.hardware.machine import CpuLayout, Machine


def parse_cpus(text: str | None) -> CpuLayout | None:
    """``2x56x2`` -> CpuLayout(sockets=2, cores_per_socket=56, threads_per_core=2).

    Raises:
        InputError: not three positive integers joined by ``x``.
    """
    if text is None:
        return None
    parts = text.lower().split("x")
    try:
        nums = [int(p) for p in parts]
    except ValueError:
        nums = []
    if len(nums) not in (2, 3) or min(nums) <= 0:
        raise InputError(f"--cpus {text!r} is not a CPU layout",
                         hint="write SOCKETSxCORESxTHREADS as slurmd -C reports it, e.g. 2x56x2")
    return CpuLayout(nums[0], nums[1], nums[2] if len(nums) == 3 else 1)


def machine_options(func):
    """Options that select where a machine description comes from (see module docstring)."""
    options = [
        click.option("--from-topo", "from_topo", type=click.Path(dir_okay=False, allow_dash=True),
                     help="parse 'nvidia-smi topo -m' output from FILE ('-' for stdin) instead of probing NVML"),
        click.option("--gpu-name", help="GPU product name for --from-topo, e.g. 'NVIDIA H100 80GB HBM3'"),
        click.option("--memory", "memory", help="memory of each GPU for --from-topo: 80G, 81559M (base 1024)"),
        click.option("--mig-table", type=click.Path(exists=True, dir_okay=False),
                     help="'nvidia-smi mig -lgip' output: MIG profiles for --from-topo"),
        click.option("--cpus", help="CPU layout SOCKETSxCORESxTHREADS (as slurmd -C); default: inferred/probed"),
        click.option("--hostname", help="node name written into the description (default: this host)"),
    ]
    for opt in reversed(options):
        func = opt(func)
    return func


def load_machine(path: str | None = None, *, from_topo: str | None = None, gpu_name: str | None = None,
                 memory: str | None = None, mig_table: str | None = None, cpus: str | None = None,
                 hostname: str | None = None) -> Machine:
    """Build a Machine from a description file, ``nvidia-smi topo -m`` text, or NVML on this host.

    Raises:
        InputError: conflicting sources, bad option values, unparsable text (file and line named).
        NvmlError: NVML failed while probing (the NVML call is named).
    """
    layout = parse_cpus(cpus)
    if path and from_topo:
        raise InputError("give either a machine description file or --from-topo, not both")
    if path:
        m = Machine.load(path)
        if hostname:
            m = replace(m, hostname=hostname)
        return m
    host = hostname or socket.gethostname().split(".")[0]
    if from_topo:
        from slurm_gpushare.memsize import parse_mib
        from slurm_gpushare.nvidia_smi import parse_mig_profiles, parse_topo_matrix

        name = "<stdin>" if from_topo == "-" else os.path.basename(from_topo)
        text = sys.stdin.read() if from_topo == "-" else _read(from_topo)
        if memory is None:
            raise InputError("--from-topo needs --memory: 'nvidia-smi topo -m' does not show GPU memory",
                             hint="add --memory 80G (see 'nvidia-smi --query-gpu=memory.total --format=csv')")
        m = parse_topo_matrix(text, source=name, hostname=host, gpu_name=gpu_name,
                              memory_mib=parse_mib(memory, default_unit="M", what="--memory"), cpus=layout)
        if mig_table:
            profiles = parse_mig_profiles(_read(mig_table), source=os.path.basename(mig_table))
            m = replace(m, gpus=tuple(replace(g, mig_profiles=profiles.get(g.index, ())) for g in m.gpus))
        return m
    if gpu_name or memory or mig_table:
        raise InputError("--gpu-name, --memory and --mig-table go with --from-topo",
                         hint="NVML reports names, memory and MIG profiles itself")
    from slurm_gpushare.hardware.hostcpu import read_cpu_layout
    from slurm_gpushare.hardware.ports import ENV, open_nvml
    from slurm_gpushare.hardware.probe import probe_machine

    port = open_nvml()
    if layout is None and os.environ.get(ENV, "nvml").startswith("fake:"):
        layout = Machine.load(os.environ[ENV][5:]).cpus  # a simulated node has its described CPUs
    with port:
        return probe_machine(port, hostname=host, cpus=layout or read_cpu_layout())


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError as e:
        raise InputError(f"cannot read {path}: {e.strerror}") from None


def write_atomically(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file and a rename: never a half-written file."""
    p = Path(path)
    tmp = p.with_name(f".{p.name}.tmp{os.getpid()}")
    try:
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise InputError(f"cannot write {p}: {e.strerror}") from None


def with_machine(func):
    """Decorator: a positional MACHINE.json plus :func:`machine_options`, passed as ``machine``."""
    @click.argument("machine_file", required=False, type=click.Path(dir_okay=False))
    @machine_options
    @functools.wraps(func)
    def wrapper(machine_file, from_topo, gpu_name, memory, mig_table, cpus, hostname, **kwargs):
        m = load_machine(machine_file, from_topo=from_topo, gpu_name=gpu_name, memory=memory,
                         mig_table=mig_table, cpus=cpus, hostname=hostname)
        return func(machine=m, **kwargs)
    return wrapper


@main.command()
@with_machine
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="write the description to FILE (default: stdout)")
def inventory(machine: Machine, output: str | None) -> None:
    """Write this node's machine description (JSON): GPUs, NVLinks, PCIe paths, NICs, CPUs, MIG.

    Probes NVML on this host, or parses --from-topo FILE. The file is what the gres.conf generator,
    the filter service and the node hooks read, and what to attach to a bug report.
    """
    text = machine.to_json()
    if output:
        write_atomically(output, text)
        click.echo(f"wrote {output}: {machine.hostname}, {len(machine.gpus)} GPU(s)", err=True)
    else:
        click.echo(text, nl=False)


@main.command()
@with_machine
@click.option("--json", "as_json", is_flag=True, help="print the topology as JSON")
def topology(machine: Machine, as_json: bool) -> None:
    """Show the hop matrix, the Slurm Links= weights, NVLink islands and NUMA groups of a node.

    Hops: 0 same GPU; 1-1.5 direct NVLink (more links nearer); 2 through NVSwitch; 3 PIX, 3.2 PXB,
    3.4 PHB, 3.6 NODE, 3.8 SYS (PCIe only).
    """
    from slurm_gpushare.topology import Topology, format_table

    topo = Topology.from_machine(machine)
    if as_json:
        click.echo(json.dumps(topo.to_dict(), indent=2))
    else:
        click.echo(format_table(topo))
