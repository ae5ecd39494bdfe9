"""The GRES a node offers in Slurm's terms, derived from its machine description (pure).

One :class:`NodeGres` per node: its gres.conf records in slurmd's device order and the ``Gres=``
counts of slurm.conf. The controller (inventory counts), the node hooks (device order = slurmd's IDX)
and the gres.conf generator (:mod:`slurm_gpushare.gresconf.render`, which writes them as text and adds
``Links=`` from the hop matrix) all read this one model. What each record holds is described in
:mod:`slurm_gpushare.gresconf.render`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from slurm_gpushare.errors import InputError
from slurm_gpushare.hardware.machine import Gpu, Machine
from slurm_gpushare.slurm.gres import GresItem, render_counts
from slurm_gpushare.slurm.gresrules import cores_problem
from slurm_gpushare.slurm.hostlist import format_ranges
from slurm_gpushare.slurm.release import MULTIPLE_FILES, OLDEST, Release

MIB_PER_GIB = 1024


@dataclass(frozen=True)
class GresOptions:
    """How device files and shards are written.

    Attributes:
        device_dir: directory of the ``nvidiaN`` device files (``/dev`` on a real node).
        caps_dir: directory of the ``nvidia-capN`` files; default ``<device_dir>/nvidia-caps``.
        shard_unit_mib: GPU memory per shard in MiB (default 1024: one shard per GiB).
        links: write ``Links=`` on whole-GPU lines.
        cores: write ``Cores=`` where the CPU affinity is known.
        shards: write ``Name=shard`` lines.
        mig_multiple_files: MIG devices as ``MultipleFiles=parent,gi-cap,ci-cap`` (True) or as
            ``File=gi-cap`` (False); None (the default): ``MultipleFiles=`` from
            :data:`~slurm_gpushare.slurm.release.MULTIPLE_FILES` on, ``File=`` before (see
            :mod:`slurm_gpushare.gresconf.render`).
        release: the Slurm release the records are for (None: the oldest supported, 22.05). It
            decides the MIG form and whether ``Cores=`` is widened to whole sockets
            (:func:`slurm_gpushare.slurm.gresrules.cores_problem`).
    """

    device_dir: str = "/dev"
    caps_dir: str | None = None
    shard_unit_mib: int = MIB_PER_GIB
    links: bool = True
    cores: bool = True
    shards: bool = True
    mig_multiple_files: bool | None = None
    release: Release | None = None

    def __post_init__(self):
        if self.shard_unit_mib <= 0:
            raise InputError(f"shard unit must be a positive number of MiB, not {self.shard_unit_mib}",
                             hint="the default is 1024 (one shard per GiB)")

    @property
    def target(self) -> Release:
        """:attr:`release`, or the oldest supported release when it is None."""
        return self.release or OLDEST

    @property
    def multiple_files(self) -> bool:
        """Whether MIG devices are written as ``MultipleFiles=``."""
        if self.mig_multiple_files is not None:
            return self.mig_multiple_files
        return self.target >= MULTIPLE_FILES

    @property
    def caps(self) -> str:
        """Directory of the ``nvidia-capN`` device files."""
        return self.caps_dir or f"{self.device_dir.rstrip('/')}/nvidia-caps"


@dataclass(frozen=True)
class GresRecord:
    """One gres.conf line (without ``NodeName=``).

    Attributes:
        name: ``gpu`` or ``shard``.
        type: GRES type (``h100``, ``h100_1g.10gb``) or ``""`` for none.
        files: device files; one goes to ``File=``, several to ``MultipleFiles=``.
        multiple_files: write ``MultipleFiles=`` (MIG) instead of ``File=``.
        count: ``Count=`` (shards) or None.
        cores: Slurm core ids for ``Cores=``; empty for none.
        links: ``Links=`` values; empty for none.
        gpu_index: NVML index of the (parent) GPU of a ``gpu`` record (not written).
        mig_gi: GPU instance id of a MIG record (not written).
    """

    name: str
    type: str = ""
    files: tuple[str, ...] = ()
    multiple_files: bool = False
    count: int | None = None
    cores: tuple[int, ...] = ()
    links: tuple[int, ...] = ()
    gpu_index: int | None = field(default=None, compare=False)
    mig_gi: int | None = field(default=None, compare=False)

    def render(self, node_name: str | None = None) -> str:
        """The gres.conf line, ``NodeName=`` first when given."""
        parts = [f"NodeName={node_name}"] if node_name else []
        parts.append(f"Name={self.name}")
        if self.type:
            parts.append(f"Type={self.type}")
        if self.count is not None:
            parts.append(f"Count={self.count}")
        if self.files:
            key = "MultipleFiles" if self.multiple_files else "File"
            parts.append(f"{key}={','.join(self.files)}")
        if self.cores:
            parts.append(f"Cores={format_ranges(self.cores)}")
        if self.links:
            parts.append("Links=" + ",".join(str(v) for v in self.links))
        return " ".join(parts)


@dataclass(frozen=True)
class NodeGres:
    """Everything generated for one node.

    Attributes:
        node_name: Slurm ``NodeName``.
        machine: the description it came from.
        records: gres.conf records in file order.
        counts: slurm.conf ``Gres=`` counts keyed by ``(name, type)`` (type ``""`` for untyped).
        notes: what the records leave out for lack of facts, one line each, written into gres.conf
            as comments (``GPU 1: CPU affinity unknown, no Cores=``).
    """

    node_name: str
    machine: Machine
    records: tuple[GresRecord, ...]
    counts: dict[tuple[str, str], int] = field(default_factory=dict)
    notes: tuple[str, ...] = ()

    @property
    def gres_value(self) -> str:
        """The slurm.conf ``Gres=`` value, e.g. ``gpu:h100:2,gpu:h100_1g.10gb:6,shard:160``."""
        return render_counts(self.counts)

    @property
    def tres(self) -> tuple[str, ...]:
        """TRES names for ``AccountingStorageTRES`` (``gres/gpu``, ``gres/gpu:h100``, ...)."""
        out = []
        for n, t in self.counts:
            out.append(GresItem(n, prefix="gres/").text)
            if t:
                out.append(GresItem(n, t, prefix="gres/").text)
        return tuple(dict.fromkeys(out))


def mig_type(gpu: Gpu, profile: str) -> str:
    """GRES type of a MIG device: ``<model>_<profile>``, e.g. ``h100_1g.10gb``.

    Requests must name the whole type (``--gres=gpu:h100_1g.10gb:1``; slurmctld 22.05 refuses
    ``gpu:1g.10gb:1`` with "Requested node configuration is not available"); the model prefix keeps
    profiles of different GPU models apart.
    """
    return f"{gpu.model}_{profile}"


def node_gres(machine: Machine, node_name: str | None = None, options: GresOptions | None = None, *,
              links: Sequence[Sequence[int]] | None = None) -> NodeGres:
    """Build the gres.conf records and ``Gres=`` counts of one node.

    Args:
        machine: the node's description (NVML probe or parsed ``nvidia-smi topo -m``).
        node_name: Slurm node name (default: the description's hostname).
        options: device paths and what to write.
        links: the node's ``Links=`` matrix, indexed by position in NVML index order
            (:func:`slurm_gpushare.topology.hops.slurm_links`), or None for no ``Links=``. Written only
            on a node without MIG devices with more than one GPU, and only when some entry is positive.

    Raises:
        MachineDescriptionError: CPU affinity outside the described CPU layout.
        InputError: a MIG device without its nvidia-caps minors.
    """
    opts = options or GresOptions()
    name = node_name or machine.hostname
    dev = opts.device_dir.rstrip("/")
    gpus = sorted(machine.gpus, key=lambda g: g.index)
    has_mig = any(g.mig_enabled for g in gpus)
    if has_mig or len(gpus) < 2 or (links is not None and not any(v > 0 for row in links for v in row)):
        links = None  # all SYS: all-zero Links= say nothing Slurm does not assume anyway
    position = {g.index: i for i, g in enumerate(gpus)}

    gpu_records: list[GresRecord] = []
    notes: list[str] = []
    for g in gpus:
        cores: tuple[int, ...] = ()
        if opts.cores and machine.cpus is not None and g.cpu_affinity:
            cores = machine.cpus.core_ids(g.cpu_affinity)
            layout = machine.cpus
            problem = cores_problem(cores, layout.sockets, layout.cores_per_socket, opts.target)
            if problem is not None:
                notes.append(f"GPU {g.index}: CPU affinity is cores {format_ranges(cores)}, part of socket "
                             f"{problem.socket} (cores {problem.first}-{problem.last}); {problem.rule}: "
                             f"Cores={format_ranges(problem.fix)}")
                cores = problem.fix
        elif opts.cores and not g.cpu_affinity:
            notes.append(f"GPU {g.index}: CPU affinity unknown, no Cores=")
        elif opts.cores:
            notes.append(f"GPU {g.index}: CPU layout unknown, no Cores= (give --cpus SOCKETSxCORESxTHREADS)")
        gpu_file = f"{dev}/nvidia{g.minor}"
        if g.mig_enabled:
            for inst in sorted(g.mig_instances, key=lambda i: (i.start, i.gi_id)):
                if len(inst.caps) < 2:
                    raise InputError(
                        f"GPU {g.index}: MIG device {inst.profile} (GPU instance {inst.gi_id}) has no "
                        "nvidia-caps minors", hint="re-run 'slurm-gpushare inventory' on the node as root",
                        source=machine.source or machine.hostname)
                caps = tuple(f"{opts.caps.rstrip('/')}/nvidia-cap{c}" for c in inst.caps)
                t = mig_type(g, inst.profile)
                files = (gpu_file, *caps) if opts.multiple_files else (caps[0],)
                gpu_records.append(GresRecord("gpu", t, files, multiple_files=opts.multiple_files,
                                              cores=cores, gpu_index=g.index, mig_gi=inst.gi_id))
            continue
        gpu_records.append(GresRecord("gpu", g.model, (gpu_file,), cores=cores, gpu_index=g.index))
    # slurmd numbers a node's GPUs (the IDX of `scontrol -d show job`, the rows of Links=) after
    # grouping its gpu records by type, in the order the types first appear (measured on slurmd
    # 22.05.8): write them in that order, so that file order, device index and Links agree.
    type_order = list(dict.fromkeys(r.type for r in gpu_records))
    gpu_records.sort(key=lambda r: type_order.index(r.type))
    if links is not None:
        order = [position[r.gpu_index] for r in gpu_records if r.gpu_index is not None]
        gpu_records = [replace(r, links=tuple(int(links[i][j]) for j in order))
                       for r, i in zip(gpu_records, order, strict=True)]
    records: list[GresRecord] = list(gpu_records)
    counts: Counter[tuple[str, str]] = Counter()
    for r in gpu_records:
        counts[("gpu", r.type)] += 1
    if opts.shards:
        for g in gpus:
            if not g.mig_enabled:
                n = g.memory_mib // opts.shard_unit_mib
                if n > 0:
                    records.append(GresRecord("shard", "", (f"{dev}/nvidia{g.minor}",), count=n))
                    counts[("shard", "")] += n
    return NodeGres(name, machine, tuple(records), dict(counts), tuple(notes))


