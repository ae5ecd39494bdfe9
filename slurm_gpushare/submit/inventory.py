"""The controller's view of the cluster: each node's machine description next to what Slurm reports.

The filter service decides from this snapshot only. It is built from two sources that must agree:

* machine descriptions (``<dir>/*.json``, one per node, written by ``slurm-gpushare inventory`` on
  the node; the file name or ``hostname`` is the Slurm node name);
* what slurmctld reports: ``sinfo --json`` (each node's configured ``gres``, partitions, state; read
  for every release by :func:`slurm_gpushare.slurm.sinfo.sinfo_nodes`) and ``scontrol -o show
  partition`` (partition membership and which partition is the default; the same ``Key=Value`` line
  on 22.05, 24.11 and 26.05, measured).

A node whose description is missing, or whose description calls for other GPU GRES than Slurm has
configured, is kept with a ``problem`` and is never a candidate: stale data is reported, not guessed.
Parsing here is pure (text in, frozen snapshot out); reading the files and running the commands is
the caller's job (:mod:`slurm_gpushare.submit.service`).
"""

from __future__ import annotations

import functools
from collections import Counter
from dataclasses import dataclass, field

from slurm_gpushare.errors import InputError
from slurm_gpushare.hardware.machine import Gpu, Machine
from slurm_gpushare.slurm.gres import parse, render_counts
from slurm_gpushare.slurm.hostlist import expand_hostlist
from slurm_gpushare.slurm.sinfo import sinfo_nodes


def parse_gres_counts(text: str) -> dict[tuple[str, str], int]:
    """``gpu:a100:8(S:0-1),shard:a100:640(S:0-1)`` -> ``{("gpu", "a100"): 8, ("shard", "a100"): 640}``.

    The format of sinfo's ``%G`` / ``sinfo --json`` ``gres`` field (Slurm 22.05), read by
    :func:`slurm_gpushare.slurm.gres.parse`. Zero counts are kept out. ``(null)`` or an empty
    string give ``{}``.

    Raises:
        InputError: an item that is not ``name[:type]:count[(...)]``.
    """
    out: Counter[tuple[str, str]] = Counter()
    text = (text or "").strip()
    if text in ("", "(null)"):
        return {}
    try:
        items = parse(text)
    except InputError as e:
        raise InputError(f"cannot read GRES {text!r}: {e.message}", source="sinfo --json") from None
    for it in items:
        if it.count is None:
            raise InputError(f"cannot read GRES item {it.text!r} in {text!r}: no count", source="sinfo --json")
        if it.count:
            out[it.key] += it.count
    return dict(out)


@dataclass(frozen=True)
class NodeInventory:
    """One Slurm node as the controller knows it.

    Attributes:
        name: Slurm node name.
        partitions: partitions the node is in.
        state: Slurm state in lower case, flags joined by ``+`` (``idle``, ``mixed``, ``idle+drain``).
        gres: configured GRES counts from Slurm, keyed ``(name, type)``.
        machine: its machine description, or None when missing.
        problem: why the node cannot be used for decisions, or None.
    """

    name: str
    partitions: tuple[str, ...]
    state: str
    gres: dict[tuple[str, str], int] = field(default_factory=dict)
    machine: Machine | None = None
    problem: str | None = None

    @property
    def usable(self) -> bool:
        """The node has a machine description and no problem: the policy may place jobs on it."""
        return self.problem is None and self.machine is not None

    @property
    def whole_gpus(self) -> tuple[Gpu, ...]:
        """GPUs not in MIG mode (the ones that get shards and whole-GPU GRES)."""
        return tuple(g for g in self.machine.gpus if not g.mig_enabled) if self.machine else ()

    @property
    def shards(self) -> int:
        """Configured shards on the node (Slurm types them after the GPU; summed here)."""
        return sum(c for (n, _t), c in self.gres.items() if n == "shard")

    @functools.cached_property
    def pool_key(self) -> tuple:
        """What a partition's pool reads of this node: ``(name, machine description, GRES counts)``, not its
        state. Made once per node object, which a refresh keeps while the node is unchanged, so a partition's
        key (a tuple of these, :class:`~slurm_gpushare.submit.policy.PoolIndex`) shares them with the one
        before it, and freeing the old key frees only the changed nodes' (freeing 10,000 such tuples at once
        held the interpreter for 12-20 ms during a refresh)."""
        return (self.name, self.machine, tuple(sorted(self.gres.items())))


@dataclass(frozen=True)
class ClusterInventory:
    """Every node, the partitions, and what was wrong while building the snapshot.

    Attributes:
        nodes: by node name.
        partitions: partition name -> node names.
        default_partition: the ``Default=YES`` partition, or None.
        problems: one line per problem found (missing or stale descriptions, unknown nodes).
        shard_unit_mib: GPU memory per shard (must match the gres.conf generator's unit).
    """

    nodes: dict[str, NodeInventory]
    partitions: dict[str, tuple[str, ...]]
    default_partition: str | None
    problems: tuple[str, ...] = ()
    shard_unit_mib: int = 1024
    #: node name -> (its ``sinfo`` entry, its description) the node was built from: what
    #: :func:`build_inventory` compares to reuse a node of the previous snapshot
    sources: dict[str, tuple] = field(default_factory=dict, compare=False, repr=False)
    #: the pools built for decisions made without a pool index (submit/policy.py: the CLI's ``policy check``,
    #: tests), per partition list and policy: they live and go with this snapshot (not copied by replace())
    pool_memo: dict[tuple, tuple] = field(default_factory=dict, init=False, compare=False, repr=False)

    def nodes_in(self, partitions: tuple[str, ...] | list[str] | None) -> list[NodeInventory]:
        """Nodes of the given partitions (the default partition when None or empty), sorted by name.

        Raises:
            InputError: a partition that does not exist (the message lists those that do).
        """
        parts = tuple(partitions or ()) or ((self.default_partition,) if self.default_partition else ())
        if not parts:
            raise InputError("no partition given and the cluster has no default partition",
                             hint="submit with -p PARTITION")
        names: set[str] = set()
        for p in parts:
            if p not in self.partitions:
                raise InputError(f"partition {p!r} does not exist",
                                 hint=f"partitions: {', '.join(sorted(self.partitions))}")
            names.update(self.partitions[p])
        return [self.nodes[n] for n in sorted(names) if n in self.nodes]


def parse_partitions(text: str) -> tuple[dict[str, tuple[str, ...]], str | None]:
    """Parse ``scontrol -o show partition``: partition -> node names, and the default partition.

    Node lists are hostlist expressions (``gpu[01-04],big``), expanded.
    """
    parts: dict[str, tuple[str, ...]] = {}
    default = None
    for line in text.splitlines():
        fields = dict(kv.split("=", 1) for kv in line.split() if "=" in kv)
        name = fields.get("PartitionName")
        if not name:
            continue
        nodes = fields.get("Nodes", "")
        parts[name] = tuple(expand_hostlist(nodes)) if nodes not in ("", "(null)") else ()
        if fields.get("Default") == "YES":
            default = name
    return parts, default


def build_inventory(machines: dict[str, Machine], sinfo_json: str, partitions_text: str, *,
                    shard_unit_mib: int = 1024, expected_gres=None,
                    previous: ClusterInventory | None = None) -> ClusterInventory:
    """Join machine descriptions with Slurm's view into a :class:`ClusterInventory` (pure).

    Args:
        machines: node name -> description.
        sinfo_json: output of ``sinfo --json`` of any supported release (its shape is chosen by its
            ``meta`` version: :func:`slurm_gpushare.slurm.sinfo.sinfo_nodes`).
        partitions_text: output of ``scontrol -o show partition``.
        shard_unit_mib: GPU memory per shard, as configured for the gres.conf generator.
        expected_gres: ``f(machine, node_name) -> {(name, type): count}`` giving the GPU GRES the
            description calls for (the gres.conf generator's counts); when given, a node whose Slurm
            ``gpu`` GRES differ is marked stale.
        previous: the inventory built before with the same ``shard_unit_mib`` and ``expected_gres``: a
            node whose ``sinfo`` entry is equal and whose description is the same object (or an equal
            one) is that inventory's :class:`NodeInventory` object, not built again (nor is
            ``expected_gres`` called for it), so that a refresh costs what changed.

    Raises:
        SlurmError: sinfo output that is not JSON, names no release, or lacks a field of its release's
            shape (the message names the release and the field).
    """
    raw_nodes = sinfo_nodes(sinfo_json)
    parts, default = parse_partitions(partitions_text)
    nodes: dict[str, NodeInventory] = {}
    problems: list[str] = []
    sources: dict[str, tuple] = {}
    old = previous.sources if previous is not None and previous.shard_unit_mib == shard_unit_mib else {}
    for raw in raw_nodes:
        name = raw.name
        machine = machines.get(name)
        sources[name] = (raw, machine)
        was = old.get(name)
        if was is not None and was[0] == raw and (was[1] is machine or was[1] == machine):
            node = previous.nodes[name]  # type: ignore[union-attr]  # old is empty without previous
            if node.problem:
                problems.append(node.problem)
            nodes[name] = node
            continue
        problem: str | None = None
        try:
            gres = parse_gres_counts(raw.gres)
        except InputError as e:
            gres, problem = {}, str(e)
        if machine is None:
            if any(n in ("gpu", "shard", "mps") for n, _t in gres):
                problem = f"node {name} has GPU GRES but no machine description"
        elif expected_gres is not None:
            want = {k: v for k, v in expected_gres(machine, name).items() if k[0] == "gpu"}
            have = {k: v for k, v in gres.items() if k[0] == "gpu"}
            if want != have:
                problem = (f"node {name}: Slurm has {_fmt(have) or 'no GPUs'} but its machine description "
                           f"calls for {_fmt(want)} (stale description or gres.conf)")
        if problem:
            problems.append(problem)
        nodes[name] = NodeInventory(name, raw.partitions, raw.state, gres, machine, problem)
    for name in sorted(set(machines) - set(nodes)):
        problems.append(f"machine description for {name} names no node Slurm knows")
    return ClusterInventory(nodes, parts, default, tuple(problems), shard_unit_mib, sources)


def _fmt(gres: dict[tuple[str, str], int]) -> str:
    return render_counts(dict(sorted(gres.items())))
