r"""Parsers for ``nvidia-smi`` text: the topology matrix and the MIG GPU instance profiles.

Two recorded outputs become plain data here, so that a machine can be described without NVML (from
a bug report, a CI fixture, a node we cannot log in to):

- ``nvidia-smi topo -m`` (the GPU/NIC "topology matrix") becomes a
  :class:`~slurm_gpushare.hardware.machine.Machine` (:func:`parse_topo_matrix`);
- ``nvidia-smi mig -lgip`` (the GPU instance profile table) becomes
  :class:`~slurm_gpushare.hardware.machine.MigProfile` tuples by GPU index (:func:`parse_mig_profiles`);
- ``nvidia-smi mig -lgi`` and ``-lci`` (the live GPU and compute instances) become rows
  (:func:`parse_mig_instances`) and MIG devices (:func:`mig_devices`);
- ``nvidia-smi -L`` (GPUs and their MIG devices with UUIDs) becomes :class:`ListedGpu` tuples
  (:func:`parse_gpu_list`).

All are pure functions of text: they open no file and run no command. Every error is a
:class:`~slurm_gpushare.errors.ParseError` whose ``source`` is ``<file>:<line>`` and whose message
quotes the token that could not be read.

Format of ``nvidia-smi topo -m`` (what the recorded outputs in ``tests/data/topo`` show):

- one header row: an empty cell, one column per device (``GPU0``..``GPUn-1``, then NICs named
  ``NIC0``.. or by device, e.g. ``mlx5_0``), then the affinity columns ``CPU Affinity``, and on newer
  drivers ``NUMA Affinity`` and ``GPU NUMA ID``;
- one row per device, in header order; a cell is ``X`` (self), ``NV#`` (a bonded set of # NVLinks),
  a PCIe level ``PIX``/``PXB``/``PHB``/``NODE``/``SYS`` (``SOC`` is the pre-2017 name of ``SYS``),
  or ``N/A``; GPU rows end with their affinity cells, NIC rows do not;
- then an optional ``Legend:`` and an optional ``NIC Legend:`` (``NIC0: mlx5_0``).

nvidia-smi separates cells with tabs. Recorded copies often have the tabs expanded to spaces at
8-column tab stops; such lines are split back into the original cells by their tab-stop positions,
so that an empty cell (a blank ``CPU Affinity`` inside a Slurm job's cpuset) does not shift the
cells after it. nvidia-smi pads the ``NUMA Affinity`` cell with one extra tab (``0\t\tN/A``), so the
cells after ``CPU Affinity`` are matched to their titles in order, skipping empty cells.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace

from slurm_gpushare.errors import MachineDescriptionError, ParseError
from slurm_gpushare.hardware.machine import (
    PCIE_LEVELS,
    CpuLayout,
    Gpu,
    Link,
    Machine,
    MigInstance,
    MigProfile,
    Nic,
    ProfileName,
    cpu_layout_problem,
    mig_cap_minors,
)
from slurm_gpushare.rangelist import parse_range_list

#: The most NVLink links one GPU has: 18 on H100/H200 and B200 (NVIDIA H100 Tensor Core GPU
#: Architecture whitepaper: "18 fourth-generation NVLink links"); A100 has 12, V100 6, P100 4.
#: A GPU whose ``NV#`` cells add up to more than this cannot be wired directly to all those peers:
#: its links go through NVSwitch chips (DGX/HGX A100 and H100 print ``NV12``/``NV18`` to all 7 peers).
MAX_DIRECT_NVLINKS = 18

#: Tab stops of a tab-expanded copy of nvidia-smi output (the terminal and GitHub default).
TAB_WIDTH = 8

#: Affinity column titles of the ``topo -m`` header, in the order nvidia-smi prints them.
AFFINITY_TITLES = ("CPU Affinity", "NUMA Affinity", "GPU NUMA ID")

#: Pre-2017 drivers print ``SOC`` (across the "socket" interconnect) where newer ones print ``SYS``.
_LEGACY_LEVELS = {"SOC": "SYS"}

_TOKENS_HINT = "a cell is X, NV<count>, PIX, PXB, PHB, NODE, SYS (or legacy SOC) or N/A"
#: A terminal escape sequence (CSI, e.g. ``\x1b[4m`` underline, or a two-byte ESC sequence).
_ANSI_ESCAPE = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|[@-Z\\-_])")
_HEADER_TOKEN = re.compile("|".join(re.escape(t) for t in AFFINITY_TITLES) + r"|\S+")
_GPU_TITLE = re.compile(r"GPU(\d+)")
_NIC_TITLE = re.compile(r"NIC(\d+)")
_NIC_LEGEND_ROW = re.compile(r"\s*NIC(\d+):\s*(\S+)\s*")


# --- nvidia-smi topo -m ------------------------------------------------------------------------


def parse_topo_matrix(text: str, *, source: str = "<topo>", hostname: str = "node",
                      gpu_name: str | None = None, memory_mib: int | None = None,
                      cpus: CpuLayout | None = None, nic_names: dict[int, str] | None = None,
                      section: int | None = None) -> Machine:
    """Build a machine description from ``nvidia-smi topo -m`` output.

    Leading ``#`` comment lines, shell prompts and any other text before the header row are skipped;
    the ``Legend:`` after the matrix is ignored and the ``NIC Legend:`` names the NICs. A text with
    several matrices (the outputs of several hosts in one file, see :func:`topo_sections`) is
    refused unless ``section`` picks one.

    What the matrix gives and what is inferred:

    - GPUs: ``index`` is the ``n`` of ``GPUn`` (the NVML index). ``topo -m`` shows no minor numbers,
      so ``minor`` is set to the index, which is what they usually are; where they differ only NVML
      (``nvmlDeviceGetMinorNumber``) can tell. ``cpu_affinity`` is the expanded ``CPU Affinity``
      list (empty when blank or ``N/A``), ``numa_node`` the ``NUMA Affinity`` (None when ``N/A`` or
      a list). Where that column is absent (drivers before 450, e.g. DGX-1 recordings) or ``N/A``
      and the CPU layout is known (given or inferred), ``numa_node`` is derived from the CPU layout,
      not reported by NVML: the socket that holds every CPU of the GPU's affinity list (None when
      they span sockets or the list is empty). On CPUs with several NUMA nodes per socket (AMD NPS,
      Intel SNC) and a layout given with real sockets, that is the socket, not the NUMA node.
      Name and memory are not in the output and come from the arguments.
    - Links: one per GPU pair; ``NV#`` gives ``nvlinks=#`` and ``pcie=None`` (the PCIe level of an
      NVLinked pair is not printed), a PCIe level gives ``pcie``; ``N/A`` pairs get no link.
      ``via_nvswitch`` is inferred: true for an NVLinked pair when either GPU's NVLink count summed
      over all its peers exceeds :data:`MAX_DIRECT_NVLINKS`, which only a switched fabric can give
      (DGX H100: NV18 to 7 peers; DGX A100: NV12 to 7 peers). Direct meshes stay false (DGX-1 V100
      NV1/NV2, NVLink-bridged PCIe pairs NV12). When only part of a switched node is visible (a
      container with 2 GPUs), the sum may stay below the limit and the switch goes unnoticed.
    - NICs: one per NIC column; index is the ``n`` of ``NICn`` (or the column's position among NIC
      columns when the column carries a device name such as ``mlx5_0``); the name comes from
      ``nic_names``, else the ``NIC Legend``, else the column title.
    - CPU layout: ``cpus`` when given, checked against the ``CPU Affinity`` and ``NUMA Affinity``
      columns (:func:`~slurm_gpushare.hardware.machine.cpu_layout_problem`); else inferred from the
      affinity lists (see :func:`infer_cpu_layout`); None when they do not tell it (one unbroken
      range per GPU: :func:`cpu_layout_unknown` says why, for the caller's message).

    Args:
        text: the whole output, as recorded.
        source: name of the text for error messages (usually the file name).
        hostname: node name for the description.
        gpu_name: product name of every GPU (``nvidia-smi --query-gpu=name``); ``unknown GPU`` if None.
        memory_mib: framebuffer size of every GPU in MiB (``nvidia-smi --query-gpu=memory.total``).
            Required: the matrix does not show it and a machine description needs it.
        cpus: the node's CPU layout (``slurmd -C``), overriding the inference.
        nic_names: NIC index -> device name (``mlx5_0``), overriding the NIC Legend.
        section: which matrix of a text with several (an index into :func:`topo_sections`).

    Returns:
        A validated :class:`Machine` whose ``source`` is ``nvidia-smi topo -m <source>``.

    Raises:
        ParseError: no header row, a truncated matrix (missing rows, rows with too few cells), an
            unknown cell token, an asymmetric matrix, a self cell that is not ``X``, a bad CPU list,
            missing ``memory_mib``, a given ``cpus`` layout that the affinity columns contradict,
            several matrices without ``section``, or a ``section`` out of range.
    """
    text = _ANSI_ESCAPE.sub("", text)  # terminal codes around a row (collect_env scripts underline the header)
    lines = text.splitlines()
    sections = topo_sections(text)
    if section is None and len(sections) > 1:
        found = ", ".join(f"line {at}" + (f" under {label}" if label else "") for label, at in sections)
        raise ParseError(f"the text holds {len(sections)} 'nvidia-smi topo -m' matrices ({found}); "
                         "which host's is meant cannot be told",
                         hint="give --host NAME to pick the matrix under that host's header (as "
                              "'clush -b' or 'pdsh ... | dshbak -c' print them), --host @N for the Nth matrix of "
                              "the file (with --hostname), or one host's output per file",
                         source=f"{source}:{sections[1][1]}")
    if section is not None:
        if not 0 <= section < max(len(sections), 1):
            raise ParseError(f"matrix {section} asked for, the text holds {len(sections)}", source=source)
        if sections:
            end = sections[section + 1][1] - 1 if section + 1 < len(sections) else len(lines)
            lines = [""] * (sections[section][1] - 1) + lines[sections[section][1] - 1:end]
    header_at = _find_header(lines, source)
    header = _read_header(lines[header_at], f"{source}:{header_at + 1}")
    if memory_mib is None or isinstance(memory_mib, bool) or not isinstance(memory_mib, int) \
            or memory_mib <= 0:
        got = "not given" if memory_mib is None else f"got {memory_mib!r}"
        raise ParseError(f"GPU memory size (memory_mib) is needed and {got}: "
                         "'nvidia-smi topo -m' does not show it",
                         hint="pass the memory and the GPU name as 'nvidia-smi --query-gpu=name,memory.total "
                              "--format=csv' prints them; on the command line: --gpu-name "
                              "'NVIDIA A100 80GB PCIe' --memory 80G",
                         source=f"{source}:{header_at + 1}")

    rows, end_at = _read_rows(lines, header_at + 1, header, source)
    missing = [t for t in header.devices if t not in rows]
    if missing:
        raise ParseError(f"truncated matrix: no row for {missing[0]} (the header has "
                         f"{len(header.devices)} device columns, {len(rows)} rows were found)",
                         hint="record the whole 'nvidia-smi topo -m' output", source=f"{source}:{end_at}")
    _check_symmetry(header, rows, source)
    _refuse_pcie_only(lines[end_at - 1:], rows, source, first_line=end_at)

    gpus = tuple(_gpu_from_row(n, rows[t], header, source, gpu_name or "unknown GPU", memory_mib)
                 for n, t in enumerate(header.gpus))
    links = _links(header, rows)
    legend = _nic_legend(lines[end_at - 1:])
    nics = tuple(_nic(k, title, header, rows, source, legend, nic_names or {})
                 for k, title in enumerate(header.nics))
    if cpus is not None:
        problem = cpu_layout_problem(gpus, cpus)
        if problem is not None:
            index, message = problem
            raise ParseError(message, hint="give --cpus SOCKETSxCORESxTHREADS as 'slurmd -C' (or lscpu: "
                                           "Socket(s) x Core(s) per socket x Thread(s) per core) prints it "
                                           "on that node", source=f"{source}:{rows[header.gpus[index]].line}")
    layout = cpus if cpus is not None else infer_cpu_layout(gpus)
    if layout is not None:
        gpus = tuple(g if g.numa_node is not None else replace(g, numa_node=socket_of_cpus(g.cpu_affinity, layout))
                     for g in gpus)
    machine = Machine(hostname=hostname, gpus=gpus, links=links, nics=nics, cpus=layout,
                      source=f"nvidia-smi topo -m {source}")
    try:
        machine.validate(source=source)
    except MachineDescriptionError as e:
        raise ParseError(e.message, hint=e.hint, source=f"{source}:{header_at + 1}") from None
    return machine


def parse_cpu_list(text: str, *, source: str = "<cpulist>") -> tuple[int, ...]:
    """Expand a Linux CPU list (``0-55,112-167``; the ``CPU Affinity`` cell) to sorted CPU ids.

    The format is the kernel's cpulist (``Documentation/admin-guide/cputopology.rst``), as
    ``nvidia-smi topo -m`` prints it from ``nvmlDeviceGetCpuAffinity``. A blank cell or ``N/A``
    means unknown and gives ``()``.

    Raises:
        ParseError: a part that is neither a CPU id nor an ascending range ``lo-hi``
            (:mod:`slurm_gpushare.rangelist`).
    """
    text = text.strip()
    if text in ("", "N/A"):
        return ()
    ids = parse_range_list(text, what="CPU id", example="0-55,112-167, as the kernel writes CPU lists", source=source)
    return tuple(sorted(set(ids)))


def socket_of_cpus(cpu_ids: Sequence[int], layout: CpuLayout) -> int | None:
    """The socket of ``layout`` that holds every CPU in ``cpu_ids``, or None.

    A CPU's socket is its Slurm core id divided by the cores per socket (core ids are socket-major,
    see :class:`~slurm_gpushare.hardware.machine.CpuLayout`). None for an empty list, CPUs on several
    sockets, or a CPU id outside the layout (validation reports that one).
    """
    if not cpu_ids or any(c < 0 or c >= layout.cpus for c in cpu_ids):
        return None
    sockets = {core // layout.cores_per_socket for core in layout.core_ids(cpu_ids)}
    return sockets.pop() if len(sockets) == 1 else None


def cpu_layout_unknown(gpus: Sequence[Gpu]) -> str:
    """Why :func:`infer_cpu_layout` finds no layout in these affinity lists, naming what would fit.

    For the message of a command that needs the layout (``gres-conf``, ``inventory``); the fix is
    always ``--cpus`` as ``slurmd -C`` or ``lscpu`` prints it on the node.
    """
    empty = [g.index for g in gpus if not g.cpu_affinity]
    if not gpus:
        return "there are no GPUs"
    if empty:
        return (f"the CPU Affinity of GPU {empty[0]} is empty or N/A (the lists were clipped by a cpuset, "
                "e.g. 'nvidia-smi topo -m' run inside a Slurm job)")
    shapes = {_runs(g.cpu_affinity) for g in gpus}
    if all(len(runs) == 1 for runs in shapes):
        lists = sorted({f"{r[0][0]}-{r[0][1]}" for r in shapes})
        total = max(r[0][1] for r in shapes) + 1
        fits = [f"{len(shapes)}x{total // len(shapes)}x1 (no SMT)"] if total % len(shapes) == 0 else []
        if total % (2 * len(shapes)) == 0:
            fits.append(f"{len(shapes)}x{total // (2 * len(shapes))}x2 (2 threads per core)")
        return (f"every CPU Affinity list is one unbroken range ({', '.join(lists)}), which does not show "
                "how many hardware threads share a core or how many sockets have no GPU"
                + (f": it fits {' or '.join(fits)}, among others" if fits else ""))
    return ("the CPU Affinity lists are not all one NUMA node's CPUs in the usual Linux numbering (one run of "
            "first threads, and one of their SMT siblings a core count above)")


def infer_cpu_layout(gpus: Sequence[Gpu]) -> CpuLayout | None:
    """Guess the node's CPU layout from the GPUs' CPU affinity lists.

    The lists are NUMA-node-local CPU sets, and Linux numbers logical CPUs socket by socket for the
    first hardware thread of every core, then again for the SMT siblings (CPU ``c`` and
    ``c + cores`` share a core). So a node with S NUMA domains of C cores and 2 threads per core
    prints, for domain s, ``s*C..s*C+C-1, S*C+s*C..S*C+s*C+C-1``:

    - every list is two equal runs of C CPUs -> ``threads_per_core=2`` and the offset of the second
      run is the total core count, so ``sockets = offset / C``. This holds even when GPUs hang off
      one domain only (8x P100, ``0-7,16-23``: 2 sockets x 8 cores x 2 threads, 32 CPUs, although
      no CPU above 23 is listed);
    - every list is one unbroken run -> unknown (None). One range does not show how many hardware
      threads share a core: a 32-core/64-thread single-socket workstation prints ``0-63`` (its SMT
      siblings 32-63 follow the first threads 0-31 without a gap), exactly like 64 cores without SMT;
      POWER and some firmware number a core's threads next to each other (``0-63`` = 16 cores x 4).
      Nor does it show sockets without GPUs. :func:`cpu_layout_unknown` names the layouts that fit.

    A "socket" here is a NUMA domain: on CPUs split into several NUMA nodes per package (AMD NPS,
    Intel SNC) the socket count is too high and the cores per socket too low, but the logical CPU
    count and the core of each CPU (what Slurm binding needs) are right. Pass the real layout
    (``slurmd -C``) to :func:`parse_topo_matrix` where it matters.

    Returns:
        The layout, or None when it cannot be inferred consistently: a GPU with an empty list (the
        lists were clipped by a cpuset, e.g. inside a Slurm job), one unbroken run per GPU, runs of
        different lengths, lists of other shapes, misaligned runs, or a NUMA node id beyond the
        inferred domains.
    """
    if not gpus or any(not g.cpu_affinity for g in gpus):
        return None
    shapes = {_runs(g.cpu_affinity) for g in gpus}
    lengths = {hi - lo + 1 for runs in shapes for lo, hi in runs}
    run_counts = {len(runs) for runs in shapes}
    if len(lengths) != 1 or len(run_counts) != 1:
        return None
    per_domain = lengths.pop()
    threads = run_counts.pop()
    if threads == 2:
        offsets = {runs[1][0] - runs[0][0] for runs in shapes}
        if len(offsets) != 1:
            return None
        total_cores = offsets.pop()
        if any(runs[0][1] >= total_cores for runs in shapes):
            return None
    else:
        return None
    if total_cores % per_domain or any(runs[0][0] % per_domain for runs in shapes):
        return None
    sockets = total_cores // per_domain
    numa = [g.numa_node for g in gpus if g.numa_node is not None]
    if numa and max(numa) >= sockets:
        return None
    return CpuLayout(sockets=sockets, cores_per_socket=per_domain, threads_per_core=threads)


_DASHES = re.compile(r"\s*-{3,}\s*")


def topo_sections(text: str) -> list[tuple[str | None, int]]:
    """The ``nvidia-smi topo -m`` matrices of a text, as ``(host label, header line)`` pairs.

    A header line (1-based) is a line of column titles starting with ``GPU0`` and holding
    ``CPU Affinity`` (so the ``nvidia-smi topo -p2p`` table that reports often add is not one). The label is the host
    name of the block header the matrix stands under, as ``clush -b`` and ``dshbak -c`` print one
    host's output (a line of dashes, the host name or hostlist, a line of dashes; a trailing
    ``(2)`` count is dropped), or None when the matrix has none. One matrix without a label is a
    plain recording; several are the outputs of several hosts.
    """
    lines = text.splitlines()
    out: list[tuple[str | None, int]] = []
    label: str | None = None
    for i, line in enumerate(lines):
        if i >= 2 and _DASHES.fullmatch(line) and _DASHES.fullmatch(lines[i - 2]) and lines[i - 1].strip():
            label = lines[i - 1].split()[0]
            continue
        if not line.lstrip().startswith("#"):
            tokens = _HEADER_TOKEN.findall(line)
            if tokens and tokens[0] == "GPU0" and "CPU Affinity" in tokens:
                out.append((label, i + 1))
                label = None
    return out


class _Header:
    """Column titles of the ``topo -m`` header row."""

    def __init__(self, devices: list[str], affinity: list[str], nics_start: int):
        self.devices = devices
        self.gpus = devices[:nics_start]
        self.nics = devices[nics_start:]
        self.affinity = affinity


class _Row:
    """One matrix row: its device cells by column title, affinity cells by title, and line number."""

    def __init__(self, cells: dict[str, str], affinity: dict[str, str], line: int):
        self.cells = cells
        self.affinity = affinity
        self.line = line


def _find_header(lines: list[str], source: str) -> int:
    """Index of the header row: the first line whose first cell is ``GPU0`` and second is not ``X``."""
    for i, line in enumerate(lines):
        if line.lstrip().startswith("#"):
            continue
        tokens = _HEADER_TOKEN.findall(line)
        if tokens and tokens[0] == "GPU0" and (len(tokens) == 1 or tokens[1] != "X"):
            return i
    raise ParseError("no 'nvidia-smi topo -m' header row found (a line of column titles "
                     "'GPU0 GPU1 ... CPU Affinity')",
                     hint="record the output of 'nvidia-smi topo -m' from its header row on",
                     source=f"{source}:{max(len(lines), 1)}")


def _read_header(line: str, where: str) -> _Header:
    tokens = _HEADER_TOKEN.findall(line)
    devices: list[str] = []
    affinity: list[str] = []
    nics_start = None
    for tok in tokens:
        if tok in AFFINITY_TITLES:
            if tok in affinity:
                raise ParseError(f"column {tok!r} appears twice in the header", source=where)
            affinity.append(tok)
            continue
        if affinity:
            raise ParseError(f"unknown header column {tok!r} after the affinity columns",
                             hint=f"known affinity columns: {', '.join(AFFINITY_TITLES)}", source=where)
        if tok in devices:
            raise ParseError(f"device column {tok!r} appears twice in the header", source=where)
        gpu = _GPU_TITLE.fullmatch(tok)
        if gpu is None:
            nics_start = len(devices) if nics_start is None else nics_start
        elif nics_start is not None or int(gpu.group(1)) != len(devices):
            raise ParseError(f"unexpected column {tok!r} in the header: GPU columns must come first, "
                             f"as GPU0, GPU1, ...", source=where)
        devices.append(tok)
    return _Header(devices, affinity, len(devices) if nics_start is None else nics_start)


def _read_rows(lines: list[str], start: int, header: _Header, source: str) -> tuple[dict[str, _Row], int]:
    """Read matrix rows from ``lines[start:]`` until a line that is not one.

    Returns:
        The rows by device title, and the 1-based number of the last line read.
    """
    rows: dict[str, _Row] = {}
    n = len(header.devices)
    at = start
    while at < len(lines):
        line = lines[at]
        label = line.split(None, 1)[0] if line.strip() else ""
        if label not in header.devices:
            break
        where = f"{source}:{at + 1}"
        if label in rows:
            raise ParseError(f"row {label!r} appears twice (first at line {rows[label].line})", source=where)
        cells = _split_cells(line, n)
        matrix = cells[1:1 + n]
        if len(matrix) < n:
            raise ParseError(f"truncated matrix: row {label} has {len(matrix)} of {n} device cells "
                             f"(no {header.devices[len(matrix)]} cell)",
                             hint="record the whole 'nvidia-smi topo -m' output", source=where)
        for title, tok in zip(header.devices, matrix, strict=True):
            _check_cell(label, title, tok, where)
        trailing = cells[1 + n:]
        if label in header.gpus:
            affinity = _match_affinity(label, trailing, header.affinity, where)
        elif any(trailing):
            raise ParseError(f"row {label} has cells after its {n} device cells: "
                             f"{[c for c in trailing if c]!r}", hint="NIC rows end with the matrix",
                             source=where)
        else:
            affinity = {}
        rows[label] = _Row(dict(zip(header.devices, matrix, strict=True)), affinity, at + 1)
        at += 1
    return rows, at


def _split_cells(line: str, n_devices: int) -> list[str]:
    """Split a matrix row into its cells, keeping empty cells where they can be seen.

    Tab-separated lines split on tabs. A line of spaces is split at its 8-column tab stops
    (:func:`_tab_stop_cells`); when it is not tab-aligned, or that would leave a device cell empty
    (device cells never are), it is split on whitespace, where an empty cell cannot be seen.
    """
    if "\t" in line:
        return [c.strip() for c in line.strip().split("\t")]
    cells = _tab_stop_cells(line)
    if cells is None or "" in cells[1:1 + n_devices]:
        return line.split()
    return cells


def _tab_stop_cells(line: str) -> list[str] | None:
    """Recover the tab-separated cells of a line whose tabs were expanded to spaces.

    A cell starts at a tab stop (counted from the row label) and the next cell starts at the first
    tab stop after its text, so a gap of a whole tab width is an empty cell.

    Returns:
        The cells, or None when a token starts before the tab stop it should be at (the line was
        aligned by other means).
    """
    tokens = list(re.finditer(r"\S+", line))
    if not tokens:
        return []
    base = tokens[0].start()
    cells: list[str] = []
    stop = 0
    for tok in tokens:
        pos = tok.start() - base
        if pos < stop:
            return None
        while pos >= stop + TAB_WIDTH:
            cells.append("")
            stop += TAB_WIDTH
        cells.append(tok.group())
        stop = (pos + len(tok.group())) // TAB_WIDTH * TAB_WIDTH + TAB_WIDTH
    return cells


def _match_affinity(label: str, trailing: list[str], titles: list[str], where: str) -> dict[str, str]:
    """Match a GPU row's cells after the matrix to the header's affinity titles.

    The first affinity cell is taken where it stands (it may be blank); later cells are matched in
    order skipping empty ones, because nvidia-smi pads the ``NUMA Affinity`` cell with an extra tab.
    """
    if not titles:
        if any(trailing):
            raise ParseError(f"row {label} has cells the header has no column for: "
                             f"{[c for c in trailing if c]!r}", source=where)
        return {}
    if not trailing:
        raise ParseError(f"row {label} ends after the matrix: no {titles[0]!r} cell",
                         hint="record the whole 'nvidia-smi topo -m' output", source=where)
    rest = [c for c in trailing[1:] if c]
    if len(rest) > len(titles) - 1:
        raise ParseError(f"row {label} has more cells than the header has columns: "
                         f"{rest[len(titles) - 1]!r} is extra", source=where)
    if len(rest) < len(titles) - 1:
        raise ParseError(f"row {label} has too few cells: no {titles[len(rest) + 1]!r} cell",
                         hint="record the whole 'nvidia-smi topo -m' output", source=where)
    return dict(zip(titles, [trailing[0], *rest], strict=True))


def _check_cell(row: str, column: str, tok: str, where: str) -> None:
    """Reject unknown tokens, a self cell that is not ``X`` and ``X`` off the diagonal."""
    if row == column:
        if tok != "X":
            raise ParseError(f"self cell {row}/{column} is {tok!r}, expected 'X'", source=where)
        return
    if tok == "X":
        raise ParseError(f"cell {row}/{column} is 'X', which marks only a device's own cell",
                         hint=_TOKENS_HINT, source=where)
    if _nvlinks(tok) is None and _level(tok) is None and tok != "N/A":
        raise ParseError(f"unknown topology token {tok!r} in cell {row}/{column}", hint=_TOKENS_HINT,
                         source=where)


def _nvlinks(tok: str) -> int | None:
    """NVLink count of an ``NV#`` cell (a bonded set of # NVLinks), else None."""
    m = re.fullmatch(r"NV([1-9]\d*)", tok)
    return int(m.group(1)) if m else None


def _level(tok: str) -> str | None:
    """PCIe level of a cell (legacy ``SOC`` read as ``SYS``), else None."""
    tok = _LEGACY_LEVELS.get(tok, tok)
    return tok if tok in PCIE_LEVELS else None


def _normal(tok: str) -> str:
    return _LEGACY_LEVELS.get(tok, tok)


def _check_symmetry(header: _Header, rows: dict[str, _Row], source: str) -> None:
    devices = header.devices
    for i, a in enumerate(devices):
        for b in devices[i + 1:]:
            ab, ba = rows[a].cells[b], rows[b].cells[a]
            if _normal(ab) != _normal(ba):
                raise ParseError(f"asymmetric matrix: {a}/{b} is {ab!r} (line {rows[a].line}) but "
                                 f"{b}/{a} is {ba!r} (line {rows[b].line})",
                                 hint="the path between two devices is the same both ways; the text "
                                      "was probably edited or mis-copied",
                                 source=f"{source}:{rows[b].line}")


def _gpu_from_row(index: int, row: _Row, header: _Header, source: str, name: str, memory_mib: int) -> Gpu:
    where = f"{source}:{row.line}"
    label = header.gpus[index]
    cpu_affinity = parse_cpu_list(row.affinity.get("CPU Affinity", ""), source=where)
    numa_node = _numa_node(row.affinity.get("NUMA Affinity", ""), label, where)
    gpu_numa = row.affinity.get("GPU NUMA ID", "N/A")
    if gpu_numa != "N/A" and not gpu_numa.isdigit():
        raise ParseError(f"bad GPU NUMA ID {gpu_numa!r} for {label}", hint="expected a number or N/A",
                         source=where)
    return Gpu(index=index, minor=index, name=name, memory_mib=memory_mib,
               cpu_affinity=cpu_affinity, numa_node=numa_node)


def _numa_node(cell: str, label: str, where: str) -> int | None:
    """The ``NUMA Affinity`` cell: a node id; None for blank, ``N/A`` or a list of several nodes."""
    try:
        nodes = parse_cpu_list(cell, source=where)
    except ParseError:
        raise ParseError(f"bad NUMA Affinity {cell!r} for {label}", hint="expected a NUMA node id or N/A",
                         source=where) from None
    return nodes[0] if len(nodes) == 1 else None


def _links(header: _Header, rows: dict[str, _Row]) -> tuple[Link, ...]:
    """One link per GPU pair whose cell is not ``N/A``; see :func:`parse_topo_matrix` for NVSwitch."""
    gpus = header.gpus
    nv_total = [sum(_nvlinks(rows[a].cells[b]) or 0 for b in gpus if b != a) for a in gpus]
    links = []
    for i, a in enumerate(gpus):
        for j in range(i + 1, len(gpus)):
            tok = rows[a].cells[gpus[j]]
            count = _nvlinks(tok)
            if count is not None:
                switched = max(nv_total[i], nv_total[j]) > MAX_DIRECT_NVLINKS
                links.append(Link(a=i, b=j, nvlinks=count, via_nvswitch=switched))
            elif tok != "N/A":
                links.append(Link(a=i, b=j, pcie=_level(tok)))
    return tuple(links)


def _refuse_pcie_only(after: list[str], rows: dict[str, _Row], source: str, *, first_line: int = 1) -> None:
    """Refuse the output of ``nvidia-smi topo -mp``: the PCIe paths only, whose legend ends at its ``PIX`` line
    without the ``NV#`` line that ``-m``'s always has. Read as ``-m``, every NVLink of the machine would be
    missing. A legend cut short before ``PIX`` (a partial copy) says nothing either way.

    Raises:
        ParseError: naming the command to run instead.
    """
    legend = [line.strip() for line in after]
    if any(line.startswith("NV#") for line in legend) or not any(line.startswith("PIX ") for line in legend):
        return
    if any(_nvlinks(tok) is not None for row in rows.values() for tok in row.cells.values()):
        return
    at = next(i for i, line in enumerate(legend) if line.startswith("PIX "))
    raise ParseError("this is 'nvidia-smi topo -mp' output (its legend has no NV# line): it shows PCIe paths only, "
                     "so any NVLink between these GPUs would be missing",
                     hint="record 'nvidia-smi topo -m' on the node instead", source=f"{source}:{first_line + at}")


def _nic_legend(lines: list[str]) -> dict[int, str]:
    """``NICn: name`` entries of the ``NIC Legend:`` section, by NIC index."""
    names: dict[int, str] = {}
    in_legend = False
    for line in lines:
        if line.strip() == "NIC Legend:":
            in_legend = True
            continue
        m = _NIC_LEGEND_ROW.fullmatch(line) if in_legend else None
        if m:
            names[int(m.group(1))] = m.group(2)
    return names


def _nic(position: int, title: str, header: _Header, rows: dict[str, _Row], source: str,
         legend: dict[int, str], nic_names: dict[int, str]) -> Nic:
    m = _NIC_TITLE.fullmatch(title)
    index = int(m.group(1)) if m else position
    name = nic_names.get(index) or (legend.get(index) if m else None) or title
    paths: list[str | None] = []
    for gpu in header.gpus:
        tok = rows[gpu].cells[title]
        if _nvlinks(tok) is not None:
            raise ParseError(f"cell {gpu}/{title} is {tok!r}: an NVLink path to a NIC cannot be described",
                             hint="NIC paths are PCIe levels", source=f"{source}:{rows[gpu].line}")
        paths.append(_level(tok))
    return Nic(index=index, name=name, paths=tuple(paths))


def _runs(cpus: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    """Maximal runs of consecutive ids in a sorted tuple, as ``(first, last)``."""
    runs: list[tuple[int, int]] = []
    for c in cpus:
        if runs and c == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], c)
        else:
            runs.append((c, c))
    return tuple(runs)


# --- nvidia-smi mig -lgip ----------------------------------------------------------------------

#: Possible GPU instance placements ``(start, size)`` in memory slices, on GPUs with 7 compute slices
#: and 8 memory slices (A100, H100, H200), by GPU instance profile id, with the profile's compute
#: slice count. Source: NVIDIA Multi-Instance GPU User Guide, ``nvidia-smi mig -lgipp`` example
#: (identical for A100 and H100): ``Profile ID 19 Placements: {0,1,2,3,4,5,6}:1``, ``20 ... :1``,
#: ``15 {0,2,4,6}:2``, ``14 {0,2,4}:2``, ``9 {0,4}:4``, ``5 {0}:4``, ``0 {0}:8``.
#: Profile ids differ on other GPUs (A30 has 4 slices and other ids), so the table is only used for a
#: GPU that offers a 7-slice profile, and only where the profile's slice count matches.
SEVEN_SLICE_PLACEMENTS: dict[int, tuple[int, tuple[tuple[int, int], ...]]] = {
    19: (1, tuple((s, 1) for s in range(7))),      # 1g.5gb / 1g.10gb
    20: (1, tuple((s, 1) for s in range(7))),      # 1g.*+me: same slots, one instance (media engines)
    15: (1, ((0, 2), (2, 2), (4, 2), (6, 2))),     # 1g with two memory slices: 1g.10gb (A100-40GB), 1g.20gb
    14: (2, ((0, 2), (2, 2), (4, 2))),             # 2g
    9: (3, ((0, 4), (4, 4))),                      # 3g
    5: (4, ((0, 4),)),                             # 4g
    0: (7, ((0, 8),)),                             # 7g: the whole GPU
}

_LGIP_ROW = re.compile(
    r"\|\s*(?P<gpu>\d+)\s+MIG\s+(?P<name>\S+)\s+(?P<id>\d+)\s+(?P<free>\d+)/(?P<total>\d+)\s+"
    r"(?P<memory>\d+(?:\.\d+)?)\s+(?P<p2p>\S+)\s+(?P<sm>\d+)\s+(?P<dec>\S+)\s+(?P<enc>\S+)\s*\|\s*")


def parse_mig_profiles(text: str, *, source: str = "<lgip>") -> dict[int, tuple[MigProfile, ...]]:
    """Read the GPU instance profile table of ``nvidia-smi mig -lgip``.

    Each profile is a table row ``| GPU  MIG <name>  ID  Free/Total  Memory  P2P  SM  DEC  ENC |``
    followed by a row of ``CE JPEG OFA`` counts, which is not needed. Lines outside the table (shell
    prompts, other command output) are skipped, and so are the other ``nvidia-smi mig`` tables a
    recording often holds after it: the rows under a ``GPU instances:`` (``-lgi``), ``Compute
    instance profiles:`` (``-lcip``) or ``Compute instances:`` (``-lci``) title, up to the next
    table title, belong to those tables (:func:`parse_mig_instances` reads ``-lgi`` and ``-lci``).
    Rows before any title are read as profile rows. The memory column is GiB with two decimals and is
    converted with ``round(GiB * 1024)`` (9.75 GiB -> 9984 MiB), so it can be a few MiB below
    NVML's exact ``memorySizeMB``; a header that says ``MiB`` is read as MiB.

    Placements come from :data:`SEVEN_SLICE_PLACEMENTS` for GPUs with a 7-slice profile and are
    empty (unknown) otherwise; ``nvidia-smi mig -lgipp`` or NVML gives them on a real node.

    Args:
        text: the whole output, as recorded.
        source: name of the text for error messages (usually the file name).

    Returns:
        GPU index -> its profiles in table order. ``name`` drops the ``MIG`` prefix and keeps
        suffixes (``1g.10gb+me``); ``max_instances`` is the ``Total`` of ``Free/Total``.

    Raises:
        ParseError: a profile row that cannot be read, a bad profile name, a profile listed twice
            for one GPU, or no profile at all (e.g. ``No MIG-enabled devices found``).
    """
    lines = text.splitlines()
    unit_mib = 1024
    found: dict[int, list[MigProfile]] = {}
    for at, (table, line) in enumerate(_mig_table_lines(lines), start=1):
        stripped = line.strip()
        if table != "profiles" or not stripped.startswith("|"):
            continue
        if "Free/Total" in stripped and "MiB" in stripped and "GiB" not in stripped:
            unit_mib = 1
        if " MIG " not in f" {stripped} ":
            continue
        where = f"{source}:{at}"
        m = _LGIP_ROW.fullmatch(stripped)
        if m is None:
            raise ParseError(f"cannot read GPU instance profile row {stripped!r}",
                             hint="expected '| GPU  MIG <name>  ID  Free/Total  Memory  P2P  SM  DEC  ENC |' "
                                  "as 'nvidia-smi mig -lgip' prints it", source=where)
        name = m.group("name")
        nm = ProfileName.parse(name, source=where)
        if nm.compute_slices is not None:
            raise ParseError(f"{name!r} is a compute instance profile, not a GPU instance profile",
                             hint="give the output of nvidia-smi mig -lgip", source=where)
        gpu, profile_id = int(m.group("gpu")), int(m.group("id"))
        profiles = found.setdefault(gpu, [])
        if any(p.profile_id == profile_id for p in profiles):
            raise ParseError(f"profile id {profile_id} ({name}) is listed twice for GPU {gpu}", source=where)
        profiles.append(MigProfile(name=name, profile_id=profile_id, slices=nm.slices,
                                   memory_mib=round(float(m.group("memory")) * unit_mib),
                                   max_instances=int(m.group("total")), sm_count=int(m.group("sm"))))
    if not found:
        raise ParseError("no GPU instance profiles found", source=f"{source}:{max(len(lines), 1)}",
                         hint="record 'nvidia-smi mig -lgip' on a node where MIG mode is enabled "
                              "('nvidia-smi -i <gpu> -mig 1')")
    return {gpu: _with_placements(profiles) for gpu, profiles in sorted(found.items())}


def _with_placements(profiles: list[MigProfile]) -> tuple[MigProfile, ...]:
    """Fill in the standard placements on GPUs with 7 compute slices (see SEVEN_SLICE_PLACEMENTS)."""
    if not any(p.slices == 7 for p in profiles):
        return tuple(profiles)
    out = []
    for p in profiles:
        slices, placements = SEVEN_SLICE_PLACEMENTS.get(p.profile_id, (0, ()))
        if slices == p.slices:
            p = replace(p, placements=placements)
        out.append(p)
    return tuple(out)


#: Titles of the ``nvidia-smi mig`` tables (the first row inside the box), and the table each opens.
MIG_TABLE_TITLES = {
    "GPU instance profiles:": "profiles",
    "GPU instances:": "gpu_instances",
    "Compute instance profiles:": "ci_profiles",
    "Compute instances:": "compute_instances",
}


def _mig_table_lines(lines: Sequence[str]) -> list[tuple[str, str]]:
    """Each line with the table it belongs to: the last table title seen (``profiles`` before any)."""
    table = "profiles"
    out = []
    for line in lines:
        stripped = line.strip().strip("|").strip()
        table = MIG_TABLE_TITLES.get(stripped, table)
        out.append((table, line))
    return out


# --- nvidia-smi mig -lgi / -lci ----------------------------------------------------------------


@dataclass(frozen=True)
class GpuInstanceRow:
    """One row of ``nvidia-smi mig -lgi`` (NVML ``nvmlGpuInstanceGetInfo``: ``id``, ``profileId``,
    ``placement.start``/``placement.size``).

    Attributes:
        gpu: the GPU's NVML index (``GPU`` column).
        profile: GPU instance profile name without ``MIG``, e.g. ``4g.40gb``.
        profile_id: GPU instance profile id (``Profile ID``).
        gi_id: GPU instance id (``Instance ID``), as the driver assigned it at creation.
        start: first memory slice (``Placement Start``).
        size: memory slices (``Placement Size``).
    """

    gpu: int
    profile: str
    profile_id: int
    gi_id: int
    start: int
    size: int


@dataclass(frozen=True)
class ComputeInstanceRow:
    """One row of ``nvidia-smi mig -lci`` (NVML ``nvmlComputeInstanceGetInfo``).

    Attributes:
        gpu: the GPU's NVML index.
        gi_id: the GPU instance the compute instance lives in (``GPU Instance ID``).
        profile: the MIG device name, e.g. ``1g.10gb`` for a compute instance spanning its GPU
            instance, ``1c.3g.20gb`` for one compute slice of a ``3g.20gb``.
        profile_id: compute instance profile id.
        ci_id: compute instance id (``Instance ID``).
        start: placement start within the GPU instance, None when the driver prints no
            ``Placement`` column (R450-R460 drivers).
    """

    gpu: int
    gi_id: int
    profile: str
    profile_id: int
    ci_id: int
    start: int | None = None


@dataclass(frozen=True)
class MigTables:
    """The live-instance tables of a recording: ``-lgi`` rows and ``-lci`` rows, in printed order.

    ``has_gpu_instances`` / ``has_compute_instances`` tell whether the recording holds that table at
    all (an empty table, "No GPU instances found", still counts as present).
    """

    gpu_instances: tuple[GpuInstanceRow, ...] = ()
    compute_instances: tuple[ComputeInstanceRow, ...] = ()
    has_gpu_instances: bool = False
    has_compute_instances: bool = False


_LGI_ROW = re.compile(r"\|\s*(?P<gpu>\d+)\s+MIG\s+(?P<name>\S+)\s+(?P<pid>\d+)\s+(?P<gi>\d+)\s+"
                      r"(?P<start>\d+):(?P<size>\d+)\s*\|")
_LCI_ROW = re.compile(r"\|\s*(?P<gpu>\d+)\s+(?P<gi>\d+)\s+MIG\s+(?P<name>\S+)\s+(?P<pid>\d+)\s+"
                      r"(?P<ci>\d+)(?:\s+(?P<start>\d+):(?P<size>\d+))?\s*\|")


def parse_mig_instances(text: str, *, source: str = "<lgi>") -> MigTables:
    """Read the ``nvidia-smi mig -lgi`` and ``-lci`` tables of a recording.

    The tables are found by their titles (``GPU instances:``, ``Compute instances:``), wherever they
    are in the text, so one file can hold ``-lgip``, ``-lgipp``, ``-cgi`` messages, ``-lgi`` and
    ``-lci`` in any order. Format (R450 and later drivers, recorded in ``tests/data/mig``):

    - ``-lgi``: ``| GPU  MIG <name>  Profile ID  Instance ID  Start:Size |``;
    - ``-lci``: ``| GPU  GPU-instance ID  MIG <name>  Profile ID  Instance ID  [Start:Size] |``
      (R470 and later add the placement column).

    GPU instance ids are the driver's, not a function of the placement: the recorded H100 ``-cgi``
    output creates ids 13, 11, 12, 7, 8, 9, 10 in that order, and ``nvidia-smi mig -lgi`` in the
    MIG user guide shows GPU instance 2 at ``0:4`` and 1 at ``4:4``. They come from ``-lgi`` /
    NVML, never from a formula.

    Raises:
        ParseError: a row of either table that cannot be read, a GPU instance or compute instance
            listed twice, GPU instances of one GPU whose placements overlap, or a compute instance of a
            GPU instance that ``-lgi`` (when present) does not list.
    """
    gis: list[GpuInstanceRow] = []
    cis: list[ComputeInstanceRow] = []
    seen: set[str] = set()
    for at, (table, line) in enumerate(_mig_table_lines(text.splitlines()), start=1):
        stripped = line.strip()
        where = f"{source}:{at}"
        if table in ("gpu_instances", "compute_instances"):
            seen.add(table)
        if not stripped.startswith("|") or " MIG " not in f" {stripped} ":
            continue
        if table == "gpu_instances":
            m = _row(_LGI_ROW, stripped, where, "GPU instance",
                     "| GPU  MIG <name>  Profile ID  Instance ID  Start:Size |", "-lgi")
            row = GpuInstanceRow(int(m["gpu"]), m["name"], int(m["pid"]), int(m["gi"]), int(m["start"]),
                                 int(m["size"]))
            if any(g.gpu == row.gpu and g.gi_id == row.gi_id for g in gis):
                raise ParseError(f"GPU {row.gpu}: GPU instance {row.gi_id} is listed twice", source=where,
                                 hint="record one 'nvidia-smi mig -lgi' output")
            clash = next((g for g in gis if g.gpu == row.gpu and g.start < row.start + row.size
                          and row.start < g.start + g.size), None)
            if clash is not None:
                raise ParseError(f"GPU {row.gpu}: GPU instance {row.gi_id} at {row.start}:{row.size} overlaps GPU "
                                 f"instance {clash.gi_id} at {clash.start}:{clash.size}; GPU instances of one GPU "
                                 "hold disjoint slices", source=where, hint="record one 'nvidia-smi mig -lgi' output")
            gis.append(row)
        elif table == "compute_instances":
            m = _row(_LCI_ROW, stripped, where, "compute instance",
                     "| GPU  GPU-instance ID  MIG <name>  Profile ID  Instance ID  Start:Size |", "-lci")
            ci = ComputeInstanceRow(int(m["gpu"]), int(m["gi"]), m["name"], int(m["pid"]), int(m["ci"]),
                                    int(m["start"]) if m["start"] is not None else None)
            if any((c.gpu, c.gi_id, c.ci_id) == (ci.gpu, ci.gi_id, ci.ci_id) for c in cis):
                raise ParseError(f"GPU {ci.gpu}: compute instance {ci.ci_id} of GPU instance {ci.gi_id} is listed "
                                 "twice", source=where, hint="record one 'nvidia-smi mig -lci' output")
            cis.append(ci)
    if "gpu_instances" in seen:
        known = {(g.gpu, g.gi_id) for g in gis}
        for c in cis:
            if (c.gpu, c.gi_id) not in known:
                raise ParseError(f"GPU {c.gpu}: compute instance {c.ci_id} is in GPU instance {c.gi_id}, which "
                                 "'nvidia-smi mig -lgi' does not list", source=source,
                                 hint="record -lgi and -lci of the same moment")
    return MigTables(tuple(gis), tuple(cis), "gpu_instances" in seen, "compute_instances" in seen)


def _row(pattern: re.Pattern[str], row: str, where: str, what: str, shape: str, option: str) -> re.Match[str]:
    """The match of a table row, or a ParseError naming the row and the shape expected."""
    m = pattern.fullmatch(row)
    if m is None:
        raise ParseError(f"cannot read {what} row {row!r}",
                         hint=f"expected '{shape}' as 'nvidia-smi mig {option}' prints it", source=where)
    return m


def mig_devices(tables: MigTables, gpu: int, gpu_minor: int, *, source: str = "<lgi>") -> tuple[MigInstance, ...]:
    """The MIG devices (one per compute instance) of GPU ``gpu`` from ``-lgi`` + ``-lci`` tables.

    ``profile`` is the compute instance's name (the MIG device name, which is the GPU instance
    profile for a compute instance spanning its GPU instance), ``start`` the GPU instance's
    placement start, ``uuid`` empty (neither table shows it), and ``caps`` the driver's
    ``mig-minors`` numbering (:func:`~slurm_gpushare.hardware.machine.mig_cap_minors`) from the
    GPU's minor number: a recording has no ``/proc/driver/nvidia-caps/mig-minors`` to read.

    Raises:
        ParseError: ``-lgi`` is there without ``-lci`` (a MIG device is a compute instance; which
            ones exist only ``-lci`` says), or the other way round.
    """
    if tables.has_gpu_instances != tables.has_compute_instances:
        have, need = (("-lgi", "-lci") if tables.has_gpu_instances else ("-lci", "-lgi"))
        raise ParseError(f"the recording has 'nvidia-smi mig {have}' but not '{need}': both are needed to know "
                         "the MIG devices (GPU instance ids and placements from -lgi, compute instances from "
                         "-lci)", hint=f"append 'nvidia-smi mig {need}' output to the file", source=source)
    starts = {g.gi_id: g.start for g in tables.gpu_instances if g.gpu == gpu}
    out = []
    for c in tables.compute_instances:
        if c.gpu != gpu:
            continue
        out.append(MigInstance(profile=c.profile, gi_id=c.gi_id, ci_id=c.ci_id, start=starts.get(c.gi_id, 0),
                               uuid="", caps=mig_cap_minors(gpu_minor, c.gi_id, c.ci_id)))
    return tuple(sorted(out, key=lambda i: (i.gi_id, i.ci_id)))


# --- nvidia-smi -L -----------------------------------------------------------------------------


@dataclass(frozen=True)
class ListedMig:
    """A MIG device line of ``nvidia-smi -L``: ``MIG 1g.10gb  Device  0: (UUID: MIG-...)``.

    Attributes:
        profile: the MIG device name, e.g. ``1g.10gb``.
        device: the MIG device index on its GPU (``nvmlDeviceGetMigDeviceHandleByIndex`` order).
        uuid: ``MIG-<uuid>`` (R470 and later) or ``MIG-GPU-<uuid>/<gi>/<ci>`` (R450-R465).
    """

    profile: str
    device: int
    uuid: str


@dataclass(frozen=True)
class ListedGpu:
    """A GPU line of ``nvidia-smi -L`` (``GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-...)``) and the MIG
    device lines under it."""

    index: int
    name: str
    uuid: str
    migs: tuple[ListedMig, ...] = ()


_L_GPU = re.compile(r"GPU (?P<index>\d+): (?P<name>.+?) \(UUID: (?P<uuid>GPU-[0-9A-Fa-f-]+)\)")
_L_MIG = re.compile(r"MIG (?P<profile>\S+)\s+Device\s+(?P<device>\d+): \(UUID: (?P<uuid>MIG-[^)\s]+)\)")


def parse_gpu_list(text: str, *, source: str = "<nvidia-smi -L>") -> tuple[ListedGpu, ...]:
    """Read ``nvidia-smi -L``: one ``GPU n: <name> (UUID: GPU-...)`` line per GPU, each followed by
    its ``  MIG <profile>  Device  k: (UUID: MIG-...)`` lines when MIG devices exist.

    ``#`` comment lines, shell prompts and other text are skipped.

    Raises:
        ParseError: a line that starts like a GPU or MIG line but cannot be read, a MIG line before
            any GPU line, a GPU index listed twice, or no GPU line at all.
    """
    gpus: list[ListedGpu] = []
    for at, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        where = f"{source}:{at}"
        if stripped.startswith("#"):
            continue
        if stripped.startswith("GPU ") and re.match(r"GPU \d+:", stripped):
            m = _L_GPU.fullmatch(stripped)
            if m is None:
                raise ParseError(f"cannot read GPU line {stripped!r}", source=where,
                                 hint="expected 'GPU <n>: <name> (UUID: GPU-...)' as 'nvidia-smi -L' prints it")
            if any(g.index == int(m["index"]) for g in gpus):
                raise ParseError(f"GPU {m['index']} is listed twice", source=where,
                                 hint="record one 'nvidia-smi -L' output")
            gpus.append(ListedGpu(int(m["index"]), m["name"], m["uuid"]))
        elif stripped.startswith("MIG ") and "Device" in stripped:
            m = _L_MIG.fullmatch(stripped)
            if m is None:
                raise ParseError(f"cannot read MIG device line {stripped!r}", source=where,
                                 hint="expected 'MIG <profile> Device <k>: (UUID: MIG-...)'")
            if not gpus:
                raise ParseError("a MIG device line comes before any GPU line", source=where,
                                 hint="record the whole 'nvidia-smi -L' output")
            g = gpus[-1]
            gpus[-1] = replace(g, migs=(*g.migs, ListedMig(m["profile"], int(m["device"]), m["uuid"])))
    if not gpus:
        raise ParseError("no 'GPU <n>: ...' line found", source=f"{source}:1",
                         hint="record the output of 'nvidia-smi -L'")
    return tuple(gpus)
