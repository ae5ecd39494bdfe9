"""gres.conf and the matching slurm.conf text, generated from machine descriptions (pure).

What is written, per node, for one Slurm release (``GresOptions.release``; gres.conf(5) of 22.05,
24.11 and 26.05 and the rules of :mod:`slurm_gpushare.slurm.gresrules`):

* one ``Name=gpu`` line per whole GPU (MIG mode off) with ``Type=<model>``, ``File=<dev>/nvidia<minor>``,
  ``Cores=`` (Slurm core ids from the GPU's CPU affinity; SMT siblings collapse onto their core, so
  hyperthread ids never appear) and ``Links=`` (from :func:`slurm_gpushare.topology.hops.slurm_links`:
  -1 for the device itself, 0 for no useful connection, larger for nearer GPUs);
* ``Cores=`` as the release takes it: up to 24.05 the GPU's own cores, even a part of a socket (a
  NUMA node of an AMD node in NPS2/NPS4); from 24.11 slurmd sets a node INVAL for ``Cores=`` that
  split a socket, so a GPU whose affinity is part of a socket gets that whole socket (24.11), or its
  socket when it touches one and every core when it touches several (25.11 on), with a comment
  naming its real affinity. Slurm's scheduler places GRES by socket anyway (the comment above
  ``_check_core_range_matches_sock``), so the wider ``Cores=`` loses no placement; the NUMA node
  stays in the machine description, where the Prolog's task binding uses it;
* one ``Name=gpu Type=<model>_<profile>`` line per live MIG device. Two forms:

  - before 23.11 (22.05): ``File=<caps>/nvidia-cap<M>``, the GPU instance's access device alone (the
    ``File=`` of the MIG GRES in the recorded real ``slurmd -G`` print, ``tests/data/slurmd``; Slurm's
    own autodetection, ``src/plugins/gpu/nvml/gpu_nvml.c`` ``_handle_mig``, builds the list parent
    ``/dev/nvidiaN``, GPU instance cap, compute instance cap at 22.05.8, 24.11.5 and 26.05.3 alike).
    Measured on slurmd 22.05.8: ``MultipleFiles=`` next to shard lines is expanded into one GRES per
    file (the node then reports more GPUs than slurm.conf, falls back to count-only tracking, and jobs
    get no device at all; fixed in 23.02.7, "Do not split GRES with MultipleFiles in
    _build_sharing_list"). The parent ``/dev/nvidiaN`` then stays outside Slurm's device cgroup, which
    is what MIG needs: every MIG job opens the parent, and the capability device grants the instance.
  - from 23.11 (:data:`~slurm_gpushare.slurm.release.MULTIPLE_FILES`), or with
    ``mig_multiple_files=True``: ``MultipleFiles=`` with the parent ``/dev/nvidiaN`` and the GPU
    instance's and compute instance's ``nvidia-caps`` devices (gres.conf(5) MultipleFiles: "Graphics
    cards using Multi-Instance GPU (MIG) technology will present multiple device files that should
    be managed as a single generic resource").

  MIG lines carry no ``Links=`` (MIG devices do not do NVLink peer-to-peer), and on a node with MIG
  devices no line carries ``Links=`` (Slurm numbers devices by record order, which would mix slices
  and whole GPUs);
* one ``Name=shard Count=<memory in the shard unit> File=<dev>/nvidia<minor>`` line per whole GPU, so a
  shard is a unit of GPU memory (default 1 GiB) and Slurm never places more reserved memory on a GPU
  than it has; :func:`check_shard_unit` refuses a unit larger than a GPU's memory;
* a comment ``# GPU N: CPU affinity unknown, no Cores=`` (or ``CPU layout unknown``) for each GPU whose
  lines get no ``Cores=`` because the facts are missing (an empty ``CPU Affinity`` cell inside a
  Slurm job's cpuset, a layout that cannot be inferred), so that the gap is visible, not silent.

The slurm.conf side is ``GresTypes=``, ``AccountingStorageTRES=`` (every ``gres/<name>`` and typed
``gres/gpu:<type>``, MIG types included), one ``NodeName=... Gres=...`` line per node whose counts equal
the gres.conf records and, when asked, one ``PartitionName=... TRESBillingWeights=...`` line per
partition (:mod:`slurm_gpushare.gresconf.billing`).
"""


from __future__ import annotations

from collections.abc import Sequence

from slurm_gpushare.errors import InputError
from slurm_gpushare.gresconf.billing import PartitionBilling, truncation_note
from slurm_gpushare.hardware.machine import Machine
from slurm_gpushare.memsize import format_mib
from slurm_gpushare.slurm.gresrules import links_for_release
from slurm_gpushare.slurm.nodegres import GresOptions, NodeGres, node_gres
from slurm_gpushare.topology.hops import slurm_links


def generate_node_gres(machine: Machine, node_name: str | None = None,
                       options: GresOptions | None = None) -> NodeGres:
    """:func:`~slurm_gpushare.slurm.nodegres.node_gres` with ``Links=`` from the hop matrix when
    ``options.links`` (the default): what ``gres-conf`` and the dev cluster write.

    Raises:
        MachineDescriptionError, InputError: as :func:`~slurm_gpushare.slurm.nodegres.node_gres`.
    """
    opts = options or GresOptions()
    links = None
    if opts.links and len(machine.gpus) > 1 and not any(g.mig_enabled for g in machine.gpus):
        links = links_for_release(slurm_links(machine).tolist(), opts.target)
    return node_gres(machine, node_name, opts, links=links)


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
                      accounting_tres: bool = True, gpushare: bool = True,
                      partitions: Sequence[PartitionBilling] = ()) -> str:
    """The slurm.conf lines that must match the gres.conf: GresTypes, AccountingStorageTRES, NodeName
    and, for ``partitions``, PartitionName with TRESBillingWeights.

    Args:
        nodes: the generated nodes.
        node_params: extra ``Key=Value`` text per node name appended to its ``NodeName=`` line
            (``NodeAddr=...``, ``RealMemory=...``).
        accounting_tres: write ``AccountingStorageTRES=`` (slurmctld 22.05 refuses to start with
            GRES TRES but no slurmdbd: "slurmdbd is required to run with TRES gres/gpu").
        gpushare: add ``gpushare`` to ``GresTypes``: sbatch/salloc/srun refuse a GRES name that is
            not in GresTypes before anything reaches job_submit.lua, which rewrites it away.
        partitions: the partitions to write ``TRESBillingWeights`` for (their GRES weights need the
            TRES of ``AccountingStorageTRES``: only with ``accounting_tres``), each preceded by its
            notes and a truncation note (:func:`~slurm_gpushare.gresconf.billing.truncation_note`).
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
    if partitions and accounting_tres:
        lines.append("# TRESBillingWeights: merge into each partition's PartitionName= line; TRES not listed "
                     "(CPU, memory) weigh 0")
        for part in partitions:
            note = truncation_note(part)
            if note:
                lines.append(f"# {note}")
            lines.append(part.render())
    return "\n".join(lines) + "\n"
