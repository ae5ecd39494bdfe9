"""``inventory`` and ``topology``: read a node's hardware into a machine description and show it.

A machine comes from one of three sources, the same for every command that takes one:
a machine description file (``MACHINE.json``), ``--from-topo FILE`` (``nvidia-smi topo -m`` text,
with ``--gpu-name``/``--memory`` because the matrix does not show them), or NVML on this host.
``topology`` uses neither the GPU names nor their memory, so with ``--from-topo`` it needs neither:
it fills in the placeholders :data:`PLACEHOLDER_GPU_NAME` and :data:`PLACEHOLDER_MEMORY_MIB`.

Every bad value, unreadable or non-text file and unwritable output is one line
(``slurm-gpushare: error: ...``, exit status 2): files are checked here, not by click, whose usage
errors take four lines.
"""

from __future__ import annotations

import functools
import json
import os
import re
import socket
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TypeVar

import click

from slurm_gpushare.atomicfile import write_all_atomic
from slurm_gpushare.cli import main
from slurm_gpushare.errors import InputError, MachineDescriptionError, ParseError
from slurm_gpushare.hardware.machine import MAX_MEMORY_MIB, NODE_NAME_RULE, CpuLayout, Machine, node_name_problem

#: GPU name ``topology --from-topo`` uses when none is given (the hop matrix does not need one).
PLACEHOLDER_GPU_NAME = "unknown GPU"
#: GPU memory ``topology --from-topo`` uses when none is given: 1 MiB, a placeholder, never shown.
PLACEHOLDER_MEMORY_MIB = 1

T = TypeVar("T")


def parse_cpus(text: str | None) -> CpuLayout | None:
    """``2x56x2`` -> CpuLayout(sockets=2, cores_per_socket=56, threads_per_core=2).

    Raises:
        InputError: not two or three positive integers joined by ``x``, or counts outside the ranges
            a machine description allows (:data:`~slurm_gpushare.hardware.machine.LIMITS`).
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
    layout = CpuLayout(nums[0], nums[1], nums[2] if len(nums) == 3 else 1)
    try:
        layout.validate(what="")
    except MachineDescriptionError as e:
        raise InputError(f"--cpus {text!r}: {e.message}", hint=e.hint) from None
    return layout


def check_node_name(value: str | None, option: str) -> None:
    """Refuse an option value that cannot be a Slurm node name (``--hostname``, ``--node-name``).

    Raises:
        InputError: empty, or a character other than letters, digits, ``-``, ``_`` and ``.``.
    """
    if value is None:
        return
    problem = node_name_problem(value)
    if problem is not None:
        raise InputError(f"{option} {value!r} {problem}", hint=NODE_NAME_RULE)


def machine_options(func):
    """Options that select where a machine description comes from (see module docstring)."""
    options = [
        click.option("--from-topo", "from_topo", type=click.Path(allow_dash=True),
                     help="parse 'nvidia-smi topo -m' output from FILE ('-' for stdin) instead of probing NVML"),
        click.option("--gpu-name", help="GPU product name for --from-topo, e.g. 'NVIDIA H100 80GB HBM3' "
                                        "(inventory and gres-conf need it; the GRES type comes from it); a box of "
                                        "mixed models: per GPU, '0-1=NVIDIA A100 80GB PCIe;2-3=NVIDIA L40S'"),
        click.option("--memory", "memory", help="memory of each GPU for --from-topo, with its unit: 80G, 81559M "
                                                "(base 1024; inventory and gres-conf need it); per GPU: "
                                                "'0-1=80G;2-3=46068M'"),
        click.option("--mig-table", type=click.Path(),
                     help="'nvidia-smi mig -lgip' output: MIG profiles for --from-topo"),
        click.option("--cpus", help="CPU layout SOCKETSxCORESxTHREADS (as slurmd -C); default: inferred/probed "
                                    "(--from-topo: needed where the CPU Affinity lists do not show it)"),
        click.option("--host", "topo_host", metavar="NAME",
                     help="with --from-topo: the host whose matrix to read from a file of several (under "
                          "'clush -b' / 'dshbak -c' host headers; also the default --hostname), or @N for the "
                          "file's Nth matrix where they have no host headers"),
        click.option("--hostname", help="node name written into the description (default: this host)"),
    ]
    for opt in reversed(options):
        func = opt(func)
    return func


def load_machine(path: str | None = None, *, from_topo: str | None = None, gpu_name: str | None = None,
                 memory: str | None = None, mig_table: str | None = None, cpus: str | None = None,
                 hostname: str | None = None, topo_host: str | None = None, placeholders: bool = False) -> Machine:
    """Build a Machine from a description file, ``nvidia-smi topo -m`` text, or NVML on this host.

    Args:
        topo_host: ``--host``: with ``--from-topo``, the host whose matrix to take from a text of
            several (:func:`~slurm_gpushare.hardware.nvidia_smi.topo_sections`; a header's hostlist
            such as ``gpu[01-02]`` names each of its hosts); the default node name.
        placeholders: with ``--from-topo``, fill in :data:`PLACEHOLDER_GPU_NAME` and
            :data:`PLACEHOLDER_MEMORY_MIB` where ``gpu_name``/``memory`` are not given, for commands
            that use neither (``topology``). Otherwise both are required, and so is a CPU layout
            wherever a GPU's CPU Affinity is known: given (``--cpus``) or inferred, never guessed.

    Raises:
        InputError: conflicting sources, options that do not go with the source, bad option values,
            unreadable or non-UTF-8 files, unparsable text (file and line named), a CPU layout the
            matrix does not show and ``--cpus`` does not give, ``--host`` without a matrix for it.
        NvmlError: NVML failed while probing (the NVML call is named).
    """
    check_node_name(hostname, "--hostname")
    if gpu_name is not None and not gpu_name.strip():
        raise InputError("--gpu-name is empty", hint="give the product name, e.g. 'NVIDIA A100 80GB PCIe'")
    names = per_gpu(gpu_name, "--gpu-name", str.strip) if gpu_name else None
    sizes = per_gpu(memory, "--memory", _memory_mib) if memory else None
    layout = parse_cpus(cpus)
    if path and from_topo:
        raise InputError("give either a machine description file or --from-topo, not both")
    by_position = topo_host is not None and _POSITION.fullmatch(topo_host) is not None
    if not by_position:
        check_node_name(topo_host, "--host")
    if not from_topo and (gpu_name or memory or mig_table or topo_host):
        raise InputError("--gpu-name, --memory, --mig-table and --host go with --from-topo",
                         hint="NVML and machine descriptions have the names, memory and MIG profiles")
    if path:
        if cpus is not None:
            raise InputError("--cpus goes with --from-topo or NVML probing",
                             hint="a machine description has its own CPU layout, its \"cpus\"")
        m = Machine.load(path)
        if hostname:
            m = replace(m, hostname=hostname)
        return m
    host = hostname or (None if by_position else topo_host) or socket.gethostname().split(".")[0]
    if from_topo:
        from slurm_gpushare.hardware.nvidia_smi import cpu_layout_unknown, parse_topo_matrix

        if placeholders:
            gpu_name = gpu_name or PLACEHOLDER_GPU_NAME
        else:
            _require_topo_options(gpu_name, memory)
        memory_mib = _first(sizes) if sizes is not None else PLACEHOLDER_MEMORY_MIB
        name = "<stdin>" if from_topo == "-" else os.path.basename(from_topo)
        what = "'nvidia-smi topo -m' output"
        text = _read_stdin(what) if from_topo == "-" else _read(from_topo, what)
        m = parse_topo_matrix(text, source=name, hostname=host, gpu_name=_first(names) if names else gpu_name,
                              memory_mib=memory_mib,
                              cpus=layout, section=_topo_section(text, name, topo_host))
        m = _per_gpu_facts(m, names, sizes, name)
        if m.cpus is None and not placeholders and any(g.cpu_affinity for g in m.gpus):
            raise InputError(f"{name}: the CPU layout cannot be read from the matrix: {cpu_layout_unknown(m.gpus)}",
                             hint="give --cpus SOCKETSxCORESxTHREADS as 'slurmd -C' prints it on the node (lscpu: "
                                  "Socket(s) x Core(s) per socket x Thread(s) per core): gres.conf Cores= are "
                                  "core ids, which need it")
        if layout is None and m.cpus is not None and m.cpus.sockets > 2 and not placeholders:
            # more NUMA nodes than a GPU server's usual two sockets: most likely sub-socket NUMA
            c = m.cpus
            click.echo(f"{name}: CPU layout read from the CPU Affinity lists as {c.sockets} sockets x "
                       f"{c.cores_per_socket} cores x {c.threads_per_core} threads, one socket per NUMA node; "
                       "the matrix does not show sockets: on a node with several NUMA nodes per socket (AMD "
                       "NPS2/NPS4, Intel SNC) give --cpus as 'slurmd -C' prints it (Slurm 24.11+ widens "
                       "Cores= to whole sockets)", err=True)
        if mig_table:
            m = _with_mig_tables(m, _read(mig_table, "'nvidia-smi mig -lgip' output"), os.path.basename(mig_table))
        return m
    from slurm_gpushare.hardware.hostcpu import read_cpu_layout
    from slurm_gpushare.hardware.ports import ENV, open_nvml
    from slurm_gpushare.hardware.probe import probe_machine

    port = open_nvml()
    if layout is None and os.environ.get(ENV, "nvml").startswith("fake:"):
        layout = Machine.load(os.environ[ENV][5:]).cpus  # a simulated node has its described CPUs
    with port:
        m = probe_machine(port, hostname=host, cpus=layout or read_cpu_layout())
    if cpus is not None and layout is not None:
        from slurm_gpushare.hardware.machine import cpu_layout_problem

        problem = cpu_layout_problem(m.gpus, layout)
        if problem is not None:
            raise InputError(f"--cpus {cpus}: {problem[1]} (NVML's CPU and memory affinity)",
                             hint="leave --cpus out to read the layout from sysfs, or give it as 'slurmd -C' prints it")
    return m


def _topo_section(text: str, name: str, host: str | None) -> int | None:
    """The matrix ``--host`` asks for (an index into ``topo_sections``), or None without ``--host``.

    Raises:
        InputError: ``--host`` with no matrix under a header naming it, or with several.
    """
    from slurm_gpushare.errors import ParseError
    from slurm_gpushare.hardware.nvidia_smi import topo_sections
    from slurm_gpushare.slurm.hostlist import expand_hostlist

    if host is None:
        return None
    sections = topo_sections(text)
    position = _POSITION.fullmatch(host)
    if position:
        n = int(position.group(1))
        if not 1 <= n <= len(sections):
            raise InputError(f"--host {host}: {name} holds {len(sections)} 'nvidia-smi topo -m' matrices",
                             hint=f"give @1 to @{len(sections)}, in the order of the file" if sections else None)
        return n - 1
    found: list[int] = []
    for i, (label, _at) in enumerate(sections):
        if not label:
            continue
        try:
            hosts = expand_hostlist(label)
        except ParseError:
            hosts = (label,)
        if host in hosts:
            found.append(i)
    if len(found) > 1:
        raise InputError(f"--host {host}: {name} has {len(found)} 'nvidia-smi topo -m' outputs for it (at lines "
                         f"{', '.join(str(sections[i][1]) for i in found)}), and nothing says which is current",
                         hint="keep one output per host in the file (collect again into a new file)")
    if found:
        return found[0]
    labels = [label for label, _at in sections if label]
    raise InputError(f"--host {host}: {name} has no 'nvidia-smi topo -m' output under a header naming it"
                     + (f" (hosts: {', '.join(labels)})" if labels else " (its matrices have no host headers)"),
                     hint="give one of the hosts of the file, or @N for its Nth matrix (with --hostname), or leave "
                          "--host out for a file of one matrix")


def _with_mig_tables(m: Machine, text: str, source: str) -> Machine:
    """Add what a ``--mig-table`` file holds to a machine parsed from ``nvidia-smi topo -m``.

    The file holds ``nvidia-smi mig -lgip`` (the profiles), and may go on with ``-lgi`` and ``-lci``
    (the live GPU and compute instances: each compute instance becomes a MIG device, its GPU marked
    MIG-enabled, its ``nvidia-caps`` minors numbered as the driver does from the GPU's minor) and
    ``nvidia-smi -L`` (checked: the MIG devices it lists per GPU must be the ones ``-lci`` gives).

    Raises:
        ParseError: a table that does not parse, ``-lgi`` without ``-lci`` or the reverse, instances
            of a GPU the matrix does not have, or a ``-L`` listing that disagrees with ``-lci``.
    """
    from slurm_gpushare.hardware.nvidia_smi import mig_devices, parse_gpu_list, parse_mig_instances, parse_mig_profiles

    profiles = parse_mig_profiles(text, source=source)
    tables = parse_mig_instances(text, source=source)
    gpus = []
    known = {g.index for g in m.gpus}
    used = {r.gpu for r in tables.gpu_instances} | {r.gpu for r in tables.compute_instances}
    strays = sorted(used - known)
    if strays:
        raise ParseError(f"MIG instances on GPU {strays[0]}, which the topology matrix does not have",
                         hint="record the tables and 'nvidia-smi topo -m' on the same node", source=source)
    for g in m.gpus:
        g = replace(g, mig_profiles=profiles.get(g.index, ()))
        if tables.has_gpu_instances or tables.has_compute_instances:
            devices = mig_devices(tables, g.index, g.minor, source=source)
            if devices:
                g = replace(g, mig_enabled=True, mig_instances=devices)
        gpus.append(g)
    if "(UUID: GPU-" in text:
        listed = {lg.index: sorted(x.profile for x in lg.migs) for lg in parse_gpu_list(text, source=source)}
        for g in gpus:
            lci = sorted(i.profile for i in g.mig_instances)
            if g.index in listed and (tables.has_compute_instances or listed[g.index]) and listed[g.index] != lci:
                raise ParseError(f"GPU {g.index}: 'nvidia-smi -L' lists MIG devices {listed[g.index]}, "
                                 f"'nvidia-smi mig -lci' gives {lci}", source=source,
                                 hint="record all the outputs at the same moment (MIG devices changed between them?)")
    return replace(m, gpus=tuple(gpus))


#: ``--host @N``: the Nth matrix of the file (1-based), for a file of several without host headers.
_POSITION = re.compile(r"@(\d+)")
#: ``0-1=...;2-3=...``: a value per GPU (indices as ``nvidia-smi topo -m`` numbers them).
_PER_GPU = re.compile(r"^\s*\d+(?:-\d+)?(?:,\d+(?:-\d+)?)*\s*=")


def _memory_mib(text: str) -> int:
    from slurm_gpushare.memsize import parse_mib

    return parse_mib(text.strip(), default_unit=None, what="--memory", maximum=MAX_MEMORY_MIB)


def per_gpu(value: str, option: str, parse: Callable[[str], T]) -> T | dict[int, T]:
    """``--gpu-name``/``--memory`` for ``--from-topo``: one value for every GPU, or one per GPU for a box of mixed
    models, ``INDICES=VALUE`` items separated by ``;`` (``0-1=NVIDIA A100 80GB PCIe;2-3=NVIDIA L40S``, the GPU
    indices of ``nvidia-smi topo -m``) -> the value, or ``{GPU index: value}``.

    Raises:
        InputError: an item that is not ``INDICES=VALUE``, an empty value, a GPU named twice.
    """
    if not _PER_GPU.match(value):
        return parse(value)
    from slurm_gpushare.hardware.nvidia_smi import parse_cpu_list

    out: dict[int, T] = {}
    for item in value.split(";"):
        indices, sep, text = item.partition("=")
        if not sep or not _PER_GPU.match(item) or not text.strip():
            example = ("'0-1=NVIDIA A100 80GB PCIe;2-3=NVIDIA L40S'" if option == "--gpu-name"
                       else "'0-1=80G;2-3=46068M'")
            raise InputError(f"{option} item {item.strip()!r} is not INDICES=VALUE", hint=f"e.g. {option} {example}")
        for index in parse_cpu_list(indices.strip(), source=option):
            if index in out:
                raise InputError(f"{option} names GPU {index} twice")
            out[index] = parse(text)
    return out


def _first(given: T | dict[int, T]) -> T:
    """The one value, or the first GPU's of a per-GPU value (:func:`per_gpu`)."""
    return next(iter(given.values())) if isinstance(given, dict) else given


def _per_gpu_facts(m: Machine, names: str | dict[int, str] | None, sizes: int | dict[int, int] | None,
                   source: str) -> Machine:
    """The machine with the per-GPU names and memory sizes of :func:`per_gpu` (each must cover every GPU)."""
    gpus = m.gpus
    if isinstance(names, dict):
        _covers(names, gpus, "--gpu-name", source)
        gpus = tuple(replace(g, name=names[g.index]) for g in gpus)
    if isinstance(sizes, dict):
        _covers(sizes, gpus, "--memory", source)
        gpus = tuple(replace(g, memory_mib=sizes[g.index]) for g in gpus)
    return replace(m, gpus=gpus)


def _covers(given: dict, gpus, option: str, source: str) -> None:
    """A per-GPU value names each GPU of the matrix, and no other.

    Raises:
        InputError: naming the GPUs missing and those the matrix does not have.
    """
    indices = {g.index for g in gpus}
    missing, extra = sorted(indices - set(given)), sorted(set(given) - indices)
    if missing or extra:
        raise InputError(f"{option} per GPU must name each GPU of {source} ({len(gpus)}: "
                         f"{','.join(str(i) for i in sorted(indices))})"
                         + (f"; missing {','.join(map(str, missing))}" if missing else "")
                         + (f"; no GPU {','.join(map(str, extra))} in the matrix" if extra else ""))


def _require_topo_options(gpu_name: str | None, memory: str | None) -> None:
    """``--from-topo`` needs what the matrix does not show: the GPU name and memory."""
    if gpu_name is None and memory is None:
        raise InputError("--from-topo needs --gpu-name and --memory: 'nvidia-smi topo -m' shows neither",
                         hint="add them as 'nvidia-smi --query-gpu=name,memory.total --format=csv' prints "
                              "them, e.g. --gpu-name 'NVIDIA A100 80GB PCIe' --memory 80G")
    if gpu_name is None:
        raise InputError("--from-topo needs --gpu-name: 'nvidia-smi topo -m' does not show the GPU model, "
                         "and the GRES Type= comes from it",
                         hint="add it as 'nvidia-smi --query-gpu=name --format=csv' prints it, "
                              "e.g. --gpu-name 'NVIDIA A100 80GB PCIe'")
    if memory is None:
        raise InputError("--from-topo needs --memory: 'nvidia-smi topo -m' does not show GPU memory",
                         hint="add it as 'nvidia-smi --query-gpu=memory.total --format=csv' prints it, "
                              "e.g. --memory 80G")


def _read(path: str, what: str) -> str:
    """A text file given on the command line; one clear line when it cannot be read or is not text."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise InputError(f"cannot read {path}: {e.strerror or e}", hint=f"give {what} as a file") from None
    except UnicodeDecodeError:
        raise InputError(f"{path} is not text (UTF-8)", hint=f"give {what} as recorded") from None


def _read_stdin(what: str) -> str:
    """Standard input as UTF-8 text (its bytes, whatever the locale's decoding would do to them)."""
    try:
        buffer = getattr(sys.stdin, "buffer", None)
        return buffer.read().decode("utf-8") if buffer is not None else sys.stdin.read()
    except UnicodeDecodeError:
        raise InputError("<stdin> is not text (UTF-8)", hint=f"pipe {what} as recorded") from None


def write_atomically(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file and a rename: never a half-written file."""
    write_files_atomically({path: text})


def write_files_atomically(files: dict[str | Path, str]) -> None:
    """Write several files, each through a temporary file next to it, renamed only when all are written
    (:func:`~slurm_gpushare.atomicfile.write_all_atomic`).

    A failure (missing directory, permissions, a directory in the way, a full disk) leaves no
    temporary file and no target changed, and becomes one line naming the file.

    Raises:
        InputError: a file could not be written.
    """
    try:
        write_all_atomic(files)
    except OSError as e:
        raise InputError(f"cannot write {e.filename}: {e.strerror or e}") from None


def with_machine(func=None, *, placeholders: bool = False):
    """Decorator: a positional MACHINE.json plus :func:`machine_options`, passed as ``machine``.

    ``@with_machine(placeholders=True)`` is for commands that use neither GPU names nor memory (see
    :func:`load_machine`).
    """
    def decorate(func):
        @click.argument("machine_file", required=False, type=click.Path())
        @machine_options
        @functools.wraps(func)
        def wrapper(machine_file, from_topo, gpu_name, memory, mig_table, cpus, topo_host, hostname, **kwargs):
            m = load_machine(machine_file, from_topo=from_topo, gpu_name=gpu_name, memory=memory,
                             mig_table=mig_table, cpus=cpus, hostname=hostname, topo_host=topo_host,
                             placeholders=placeholders)
            return func(machine=m, **kwargs)
        return wrapper
    return decorate(func) if func is not None else decorate


@main.command()
@with_machine
@click.option("-o", "--output", type=click.Path(), help="write the description to FILE (default: stdout)")
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
@with_machine(placeholders=True)
@click.option("--json", "as_json", is_flag=True, help="print the topology as JSON")
@click.option("--score", "score_gpus", metavar="GPUS",
              help="score a GPU set (e.g. 0,2,4): placement cost, ring order and excess over the best set "
                   "of its size, as 'place --score' prints it")
def topology(machine: Machine, as_json: bool, score_gpus: str | None) -> None:
    """Show the hop matrix, the Slurm Links= weights, NVLink islands and NUMA groups of a node.

    Hops: 0 same GPU; 1-1.5 direct NVLink (more links nearer); 2 through NVSwitch; 3 PIX, 3.2 PXB,
    3.4 PHB, 3.6 NODE, 3.8 SYS (PCIe only, and pairs the description does not describe). With
    --from-topo, --gpu-name and --memory are not needed: the matrix does not use them.
    """
    if score_gpus is not None:
        from slurm_gpushare.cli.gpusets import score_report

        click.echo(score_report(machine, score_gpus, as_json=as_json))
        return
    from slurm_gpushare.topology.hops import Topology, format_table

    topo = Topology.from_machine(machine)
    if as_json:
        click.echo(json.dumps(topo.to_dict(), indent=2))
    else:
        click.echo(format_table(topo))
