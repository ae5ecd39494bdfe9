"""GPU topology: the hop matrix, gres.conf ``Links=`` values and graph queries over one node.

This is a models-layer module: pure functions of a :class:`~slurm_gpushare.hardware.machine.Machine`
(or of a hop matrix), no I/O. It answers "how far apart are these GPUs" for the gres.conf generator
(``Links=``), the placement engine and ``slurm-gpushare topology``.

Positions and indices
    A hop or links matrix has one row and column per GPU, in ascending GPU (NVML) index order. NVML
    numbers a node's GPUs ``0..n-1`` (``nvmlDeviceGetHandleByIndex``), so the position of a GPU in
    the matrix is its index; a description holding only some GPUs (indices ``2, 5``) keeps the
    ascending order and row ``i`` is the ``i``-th smallest index. Functions that take a
    :class:`Machine` or :class:`Topology` speak GPU indices; functions that take a bare matrix speak
    positions.

The hop matrix
    A dimensionless distance, smaller is nearer, built from the facts ``nvidia-smi topo -m`` and NVML
    report (``nvmlDeviceGetTopologyCommonAncestor``, ``nvmlDeviceGetNvLinkState``,
    ``nvmlDeviceGetNvLinkRemoteDeviceType``):

    ====================  ==========================================  ===============
    path                  hop                                          ``topo -m``
    ====================  ==========================================  ===============
    same GPU              0                                            ``X``
    direct NVLink         ``1 + 1/(1 + nvlinks)``, in (1, 1.5]         ``NV#``
    through NVSwitch      2                                            ``NV#`` (switch)
    PCIe only             3 + 0.0 / 0.2 / 0.4 / 0.6 / 0.8              PIX/PXB/PHB/NODE/SYS
    ====================  ==========================================  ===============

    More bonded links make a direct NVLink pair nearer (NV1 = 1.5, NV2 = 1.333, NV12 = 1.077). A pair
    the description says nothing about (no :class:`Link`, or a link with neither NVLinks nor a PCIe
    level) counts as ``SYS``, whatever NUMA nodes its GPUs report: unknown is taken as no useful
    connection, the worst path a node has, so an unknown pair is never nearer than a known one and
    never gets a ``Links=`` value above 0. (Sharing a NUMA node does not say which PCIe path joins two
    GPUs, and a description written without links must not make Slurm prefer pairs nobody measured.)
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from slurm_gpushare.errors import InputError, MachineDescriptionError
from slurm_gpushare.hardware.machine import PCIE_LEVELS, Link, Machine, Nic

if TYPE_CHECKING:
    import networkx as nx

# --- hop matrix constants ---------------------------------------------------------------------

#: Hop from a GPU to itself (the matrix diagonal).
HOP_SAME_GPU = 0.0
#: Base of a direct NVLink pair; the hop is ``HOP_NVLINK + 1 / (1 + nvlinks)``, so it lies in
#: (1, 1.5] and more bonded links (the ``#`` of ``NV#``) make the pair nearer.
HOP_NVLINK = 1.0
#: A pair whose NVLinks go through an NVSwitch (``nvmlDeviceGetNvLinkRemoteDeviceType`` is
#: ``NVML_NVLINK_DEVICE_TYPE_SWITCH``): every pair on the switch is equally near, whatever its link count.
HOP_NVSWITCH = 2.0
#: Base of a PCIe-only pair; the PCIe level adds :data:`HOP_PCIE_LEVEL`.
HOP_PCIE = 3.0
#: Added to :data:`HOP_PCIE` per PCIe level (``nvidia-smi topo -m`` legend): PIX at most one PCIe
#: bridge, PXB several bridges, PHB through a host bridge (the CPU), NODE between host bridges of one
#: NUMA node, SYS across the SMP interconnect between NUMA nodes (QPI/UPI/Infinity Fabric).
HOP_PCIE_LEVEL: dict[str, float] = {"PIX": 0.0, "PXB": 0.2, "PHB": 0.4, "NODE": 0.6, "SYS": 0.8}
#: The farthest hop a described node has (PCIe ``SYS``).
HOP_SYS = HOP_PCIE + HOP_PCIE_LEVEL["SYS"]

# --- gres.conf Links= constants ---------------------------------------------------------------
#
# gres.conf(5), "Links": "A comma-delimited list of numbers identifying the number of connections
# between this device and other devices to allow coscheduling of better connected devices. [...] A -1
# indicates the device itself and a 0 indicates no connection." (Slurm 22.05 man page, as installed
# by Debian's slurm-wlm.) Slurm's cons_tres (src/plugins/select/cons_tres/gres_select_filter.c) only
# compares these numbers: for each candidate GPU it sums its Links values to the GPUs already picked
# (or, for --gres-per-socket, to all free GPUs) and takes the candidate with the largest sum first.
# So any integers that grow with nearness work; we keep small readable ones.

#: ``Links=`` value of a GPU for itself (gres.conf(5)).
LINKS_SELF = -1
#: ``Links=`` value for "no connection": PCIe ``SYS`` and pairs the description says nothing about.
LINKS_NONE = 0
#: ``Links=`` value per PCIe level: nearer levels get larger numbers, ``SYS`` is "no connection".
LINKS_PCIE: dict[str, int] = {"PIX": 4, "PXB": 3, "PHB": 2, "NODE": 1, "SYS": 0}
#: ``Links=`` value of a pair joined through an NVSwitch. Above every PCIe value.
LINKS_NVSWITCH = 10
#: A direct NVLink pair gets ``LINKS_NVLINK + nvlinks`` (NV1 = 11, NV2 = 12, NV12 = 22): above the
#: NVSwitch value (a direct link is nearer in the hop matrix) and more links above fewer.
LINKS_NVLINK = 10

#: Schema version of :meth:`Topology.to_dict`.
TOPOLOGY_JSON_VERSION = 1

# Hops are sums of a few float constants; compare them with this tolerance.
_TOL = 1e-9


# --- hop matrix -------------------------------------------------------------------------------


def nvlink_hop(nvlinks: int) -> float:
    """Hop of a direct NVLink pair with ``nvlinks`` bonded links: ``1 + 1/(1 + nvlinks)``.

    Args:
        nvlinks: links between the two GPUs (the ``#`` of ``NV#``), at least 1.

    Returns:
        A hop in (1, 1.5]: NV1 = 1.5, NV2 = 1.333..., NV12 = 1.0769...

    Raises:
        InputError: ``nvlinks`` below 1.
    """
    if nvlinks < 1:
        raise InputError(f"a direct NVLink pair needs at least 1 link, got {nvlinks}")
    return HOP_NVLINK + 1.0 / (1 + nvlinks)


def pcie_hop(level: str) -> float:
    """Hop of a PCIe-only pair at PCIe path ``level`` (one of :data:`PCIE_LEVELS`).

    Raises:
        InputError: an unknown level.
    """
    if level not in HOP_PCIE_LEVEL:
        raise InputError(f"unknown PCIe level {level!r}", hint=f"use one of {', '.join(PCIE_LEVELS)}")
    return HOP_PCIE + HOP_PCIE_LEVEL[level]


def hop_matrix(machine: Machine) -> np.ndarray:
    """The hop matrix of a node (the table in this module's docstring).

    Args:
        machine: the node's description.

    Returns:
        float64 array of shape ``(n, n)``, ``n`` = number of GPUs, rows and columns in ascending GPU
        index order; symmetric, 0 on the diagonal, dimensionless (smaller is nearer). Pairs the
        description does not describe are ``SYS`` (3.8).

    Raises:
        MachineDescriptionError: the description contradicts itself: duplicate GPU indices, a link to
            a GPU that does not exist or to the GPU itself, a pair described twice (in either order),
            a negative NVLink count, an NVSwitch path without NVLinks, an unknown PCIe level.
    """
    order = _gpu_order(machine)
    pos = {g: i for i, g in enumerate(order)}
    n = len(order)
    hop = np.full((n, n), np.nan, dtype=np.float64)
    np.fill_diagonal(hop, HOP_SAME_GPU)
    for ln in _checked_links(machine, pos):
        h = _link_hop(ln, machine)
        i, j = pos[ln.a], pos[ln.b]
        hop[i, j] = hop[j, i] = h
    hop[np.isnan(hop)] = HOP_SYS  # undescribed pairs: unknown is no useful connection (module doc)
    return hop


def _gpu_order(machine: Machine) -> list[int]:
    idx = [g.index for g in machine.gpus]
    if len(set(idx)) != len(idx):
        raise MachineDescriptionError(f"duplicate GPU indices {idx}", source=_where(machine))
    return sorted(idx)


def _checked_links(machine: Machine, pos: dict[int, int]) -> list[Link]:
    """The machine's links with ``a < b``, after checking they do not contradict each other."""
    seen: dict[tuple[int, int], Link] = {}
    for ln in machine.links:
        if ln.a not in pos or ln.b not in pos:
            raise MachineDescriptionError(
                f"link {ln.a}-{ln.b} names a GPU that is not described",
                hint=f"GPU indices are {sorted(pos)}", source=_where(machine))
        if ln.a == ln.b:
            raise MachineDescriptionError(f"link {ln.a}-{ln.b} joins a GPU to itself", source=_where(machine))
        key = (min(ln.a, ln.b), max(ln.a, ln.b))
        if key in seen:
            raise MachineDescriptionError(
                f"GPU pair {key[0]}-{key[1]} is described twice ({_describe(seen[key])} and {_describe(ln)})",
                hint="describe each pair once", source=_where(machine))
        seen[key] = Link(key[0], key[1], ln.nvlinks, ln.via_nvswitch, ln.pcie)
    return list(seen.values())


def _link_hop(ln: Link, machine: Machine) -> float:
    """Hop of one described pair, or NaN when the link carries no usable fact."""
    if ln.nvlinks < 0:
        raise MachineDescriptionError(f"link {ln.a}-{ln.b}: negative NVLink count {ln.nvlinks}",
                                      source=_where(machine))
    if ln.via_nvswitch and ln.nvlinks == 0:
        raise MachineDescriptionError(f"link {ln.a}-{ln.b}: goes through an NVSwitch but has no NVLinks",
                                      hint="give the NVLink count, or drop via_nvswitch",
                                      source=_where(machine))
    if ln.pcie is not None and ln.pcie not in HOP_PCIE_LEVEL:
        raise MachineDescriptionError(f"link {ln.a}-{ln.b}: unknown PCIe level {ln.pcie!r}",
                                      hint=f"use one of {', '.join(PCIE_LEVELS)}", source=_where(machine))
    # NVLink wins over the PCIe level: GPU peer traffic takes NVLink when it exists.
    if ln.via_nvswitch:
        return HOP_NVSWITCH
    if ln.nvlinks > 0:
        return nvlink_hop(ln.nvlinks)
    if ln.pcie is not None:
        return pcie_hop(ln.pcie)
    return math.nan


def _describe(ln: Link) -> str:
    parts = []
    if ln.nvlinks:
        parts.append(f"NV{ln.nvlinks}" + (" via NVSwitch" if ln.via_nvswitch else ""))
    if ln.pcie:
        parts.append(ln.pcie)
    return "/".join(parts) or "no path"


def _where(machine: Machine) -> str:
    return machine.source or machine.hostname or "machine description"


# --- gres.conf Links= -------------------------------------------------------------------------


def slurm_links(topology: Machine | Topology | np.ndarray) -> np.ndarray:
    """gres.conf ``Links=`` values for every GPU pair, from the hop matrix.

    The mapping (constants above; gres.conf(5) "Links"): diagonal :data:`LINKS_SELF` (-1); PCIe
    ``SYS`` and undescribed pairs :data:`LINKS_NONE` (0); PCIe ``NODE`` 1, ``PHB`` 2, ``PXB`` 3,
    ``PIX`` 4; NVSwitch 10; direct NVLink ``10 + nvlinks``. So every NVLink pair ranks above every
    PCIe pair, a direct link above the switch, more links above fewer, and the order is exactly the
    (reversed) hop order. Slurm sums these values over the GPUs a job already holds, so three ``PIX``
    neighbours (12) can outweigh one ``NV1`` neighbour (11); per pair the order is exact.

    Column ``j`` of a ``Links=`` list is Slurm's device number ``j``, which gres.conf(5) says comes
    from sorting the GPUs by PCI bus id; NVML (and ``nvidia-smi``) index GPUs in PCI bus order too, so
    the matrix order (ascending GPU index) is the order Slurm expects.

    Args:
        topology: a machine description, a :class:`Topology`, or a hop matrix as
            :func:`hop_matrix` makes it (``(n, n)``, values from the table in the module docstring).

    Returns:
        int64 array of shape ``(n, n)``, symmetric, rows in ascending GPU index order. Row ``i`` is
        the ``Links=`` of the gres.conf line of the ``i``-th GPU (see :func:`format_links`).

    Raises:
        MachineDescriptionError: a contradictory machine description (see :func:`hop_matrix`).
        InputError: a matrix that is not square, not symmetric, not 0 on the diagonal, or holds a
            value :func:`hop_matrix` never produces.
    """
    hop = _hop_of(topology)
    n = hop.shape[0]
    out = np.empty((n, n), dtype=np.int64)
    for i in range(n):
        for j in range(n):
            out[i, j] = LINKS_SELF if i == j else _links_of_hop(float(hop[i, j]), i, j)
    return out


def _links_of_hop(h: float, i: int, j: int) -> int:
    if HOP_NVLINK < h <= HOP_NVLINK + 0.5 + _TOL:
        k = round(1.0 / (h - HOP_NVLINK) - 1.0)
        if k >= 1 and abs(nvlink_hop(k) - h) < _TOL:
            return LINKS_NVLINK + k
    if abs(h - HOP_NVSWITCH) < _TOL:
        return LINKS_NVSWITCH
    for level, extra in HOP_PCIE_LEVEL.items():
        if abs(h - (HOP_PCIE + extra)) < _TOL:
            return LINKS_PCIE[level]
    raise InputError(f"hop {h!r} between positions {i} and {j} is not a value hop_matrix produces",
                     hint="build the matrix with slurm_gpushare.topology.hops.hop_matrix")


def format_links(row: Iterable[int | np.integer]) -> str:
    """The gres.conf ``Links=`` field for one GPU line, e.g. ``Links=-1,12,0,0``.

    Args:
        row: the GPU's row of :func:`slurm_links` (one value per GPU, -1 for itself).

    Raises:
        InputError: an empty row, a value that is not an integer, or one below -1.
    """
    values = []
    for v in row:
        if isinstance(v, bool) or not float(v).is_integer() or int(v) < LINKS_SELF:
            raise InputError(f"Links= value {v!r} is not an integer >= -1", hint="see gres.conf(5) Links")
        values.append(int(v))
    if not values:
        raise InputError("Links= needs one value per GPU, got none")
    return "Links=" + ",".join(str(v) for v in values)


# --- graph queries ----------------------------------------------------------------------------


def nvlink_graph(machine: Machine) -> nx.Graph:
    """The NVLink graph of a node: one node per GPU index, one edge per pair joined by NVLink.

    Edges carry ``nvlinks`` (int) and ``via_nvswitch`` (bool) attributes.

    Raises:
        MachineDescriptionError: a contradictory description (see :func:`hop_matrix`).
    """
    import networkx as nx  # here, not at module level: the Prolog's hop matrix needs no graph library (~0.1 s)

    order = _gpu_order(machine)
    pos = {g: i for i, g in enumerate(order)}
    graph = nx.Graph()
    graph.add_nodes_from(order)
    for ln in _checked_links(machine, pos):
        _link_hop(ln, machine)  # the same consistency checks as the hop matrix
        if ln.nvlinks > 0:
            graph.add_edge(ln.a, ln.b, nvlinks=ln.nvlinks, via_nvswitch=ln.via_nvswitch)
    return graph


def nvlink_islands(machine: Machine) -> list[frozenset[int]]:
    """GPUs that reach each other over NVLink (directly, through other GPUs, or an NVSwitch).

    Returns:
        The connected components of :func:`nvlink_graph` as sets of GPU indices, a singleton for each
        GPU without NVLink, ordered by their smallest GPU index.

    Raises:
        MachineDescriptionError: a contradictory description (see :func:`hop_matrix`).
    """
    import networkx as nx

    comps = [frozenset(c) for c in nx.connected_components(nvlink_graph(machine))]
    return sorted(comps, key=min)


def numa_groups(machine: Machine) -> dict[int | None, tuple[int, ...]]:
    """GPUs by NUMA node (``Gpu.numa_node``: ``nvmlDeviceGetNumaNodeId`` / ``NUMA Affinity``).

    Returns:
        NUMA node -> ascending GPU indices; nodes in ascending order, ``None`` (unknown) last.
    """
    return _group_by_numa((g.index, g.numa_node) for g in machine.gpus)


def _group_by_numa(pairs: Iterable[tuple[int, int | None]]) -> dict[int | None, tuple[int, ...]]:
    groups: dict[int | None, list[int]] = {}
    for g, node in sorted(pairs, key=lambda p: p[0]):
        groups.setdefault(node, []).append(g)
    keys = sorted(groups, key=lambda k: (k is None, k if k is not None else 0))
    return {k: tuple(groups[k]) for k in keys}


def nearest_nic(machine: Machine, gpu: int) -> Nic | None:
    """The network interface nearest to GPU ``gpu`` by PCIe level (``Nic.paths``; PIX nearest).

    Ties go to the NIC listed first (lowest ``NICn``).

    Args:
        machine: the node's description.
        gpu: GPU index.

    Returns:
        The NIC, or None when the node has no NICs or no NIC's path to this GPU is known.

    Raises:
        MachineDescriptionError: no such GPU, or a NIC whose paths do not match the GPUs.
    """
    machine.gpu(gpu)
    pos = _gpu_order(machine).index(gpu)
    best: tuple[int, int] | None = None
    found: Nic | None = None
    for order, nic in enumerate(machine.nics):
        if not nic.paths:
            continue
        if len(nic.paths) != len(machine.gpus):
            raise MachineDescriptionError(
                f"NIC {nic.name}: {len(nic.paths)} paths for {len(machine.gpus)} GPUs",
                source=_where(machine))
        level = nic.paths[pos]
        if level is None:
            continue
        if level not in PCIE_LEVELS:
            raise MachineDescriptionError(f"NIC {nic.name}: unknown PCIe level {level!r}",
                                          source=_where(machine))
        rank = (PCIE_LEVELS.index(level), order)
        if best is None or rank < best:
            best, found = rank, nic
    return found


# --- matrix checks ---------------------------------------------------------------------------


def _square(hop: Any) -> np.ndarray:
    h = np.asarray(hop, dtype=np.float64)
    if h.ndim != 2 or h.shape[0] != h.shape[1]:
        raise InputError(f"a hop matrix must be square, got shape {h.shape}")
    return h


def _hop_of(topology: Machine | Topology | np.ndarray) -> np.ndarray:
    if isinstance(topology, Machine):
        return hop_matrix(topology)
    if isinstance(topology, Topology):
        return topology.hop_array
    h = _square(topology)
    if not np.allclose(np.diag(h), HOP_SAME_GPU, atol=_TOL):
        raise InputError("a hop matrix must be 0 on the diagonal")
    if not np.allclose(h, h.T, atol=_TOL):
        raise InputError("a hop matrix must be symmetric")
    return h


# --- snapshot ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Topology:
    """What the topology models derive from one machine description, frozen.

    Built by :meth:`from_machine`; printed by ``slurm-gpushare topology`` (:func:`format_table`, or
    :meth:`to_dict` as JSON). Matrices are nested tuples so the snapshot is immutable and hashable;
    :attr:`hop_array` gives a numpy copy of the hop matrix.

    Attributes:
        hostname: node name of the description.
        source: where the description came from (``Machine.source``).
        gpus: GPU indices, ascending: the order of every row and column below.
        numa_nodes: NUMA node of each GPU (None = unknown).
        hop: :func:`hop_matrix`, ``n x n`` floats.
        links: :func:`slurm_links`, ``n x n`` ints.
        islands: :func:`nvlink_islands`.
        nearest_nics: per GPU, ``(NIC name, PCIe level)`` of :func:`nearest_nic`, or None.
    """

    hostname: str
    source: str
    gpus: tuple[int, ...]
    numa_nodes: tuple[int | None, ...]
    hop: tuple[tuple[float, ...], ...]
    links: tuple[tuple[int, ...], ...]
    islands: tuple[frozenset[int], ...]
    nearest_nics: tuple[tuple[str, str] | None, ...] = ()

    @classmethod
    def from_machine(cls, machine: Machine) -> Topology:
        """Derive the snapshot of ``machine``.

        Raises:
            MachineDescriptionError: a contradictory description (see :func:`hop_matrix`).
        """
        hop = hop_matrix(machine)
        order = _gpu_order(machine)
        pos = {g: i for i, g in enumerate(order)}
        by_index = {g.index: g for g in machine.gpus}
        nics: list[tuple[str, str] | None] = []
        for g in order:
            nic = nearest_nic(machine, g)
            level = nic.paths[pos[g]] if nic is not None else None
            if nic is None or level is None:
                nics.append(None)
            else:
                nics.append((nic.name, level))
        return cls(
            hostname=machine.hostname,
            source=machine.source,
            gpus=tuple(order),
            numa_nodes=tuple(by_index[g].numa_node for g in order),
            hop=tuple(tuple(float(v) for v in row) for row in hop),
            links=tuple(tuple(int(v) for v in row) for row in slurm_links(hop)),
            islands=tuple(nvlink_islands(machine)),
            nearest_nics=tuple(nics),
        )

    @property
    def hop_array(self) -> np.ndarray:
        """The hop matrix as a new float64 array, ``(n, n)``."""
        return np.array(self.hop, dtype=np.float64).reshape(len(self.gpus), len(self.gpus))

    @property
    def numa_groups(self) -> dict[int | None, tuple[int, ...]]:
        """NUMA node -> GPU indices, as :func:`numa_groups` gives it."""
        return _group_by_numa(zip(self.gpus, self.numa_nodes, strict=True))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (``slurm-gpushare topology --json``), versioned.

        Keys: ``version``, ``hostname``, ``source``, ``gpus``, ``hop`` (rows of floats), ``links``
        (rows of ints), ``gres_links`` (the ``Links=...`` text per GPU), ``nvlink_islands`` (lists of
        GPU indices), ``numa_groups`` (``[{"numa_node": 0 or null, "gpus": [...]}]``),
        ``nearest_nics`` (``[{"gpu": 0, "nic": "mlx5_0", "path": "PIX"} ...]``, GPUs with a known NIC).
        """
        return {
            "version": TOPOLOGY_JSON_VERSION,
            "hostname": self.hostname,
            "source": self.source,
            "gpus": list(self.gpus),
            "hop": [list(row) for row in self.hop],
            "links": [list(row) for row in self.links],
            "gres_links": [format_links(row) for row in self.links] if len(self.gpus) > 1 else [],
            "nvlink_islands": [sorted(isl) for isl in self.islands],
            "numa_groups": [{"numa_node": k, "gpus": list(v)} for k, v in self.numa_groups.items()],
            "nearest_nics": [{"gpu": g, "nic": nic[0], "path": nic[1]}
                             for g, nic in zip(self.gpus, self.nearest_nics, strict=False)
                             if nic is not None],
        }


def format_table(topology: Topology) -> str:
    """Human-readable text of a :class:`Topology`: the hop matrix, NVLink islands, NUMA groups, NICs.

    The hop matrix is printed with 2 decimals, one row and column per GPU (``GPUn``), after a legend
    line. Ends with a newline.
    """
    names = [f"GPU{g}" for g in topology.gpus]
    width = max([len(s) for s in names] + [4]) + 2
    lines = ["hop matrix (0 same GPU, 1-1.5 NVLink (more links nearer), 2 NVSwitch, "
             "3.0 PIX, 3.2 PXB, 3.4 PHB, 3.6 NODE, 3.8 SYS)"]
    lines.append(" " * width + "".join(s.rjust(width) for s in names))
    for name, row in zip(names, topology.hop, strict=True):
        lines.append(name.ljust(width) + "".join(f"{v:.2f}".rjust(width) for v in row))
    lines.append("")
    lines.append("NVLink islands:")
    for isl in topology.islands:
        lines.append("  " + ",".join(f"GPU{g}" for g in sorted(isl)))
    lines.append("NUMA groups:")
    for node, gpus in topology.numa_groups.items():
        label = "unknown" if node is None else f"node {node}"
        lines.append(f"  {label}: " + ",".join(f"GPU{g}" for g in gpus))
    if any(nic is not None for nic in topology.nearest_nics):
        lines.append("Nearest NIC:")
        for g, nic in zip(topology.gpus, topology.nearest_nics, strict=False):
            lines.append(f"  GPU{g}: " + (f"{nic[0]} ({nic[1]})" if nic is not None else "unknown"))
    return "\n".join(lines) + "\n"
