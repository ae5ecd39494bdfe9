"""The submit-side decision: a job's GPU-share request -> a TRES string Slurm can schedule (pure).

:func:`decide` takes what job_submit.lua sees (``job_desc.tres_per_node`` / ``tres_per_job``), the
job's partitions, the controller's :class:`~slurm_gpushare.submit.inventory.ClusterInventory` and the
:class:`~slurm_gpushare.submit.policyfile.SitePolicy`, and answers with a :class:`Decision`: nothing to do
(``pass``), a new ``tres_per_node`` plus an audit record (``rewrite``), or a refusal with one line for
the user and Slurm's ``ESLURM_INVALID_GRES`` (``reject``). It does no I/O and never raises for a bad
request: every :class:`~slurm_gpushare.errors.InputError` becomes a refusal.

How a ``gpushare`` request is served (``docs/request-syntax.md`` for users):

* Candidates come only from usable nodes (no inventory problem) of the job's partitions (the default
  partition when none is given), and only of the kinds the site policy allows there.
* MIG: a configured MIG GRES type (``gpu:<model>_<profile>``) whose profile holds the memory (fit
  rule ``nominal`` or ``exact``), with ``count`` of them on one node and, under ``mode=auto``, no
  more than ``mig.max_waste`` of the slice left unused.
* MPS share: ``shard:<ceil(mem / shard unit)>`` when some usable node has a whole GPU with at least
  that many shards (Slurm packs the shards of one job onto one GPU); one GPU only, so ``count`` must
  be 1. ``sm=`` asks for this kind; the node Prolog enforces it as the MPS active thread percentage.
* Whole GPUs: ``gpu:<model>:<count>`` on a node with ``count`` whole GPUs of that model whose
  memory (fit rule) holds the request. Under ``mode=auto`` a request of at least
  ``whole_gpu.threshold`` of a model's memory gets whole GPUs of that model first; otherwise whole
  GPUs come where ``gpu`` stands in ``mode_order`` (last by default: a request no share can hold).
* One GRES type per job: the first kind in order that has candidates, then the least memory left
  unused, then the site's model preference, then the model name. The other candidates go into the
  audit record.

Direct ``shard:N`` / ``mps:N`` requests are policed too (``police_direct``): a shard job must fit one
GPU (a typed ``shard:rtx4090:N`` one GPU of that type), ``mps:N`` needs configured ``mps`` GRES and at
most 100 (one GPU).
"""

from __future__ import annotations

import math
import re
from bisect import bisect_left
from dataclasses import dataclass, field, replace
from typing import Any

from slurm_gpushare.errors import InputError
from slurm_gpushare.hardware.machine import MigProfile, nominal_gpu_mib, nominal_profile_mib
from slurm_gpushare.memsize import format_mib
from slurm_gpushare.slurm.admincomment import AUDIT
from slurm_gpushare.slurm.gres import DEFAULT_PREFIX, GresItem, item_name, prefix_of
from slurm_gpushare.slurm.nodegres import mig_type
from slurm_gpushare.submit.inventory import ClusterInventory, NodeInventory
from slurm_gpushare.submit.policyfile import KINDS, SitePolicy
from slurm_gpushare.submit.request import (
    SHARE_NAMES,
    GpushareRequest,
    make_error,
    mentions_share,
    parse_gpushare,
    parse_tres,
    unescape_knobs,
)

#: ``ESLURM_INVALID_GRES`` (slurm/slurm_errno.h): "Invalid generic resource (gres) specification"; 2072 at
#: slurm-22-05-8-1, slurm-24-11-5-1 and slurm-26-05-3-1 (the enum counted; ``slurm.ESLURM_INVALID_GRES`` in
#: job_submit.lua is 2072 on 24.11.5, measured; 22.05 does not export it to Lua).
ESLURM_INVALID_GRES = 2072
#: ``SLURM_SUCCESS``.
SUCCESS = 0
#: ``mps:N`` is a percentage of one GPU (Slurm's default ``mps`` count per GPU).
MPS_PER_GPU = 100
#: The largest node count :func:`decide` accepts (more than any partition it serves).
MAX_NODES = 100_000
#: Slurm's "not set" sentinels for 32-bit and 16-bit job_desc numbers (NO_VAL, NO_VAL16, INFINITE...).
_UNSET = (0xFFFFFFFE, 0xFFFFFFFF, 0xFFFE, 0xFFFF)


def nodes_needed(min_nodes: object = None, num_tasks: object = None, ntasks_per_node: object = None) -> int:
    """How many nodes a job spans, from job_desc numbers as job_submit.lua sees them (Slurm 22.05).

    ``min_nodes`` (``-N``/``--nodes``) and ``ceil(num_tasks / ntasks_per_node)`` (``-n`` with
    ``--ntasks-per-node``), the larger; at least 1. Unset fields arrive as Slurm's NO_VAL sentinels
    (``4294967294``, ``65534``, as job_submit.lua sees them) or are missing; they, non-numbers and
    non-positive values count as unset. Never raises.

    >>> nodes_needed(2), nodes_needed(4294967294), nodes_needed(None, 8, 2), nodes_needed("x")
    (2, 1, 4, 1)
    """
    n = _number(min_nodes) or 1
    tasks, per = _number(num_tasks), _number(ntasks_per_node)
    if tasks and per:
        n = max(n, -(-tasks // per))
    return n

#: Every refusal of this module: id -> (message template, hint template). ``str.format`` fields.
MESSAGES: dict[str, tuple[str, str]] = {
    "per-task": ("'{item}': GPU shares per task or per socket are not supported",
                 "ask for the share per node, --gres=shard:N or --gres=gpushare:mem=10G (with --ntasks-per-node "
                 "for the tasks), not --tres-per-task"),
    "gpus-per-task": ("GPUs per task ('{item}', from --gpus-per-task or --tres-per-task) do not combine with "
                      "--gres=gpushare: a GPU share is decided per node",
                      "ask for the share per node, --gres=gpushare:mem=10G (or gpushare:mode=gpu:N for N whole GPUs), "
                      "with --ntasks-per-node for the tasks; or drop gpushare and keep --gpus-per-task"),
    "gpus-per-socket": ("GPUs per socket ('{item}', from --gpus-per-socket) do not combine with --gres=gpushare: "
                        "a GPU share is decided per node",
                        "ask for the share per node, --gres=gpushare:mem=10G (or gpushare:mode=gpu:N for N whole "
                        "GPUs), with --ntasks-per-socket for the tasks; or drop gpushare and keep --gpus-per-socket"),
    "mem-per-gpu": ("--mem-per-gpu ({item}) does not combine with --gres=gpushare: it sets host memory per whole "
                    "GPU, and a share may be a MIG slice or part of a GPU",
                    "give the share's GPU memory as gpushare:mem=SIZE and the job's host memory with --mem "
                    "(per node) or --mem-per-cpu"),
    "cpus-per-gpu": ("--cpus-per-gpu ({item}) does not combine with --gres=gpushare: it counts CPUs per whole GPU, "
                     "and a share may be a MIG slice or part of a GPU",
                     "give the CPUs with --cpus-per-task (-c) and the tasks with --ntasks-per-node"),
    "ntasks-per-gpu": ("--ntasks-per-gpu ({item}) does not combine with --gres=gpushare: it counts tasks per whole "
                       "GPU, and a share may be a MIG slice or part of a GPU",
                       "give the tasks with --ntasks-per-node; the tasks of a node share its GPU share"),
    "per-job": ("'{item}' must be asked for per node with --gres",
                "write --gres=gpushare:mem=10G (or --gres=shard:N), not --gpus or --tres-per-job"),
    "gpus-per-job": ("gpushare cannot be combined with --gpus ('{item}') in one job",
                     "for whole GPUs write --gres=gpushare:mode=gpu:N, or drop gpushare"),
    "mixed-gpu": ("gpushare cannot be combined with '{item}' in one job",
                  "for whole GPUs write gpushare:mode=gpu:N, or drop gpushare"),
    "mixed-share": ("gpushare cannot be combined with '{item}' in one job",
                    "ask for gpushare:mem=SIZE alone, or for shard:N alone"),
    "shard-mps": ("shard and mps cannot be combined in one job",
                  "ask for shard:N (N GiB of one GPU) or for gpushare:mem=10G"),
    "twice": ("'{name}' is asked for twice ({first} and {second})", "ask for it once"),
    "direct-zero": ("'{item}' asks for no {name}", "ask for at least 1, e.g. shard:10 for 10 GiB of one GPU"),
    "no-partition": ("no partition given and the cluster has no default partition", "submit with -p PARTITION"),
    "partition": ("partition '{name}' does not exist", "partitions: {known}"),
    "no-gpus": ("{where} has no usable GPU nodes", "try {others}"),
    "no-gpus-anywhere": ("{where} has no usable GPU nodes",
                         "no partition has usable GPU nodes now; ask the administrators"),
    "count-max": ("the count {count} is more than this site allows ({max} per job)", "ask for at most {max}"),
    "none-allowed": ("no kind of GPU share is allowed in {where}", "submit to another partition"),
    "mig-disabled": ("mode=mig: MIG slices are switched off on this cluster", "use {modes}"),
    "mode-disallowed": ("mode={mode} is not allowed in {where}", "allowed there: {allowed}"),
    "sm-mode": ("sm={sm} sets an MPS compute share, which mode={mode} does not have",
                "drop sm=, or use mode=mps"),
    "sm-no-mps": ("sm={sm} asks for an MPS share, which {where} does not allow", "drop sm= (allowed there: {allowed})"),
    "mps-count": ("an MPS share is part of one GPU, but {request} asks for {count}",
                  "use mode=mig or mode=gpu for {count} slices or GPUs, or drop the count"),
    "sm-count": ("sm={sm} asks for an MPS share, which is part of one GPU, but {request} asks for {count}",
                 "drop sm= to get {count} MIG slices or whole GPUs, or drop the count"),
    "no-kind": ("{where} has no {nouns}", "{suggestion}"),
    "too-large": ("mem={mem} is more than the largest {noun} in {where} ({size} on {on})", "ask for {suggestion}"),
    "count-too-many": ("no node in {where} has {count} {nouns} for {request}",
                       "at most {best} on one node: ask for {spec}"),
    "mig-waste": ("mem={mem} would leave {waste}% of the smallest MIG slice that holds it unused "
                  "({slice}, {size}); this site allows at most {max}%",
                  "ask for mode=mig to take the slice anyway"),
    "shard-none": ("{where} has no shards configured", "use gpushare:mem=10G, or another partition"),
    "shard-large": ("shard:{n} is more than one GPU holds in {where} ({most} shards on {on})",
                    "a shard job must fit one GPU: ask for shard:{most} at most, or for whole GPUs "
                    "with gpushare:mode=gpu:N"),
    "shard-type": ("{item}: no GPU of type {type} in {where} has shards (shards are on {models})",
                   "ask for shard:N of one of those types, or for shard:N without a type"),
    "direct-no-share": ("{item} shares a GPU, which {where} does not allow (allowed there: {allowed})",
                        "ask for whole GPUs with gpushare:mode=gpu:N, or submit to another partition"),
    "mps-none": ("mps:{n}: {where} has no mps GRES configured",
                 "use gpushare:mem=10G (memory) or shard:N (N GiB of one GPU)"),
    "nodes-too-many": ("{nodes} nodes asked for, but only {have} node(s) of {where} have {what}",
                       "ask for -N {have} (--nodes), or for a smaller request"),
    "nodes-bad": ("the node count {nodes} cannot be served", "ask for --nodes between 1 and {max}"),
    "grant-not-here": ("{what}, which this job was granted for its gpushare request, is on no usable node of {where}",
                       "keep the job where it is, or cancel it and submit it again with the new options (the "
                       "request is then decided for them)"),
    "mps-large": ("mps:{n} is more than one GPU (mps:100)",
                  "ask for mps:100 at most, or for whole GPUs with gpushare:mode=gpu:1"),
}

_NOUN = {"mig": ("MIG slice", "MIG slices"), "mps": ("MPS share", "MPS shares"), "gpu": ("GPU", "whole GPUs")}
#: a character an audit value may not hold (each one becomes "?", in one pass over the text)
_UNSAFE = re.compile(r"[^a-zA-Z0-9_.:=+/,%@-]")


def _error(message_id: str, **fields: object) -> InputError:
    return make_error(message_id, MESSAGES, **fields)


@dataclass(frozen=True)
class Candidate:
    """One way to serve a request.

    Attributes:
        kind: ``mig``, ``mps`` or ``gpu``.
        name: GRES name: ``gpu`` (MIG slice or whole GPU) or ``shard``.
        type: GRES type (``h100_1g.10gb``, ``h100``), ``""`` for shards.
        count: GRES count (slices, GPUs, or shards).
        models: GPU models it may land on (one, except for shards).
        capacity_mib: memory per device the fit rule compares with the request, MiB.
        granted_mib: memory per device the job gets, MiB (a MIG instance's, a GPU's, or the shards').
        waste_mib: ``capacity_mib`` minus the request (the capacity itself when no memory was asked).
        nodes: usable nodes that can hold it.
    """

    kind: str
    name: str
    type: str
    count: int
    models: tuple[str, ...]
    capacity_mib: int
    granted_mib: int
    waste_mib: int
    nodes: tuple[str, ...] = ()

    @property
    def gres(self) -> str:
        """``gpu:h100_1g.10gb:1``, ``shard:10``."""
        return GresItem(self.name, self.type, self.count).text

    @property
    def label(self) -> str:
        """``mig:gpu:h100_1g.10gb:1``: kind and GRES, for the audit record."""
        return f"{self.kind}:{self.gres}"


@dataclass(frozen=True)
class Decision:
    """What job_submit does with one job.

    Attributes:
        action: ``pass`` (nothing for us to do: leave the job alone), ``rewrite`` (set
            ``tres_per_node``, record :meth:`audit_fields` in AdminComment
            with :func:`slurm_gpushare.slurm.admincomment.format_segment`) or ``reject``.
        tres_per_node: the new TRES string (``rewrite``; prefix kept, other items kept in order with
            explicit counts), else the input unchanged.
        audit: the record of the decision: ``version``, ``original`` (the TRES as it came),
            ``request`` (the share request as written), ``action``, and for a rewrite ``kind``
            (``mig``, ``mps``, ``gpu``, ``shard-direct``, ``mps-direct``), ``grant`` (the new GRES
            item with prefix), ``gres_type``, ``model`` (GPU model(s) it may land on),
            ``mem_asked_mib``, ``mem_granted_mib`` (per device), ``sm_percent``, ``count``, ``mode``,
            ``partitions``, ``candidates`` (labels of every candidate considered, chosen first, the
            others best first), ``models_considered`` and ``reason``; for a refusal ``reason``.
            Empty for ``pass``.
        message: one line for the user, starting with ``gpushare: ``: the refusal and what would
            work, or what a rewrite granted. Empty when there is nothing to say.
        errno: Slurm return code: ``ESLURM_INVALID_GRES`` (2072) for a refusal, else 0.
    """

    action: str
    tres_per_node: str | None
    audit: dict[str, Any] = field(default_factory=dict, hash=False)
    message: str = ""
    errno: int = SUCCESS

    def audit_fields(self) -> dict[str, str]:
        """The audit record as ``key -> value`` strings for the AdminComment segment.

        Keys, in order: ``req`` (the request as written), ``grant`` (the new GRES item), ``kind``,
        ``model`` (models joined by ``,``), ``mem`` (``<asked>/<granted>MiB``, ``-`` for nothing
        asked), ``sm`` (when given), ``part`` (partitions joined by ``,``), ``nodes`` (when more
        than 1), ``alt`` (other candidates,
        at most 6, joined by ``,``); a refusal has ``req`` and ``action=reject``. Values hold only
        ``A-Za-z0-9_.:=+/,%@-`` (anything else becomes ``?``): no spaces, no brackets. Empty for ``pass``.
        """
        a = self.audit
        if self.action == "pass" or not a:
            return {}
        out = {"req": _safe(a.get("request", ""))}
        if self.action == "reject":
            out["action"] = "reject"
            return out
        out["grant"] = _safe(a.get("grant", ""))
        out["kind"] = _safe(a.get("kind", ""))
        if a.get("model"):
            out["model"] = _safe(a["model"])
        asked, granted = a.get("mem_asked_mib"), a.get("mem_granted_mib")
        if asked is not None or granted is not None:
            out["mem"] = f"{'-' if asked is None else asked}/{'-' if granted is None else granted}MiB"
        if a.get("sm_percent") is not None:
            out["sm"] = str(a["sm_percent"])
        if a.get("partitions"):
            out["part"] = _safe(",".join(a["partitions"]))
        if a.get("nodes", 1) > 1:
            out["nodes"] = str(a["nodes"])
        alt = [c for c in a.get("candidates", ())[1:]][:6]
        if alt:
            out["alt"] = _safe(",".join(alt))
        return out


def _safe(text: str) -> str:
    return _UNSAFE.sub("?", str(text)) or "-"


# --- the cluster as the policy sees it ---------------------------------------------------------------


class _OnNodes:
    """Where one GRES type is: ``per_node`` maps each usable node to its count of that type.

    :meth:`finish` (called once the pool is built) computes what decisions ask of it, so that a
    decision costs a lookup, not a walk over the nodes."""

    per_node: dict[str, int]
    _nodes: tuple[str, ...] | None = None
    _max: int = 0
    _held: dict[int, tuple[str, ...]] | None = None

    def finish(self, parts: tuple[_OnNodes, ...] = ()) -> None:
        """Precompute; ``parts``: this one was merged from those (finished), whose lists are merged then."""
        self._nodes = tuple(self.per_node)
        self._max = max(self.per_node.values(), default=0)
        values = set(self.per_node.values())
        if parts:
            self._held = {v: _union([p.held(v) for p in parts]) for v in values}
        else:
            self._held = {v: _holding(self.per_node, v) for v in values}

    @property
    def nodes(self) -> tuple[str, ...]:
        return self._nodes if self._nodes is not None else tuple(self.per_node)

    @property
    def max_on_node(self) -> int:
        return self._max if self._held is not None else max(self.per_node.values(), default=0)

    def held(self, count: int) -> tuple[str, ...]:
        """Nodes with at least ``count`` of this type, sorted (:func:`_holding`, precomputed)."""
        if self._held is None:
            return _holding(self.per_node, count)
        fits = [v for v in self._held if v >= count]
        return self._held[min(fits)] if fits else ()


@dataclass
class _Mig(_OnNodes):
    model: str
    profile: MigProfile
    capacity_mib: int
    per_node: dict[str, int] = field(default_factory=dict)


@dataclass
class _Whole(_OnNodes):
    model: str
    memory_mib: int
    capacity_mib: int
    per_node: dict[str, int] = field(default_factory=dict)


@dataclass
class _Pool:
    """What the usable nodes of the job's partitions offer."""

    parts: tuple[str, ...]
    unit_mib: int
    mig: dict[str, _Mig] = field(default_factory=dict)
    whole: dict[str, _Whole] = field(default_factory=dict)
    shards: dict[str, int] = field(default_factory=dict)  # model -> most shards on one GPU
    shard_nodes: dict[str, list[str]] = field(default_factory=dict)  # model -> nodes
    shard_per_node: dict[str, dict[str, int]] = field(default_factory=dict)  # model -> node -> most on one GPU
    mps: bool = False
    #: (models, n) -> nodes holding n shards on a GPU of one of models (:func:`shard_nodes_holding`)
    held_shards: dict[tuple[tuple[str, ...], int], tuple[str, ...]] = field(
        default_factory=dict, compare=False, repr=False)
    shard_sizes: dict[str, tuple[int, ...]] = field(default_factory=dict, compare=False, repr=False)  # model -> sizes
    #: the pools this one was merged from (:func:`_merged`), or ()
    components: tuple[_Pool, ...] = field(default=(), compare=False, repr=False)

    def finish(self) -> None:
        """Precompute what decisions read (nodes holding a count of each type; shard holders by size)."""
        for on in (*self.mig.values(), *self.whole.values()):
            on.finish()
        self.shard_sizes = {md: tuple(sorted(set(per.values()))) for md, per in self.shard_per_node.items()}
        for v in {x for sizes in self.shard_sizes.values() for x in sizes}:
            fit = tuple(md for md in sorted(self.shards) if self.shards[md] >= v)
            self.held_shards[(fit, v)] = _shard_holders(self, fit, v)
        for md, sizes in self.shard_sizes.items():
            for v in sizes:
                self.held_shards[((md,), v)] = _shard_holders(self, (md,), v)

    @property
    def where(self) -> str:
        """``partition gpu`` / ``partitions a, b``, for messages."""
        return _where(self.parts)

    @property
    def empty(self) -> bool:
        return not (self.mig or self.whole or self.shards or self.mps)


def _capacity_gpu(memory_mib: int, policy: SitePolicy) -> int:
    return nominal_gpu_mib(memory_mib) if policy.gpu_fit == "nominal" else memory_mib


def _capacity_mig(profile: MigProfile, policy: SitePolicy) -> int:
    return nominal_profile_mib(profile) if policy.mig_fit == "nominal" else profile.memory_mib


def _where(parts: tuple[str, ...]) -> str:
    return f"partition {parts[0]}" if len(parts) == 1 else "partitions " + ", ".join(parts)


def _build_pool(nodes: list[NodeInventory], parts: tuple[str, ...], unit: int, policy: SitePolicy) -> _Pool:
    pool = _Pool(parts, unit)
    for node in nodes:
        if not node.usable or node.machine is None:
            continue
        profiles: dict[str, tuple[str, MigProfile]] = {}
        for g in node.machine.gpus:
            if g.mig_enabled:
                for p in g.mig_profiles:
                    profiles.setdefault(mig_type(g, p.name), (g.model, p))
        whole_mem: dict[str, int] = {}
        for g in node.whole_gpus:
            whole_mem[g.model] = min(whole_mem.get(g.model, g.memory_mib), g.memory_mib)
        for (name, gtype), count in sorted(node.gres.items()):
            if name != "gpu" or count <= 0 or not gtype:
                continue
            if gtype in whole_mem:
                # one GRES type may cover GPUs of different memory (A100 40GB and 80GB are both
                # "a100"): Slurm may hand out any of them, so the smallest one counts
                w = pool.whole.setdefault(gtype, _Whole(gtype, whole_mem[gtype], 0))
                w.memory_mib = min(w.memory_mib, whole_mem[gtype])
                w.capacity_mib = _capacity_gpu(w.memory_mib, policy)
                w.per_node[node.name] = count
            elif gtype in profiles:
                model, prof = profiles[gtype]
                m = pool.mig.setdefault(gtype, _Mig(model, prof, _capacity_mig(prof, policy)))
                m.per_node[node.name] = count
        if node.shards > 0:
            for g in node.whole_gpus:
                n = g.memory_mib // unit
                if n > 0:
                    pool.shards[g.model] = max(pool.shards.get(g.model, 0), n)
                    listed = pool.shard_nodes.setdefault(g.model, [])
                    if not listed or listed[-1] != node.name:  # nodes come once each: only this node's GPUs repeat
                        listed.append(node.name)
                    on = pool.shard_per_node.setdefault(g.model, {})
                    on[node.name] = max(on.get(node.name, 0), n)
        if any(name == "mps" and count > 0 for (name, _t), count in node.gres.items()):
            pool.mps = True
    pool.finish()
    return pool


def _resolve_partitions(inventory: ClusterInventory, partitions: tuple[str, ...] | None) -> tuple[str, ...]:
    parts = tuple(dict.fromkeys(p for p in (partitions or ()) if p))
    if not parts:
        if not inventory.default_partition:
            raise _error("no-partition")
        parts = (inventory.default_partition,)
    for p in parts:
        if p not in inventory.partitions:
            raise _error("partition", name=p, known=", ".join(sorted(inventory.partitions)) or "none")
    return parts


class PoolIndex:
    """The pools of one inventory under one policy: one per partition, built ahead of the requests, and
    those of partition lists (``-p a,b``), merged from their partitions' pools on first use and kept.

    Built off the request path (the filter service builds it with each snapshot, in its refresh thread),
    from the previous index when there is one: a partition whose usable nodes offer the same as before
    (same machine description, GRES and usability, node by node: a node's state plays no part) keeps
    its pool object, so a decision remembered with that pool object (:meth:`token`) still holds. The
    partition lists the previous index had are built again too (or kept when all their partitions' pools
    are). Thread-safe for readers: a pool is put into a dict whole (one store).

    Args:
        inventory: the cluster snapshot.
        policy: the site policy (fit rules and the shard unit shape the pools).
        previous: the index of the snapshot before, or None.
    """

    def __init__(self, inventory: ClusterInventory, policy: SitePolicy, previous: PoolIndex | None = None):
        self.inventory = inventory
        self.policy = policy
        self.unit = inventory.shard_unit_mib if inventory.shard_unit_mib > 0 else policy.shard_unit_mib
        prev = previous if previous is not None and previous.policy is policy and previous.unit == self.unit else None
        names = (tuple(sorted(inventory.partitions)), inventory.default_partition)
        self.names: tuple[tuple[str, ...], str | None] = prev.names if prev and prev.names == names else names
        self._keys: dict[str, tuple] = {}
        self.single: dict[str, _Pool] = {}
        self.built = 0  # pools built by this index (counted by the tests)
        for p in names[0]:
            nodes = [n for n in inventory.nodes_in((p,)) if n.usable]
            key = tuple(n.pool_key for n in nodes)
            if prev is not None and prev._keys.get(p) == key:
                self.single[p] = prev.single[p]
                key = prev._keys[p]
            else:
                self.single[p] = _build_pool(nodes, (p,), self.unit, policy)
                self.built += 1
            self._keys[p] = key
        self.multi: dict[tuple[str, ...], _Pool] = {}
        if prev is not None:
            for parts, pool in list(prev.multi.items()):
                if all(p in self.single and self.single[p] is prev.single.get(p) for p in parts):
                    self.multi[parts] = pool
                elif all(p in self.single for p in parts):
                    self.get(parts)

    def get(self, parts: tuple[str, ...]) -> _Pool:
        """The pool of existing partitions ``parts`` (built now and kept when not built yet)."""
        if len(parts) == 1:
            return self.single[parts[0]]
        pool = self.multi.get(parts)
        if pool is None:
            pool = _merged([self.single[p] for p in parts], parts, self.unit)
            if len(self.multi) >= _POOLS_MAX:
                self.multi = {}
            self.multi[parts] = pool
        return pool

    def token(self, partitions: tuple[str, ...] | None) -> tuple:
        """What a decision for ``partitions`` (None: the default) reads of this index: the policy, the
        partition names and the pools. Two indexes whose tokens for the same partitions are element by
        element the same objects (``is``) give the same decision for the same request."""
        parts = tuple(dict.fromkeys(p for p in (partitions or ()) if p)) or (self.names[1],)
        pool = self.single.get(parts[0]) if len(parts) == 1 else self.multi.get(parts)  # type: ignore[arg-type]
        if pool is None or pool.empty:  # a refusal that names the partitions that have GPUs reads them all
            return (self.policy, self.names, pool, *self.single.values())
        return (self.policy, self.names, pool)


#: Most partition lists an index (or an inventory's ``pool_memo``) keeps pools for; more empties it.
_POOLS_MAX = 256


def _pool_for(inventory: ClusterInventory, parts: tuple[str, ...], policy: SitePolicy,
              pools: PoolIndex | None = None, *, direct: bool = False) -> _Pool:
    if pools is not None and pools.inventory is inventory and pools.policy is policy:
        pool = pools.get(parts)
    else:
        pools = None
        memo = inventory.pool_memo  # goes with the inventory; the policy is kept beside its id, so no reuse
        hit = memo.get((parts, id(policy)))
        if hit is not None and hit[0] is policy:
            pool = hit[1]
        else:
            unit = inventory.shard_unit_mib if inventory.shard_unit_mib > 0 else policy.shard_unit_mib
            pool = _build_pool([n for n in inventory.nodes_in(parts) if n.usable], parts, unit, policy)
            if len(memo) >= _POOLS_MAX:
                memo.clear()
            memo[(parts, id(policy))] = (policy, pool)
    if pool.empty and not direct:
        others = [p for p in sorted(inventory.partitions) if p not in parts
                  and not _pool_for(inventory, (p,), policy, pools, direct=True).empty]
        if others:
            raise _error("no-gpus", where=pool.where, others=_where(tuple(others)))
        raise _error("no-gpus-anywhere", where=pool.where)
    return pool


# --- candidates --------------------------------------------------------------------------------------


def _holding(per_node: dict[str, int], count: int) -> tuple[str, ...]:
    """Nodes with at least ``count`` of a GRES, sorted."""
    return tuple(sorted(n for n, c in per_node.items() if c >= count))


def shard_nodes_holding(pool: _Pool, models: tuple[str, ...] | list[str], n: int) -> tuple[str, ...]:
    """Nodes with a whole GPU of one of ``models`` that holds ``n`` shards, sorted.

    A model whose GPUs hold fewer than ``n`` shards adds no node, and a node holds ``n`` exactly where it
    holds the smallest size at least ``n`` that a GPU of those models has; so the answer is kept per
    (models that hold ``n``, that size): precomputed by :meth:`_Pool.finish` for one model and for all
    models, remembered for other sets."""
    fit = tuple(sorted(md for md in set(models) if pool.shards.get(md, 0) >= n))
    if not fit:
        return ()
    v = min(sizes[bisect_left(sizes, n)] for sizes in (pool.shard_sizes[md] for md in fit))
    held = pool.held_shards.get((fit, v))
    if held is None:
        held = (_union([shard_nodes_holding(c, fit, n) for c in pool.components]) if pool.components
                else _shard_holders(pool, fit, v))
        pool.held_shards[(fit, v)] = held
    return held


def _union(runs: list[tuple[str, ...]]) -> tuple[str, ...]:
    """The sorted union of sorted node-name tuples."""
    runs = [r for r in runs if r]
    return runs[0] if len(runs) == 1 else tuple(sorted(set().union(*runs)))


def _merged(pools: list[_Pool], parts: tuple[str, ...], unit: int) -> _Pool:
    """The pool of the nodes of several partitions, from each partition's pool (what :func:`_build_pool` gives
    for all their nodes, but for the order of its node lists; a node in several partitions offers the same
    in each), without a walk over the nodes' descriptions."""
    out = _Pool(parts, unit, components=tuple(pools))
    sources: dict[tuple[str, str], list[_OnNodes]] = {}
    for p in pools:
        for kind, theirs in (("whole", p.whole), ("mig", p.mig)):
            mine: dict = getattr(out, kind)
            for gtype, on in theirs.items():
                m = mine.get(gtype)
                if m is None:
                    m = mine[gtype] = replace(on, per_node=dict(on.per_node))
                else:
                    m.per_node.update(on.per_node)
                    if isinstance(on, _Whole) and on.memory_mib < m.memory_mib:  # the smallest GPU counts
                        m.memory_mib, m.capacity_mib = on.memory_mib, on.capacity_mib
                sources.setdefault((kind, gtype), []).append(on)
        for md, most in p.shards.items():
            out.shards[md] = max(out.shards.get(md, 0), most)
            out.shard_nodes[md] = list(dict.fromkeys(out.shard_nodes.get(md, []) + p.shard_nodes.get(md, [])))
            out.shard_per_node.setdefault(md, {}).update(p.shard_per_node.get(md, {}))
        out.mps = out.mps or p.mps
    for (kind, gtype), ons in sources.items():
        (out.whole if kind == "whole" else out.mig)[gtype].finish(tuple(ons))
    out.shard_sizes = {md: tuple(sorted(set(per.values()))) for md, per in out.shard_per_node.items()}
    return out


def _shard_holders(pool: _Pool, models: tuple[str, ...], n: int) -> tuple[str, ...]:
    return tuple(sorted({x for md in models for x, most in pool.shard_per_node.get(md, {}).items() if most >= n}))


def _candidates(kind: str, req: GpushareRequest, pool: _Pool, policy: SitePolicy, *, auto: bool,
                skipped: list[str], nodes: int = 1) -> list[Candidate]:
    mem, count = req.mem_mib, req.count
    out: list[Candidate] = []
    if kind == "mig" and mem is not None:
        for gtype, m in sorted(pool.mig.items()):
            if m.max_on_node < count or mem > m.capacity_mib or len(m.held(count)) < nodes:
                continue
            waste = m.capacity_mib - mem
            if auto and waste > policy.mig_max_waste * m.capacity_mib:
                skipped.append(f"mig:{gtype} would leave {_pct(waste, m.capacity_mib)}% unused")
                continue
            out.append(Candidate("mig", "gpu", gtype, count, (m.model,), m.capacity_mib, m.profile.memory_mib,
                                 waste, tuple(m.nodes)))
    elif kind == "mps" and mem is not None and count == 1:
        n = math.ceil(mem / pool.unit_mib)
        models = tuple(sorted(md for md, most in pool.shards.items() if most >= n))
        holding = shard_nodes_holding(pool, models, n)
        if models and len(holding) >= nodes:
            out.append(Candidate("mps", "shard", "", n, models, n * pool.unit_mib, n * pool.unit_mib,
                                 n * pool.unit_mib - mem, holding))
    elif kind == "gpu":
        for model, w in sorted(pool.whole.items()):
            if (w.max_on_node < count or (mem is not None and mem > w.capacity_mib)
                    or len(w.held(count)) < nodes):
                continue
            waste = w.capacity_mib - (mem or 0)
            out.append(Candidate("gpu", "gpu", model, count, (model,), w.capacity_mib, w.memory_mib, waste,
                                 tuple(w.nodes)))
    return out


def _pct(part: int, whole: int) -> int:
    return int(100 * part / whole + 0.5) if whole else 0


def _ranked(cands: list[Candidate], policy: SitePolicy) -> list[Candidate]:
    """Best first: least unused memory, then the site's model preference, then model name and type."""
    pref = {m: i for i, m in enumerate(policy.model_preference)}

    def key(c: Candidate):
        rank = min((pref.get(m, len(pref)) for m in c.models), default=len(pref))
        return (c.waste_mib, rank, c.models, c.type)

    return sorted(cands, key=key)


def _best(cands: list[Candidate], policy: SitePolicy) -> Candidate:
    return _ranked(cands, policy)[0]


def _gib(mib: int) -> str:
    if mib % 1024 == 0:
        return f"{mib // 1024} GiB"
    return f"{mib / 1024:.2f}".rstrip("0").rstrip(".") + " GiB"


def _kinds(req: GpushareRequest, policy: SitePolicy, parts: tuple[str, ...], where: str) -> tuple[str, ...]:
    """The kinds this request may get, in the order they are tried."""
    allowed = policy.allowed_kinds(parts)
    if not allowed:
        raise _error("none-allowed", where=where)
    allowed_text = ", ".join(f"mode={k}" for k in allowed)
    if req.mode != "auto":
        if req.mode == "mig" and not policy.mig_enabled:
            raise _error("mig-disabled", modes=" or ".join(f"mode={k}" for k in allowed))
        if req.mode not in allowed:
            raise _error("mode-disallowed", mode=req.mode, where=where, allowed=allowed_text)
        if req.sm_percent is not None and req.mode != "mps":
            raise _error("sm-mode", sm=req.sm_percent, mode=req.mode)
        if req.mode == "mps" and req.count > 1:
            raise _error("mps-count", request=req.spec(), count=req.count)
        return (req.mode,)
    if req.sm_percent is not None:
        if "mps" not in allowed:
            raise _error("sm-no-mps", sm=req.sm_percent, where=where, allowed=allowed_text)
        if req.count > 1:
            raise _error("sm-count", sm=req.sm_percent, request=req.spec(), count=req.count)
        return ("mps",)
    kinds = tuple(k for k in policy.mode_order if k in allowed)
    if not kinds:
        raise _error("none-allowed", where=where)
    if kinds == ("mps",) and req.count > 1:
        raise _error("mps-count", request=req.spec(), count=req.count)
    return kinds


def _choose(req: GpushareRequest, pool: _Pool, policy: SitePolicy, parts: tuple[str, ...], nodes: int = 1
            ) -> tuple[Candidate, list[Candidate], str]:
    """Pick one candidate that ``nodes`` nodes of the pool each hold. Returns (chosen, all candidates
    considered, reason).

    Raises:
        InputError: nothing can serve the request; the message says why and what would.
    """
    if req.count > policy.max_count:
        raise _error("count-max", count=req.count, max=policy.max_count)
    kinds = _kinds(req, policy, parts, pool.where)
    auto = req.mode == "auto"
    skipped: list[str] = []
    by_kind = {k: _candidates(k, req, pool, policy, auto=auto, skipped=skipped, nodes=nodes) for k in kinds}
    if nodes > 1 and not any(by_kind.values()):
        one = [c for k in kinds for c in _candidates(k, req, pool, policy, auto=auto, skipped=[])]
        if one:
            best = max(one, key=lambda c: (len(c.nodes), -c.waste_mib))
            have = max(len(c.nodes) for c in one)
            raise _error("nodes-too-many", nodes=nodes, have=have, where=pool.where,
                         what=f"{best.gres} ({best.kind})")
    considered = [c for k in kinds for c in _ranked(by_kind[k], policy)]
    chosen, reason = None, ""
    if auto and "gpu" in kinds and req.mem_mib is not None:
        large = [c for c in by_kind["gpu"] if req.mem_mib >= policy.whole_gpu_threshold * c.capacity_mib]
        if large:
            chosen = _best(large, policy)
            reason = (f"whole GPU: mem is at least {policy.whole_gpu_threshold:g} of a {chosen.models[0]}'s "
                      f"{_gib(chosen.capacity_mib)}")
    if chosen is None:
        for k in kinds:
            if by_kind[k]:
                chosen = _best(by_kind[k], policy)
                how = f"mode={req.mode}" if not auto else (
                    "sm= asks for MPS" if req.sm_percent is not None else "mode_order " + ",".join(kinds))
                reason = f"{k} by {how}; least unused memory ({chosen.waste_mib} MiB)"
                break
    if chosen is None:
        raise _refusal(req, kinds, pool, policy, auto=auto)
    if skipped:
        reason += "; skipped " + "; ".join(skipped)
    ordered = [chosen] + [c for c in considered if c != chosen]
    return chosen, ordered, reason


def _refusal(req: GpushareRequest, kinds: tuple[str, ...], pool: _Pool, policy: SitePolicy, *,
             auto: bool) -> InputError:
    """Why nothing of ``kinds`` serves ``req``, and what would (the largest thing that fits, ...)."""
    mem, count = req.mem_mib, req.count
    sizes: list[tuple[int, int, str, str]] = []  # (capacity, kind rank, kind, on)
    rank = {"gpu": 0, "mps": 1, "mig": 2}
    if "mig" in kinds:
        for gtype, m in pool.mig.items():
            sizes.append((m.capacity_mib, rank["mig"], "mig", gtype))
    if "mps" in kinds and count == 1:
        for model, most in pool.shards.items():
            sizes.append((most * pool.unit_mib, rank["mps"], "mps", model))
    if "gpu" in kinds:
        for model, w in pool.whole.items():
            sizes.append((w.capacity_mib, rank["gpu"], "gpu", model))
    if not sizes:
        nouns = " or ".join(_NOUN[k][1] for k in kinds)
        others = [k for k in policy.allowed_kinds(pool.parts) if k not in kinds]
        suggestion = ("use " + " or ".join(f"mode={k}" for k in others)) if others else "submit to another partition"
        return _error("no-kind", where=pool.where, nouns=nouns, suggestion=suggestion)
    if mem is not None:
        top = max(s[0] for s in sizes)
        if mem > top:
            best_kind = min((s for s in sizes if s[0] == top), key=lambda s: s[1])[2]
            on = ", ".join(sorted({s[3] for s in sizes if s[0] == top and s[2] == best_kind}))
            suggestion = f"mem={format_mib(top)}"
            top_whole = max((w.capacity_mib for w in pool.whole.values()), default=0)
            whole = [w for w in pool.whole.values() if w.capacity_mib == top_whole]
            if whole and "gpu" in policy.allowed_kinds(pool.parts) and count == 1:
                n = math.ceil(mem / whole[0].capacity_mib)
                if n <= policy.max_count and any(w.max_on_node >= n for w in whole):
                    suggestion += f" or for whole GPUs with gpushare:mode=gpu:{n}"
            return _error("too-large", mem=req.mem_text or format_mib(mem), noun=_NOUN[best_kind][0],
                          where=pool.where, size=_gib(top), on=on, suggestion=suggestion)
    # the memory fits something: the count does not, or (auto) MIG would waste too much
    fitting_counts = []
    if "mig" in kinds:
        fitting_counts += [m.max_on_node for m in pool.mig.values() if mem is not None and mem <= m.capacity_mib]
    if "gpu" in kinds:
        fitting_counts += [w.max_on_node for w in pool.whole.values() if mem is None or mem <= w.capacity_mib]
    best = max(fitting_counts, default=0)
    if count > 1 and 0 < best < count:
        nouns = " or ".join(_NOUN[k][1] for k in kinds if k != "mps")
        return _error("count-too-many", where=pool.where, count=count, nouns=nouns, request=req.spec(),
                      best=best, spec=req.spec(count=best))
    if auto and "mig" in kinds and mem is not None:
        fits = sorted((m.capacity_mib, t) for t, m in pool.mig.items() if mem <= m.capacity_mib)
        if fits:
            cap, gtype = fits[0]
            return _error("mig-waste", mem=req.mem_text or format_mib(mem), waste=_pct(cap - mem, cap),
                          slice=gtype, size=_gib(cap), max=int(policy.mig_max_waste * 100 + 0.5))
    nouns = " or ".join(_NOUN[k][1] for k in kinds if k != "mps" or count == 1)
    return _error("count-too-many", where=pool.where, count=count, nouns=nouns or "GPUs", request=req.spec(),
                  best=max(best, 1), spec=req.spec(count=max(best, 1)))


# --- decide --------------------------------------------------------------------------------------------


def decide(tres_per_node: str | None, tres_per_job: str | None, *, partitions: tuple[str, ...] | None,
           inventory: ClusterInventory, policy: SitePolicy, nodes: int = 1, tres_per_task: str | None = None,
           tres_per_socket: str | None = None, mem_per_tres: str | None = None, cpus_per_tres: str | None = None,
           ntasks_per_tres: object = None, granted_share: bool = False, pools: PoolIndex | None = None) -> Decision:
    """Decide what to do with one job's GRES request (job_submit / job_modify). Pure; never raises
    for a bad request.

    Args:
        tres_per_node: ``job_desc.tres_per_node`` (``gres:gpushare:mem=10G``), or None.
        tres_per_job: ``job_desc.tres_per_job`` (``--gpus``: ``gres:gpu:a100:2``), or None.
        partitions: the job's partitions (``job_desc.partition`` split on ``,``); None or empty for
            the cluster's default partition.
        inventory: the controller's cluster snapshot; only usable nodes count.
        policy: the site policy.
        nodes: how many nodes the job spans (``job_desc.min_nodes``, ``-N``; or ``num_tasks /
            ntasks_per_node`` rounded up, whichever is more; see :func:`nodes_needed`): the granted
            GRES is per node (``tres_per_node``), so that many usable nodes of the partitions must
            each hold it. The audit records it as ``nodes`` when more than 1.
        tres_per_task: ``job_desc.tres_per_task`` (``--tres-per-task=gres/shard:2``, 23.11+ clients;
            ``cpu=2`` for ``--cpus-per-task``), or None.
        tres_per_socket: ``job_desc.tres_per_socket`` (``--gres-per-socket``), or None. A share in
            either is refused (``per-task``): the per-node policy cannot judge it, and passed it would
            hold a share no limit was checked for. ``shard``/``mps`` there pass when
            ``police_direct`` is off, like direct ones per node. Beside a ``gpushare`` request, GPUs
            there (``--gpus-per-task``: ``gres:gpu:1`` on 22.05, ``gres/gpu:1`` from 23.11;
            ``--gpus-per-socket``) are refused too (``gpus-per-task``, ``gpus-per-socket``): Slurm
            would allocate them on top of the decided share.
        mem_per_tres: ``job_desc.mem_per_tres`` (``--mem-per-gpu``: ``gres:gpu:<MB>`` on 22.05,
            ``gres/gpu:<MB>`` from 23.11, src/common/slurm_opt.c at slurm-22-05-8-1 and
            slurm-24-11-5-1), or None.
        cpus_per_tres: ``job_desc.cpus_per_tres`` (``--cpus-per-gpu``, same forms), or None.
        ntasks_per_tres: ``job_desc.ntasks_per_tres`` (``--ntasks-per-gpu``; Slurm's NO_VAL16
            sentinel when unset), or None. Beside ``gpushare`` each of these three is refused
            (``mem-per-gpu``, ``cpus-per-gpu``, ``ntasks-per-gpu``): they count per whole GPU, and
            a share may become a MIG slice or part of one GPU.
        granted_share: ``tres_per_node`` is what a ``gpushare`` request was granted (a share, a MIG slice or
            whole GPUs; an update of a pending job that holds it, the service's ``move``): the options
            refused beside ``gpushare`` are refused beside it too, as they were at submit.
        pools: the :class:`PoolIndex` of ``inventory`` and ``policy`` (the filter service builds one with
            each snapshot, so that no decision builds a pool); None, or one of another inventory or
            policy: pools are built on first use and kept per inventory (the same decisions).

    Returns:
        ``pass`` for jobs without ``gpushare``/``shard``/``mps`` items (and direct ones when
        ``police_direct`` is off), untouched; ``rewrite`` with the new ``tres_per_node`` and the
        audit record; ``reject`` with a ``gpushare: ...`` message and ``ESLURM_INVALID_GRES``.
    """
    for other in (tres_per_task, tres_per_socket):
        share = [t for t in (other or "").split(",") if tres_name(t) in SHARE_NAMES]
        if share and (policy.police_direct or any(tres_name(t) == "gpushare" for t in share)):
            e = _error("per-task", item=unescape_knobs(share[0]) or share[0])
            text = f"gpushare: {e.message}; {e.hint}"
            refused = {"version": AUDIT.version, "original": tres_per_node or "", "request": share[0],
                       "action": "reject", "reason": text[len("gpushare: "):]}
            return Decision("reject", tres_per_node, refused, text, ESLURM_INVALID_GRES)
    shared = mentions_share(tres_per_node) or mentions_share(tres_per_job)
    if not shared and not granted_share:
        return Decision("pass", tres_per_node)
    tres_per_node, tres_per_job = unescape_knobs(tres_per_node), unescape_knobs(tres_per_job)
    gpushare = any(item_name(t) == "gpushare" for s in (tres_per_node, tres_per_job) if s for t in s.split(","))
    policed = shared and (gpushare or policy.police_direct)
    if not policed and not granted_share:
        return Decision("pass", tres_per_node)
    audit: dict[str, Any] = {"version": AUDIT.version, "original": tres_per_node or "",
                             "request": _request_text(tres_per_node, tres_per_job)}
    try:
        if policed:
            if not 1 <= nodes <= MAX_NODES:
                raise _error("nodes-bad", nodes=nodes, max=MAX_NODES)
            audit["nodes"] = nodes
        if granted_share or any(item_name(t) == "gpushare" for t in (tres_per_node or "").split(",")):
            _refuse_per_gpu_options(tres_per_task, tres_per_socket, mem_per_tres, cpus_per_tres, ntasks_per_tres)
        if not policed:
            if granted_share:  # the new partition or node count must still hold what was granted
                _grant_on_nodes(tres_per_node or "", partitions, inventory, policy, pools, nodes)
            return Decision("pass", tres_per_node)
        return _decide(tres_per_node or "", tres_per_job or "", partitions, inventory, policy, audit, pools)
    except InputError as e:
        text = f"gpushare: {e.message}" + (f"; {e.hint}" if e.hint else "")
        audit.update(action="reject", reason=text[len("gpushare: "):])
        return Decision("reject", tres_per_node, audit, text, ESLURM_INVALID_GRES)


def _grant_on_nodes(tres_per_node: str, partitions: tuple[str, ...] | None, inventory: ClusterInventory,
                    policy: SitePolicy, pools: PoolIndex | None, nodes: int) -> None:
    """Check that ``nodes`` usable nodes of the partitions each hold the ``gpu`` items of a granted MIG slice or
    whole GPUs (an update that moved the job to another partition or raised its node count: the grant is per
    node, and a partition without it would leave the job pending for ever).

    Raises:
        InputError: ``nodes`` out of range, no node holds an item, or fewer nodes do (the message names how many).
    """
    from slurm_gpushare.slurm.gres import GresSyntaxError, parse

    if not 1 <= nodes <= MAX_NODES:
        raise _error("nodes-bad", nodes=nodes, max=MAX_NODES)
    try:
        items = [it for it in parse(tres_per_node) if it.name == "gpu" and it.type]
    except GresSyntaxError:
        return  # not a grant this service wrote: Slurm judges it
    pool = _pool_for(inventory, _resolve_partitions(inventory, partitions), policy, pools, direct=True)
    for it in items:
        on = pool.mig.get(it.type) or pool.whole.get(it.type)
        have = len(on.held(it.count or 1)) if on is not None else 0
        if have == 0:
            raise _error("grant-not-here", where=pool.where, what=it.body)
        if have < nodes:
            raise _error("nodes-too-many", nodes=nodes, have=have, where=pool.where, what=it.body)


def _refuse_per_gpu_options(tres_per_task: str | None, tres_per_socket: str | None, mem_per_tres: str | None,
                            cpus_per_tres: str | None, ntasks_per_tres: object) -> None:
    """Refuse the options beside a ``gpushare`` request that count GPUs or per GPU (see :func:`decide`).

    Raises:
        InputError: the first such option, naming it and what to write instead.
    """
    for message_id, tres in (("gpus-per-task", tres_per_task), ("gpus-per-socket", tres_per_socket)):
        gpus = [t for t in (tres or "").split(",") if tres_name(t) == "gpu"]
        if gpus:
            raise _error(message_id, item=gpus[0][len(prefix_of(gpus[0])):])
    for message_id, tres, unit in (("mem-per-gpu", mem_per_tres, "M"), ("cpus-per-gpu", cpus_per_tres, " CPUs")):
        per_gpu = [t for t in (tres or "").split(",") if tres_name(t) == "gpu"]
        if per_gpu:
            value = re.split("[:=]", per_gpu[0])[-1]
            raise _error(message_id, item=f"{value}{unit}" if value.isdigit() else per_gpu[0])
    n = _number(ntasks_per_tres)
    if n is not None:
        raise _error("ntasks-per-gpu", item=n)


def tres_name(text: str) -> str:
    """The name of one TRES item of a ``tres_per_task``/``tres_per_socket``/``*_per_tres`` string, whose count
    follows ``:`` (``gres:gpu:1`` on 22.05, ``gres/gpu:1`` as ``--tres-per-task`` takes it) or ``=``: from
    23.11 the clients write ``--gpus-per-task=1`` as ``gres/gpu=1`` and ``-c 2`` as ``cpu=2``
    (``slurm_option_update_tres_per_task`` in src/common/slurm_opt.c at slurm-24-11-5-1).

    >>> tres_name("gres/gpu=1"), tres_name("gres:gpu:a100:2"), tres_name("cpu=2"), tres_name("gres/shard=4")
    ('gpu', 'gpu', 'cpu', 'shard')
    """
    body = text.strip()[len(prefix_of(text.strip())):]
    return re.split("[:=]", body, maxsplit=1)[0]


def _number(v: object) -> int | None:
    """A job_desc number as job_submit.lua sends it, or None when unset (NO_VAL sentinels, 0, missing)."""
    try:
        n = int(float(v))  # type: ignore[arg-type]  # Lua numbers arrive as JSON floats or strings
    except (TypeError, ValueError, OverflowError):
        return None
    return None if n <= 0 or n in _UNSET else n


def _request_text(*tres: str | None) -> str:
    """The share items as written, without prefix (and without the name for ``gpushare``)."""
    out = []
    for s in tres:
        for t in (s or "").split(","):
            name = item_name(t)
            if name in SHARE_NAMES:
                body = t[len(prefix_of(t)):]
                out.append(body[len("gpushare:"):] if name == "gpushare" else body)
    return ",".join(out)


def _decide(tpn: str, tpj: str, partitions: tuple[str, ...] | None, inventory: ClusterInventory,
            policy: SitePolicy, audit: dict[str, Any], pools: PoolIndex | None = None) -> Decision:
    items = parse_tres(tpn)
    has_gpushare = any(it.name == "gpushare" for it in items)
    job_items = parse_tres(tpj) if tpj and (has_gpushare or mentions_share(tpj)) else ()
    for it in job_items:
        if it.name in SHARE_NAMES:
            raise _error("per-job", item=it.text)
    prefix = next((it.prefix for it in items if it.prefix), DEFAULT_PREFIX)
    if has_gpushare:
        for it in items:
            if it.name in ("shard", "mps"):
                raise _error("mixed-share", item=it.body)
            if it.name == "gpu":
                raise _error("mixed-gpu", item=it.body)
        for it in job_items:
            if it.name == "gpu":
                raise _error("gpus-per-job", item=it.body)
        req = parse_gpushare(items)
        audit["request"] = req.text
        parts = _resolve_partitions(inventory, partitions)
        pool = _pool_for(inventory, parts, policy, pools)
        chosen, considered, reason = _choose(req, pool, policy, parts, audit.get("nodes", 1))
        first = next(it for it in items if it.name == "gpushare")
        new_item = GresItem(chosen.name, chosen.type, chosen.count, prefix=first.prefix or prefix)
        out = []
        for it in items:
            if it is first:
                out.append(new_item.strict(prefix))
            elif it.name != "gpushare":
                out.append(it.strict(prefix))
        grant = new_item.strict(prefix)
        audit.update(action="rewrite", kind=chosen.kind, grant=grant, gres_type=chosen.type,
                     model=",".join(chosen.models), mem_asked_mib=req.mem_mib, mem_granted_mib=chosen.granted_mib,
                     sm_percent=req.sm_percent, count=req.count, mode=req.mode, partitions=list(parts),
                     candidates=[c.label for c in considered],
                     models_considered=sorted({m for c in considered for m in c.models}), reason=reason)
        return Decision("rewrite", ",".join(out), audit, _granted_message(req, chosen, audit.get("nodes", 1)), SUCCESS)
    return _direct(items, prefix, partitions, inventory, policy, audit, pools)


def _granted_message(req: GpushareRequest, c: Candidate, nodes: int = 1) -> str:
    """The decision line the user reads; ``--gres`` counts are per node, so with ``nodes`` > 1 it says the grant is
    on each node."""
    ask = f"gpushare:{req.text}" if req.text else "gpushare"
    each = " each" if c.count > 1 else ""
    per_node = f" on each of the {nodes} nodes" if nodes > 1 else ""
    if c.kind == "mig":
        what = (f"a MIG slice {c.type}" if c.count == 1 else f"{c.count} MIG slices {c.type}")
        return f"gpushare: {ask} -> {what}{per_node} ({_gib(c.granted_mib)}{each})"
    if c.kind == "mps":
        sm = f", {req.sm_percent}% of its compute" if req.sm_percent is not None else ""
        return (f"gpushare: {ask} -> an MPS share of one {'/'.join(c.models)} GPU{per_node}, {c.gres} "
                f"({_gib(c.granted_mib)}{sm})")
    plural = "GPU" if c.count == 1 else "GPUs"
    return f"gpushare: {ask} -> {c.count} whole {c.type} {plural}{per_node} ({_gib(c.granted_mib)}{each})"


def _direct(items: tuple[GresItem, ...], prefix: str, partitions: tuple[str, ...] | None,
            inventory: ClusterInventory, policy: SitePolicy, audit: dict[str, Any],
            pools: PoolIndex | None = None) -> Decision:
    """Police direct ``shard:N`` / ``mps:N`` requests (from the partitions' pool, built once per snapshot)."""
    shards = [it for it in items if it.name == "shard"]
    mps = [it for it in items if it.name == "mps"]
    if shards and mps:
        raise _error("shard-mps")
    direct = shards or mps
    if not direct:  # unreachable: share items only in tres_per_job were refused by _decide
        return Decision("pass", audit["original"] or None)
    if len(direct) > 1:
        raise _error("twice", name=direct[0].name, first=direct[0].body, second=direct[1].body)
    it = direct[0]
    n = 1 if it.count is None else it.count
    if n == 0:
        raise _error("direct-zero", item=it.body, name=it.name)
    parts = _resolve_partitions(inventory, partitions)
    allowed = policy.allowed_kinds(parts)
    if "mps" not in allowed:  # shard:N / mps:N share one GPU, as an MPS share does: not where only whole GPUs go
        raise _error("direct-no-share", item=it.body, where=_where(parts),
                     allowed=", ".join(f"mode={k}" for k in allowed) or "none")
    unit = inventory.shard_unit_mib if inventory.shard_unit_mib > 0 else policy.shard_unit_mib
    pool = _pool_for(inventory, parts, policy, pools, direct=True)
    if it.name == "shard":
        if not pool.shards:
            raise _error("shard-none", where=pool.where)
        # a typed shard (shard:rtx4090:8) comes only from GPUs of that type: Slurm types each shard
        # like the GPU whose device file it shares (sinfo shows shard:rtx4090:184 and, for a MIG
        # type, shard:h100_1g.10gb:0; measured on 22.05), so only that type's GPUs can hold it
        sizes = pool.shards if not it.type else {m: s for m, s in pool.shards.items() if m == it.type}
        if not sizes:
            raise _error("shard-type", item=it.body, type=it.type, where=pool.where,
                         models=", ".join(sorted(pool.shards)))
        most = max(sizes.values())
        if n > most:
            on = ", ".join(sorted(m for m, s in sizes.items() if s == most))
            raise _error("shard-large", n=n, where=pool.where, most=most, on=on)
        models = sorted(m for m, s in sizes.items() if s >= n)
        nodes = audit.get("nodes", 1)
        holding = shard_nodes_holding(pool, models, n)
        if len(holding) < nodes:
            raise _error("nodes-too-many", nodes=nodes, have=len(holding), where=pool.where,
                         what=f"a GPU with {n} shards")
        audit.update(kind="shard-direct", mem_asked_mib=n * unit, mem_granted_mib=n * unit,
                     model=",".join(models), candidates=[f"shard-direct:shard:{n}"])
    else:
        if not pool.mps:
            raise _error("mps-none", n=n, where=pool.where)
        if n > MPS_PER_GPU:
            raise _error("mps-large", n=n)
        audit.update(kind="mps-direct", sm_percent=n, candidates=[f"mps-direct:mps:{n}"])
    grant = it.strict(prefix)
    audit.update(action="rewrite", grant=grant, gres_type=it.type, count=n, mode="direct", partitions=list(parts),
                 reason=f"direct {it.name} request within the limits of {pool.where}")
    return Decision("rewrite", ",".join(x.strict(prefix) for x in items), audit, "", SUCCESS)


__all__ = [
    "Candidate",
    "Decision",
    "ESLURM_INVALID_GRES",
    "KINDS",
    "MESSAGES",
    "MPS_PER_GPU",
    "PoolIndex",
    "SUCCESS",
    "decide",
    "nodes_needed",
    "nominal_gpu_mib",
    "nominal_profile_mib",
]
