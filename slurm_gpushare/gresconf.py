"""gres.conf and the matching slurm.conf text, generated from machine descriptions (pure).

What is written, per node (gres.conf(5) of Slurm 22.05 is the reference for every key):

* one ``Name=gpu`` line per whole GPU (MIG mode off) with ``Type=<model>``, ``File=<dev>/nvidia<minor>``,
  ``Cores=`` (Slurm core ids from the GPU's CPU affinity; SMT siblings collapse onto their core, so
  hyperthread ids never appear) and ``Links=`` (from :func:`slurm_gpushare.topology.slurm_links`:
  -1 for the device itself, 0 for no useful connection, larger for nearer GPUs);
* one ``Name=gpu Type=<model>_<profile>`` line per live MIG device. Two forms:

  - default (Slurm 22.05): ``File=<caps>/nvidia-cap<M>``, the GPU instance's access device alone (the
    device real 22.05 autodetection reports as the MIG GRES's ``File=``).
    Measured on slurmd 22.05.8: ``MultipleFiles=`` with AutoDetect off is expanded into one GRES per
    file (the node then reports more GPUs than slurm.conf, falls back to count-only tracking, and jobs
    get no device at all). The parent ``/dev/nvidiaN`` then stays outside Slurm's device cgroup, which
    is what MIG needs: every MIG job opens the parent, and the capability device grants the instance.
  - ``mig_multiple_files=True`` (newer Slurm): ``MultipleFiles=`` with the parent ``/dev/nvidiaN`` and
    the GPU instance's and compute instance's ``nvidia-caps`` devices.

  MIG lines carry no ``Links=`` (MIG devices do not do NVLink peer-to-peer), and on a node with MIG
  devices no line carries ``Links=`` (Slurm numbers devices by record order, which would mix slices
  and whole GPUs);
* one ``Name=shard Count=<memory in the shard unit> File=<dev>/nvidia<minor>`` line per whole GPU, so a
  shard is a unit of GPU memory (default 1 GiB) and Slurm never places more reserved memory on a GPU
  than it has (DESIGN.md section 4); :func:`check_shard_unit` refuses a unit larger than a GPU's memory;
* a comment ``# GPU N: CPU affinity unknown, no Cores=`` (or ``CPU layout unknown``) for each GPU whose
  lines get no ``Cores=`` because the facts are missing (an empty ``CPU Affinity`` cell inside a
  Slurm job's cpuset, a layout that cannot be inferred), so that the gap is visible, not silent.

The slurm.conf side is ``GresTypes=``, ``AccountingStorageTRES=`` and one ``NodeName=... Gres=...``
line per node whose counts equal the gres.conf records.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace

from slurm_gpushare.errors import InputError
from slurm_gpushare.hardware.machine import Gpu, Machine
from slurm_gpushare.memsize import format_mib
from slurm_gpushare.slurmconf import format_ranges

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
        mig_multiple_files: MIG devices as ``MultipleFiles=parent,gi-cap,ci-cap`` (Slurm releases
            where MultipleFiles works) instead of ``File=ci-cap`` (Slurm 22.05; see module doc).
    """

    device_dir: str = "/dev"
    caps_dir: str | None = None
    shard_unit_mib: int = MIB_PER_GIB
    links: bool = True
    cores: bool = True
    shards: bool = True
    mig_multiple_files: bool = False

    def __post_init__(self):
        if self.shard_unit_mib <= 0:
            raise InputError(f"shard unit must be a positive number of MiB, not {self.shard_unit_mib}",
                             hint="the default is 1024 (one shard per GiB)")

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
        return ",".join(f"{n}:{t}:{c}" if t else f"{n}:{c}" for (n, t), c in self.counts.items())

    @property
    def tres(self) -> tuple[str, ...]:
        """TRES names for ``AccountingStorageTRES`` (``gres/gpu``, ``gres/gpu:h100``, ...)."""
        out = []
        for n, t in self.counts:
            out.append(f"gres/{n}")
            if t:
                out.append(f"gres/{n}:{t}")
        return tuple(dict.fromkeys(out))


def mig_type(gpu: Gpu, profile: str) -> str:
    """GRES type of a MIG device: ``<model>_<profile>``, e.g. ``h100_1g.10gb``.

    Requests must name the whole type (``--gres=gpu:h100_1g.10gb:1``; slurmctld 22.05 refuses
    ``gpu:1g.10gb:1`` with "Requested node configuration is not available"); the model prefix keeps
    profiles of different GPU models apart.
    """
    return f"{gpu.model}_{profile}"


def node_gres(machine: Machine, node_name: str | None = None, options: GresOptions | None = None) -> NodeGres:
    """Build the gres.conf records and ``Gres=`` counts of one node.

    Args:
        machine: the node's description (NVML probe or parsed ``nvidia-smi topo -m``).
        node_name: Slurm node name (default: the description's hostname).
        options: device paths and what to write.

    Raises:
        MachineDescriptionError: CPU affinity outside the described CPU layout.
        InputError: a MIG device without its nvidia-caps minors.
    """
    opts = options or GresOptions()
    name = node_name or machine.hostname
    dev = opts.device_dir.rstrip("/")
    gpus = sorted(machine.gpus, key=lambda g: g.index)
    has_mig = any(g.mig_enabled for g in gpus)
    links = None
    if opts.links and not has_mig and len(gpus) > 1:
        # imported here: numpy/networkx cost the node hooks' start-up, which never needs Links
        from slurm_gpushare.topology import slurm_links

        links = slurm_links(machine)
    if links is not None and not (links > 0).any():
        links = None  # all SYS: all-zero Links= say nothing Slurm does not assume anyway
    position = {g.index: i for i, g in enumerate(gpus)}

    gpu_records: list[GresRecord] = []
    notes: list[str] = []
    for g in gpus:
        cores = ()
        if opts.cores and machine.cpus is not None and g.cpu_affinity:
            cores = machine.cpus.core_ids(g.cpu_affinity)
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
                files = (gpu_file, *caps) if opts.mig_multiple_files else (caps[0],)
                gpu_records.append(GresRecord("gpu", t, files, multiple_files=opts.mig_multiple_files,
                                              cores=cores, gpu_index=g.index, mig_gi=inst.gi_id))
            continue
        gpu_records.append(GresRecord("gpu", g.model, (gpu_file,), cores=cores, gpu_index=g.index))
    # slurmd numbers a node's GPUs (the IDX of `scontrol -d show job`, the rows of Links=) after
    # grouping its gpu records by type, in the order the types first appear (measured on slurmd
    # 22.05.8): write them in that order, so that file order, device index and Links agree.
    type_order = list(dict.fromkeys(r.type for r in gpu_records))
    gpu_records.sort(key=lambda r: type_order.index(r.type))
    if links is not None:
        order = [position[r.gpu_index] for r in gpu_records]
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


def check_shard_unit(machine: Machine, shard_unit_mib: int, node_name: str | None = None) -> None:
    """Refuse a shard unit larger than the memory of a whole GPU: that GPU would get no shard line.

    (:func:`node_gres` itself leaves such a GPU without shards; the command line calls this first.)

    Raises:
        InputError: the first such GPU, with its name and memory.
    """
    for g in sorted(machine.gpus, key=lambda g: g.index):
        if not g.mig_enabled and g.memory_mib < shard_unit_mib:
            raise InputError(
                f"shard unit {format_mib(shard_unit_mib)} is larger than GPU {g.index} ({g.name}, "
                f"{format_mib(g.memory_mib)}) of {node_name or machine.hostname}: it would get no shards",
                hint=f"give --shard-unit {format_mib(g.memory_mib)} or less, e.g. 1G, or --no-shards")


def render_gres_conf(nodes: list[NodeGres], *, header: str = "") -> str:
    """Render one gres.conf for all nodes (every line starts with ``NodeName=``).

    ``AutoDetect=off`` comes first: a File-less duplicate next to an autodetected device is the
    classic mistake this avoids, and Debian's build has no NVML autodetection anyway.
    """
    lines = []
    if header:
        lines += [f"# {h}" if h else "#" for h in header.splitlines()]
    lines.append("AutoDetect=off")
    for node in nodes:
        origin = node.machine.source or "machine description"
        lines.append(f"# {node.node_name}: {len(node.machine.gpus)} GPU(s), from {origin}")
        lines += [f"# {note}" for note in node.notes]
        lines += [r.render(node.node_name) for r in node.records]
    return "\n".join(lines) + "\n"


def render_slurm_conf(nodes: list[NodeGres], *, node_params: dict[str, str] | None = None,
                      accounting_tres: bool = True, gpushare: bool = True) -> str:
    """The slurm.conf lines that must match the gres.conf: GresTypes, AccountingStorageTRES, NodeName.

    Args:
        nodes: the generated nodes.
        node_params: extra ``Key=Value`` text per node name appended to its ``NodeName=`` line
            (``NodeAddr=...``, ``RealMemory=...``).
        accounting_tres: write ``AccountingStorageTRES=`` (slurmctld 22.05 refuses to start with
            GRES TRES but no slurmdbd: "slurmdbd is required to run with TRES gres/gpu").
        gpushare: add ``gpushare`` to ``GresTypes``: sbatch/salloc/srun refuse a GRES name that is
            not in GresTypes before anything reaches job_submit.lua, which rewrites it away.
    """
    names = dict.fromkeys(["gpu"] + [n for node in nodes for (n, _t) in node.counts])
    if gpushare:
        names["gpushare"] = None
    tres = dict.fromkeys(t for node in nodes for t in node.tres)
    lines = [f"GresTypes={','.join(names)}"]
    if accounting_tres:
        lines.append(f"AccountingStorageTRES={','.join(tres)}")
    for node in nodes:
        parts = [f"NodeName={node.node_name}"]
        cpus = node.machine.cpus
        if cpus is not None:
            parts.append(f"Sockets={cpus.sockets} CoresPerSocket={cpus.cores_per_socket} "
                         f"ThreadsPerCore={cpus.threads_per_core}")
        extra = (node_params or {}).get(node.node_name)
        if extra:
            parts.append(extra)
        if node.counts:
            parts.append(f"Gres={node.gres_value}")
        lines.append(" ".join(parts))
    return "\n".join(lines) + "\n"
