"""``TRESBillingWeights`` for GPU partitions: a shard job billed its fraction of a GPU, a MIG device its
fraction of its GPU (pure).

What Slurm does with the weights (slurm.conf(5) ``TRESBillingWeights`` and ``AccountingStorageTRES``
at 22.05, 24.11 and 26.05, SchedMD's ``tres.html``; ``assoc_mgr_tres_weighted`` in
``src/common/assoc_mgr.c`` and ``calc_job_billable_tres`` in ``src/slurmctld/job_mgr.c`` at
slurm-22-05-8-1, slurm-24-11-5-1 and slurm-26-05-3-1):

* the weights are a partition parameter, ``PartitionName=... TRESBillingWeights=<TRES>=<weight>,...``;
  each weight is read with ``strtod`` (a decimal such as ``0.0125``, negative allowed; ``1/80`` is not
  a number and slurmctld stops: "failed to parse tres weights str"); every TRES named must be tracked
  (``AccountingStorageTRES`` or a default TRES), else slurmctld stops at start ("TRES weight ... is not
  a configured TRES type"); names are matched without regard to case;
* a job's billing is the sum over its allocated TRES of count x weight (``PriorityFlags=MAX_TRES``:
  the largest node TRES term plus the global ones); TRES not listed weigh 0, so a partition with
  weights bills CPUs only through a ``CPU=`` weight (without ``TRESBillingWeights`` a job is billed
  its CPU count);
* fairshare uses that sum as a double; the ``billing`` TRES (``scontrol show job`` ``TRES=``, ``sacct
  -o AllocTRES``, QOS and association ``billing=`` limits) is the sum truncated to an integer
  (tres.html: "the final billing amount is stored as an integer and truncated");
* a typed request (``--gres=gpu:h100_1g.10gb:1``) is allocated ``gres/gpu=1`` and
  ``gres/gpu:h100_1g.10gb=1``; an untyped one (``--gres=gpu:2``) is allocated the typed TRES of the
  devices it got as well (measured on 22.05.8, 24.11.5 and 26.05.5 by ``tests/test_billing_slurm.py``);
  a shard job is allocated ``gres/shard=N`` only, never ``gres/gpu`` (measured likewise) nor a typed
  ``gres/shard:<model>``, even with that TRES tracked (measured on the same releases on a dev cluster
  whose ``AccountingStorageTRES`` had ``gres/shard:a100``: a partition weighed ``GRES/shard:a100=0.0125``
  billed a ``shard:10`` job 0), so one ``GRES/shard`` weight serves every GPU of a partition.

The weights written here: ``GRES/gpu:<model>=W`` for each whole-GPU type, ``GRES/gpu:<model>_<profile>=
W x fraction`` for each MIG type and ``GRES/shard=W/Count`` (Count: the shards per GPU, the GPU's
memory in the shard unit, :func:`slurm_gpushare.slurm.nodegres.node_gres`), with ``W`` the weight of
one whole GPU. The untyped ``GRES/gpu`` is not weighed (it would count every device twice). A MIG
device's fraction is its share of the GPU's memory slices (``memory``: the size of its placement over
the full GPU's, 1/8 for a ``1g.10gb`` on an H100) or of its compute slices (``slices``: 1/7 for a
``1g.10gb``), both from the GPU's MIG profiles (NVML ``nvmlGpuInstanceProfileInfo_t`` ``sliceCount`` and
``nvmlGpuInstancePlacement_t`` ``size``).

A partition whose GPUs have different shard counts (an 80 GB and a 24 GB model; an H100 80GB HBM3 has
79 shards of 1 GiB, an A100 80GB 80) cannot bill a shard its fraction of each with one ``GRES/shard``
weight: it gets ``W/<the largest count>`` (a shard never bills more than its share of any GPU there),
and a note says so (split the partition by GPU model for exact shares).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from slurm_gpushare.errors import InputError
from slurm_gpushare.hardware.machine import Gpu, MigProfile
from slurm_gpushare.slurm.hostlist import compress_hostlist
from slurm_gpushare.slurm.nodegres import NodeGres, mig_type

#: How a MIG device is weighed against its whole GPU.
MIG_BY = ("memory", "slices")


@dataclass(frozen=True)
class BillingOptions:
    """What one whole GPU weighs, and how MIG devices are weighed.

    Attributes:
        gpu_weight: billing weight of one whole GPU (> 0; default 1.0, a GPU-hour for fairshare).
        mig_by: ``memory`` (share of the GPU's memory slices) or ``slices`` (share of its compute slices).

    Raises:
        InputError: a weight that is not a positive finite number, or an unknown ``mig_by``.
    """

    gpu_weight: float = 1.0
    mig_by: str = "memory"

    def __post_init__(self) -> None:
        if not (math.isfinite(self.gpu_weight) and self.gpu_weight > 0):
            raise InputError(f"the billing weight of a GPU must be a positive number, not {self.gpu_weight}",
                             hint="e.g. 1.0 (fairshare in GPU-hours) or the shards per GPU, 80, so one shard "
                                  "bills 1 in the integer billing TRES")
        if self.mig_by not in MIG_BY:
            raise InputError(f"MIG devices are weighed by memory or slices, not {self.mig_by!r}",
                             hint="give memory (share of the GPU's memory slices) or slices (compute slices)")


@dataclass(frozen=True)
class PartitionBilling:
    """The weights of one partition.

    Attributes:
        name: the partition's name.
        nodes: its node names.
        weights: ``(TRES, weight)`` in writing order: ``("GRES/gpu:a100", 1.0)``, ``("GRES/shard", 0.0125)``.
        notes: what the weights cannot do here, one line each (written as comments).
        whole: the TRES of the whole-GPU types among ``weights`` (``GRES/gpu:a100``).
        gpu_weight: what one whole GPU bills.
    """

    name: str
    nodes: tuple[str, ...]
    weights: tuple[tuple[str, float], ...]
    notes: tuple[str, ...] = ()
    whole: tuple[str, ...] = ()
    gpu_weight: float = 1.0

    @property
    def value(self) -> str:
        """The ``TRESBillingWeights=`` value, e.g. ``GRES/gpu:a100=1,GRES/shard=0.0125``."""
        return ",".join(f"{tres}={format_weight(w)}" for tres, w in self.weights)

    @property
    def smallest(self) -> tuple[str, float] | None:
        """The TRES whose one unit bills least (a shard, usually), or None without weights."""
        return min(self.weights, key=lambda tw: tw[1]) if self.weights else None

    def render(self) -> str:
        """The ``PartitionName=`` line (notes as comment lines before it)."""
        lines = [f"# {note}" for note in self.notes]
        line = f"PartitionName={self.name} Nodes={compress_hostlist(self.nodes)}"
        if self.weights:
            line += f" TRESBillingWeights={self.value}"
        return "\n".join([*lines, line])


def format_weight(w: float) -> str:
    """A weight as Slurm's ``strtod`` reads it back to the same double: ``1``, ``80``, ``0.0125``,
    ``0.043478260869565216`` (Python's shortest round-trip form; never a fraction or an exponent)."""
    if w == int(w) and abs(w) < 1e15:
        return str(int(w))
    text = repr(w)
    if "e" in text or "E" in text:
        text = f"{w:.17f}".rstrip("0")
    return text


def mig_fraction(gpu: Gpu, profile: str, mig_by: str) -> float:
    """The share of ``gpu`` one MIG device of ``profile`` holds: memory slices or compute slices.

    Raises:
        InputError: the GPU's description lists no such profile (or no full-GPU profile to compare with).
    """
    profiles = {p.name: p for p in gpu.mig_profiles}
    p = profiles.get(profile)
    if p is None or not gpu.mig_profiles:
        raise InputError(f"GPU {gpu.index} ({gpu.name}) has a MIG device of profile {profile} but its description "
                         "lists no such MIG profile: its share of the GPU is unknown",
                         hint="re-run 'slurm-gpushare inventory' on the node (it records the GPU's MIG profiles)")
    if mig_by == "slices":
        return p.slices / max(q.slices for q in gpu.mig_profiles)
    return _memory_slices(p) / max(_memory_slices(q) for q in gpu.mig_profiles)


def _memory_slices(p: MigProfile) -> int:
    """Memory slices of a GPU instance of profile ``p``: the size of its placements (NVML
    ``nvmlGpuInstancePlacement_t.size``), else its compute slices."""
    return max((size for _start, size in p.placements), default=p.slices)


def partition_billing(name: str, nodes: Iterable[NodeGres], options: BillingOptions | None = None) -> PartitionBilling:
    """The ``TRESBillingWeights`` of a partition made of ``nodes`` (see the module docstring).

    Raises:
        InputError: a MIG type whose share differs between two GPUs (two descriptions of one model that
            disagree), or a MIG profile the description does not list (:func:`mig_fraction`).
    """
    opts = options or BillingOptions()
    w = opts.gpu_weight
    nodes = list(nodes)
    whole: dict[str, float] = {}
    mig: dict[str, tuple[float, str]] = {}
    shard_counts: dict[int, list[str]] = {}
    for node in nodes:
        gpus = {g.index: g for g in node.machine.gpus}
        for r in node.records:
            if r.name == "gpu" and r.mig_gi is None:
                whole.setdefault(r.type, w)
            elif r.name == "gpu" and r.gpu_index is not None:
                g = gpus[r.gpu_index]
                inst = next(i for i in g.mig_instances if i.gi_id == r.mig_gi)
                share = mig_fraction(g, inst.profile, opts.mig_by)
                seen = mig.setdefault(mig_type(g, inst.profile), (share, f"{node.node_name} GPU {g.index}"))
                if not math.isclose(seen[0], share):
                    raise InputError(f"MIG type {r.type} is {format_weight(seen[0])} of a GPU on {seen[1]} but "
                                     f"{format_weight(share)} on {node.node_name} GPU {g.index}",
                                     hint="give the GPUs of one model the same descriptions (re-run inventory)")
            elif r.name == "shard" and r.count:
                shard_counts.setdefault(r.count, []).append(node.node_name)
    weights: list[tuple[str, float]] = [(f"GRES/gpu:{t}", v) for t, v in whole.items()]
    weights += [(f"GRES/gpu:{t}", w * share) for t, (share, _where) in mig.items()]
    notes: list[str] = []
    if shard_counts:
        most = max(shard_counts)
        weights.append(("GRES/shard", w / most))
        if len(shard_counts) > 1:
            counts = ", ".join(f"{c} on {compress_hostlist(dict.fromkeys(ns))}"
                               for c, ns in sorted(shard_counts.items()))
            notes.append(f"partition {name}: GPUs with different shard counts ({counts}): one GRES/shard weight "
                         f"bills a shard 1/{most} of a GPU on each (Slurm allocates a shard job gres/shard only, "
                         "never a typed gres/shard:<model>), less than its share of a GPU with fewer shards: "
                         "split the partition by GPU model for exact shares")
    return PartitionBilling(name, tuple(n.node_name for n in nodes), tuple(weights), tuple(notes),
                            tuple(f"GRES/gpu:{t}" for t in whole), w)


def truncation_note(part: PartitionBilling) -> str | None:
    """A comment line when one unit of some TRES bills less than 1: the integer ``billing`` TRES (QOS
    ``billing=`` limits, ``sacct`` ``billing=``) truncates it, though fairshare counts it exactly. It names
    the GPU weight that makes that unit bill 1."""
    smallest = part.smallest
    if smallest is None or smallest[1] >= 1:
        return None
    tres, weight = smallest
    better = math.ceil(part.gpu_weight / weight - 1e-9)
    return (f"partition {part.name}: one {tres} bills {format_weight(weight)}: exact in fairshare, truncated in the "
            f"integer billing TRES (sacct billing=, QOS billing= limits); --billing-gpu-weight {better} bills it 1")


#: The TRES Slurm tracks without ``AccountingStorageTRES`` (tres.html, 22.05 to 26.05): type, or type/name.
DEFAULT_TRES = ("cpu", "mem", "energy", "node", "billing", "fs/disk", "vmem", "pages")
_UNITS = "KMGTP"


def parse_weights(text: str) -> list[tuple[str, float | None, str]]:
    """Split a ``TRESBillingWeights`` value the way slurmctld does (``_tres_weight_item`` in
    ``src/common/slurm_protocol_api.c``): comma-separated ``<type>[/<name>]=<number>[K|M|G|T|P]``.

    Returns:
        ``(TRES, weight, item)`` per item: the TRES lower-cased (``gres/gpu:a100``), the weight as Slurm
        reads it (a unit suffix divides by 1024 per step for memory and burst buffers; kept as written
        for the others, which have no unit), None when the item would stop slurmctld
        ("failed to parse tres weights str"), and the item as written.
    """
    out: list[tuple[str, float | None, str]] = []
    for item in (i for i in text.split(",") if i):
        tres, eq, value = item.partition("=")
        weight: float | None = None
        if eq and tres and value:
            number = value[:-1] if value[-1:].upper() in _UNITS else value
            try:
                weight = float(number)
            except ValueError:
                weight = None
            if weight is not None and not math.isfinite(weight):
                weight = None
        out.append((tres.lower(), weight, item))
    return out
