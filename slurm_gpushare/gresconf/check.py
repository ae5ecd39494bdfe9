"""Lints of an installed gres.conf (and the GRES part of slurm.conf), pure.

:func:`lint_gres_conf` finds the mistakes that make Slurm 22.05 reject a node, miscount its GPUs or
schedule them blind; :func:`~slurm_gpushare.gresconf.diff.compare` says how an installed file differs from
the one ``slurm-gpushare gres-conf`` generates. Both take parsed or plain text and return plain data; the
CLI reads the files and turns findings into exit codes.

The lints, each with the rule it enforces (gres.conf(5) and slurm.conf(5) of the release checked
for, https://slurm.schedmd.com/gres.html; the rules that differ between releases come from
:mod:`slurm_gpushare.slurm.gresrules`, with their sources):

a. ``Cores=`` ids at or above the node's core count are SMT sibling (hyperthread) CPU ids or no
   core at all: gres.conf(5) "Cores" takes logical core indices; slurmd refuses the line
   ("invalid GRES core specification"). ``CPUs=`` (the old name of ``Cores=``) is a warning.
b. A ``Name=gpu`` line without ``File=``: next to ``AutoDetect`` it is a second, count-only record of
   GPUs that are already detected; with a ``Type=`` it breaks gres.conf(5) "File" ("File is required
   for all gpu typed GRES"); otherwise Slurm only counts the GPUs (warning).
c. ``Links=`` (gres.conf(5) "Links"): one value per GPU device of the node, ``-1`` exactly at the
   line's own device number, integers only, the same value both ways between two devices; all 0 is
   a warning (it tells Slurm that no GPU pair is connected). With a machine description, values that
   differ from :func:`slurm_gpushare.topology.hops.slurm_links` (reversed from 24.05:
   :func:`slurm_gpushare.slurm.gresrules.links_for_release`) are a warning.
d. slurm.conf ``Gres=`` counts that differ from gres.conf per node, name and type (gres.html: a node
   with fewer resources than configured is drained); GRES names missing from ``GresTypes``
   (gres.conf(5) "Name"); typed GRES missing from ``AccountingStorageTRES`` (warning, slurm.conf(5));
   GRES in ``AccountingStorageTRES`` with ``AccountingStorageType`` set to anything but slurmdbd
   (slurmctld 22.05 refuses to start: "slurmdbd is required to run with TRES gres/gpu").
e. A ``Name=shard``/``Name=mps`` count without ``File=`` that the node's GPUs cannot split evenly
   (gres.html "Sharding": it is "evenly distributed across all GPUs"; warning); ``Links=`` on a line
   with several devices; ``File=`` with ``MultipleFiles=``; ``Count=`` that is not the number of files.
f. ``AutoDetect=`` values the release does not know (slurmd logs "unknown autodetect flag" and
   detects nothing); ``Flags=`` items it does not know (ignored: a warning, naming the release that
   has the item); ``no_gpu_env`` beside an env flag, and lines of one GRES name with different
   ``Flags=`` (the env flags on 22.05, all flags from 23.02 on): slurmd stops with a fatal error.
g. ``Cores=`` that the release's slurmd refuses against the node's sockets (24.11: whole sockets
   only; 25.11 on: one whole socket or every core): the node is set INVAL with
   "doesn't match socket boundaries" (:func:`slurm_gpushare.slurm.gresrules.cores_problem`).
h. One ``Type=`` for GPUs of two models (with machine descriptions: the GPU behind each
   ``File=/dev/nvidiaN`` line, by minor number, and its model by
   :func:`~slurm_gpushare.hardware.machine.gpu_model`): ``--gres=gpu:<type>`` would be granted
   either model (a type collision, e.g. ``rtx6000`` for both a Quadro RTX 6000 and an RTX 6000 Ada).
i. ``TRESBillingWeights`` (:func:`lint_billing`): an item that is not ``<TRES>=<number>`` or names a
   TRES that is not tracked stops slurmctld at start (an error); a partition of the checked GPU nodes
   without weights, or whose weights bill a shard or a MIG device another share of a GPU than
   :mod:`slurm_gpushare.gresconf.billing` gives it (a MIG slice billed as a whole GPU, a shard billed
   nothing), is a warning.

Device numbers (the positions of ``Links=``) are the order of the node's ``Name=gpu`` device lines,
which is how :mod:`slurm_gpushare.gresconf.render` writes them (ascending NVML index = PCI bus order).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, replace

from slurm_gpushare.errors import InputError
from slurm_gpushare.gresconf.billing import (
    DEFAULT_TRES,
    BillingOptions,
    format_weight,
    parse_weights,
    partition_billing,
)
from slurm_gpushare.hardware.machine import CpuLayout, Machine, gpu_model
from slurm_gpushare.slurm.conf import (
    GresConf,
    GresEntry,
    SlurmGresConf,
    SlurmNode,
)
from slurm_gpushare.slurm.gres import GresItem, render_counts
from slurm_gpushare.slurm.gresrules import (
    AUTODETECT_BUILD_OPTION,
    ENV_FLAGS,
    FLAGS_SINCE,
    autodetect_values,
    cores_problem,
    flag_values,
    links_for_release,
)
from slurm_gpushare.slurm.hostlist import compress_hostlist, format_ranges
from slurm_gpushare.slurm.nodegres import NodeGres
from slurm_gpushare.slurm.release import GRES_FLAGS_ENV_ONLY, GRES_FLAGS_EVERY_BIT, OLDEST, Release
from slurm_gpushare.topology.hops import slurm_links

#: Severities of a :class:`Finding`.
SEVERITIES = ("error", "warning")
#: GRES whose ``Count`` is a share of a GPU rather than a number of devices (gres.conf(5) "File").
SHARING_GRES = ("mps", "shard")

_MAN_LINKS = "gres.conf(5) Links"
_MAN_LINKS_SINGLE = "'If specified, then this line can only contain a single GRES device'"


@dataclass(frozen=True)
class Finding:
    """One problem found in gres.conf or slurm.conf.

    Attributes:
        severity: ``"error"`` (Slurm refuses it or schedules wrongly) or ``"warning"``.
        where: ``file:line`` of the line at fault.
        message: what is wrong, with the values read.
        hint: what would work instead, and the rule's source.
    """

    severity: str
    where: str
    message: str
    hint: str = ""

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise InputError(f"finding severity must be one of {', '.join(SEVERITIES)}, not {self.severity!r}")

    def __str__(self) -> str:
        text = f"{self.where}: {self.severity}: {self.message}"
        return f"{text} ({self.hint})" if self.hint else text


@dataclass(frozen=True)
class _Node:
    """What one node sees: its gres.conf lines and what else is known about it."""

    name: str | None
    records: tuple[GresEntry, ...]
    autodetect: str | None
    slurm: SlurmNode | None
    machine: Machine | None

    @property
    def layout(self) -> CpuLayout | None:
        if self.slurm is not None and self.slurm.layout is not None:
            return self.slurm.layout
        return self.machine.cpus if self.machine is not None else None

    @property
    def gpu_lines(self) -> tuple[GresEntry, ...]:
        """``Name=gpu`` lines with device files, in file order."""
        return tuple(e for e in self.records if e.name.lower() == "gpu" and e.devices)

    @property
    def gpu_devices(self) -> int:
        """GPU devices of the node: from gres.conf device lines, else slurm.conf's gpu count."""
        n = sum(e.devices for e in self.gpu_lines)
        if n == 0 and self.slurm is not None:
            n = sum(c for (name, _t), c in self.slurm.gres_counts.items() if name.lower() == "gpu")
        return n


# (severity, where, node name or "", message, hint); node-level findings carry their node.
_Raw = tuple[str, str, str, str, str]


def lint_gres_conf(gres: GresConf, slurm: SlurmGresConf | None = None,
                   machines: dict[str, Machine] | None = None, *,
                   nodes: Iterable[str] | None = None, release: Release = OLDEST) -> list[Finding]:
    """Lint a gres.conf, alone or against slurm.conf and machine descriptions (rules in the module doc).

    Nodes are those named in gres.conf, the slurm.conf nodes that have ``Gres=`` and the machines;
    lines without ``NodeName`` apply to each of them (or, when none is known, to one unnamed node).
    A line's finding that is the same on several nodes is reported once; a node-level finding the
    same on several nodes is reported once with the nodes as a hostlist (``nodes tux[1-16]: ...``).

    Args:
        gres: the parsed gres.conf.
        slurm: the parsed slurm.conf GRES settings, for lint (d) and the node CPU layouts.
        machines: machine descriptions by node name, for CPU layouts and the expected ``Links=``.
        nodes: lint only these nodes (checking some nodes against the cluster-wide files): only the
            gres.conf lines that apply to one of them (their ``NodeName`` names one, or they have no
            ``NodeName``) and only their slurm.conf node lines are looked at. The cluster-wide
            settings (``GresTypes``, ``AccountingStorageTRES``) are still checked against those.
        release: the Slurm release that will read the files (rules f and g).

    Returns:
        Findings sorted by file (gres.conf first) and line; empty when the configuration is clean.
    """
    machines = machines or {}
    if nodes is not None:
        wanted = list(dict.fromkeys(nodes))
        gres = for_nodes(gres, wanted)
        if slurm is not None:
            slurm = replace(slurm, nodes=tuple(n for n in slurm.nodes if n.name in wanted))
        machines = {n: m for n, m in machines.items() if n in wanted}
    raw: list[_Raw] = []
    for entry in gres.entries:
        raw += _lint_line(entry, release)
    checked = _nodes(gres, slurm, machines, wanted if nodes is not None else None)
    raw += _lint_type_collisions(checked)
    for node in checked:
        raw += _lint_flags_agree(node, release)
        for entry in node.records:
            raw += _lint_cores(node, entry)
            raw += _lint_cores_sockets(node, entry, release)
            raw += _lint_fileless_gpu(node, entry)
            raw += _lint_sharing_count(node, entry)
        raw += _lint_links(node, release)
        if slurm is not None:
            raw += _lint_counts(node)
    if slurm is not None:
        raw += _lint_types(gres, slurm)
    return _collect(raw, gres.source)


def for_nodes(gres: GresConf, nodes: Iterable[str]) -> GresConf:
    """The lines of ``gres`` that configure at least one of ``nodes``: those whose ``NodeName``
    hostlist names one of them, and those without ``NodeName`` (they apply to every node)."""
    wanted = set(nodes)
    return replace(gres, entries=tuple(e for e in gres.entries if not e.nodes or wanted & set(e.nodes)))


def _nodes(gres: GresConf, slurm: SlurmGresConf | None, machines: dict[str, Machine],
           only: list[str] | None = None) -> list[_Node]:
    if only is not None:
        names: list[str] = list(only)
    else:
        names = list(gres.node_names)
        if slurm is not None:
            names += [n.name for n in slurm.nodes if n.gres]
        names += list(machines)
    ordered: list[str | None] = list(dict.fromkeys(names)) or [None]
    return [_Node(n, gres.records_for(n), gres.autodetect_for(n),
                  slurm.node(n) if slurm is not None and n is not None else None,
                  machines.get(n) if n is not None else None) for n in ordered]


def _collect(raw: list[_Raw], gres_source: str) -> list[Finding]:
    """Deduplicate, group node-level findings over their nodes, sort by file and line."""
    grouped: dict[tuple[str, str, str, str], list[str]] = {}
    for severity, where, node, message, hint in raw:
        nodes = grouped.setdefault((severity, where, message, hint), [])
        if node and node not in nodes:
            nodes.append(node)
    out = []
    for (severity, where, message, hint), nodes in grouped.items():
        if nodes:
            message = f"{'node' if len(nodes) == 1 else 'nodes'} {compress_hostlist(nodes)}: {message}"
        out.append(Finding(severity, where, message, hint))

    def key(f: Finding) -> tuple[int, str, int]:
        file, _, line = f.where.rpartition(":")
        return (0 if file == gres_source else 1, file, int(line) if line.isdigit() else 0)

    return sorted(out, key=key)


def _per_node(node: _Node, severity: str, where: str, message: str, hint: str) -> _Raw:
    """A finding about the node as a whole (reported as ``node X: message``)."""
    return (severity, where, node.name or "", message, hint)


def _line(severity: str, where: str, message: str, hint: str) -> _Raw:
    """A finding about one line, the same whichever node reads it."""
    return (severity, where, "", message, hint)


# --- per line ---------------------------------------------------------------------------------


def _lint_line(e: GresEntry, release: Release) -> list[_Raw]:
    """Rules that need nothing but the line itself (and the release)."""
    out = []
    known = autodetect_values(release)
    if e.autodetect is not None and e.autodetect not in known:
        out.append(_line("error", e.where, f"AutoDetect={e.param('AutoDetect')} is not a mechanism Slurm {release} "
                         "knows: slurmd logs 'unknown autodetect flag' and detects nothing",
                         f"use one of {', '.join(known)}; gres.conf(5) AutoDetect"))
    elif e.autodetect in AUTODETECT_BUILD_OPTION:
        plugin, library, said = AUTODETECT_BUILD_OPTION[e.autodetect]
        out.append(_line("warning", e.where,
                         f"AutoDetect={e.param('AutoDetect')} works only in a slurmd built with {library} ({plugin} in "
                         f"its PluginDir): a slurmd built without it logs '{said}' and detects nothing",
                         f"check that {plugin} is in slurmd's PluginDir (Debian's slurm-wlm 22.05 has no {plugin}, "
                         "nor have its 24.11 and 26.05 packages); without it write AutoDetect=off with File= lines"
                         f"{', or AutoDetect=nvidia (Slurm 24.11 on)' if e.autodetect == 'nvml' else ''}; "
                         "_get_gpu_type in Slurm's src/interfaces/gpu.c"))
    out += _lint_flag_items(e, release)
    if e.cores_key == "CPUs":
        out.append(_line("warning", e.where,
                         "CPUs= is the old name of Cores=: gres.conf(5) documents only Cores=, "
                         "and Slurm reads the values as core ids, not CPU ids",
                         "write Cores= with Slurm core ids, the 'Core L#' of lstopo -l; gres.conf(5) Cores"))
    if e.files and e.multiple_files:
        out.append(_line("error", e.where, "File= and MultipleFiles= on one line",
                         "gres.conf(5) File: 'File and MultipleFiles are mutually exclusive'; use File= for a "
                         "whole GPU, MultipleFiles= for a MIG device"))
    if (e.files and e.count is not None and e.count != len(e.files)
            and e.name.lower() not in SHARING_GRES):
        out.append(_line("error", e.where, f"Count={e.param('Count')} on a line with {len(e.files)} File= device(s)",
                         "gres.conf(5) File: 'Count must be either set to the number of file names specified "
                         "or not set'"))
    if e.links is not None:
        if len(e.files) > 1:
            out.append(_line("error", e.where,
                             f"Links= on a line with {len(e.files)} devices (File={e.param('File')})",
                             f"{_MAN_LINKS}: {_MAN_LINKS_SINGLE}; write one line per device file, each with "
                             "its own Links="))
        problems = []
        for i, field in enumerate(e.links.split(","), start=1):
            text = field.strip()
            if not text:
                problems.append(f"field {i} is empty")
            elif not _is_int(text):
                problems.append(f"field {i} ({text!r}) is not an integer")
            elif int(text) < -1:
                problems.append(f"field {i} ({text}) is below -1")
        if problems:
            out.append(_line("error", e.where, f"Links={e.links} is malformed: {'; '.join(problems)}",
                             f"{_MAN_LINKS}: one integer per GPU of the node, -1 for this GPU itself, 0 for no "
                             "connection, larger for better connected GPUs"))
    return out


def _lint_flag_items(e: GresEntry, release: Release) -> list[_Raw]:
    """Rule (f) per line: ``Flags=`` items the release does not know, ``no_gpu_env`` beside an env flag."""
    out: list[_Raw] = []
    known = flag_values(release)
    items = [f.lower() for f in e.flags]
    for item, written in zip(items, e.flags, strict=True):
        if item in known:
            continue
        since = FLAGS_SINCE.get(item)
        why = (f"Flags={written} arrives in Slurm {since}; Slurm {release} ignores it" if since is not None
               else f"Flags={written} is not a flag Slurm {release} knows; it is ignored")
        out.append(_line("warning", e.where, why,
                         f"known flags: {', '.join(known)}; gres.conf(5) Flags"))
    env = [f for f in items if f in ENV_FLAGS]
    if "no_gpu_env" in items and env:
        out.append(_line("error", e.where, f"Flags={e.param('Flags')} has no_gpu_env beside {','.join(env)}: slurmd "
                         "stops ('contains \"no_gpu_env\", which must be mutually exclusive to all other GRES "
                         "env flags')", "keep either no_gpu_env or the env flags; gres.conf(5) Flags"))
    return out


def _flag_set(e: GresEntry, release: Release) -> tuple[frozenset[str], bool]:
    """What slurmd compares between lines of one GRES name (``_parse_gres_config``): the env flags
    and ``no_gpu_env`` on 22.05; every flag bit (``all_sharing`` is none) and ``no_gpu_env`` from 23.02."""
    items = {f.lower() for f in e.flags}
    no_env = "no_gpu_env" in items
    if release < GRES_FLAGS_EVERY_BIT:
        return frozenset(items & set(ENV_FLAGS)), no_env
    bits = items & set(flag_values(release)) - {"all_sharing", "no_gpu_env"}
    if e.name.lower() == "mps" and not items & {"one_sharing", "all_sharing"}:
        bits |= {"one_sharing"}  # the default of mps
    return frozenset(bits), no_env


#: What a gpu line gets from slurmd without an explicit env flag (``GRES_CONF_ENV_SET | GRES_CONF_ENV_DEF``):
#: no ``Flags=`` value parses to it.
_DEFAULT_ENV = (frozenset({"<default env flags>"}), False)


def _lint_flags_agree(node: _Node, release: Release) -> list[_Raw]:
    """Rule (f) per node: a ``Flags=`` line that differs from what slurmd remembers of the line before it
    of the same GRES name (slurmd: "Flags (...) does not match env flags for previous GRES of same node
    and name", fatal).

    slurmd's walk (``_parse_gres_config``, src/common/gres.c at slurm-22-05-8-1, src/interfaces/gres.c
    at slurm-24-11-5-1 and slurm-26-05-3-1) remembers one line: a ``Flags=`` line that is compared
    (22.05 and 26.05: one with an env flag or ``no_gpu_env``; 23.02 to 25.11: every one) is checked
    against the remembered line when that is of the same name, and is remembered; a line without
    ``Flags=`` after a remembered line of its name with flags inherits them; any other gpu line (no
    ``Flags=``, or flags that are not compared) gets the default env flags and is remembered with them,
    so a compared ``Flags=`` gpu line after it always differs.
    """
    out: list[_Raw] = []
    compare_all = GRES_FLAGS_EVERY_BIT <= release < GRES_FLAGS_ENV_ONLY
    previous: tuple[str, tuple[frozenset[str], bool], GresEntry] | None = None
    for e in node.records:
        name = e.name.lower()
        default = False
        if e.flags:
            key = _flag_set(e, release)
            has_env = bool({f.lower() for f in e.flags} & set(ENV_FLAGS)) or key[1]
            if compare_all or has_env:
                if previous is not None and previous[0] == name and previous[1] != key:
                    out.append(_flags_differ(node, e, previous[2], previous[1] == _DEFAULT_ENV, release))
                previous = (name, key, e)
            else:
                default = True
        else:
            inherits = previous is not None and previous[0] == name and (bool(previous[1][0]) or previous[1][1])
            default = not inherits
        if default and name == "gpu":
            previous = (name, _DEFAULT_ENV, e)
    return out


def _flags_differ(node: _Node, e: GresEntry, previous: GresEntry, by_default: bool, release: Release) -> _Raw:
    before = (f"the {e.name} line before it ({previous.where}), which has no Flags= and so gets Slurm's "
              "default env flags" if by_default else
              f"Flags={previous.param('Flags')} of the {e.name} line before it ({previous.where})")
    return _per_node(node, "error", e.where,
                     f"Flags={e.param('Flags')} differs from {before}: slurmd {release} stops ('does not "
                     "match env flags for previous GRES of same node and name')",
                     f"give every {e.name} line of the node the same Flags=, or write Flags= on the "
                     f"first {e.name} line only (the lines after it inherit it); gres.conf(5) Flags")


def _is_int(text: str) -> bool:
    return text.lstrip("-").isdigit() and text.count("-") <= 1 and not text.endswith("-")


def links_values(e: GresEntry) -> list[int] | None:
    """The ``Links=`` values, or None when the line has none or they are malformed."""
    if e.links is None:
        return None
    fields = [f.strip() for f in e.links.split(",")]
    if not all(f and _is_int(f) and int(f) >= -1 for f in fields):
        return None
    return [int(f) for f in fields]


# --- per node: lines in their node's context --------------------------------------------------


def _lint_cores(node: _Node, e: GresEntry) -> list[_Raw]:
    """Lint (a): ``Cores=`` ids beyond the node's cores (gres.conf(5) Cores: logical core indices)."""
    layout = node.layout
    if e.cores is None or layout is None:
        return []
    beyond = sorted({c for c in e.cores if c >= layout.cores})
    if not beyond:
        return []
    key = e.cores_key
    if layout.threads_per_core > 1 and beyond[-1] < layout.cpus:
        fix = format_ranges(layout.core_ids(e.cores))
        return [_line("error", e.where,
                      f"{key}= lists CPU ids {format_ranges(beyond)} beyond the node's {layout.cores} cores: "
                      f"these are SMT sibling (hyperthread) ids; use core ids {fix}",
                      f"write Cores={fix}: gres.conf(5) Cores takes logical core indices, not CPU ids, and "
                      "slurmd refuses the line ('invalid GRES core specification')")]
    return [_line("error", e.where,
                  f"{key}= lists ids {format_ranges(beyond)} beyond the node's {layout.cores} cores "
                  f"({layout.cpus} CPUs): no such core",
                  f"core ids on this node are 0-{layout.cores - 1}; gres.conf(5) Cores")]


def _lint_cores_sockets(node: _Node, e: GresEntry, release: Release) -> list[_Raw]:
    """Lint (g): ``Cores=`` that ``release``'s slurmd refuses against the node's sockets."""
    layout = node.layout
    if e.cores is None or layout is None:
        return []
    problem = cores_problem(e.cores, layout.sockets, layout.cores_per_socket, release)
    if problem is None:
        return []
    fix = format_ranges(problem.fix)
    return [_per_node(node, "error", e.where,
                      f"{e.cores_key}={e.param(e.cores_key)} {problem.describe()} of the node's "
                      f"{layout.sockets} x {layout.cores_per_socket} "
                      f"cores: {problem.rule}, and slurmd sets the node INVAL "
                      f"('{problem.slurmd_message(e.cores, node.name or 'NODE', e.name.lower() or 'gpu')}')",
                      f"write Cores={fix}, or declare the NUMA domains as sockets in slurm.conf (Sockets=, "
                      "CoresPerSocket= and SlurmdParameters=numa_node_as_socket) and regenerate; "
                      "_check_core_range_matches_sock in Slurm's src/interfaces/gres.c")]


_WHOLE_GPU_FILE = re.compile(r".*/nvidia(\d+)")


def _lint_type_collisions(nodes: list[_Node]) -> list[_Raw]:
    """Lint (h): a ``Type=`` given to GPUs of different models, over all checked nodes.

    The GPU of a whole-GPU line is the machine's GPU with the minor number of its ``File=`` (MIG
    lines, whose types carry a profile, are not looked at). Nodes without a machine description
    are skipped: gres.conf does not say which model a line's GPU is.
    """
    seen: dict[str, dict[str, tuple[str, str]]] = {}
    out: list[_Raw] = []
    for node in nodes:
        if node.machine is None:
            continue
        by_minor = {g.minor: g for g in node.machine.gpus if not g.mig_enabled}
        for e in node.gpu_lines:
            if not e.type or e.multiple_files:
                continue
            for f in e.files:
                m = _WHOLE_GPU_FILE.fullmatch(f)
                gpu = by_minor.get(int(m.group(1))) if m else None
                if gpu is None:
                    continue
                models = seen.setdefault(e.type, {})
                model = gpu_model(gpu.name)
                if models and model != next(iter(models)):
                    other, (other_name, other_where) = next(iter(models.items()))
                    out.append(_per_node(
                        node, "error", e.where,
                        f"Type={e.type} is given to a {gpu.name} (model {model}) here and to a {other_name} "
                        f"(model {other}) at {other_where}: a job asking for gpu:{e.type} gets either",
                        f"give each model its own type, e.g. Type={model} here, as 'slurm-gpushare gres-conf' "
                        "writes it (docs/admin-guide.md, GPU type names)"))
                models.setdefault(model, (gpu.name, e.where))
    return out


def _lint_fileless_gpu(node: _Node, e: GresEntry) -> list[_Raw]:
    """Lint (b): ``Name=gpu`` without ``File=``/``MultipleFiles=``."""
    if e.name.lower() != "gpu" or e.devices:
        return []
    if node.autodetect not in (None, "off"):
        return [_line("error", e.where,
                      f"Name=gpu line without File= next to AutoDetect={node.autodetect}: AutoDetect already "
                      "reports every GPU with its device file, so this count-only record is a duplicate that "
                      "double counts the GPUs",
                      "delete the line, or give the File= of the GPUs it means: AutoDetect then only "
                      "sanity-checks them; gres.conf(5) AutoDetect")]
    if e.type:
        return [_line("error", e.where, f"Name=gpu Type={e.type} without File=",
                      "gres.conf(5) File: 'File is required for all gpu typed GRES'; write one line per GPU "
                      "with File=/dev/nvidiaN")]
    return [_line("warning", e.where,
                  "Name=gpu without File=: Slurm only counts these GPUs and cannot confine jobs to the ones "
                  "they were given",
                  "add File=/dev/nvidiaN per GPU, or AutoDetect=nvml; gres.conf(5) File")]


def _lint_sharing_count(node: _Node, e: GresEntry) -> list[_Raw]:
    """Lint (e): a file-less shard/mps ``Count=`` that the node's GPUs cannot split evenly."""
    if e.name.lower() not in SHARING_GRES or e.devices or e.count is None:
        return []
    return _uneven_split(node, e.name, e.count, e.where, f"Name={e.name} Count={e.param('Count')} without File=")


def _uneven_split(node: _Node, name: str, count: int, where: str, what: str) -> list[_Raw]:
    gpus = node.gpu_devices
    if gpus <= 1 or count % gpus == 0:
        return []
    lower = count - count % gpus
    return [_line("warning", where,
                  f"{what} is split evenly over the node's {gpus} GPUs, but {count} is not a multiple of "
                  f"{gpus}: the GPUs get unequal shares",
                  f"use a count of {lower or gpus} or {lower + gpus}, or one Name={name} File=/dev/nvidiaN "
                  "Count=... line per GPU; https://slurm.schedmd.com/gres.html#Sharding")]


def _lint_links(node: _Node, release: Release = OLDEST) -> list[_Raw]:
    """Lint (c): ``Links=`` length, own position, symmetry, all zero, and the machine's topology."""
    lines = node.gpu_lines
    n = sum(e.devices for e in lines)
    if not any(e.links is not None for e in lines):
        return []
    out: list[_Raw] = []
    rows: dict[int, list[int]] = {}
    position = 0
    for e in lines:
        pos = position
        position += e.devices
        if e.links is None or e.devices != 1:
            continue
        fields = e.links.split(",")
        if len(fields) != n:
            out.append(_line("error", e.where, f"Links= has {len(fields)} values for the node's {n} GPU devices",
                             f"{_MAN_LINKS}: one value per gpu device of the node, in the order of its "
                             "Name=gpu lines, device 0 first"))
        values = links_values(e)
        if values is None:
            continue
        selves = [i for i, v in enumerate(values) if v == -1]
        if selves != [pos]:
            found = (f"marks device {format_ranges(selves)} as itself (-1)" if selves
                     else "has no -1 for the device itself")
            out.append(_line("error", e.where, f"Links= {found}, but this line is device {pos} of the node",
                             f"{_MAN_LINKS}: 'A -1 indicates the device itself'; put -1 at position {pos}, "
                             "counting from 0, and nowhere else"))
        if len(values) == n:
            rows[pos] = values
    where_of = _device_lines(lines)
    for i in sorted(rows):
        for j in sorted(rows):
            if i < j and rows[i][j] != rows[j][i]:
                out.append(_line("error", where_of[i],
                                 f"Links are not symmetric: device {i} -> {j} is {rows[i][j]} but device {j} -> {i} "
                                 f"is {rows[j][i]} ({where_of[j]})",
                                 "a connection joins two GPUs: give both lines the same value"))
    expected = _expected_links(node, release)
    values_all = [v for e in lines if e.devices == 1 and e.links is not None
                  for v in (int(f) for f in e.links.split(",") if f.strip() and _is_int(f.strip()))]
    zero_is_right = expected is not None and all(v <= 0 for row in expected for v in row)
    if n > 1 and values_all and all(v in (-1, 0) for v in values_all) and not zero_is_right:
        first = next(e for e in lines if e.links is not None)
        out.append(_line("warning", first.where,
                         "Links are all 0: Slurm cannot prefer NVLinked GPUs; generate them with "
                         "slurm-gpushare gres-conf",
                         f"{_MAN_LINKS}: 0 means no connection; on a node whose GPUs share no NVLink or PCIe "
                         "switch all 0 is right"))
    if expected is not None:
        for pos, values in rows.items():
            if values != expected[pos]:
                source = (node.machine.source if node.machine else None) or "machine description"
                out.append(_per_node(node, "warning", where_of[pos],
                                     f"Links={','.join(map(str, values))} differ from the topology of {source}: "
                                     f"expected Links={','.join(map(str, expected[pos]))}",
                                     "generate gres.conf with slurm-gpushare gres-conf"))
    return out


def _device_lines(lines: tuple[GresEntry, ...]) -> dict[int, str]:
    out, pos = {}, 0
    for e in lines:
        for _ in range(e.devices):
            out[pos] = e.where
            pos += 1
    return out


def _expected_links(node: _Node, release: Release = OLDEST) -> list[list[int]] | None:
    """The node's ``Links=`` matrix in gres.conf device order, from its machine description, as
    ``release`` needs it (:func:`~slurm_gpushare.slurm.gresrules.links_for_release`).

    None when there is no machine, or its GPUs cannot be matched one to one with the node's
    ``File=/.../nvidiaN`` lines by minor number.
    """
    m = node.machine
    lines = node.gpu_lines
    if m is None or len(m.gpus) < 2 or any(len(e.files) != 1 for e in lines) or len(lines) != len(m.gpus):
        return None
    order = [g.index for g in sorted(m.gpus, key=lambda g: g.index)]
    by_minor = {g.minor: order.index(g.index) for g in m.gpus}
    positions = []
    for e in lines:
        tail = e.files[0].rsplit("nvidia", 1)[-1]
        if not tail.isdigit() or int(tail) not in by_minor:
            return None
        positions.append(by_minor[int(tail)])
    if sorted(positions) != list(range(len(order))):
        return None
    links = links_for_release(slurm_links(m).tolist(), release)
    return [[int(links[a][b]) for b in positions] for a in positions]


# --- slurm.conf against gres.conf --------------------------------------------------------------


def _lint_counts(node: _Node) -> list[_Raw]:
    """Lint (d): per node, name and type, slurm.conf ``Gres=`` counts against gres.conf."""
    s = node.slurm
    if s is None:
        named = [e for e in node.records if node.name in e.nodes]
        if not named:
            return []
        return [_per_node(node, "warning", named[0].where,
                          "gres.conf configures this node but slurm.conf has no NodeName line for it",
                          "check the node name: slurmd reads only the gres.conf lines whose NodeName "
                          "matches its own; slurm.conf(5) NodeName")]
    if not node.records:
        return _slurm_only_split(node)
    ours: dict[str, dict[str, int]] = {}
    lines: dict[str, list[GresEntry]] = {}
    for e in node.records:
        ours.setdefault(e.name.lower(), {})
        ours[e.name.lower()][e.type] = ours[e.name.lower()].get(e.type, 0) + e.effective_count
        lines.setdefault(e.name.lower(), []).append(e)
    theirs: dict[str, dict[str, int]] = {}
    for (name, type_), count in s.gres_counts.items():
        theirs.setdefault(name.lower(), {})[type_] = count
    out: list[_Raw] = []
    for name, by_type in ours.items():
        if name not in theirs:
            total = sum(by_type.values())
            has = "has no Gres=" if not s.gres else f"Gres={gres_text(s)} has no {name}"
            out.append(_per_node(node, "error", s.where,
                                 f"gres.conf configures {total} {name} ({_where_list(lines[name])}) but "
                                 f"slurm.conf {has}",
                                 f"add {_spec_list(name, by_type)} to Gres=; slurm.conf(5) Gres"))
            continue
        if set(theirs[name]) == {""}:
            pairs = [("", sum(by_type.values()), theirs[name][""])]
        else:
            types = list(dict.fromkeys([*theirs[name], *by_type]))
            pairs = [(t, by_type.get(t, 0), theirs[name].get(t, 0)) for t in types]
        for type_, have, said in pairs:
            if have != said:
                label = f"{name}:{type_}" if type_ else name
                out.append(_per_node(node, "error", s.where,
                                     f"gres.conf has {have} {label} but slurm.conf Gres= says {label}:{said}",
                                     f"make them equal, e.g. {label}:{have} in Gres=; a node that reports fewer "
                                     "GRES than slurm.conf configures is drained: https://slurm.schedmd.com/"
                                     "gres.html"))
    return out + _slurm_only_split(node, skip=set(ours))


def _slurm_only_split(node: _Node, skip: frozenset[str] | set[str] = frozenset()) -> list[_Raw]:
    """Lint (e) for slurm.conf: a shard/mps count with no gres.conf lines is split over the GPUs too."""
    s = node.slurm
    out: list[_Raw] = []
    if s is None:
        return out
    for (name, _type), count in s.gres_counts.items():
        if name.lower() in SHARING_GRES and name.lower() not in skip:
            spec = GresItem(name, count=count).text
            out += _uneven_split(node, name, count, s.where, f"Gres={spec} (no gres.conf {name} lines)")
    return out


def gres_text(s: SlurmNode) -> str:
    """A slurm.conf node's ``Gres=`` as canonical text (``gpu:a100:8,shard:640``)."""
    return ",".join(g.strict("") for g in s.gres or ())


def _spec_list(name: str, by_type: dict[str, int]) -> str:
    return render_counts({(name, t): c for t, c in by_type.items()})


def _where_list(entries: list[GresEntry]) -> str:
    source = entries[0].source
    return f"{source}:{format_ranges([e.line for e in entries])}"


def _storage_type(slurm: SlurmGresConf) -> str:
    """How slurm.conf sets AccountingStorageType, for a message."""
    if slurm.accounting_storage_type is None:
        return "no AccountingStorageType: accounting_storage/none"
    return f"AccountingStorageType={slurm.accounting_storage_type}"


def _lint_types(gres: GresConf, slurm: SlurmGresConf) -> list[_Raw]:
    """Lint (d): GRES names missing from ``GresTypes``, typed GRES missing from ``AccountingStorageTRES``."""
    used: dict[str, str] = {}
    typed: dict[tuple[str, str], str] = {}
    for e in gres.entries:
        if e.name:
            used.setdefault(e.name.lower(), e.where)
            if e.type:
                typed.setdefault((e.name.lower(), e.type), e.where)
    for n in slurm.nodes:
        for g in n.gres or ():
            used.setdefault(g.name.lower(), n.where)
            if g.type:
                typed.setdefault((g.name.lower(), g.type), n.where)
    out: list[_Raw] = []
    known = {t.lower() for t in slurm.gres_types or ()}
    missing = [name for name in used if name not in known]
    if missing:
        written = f"GresTypes={','.join(slurm.gres_types)}" if slurm.gres_types else "no GresTypes="
        fix = ",".join([*(slurm.gres_types or ()), *missing])
        for name in missing:
            where = slurm.where("GresTypes") if slurm.gres_types_line else used[name]
            out.append(_line("error", where, f"GRES {name} is configured ({used[name]}) but slurm.conf has {written}",
                             f"GresTypes={fix}; gres.conf(5) Name: 'The name must match a value in GresTypes'"))
    no_slurmdbd = slurm.no_slurmdbd
    if slurm.accounting_tres is not None and no_slurmdbd:
        gres_tres = [t for t in slurm.accounting_tres if t.lower().startswith("gres/")]
        if gres_tres:
            out.append(_line("error", slurm.where("AccountingStorageTRES"),
                             f"AccountingStorageTRES lists {','.join(gres_tres)} but there is no slurmdbd "
                             f"({_storage_type(slurm)}): slurmctld 22.05 refuses "
                             "to start ('slurmdbd is required to run with TRES gres/gpu')",
                             "remove the gres/ items, or set AccountingStorageType=accounting_storage/slurmdbd; "
                             "slurm.conf(5) AccountingStorageTRES"))
    if slurm.accounting_tres is not None and not no_slurmdbd:
        tracked = {t.lower() for t in slurm.accounting_tres}
        where = slurm.where("AccountingStorageTRES")
        for (name, type_), used_at in typed.items():
            tres = f"gres/{name}:{type_}"
            if tres.lower() not in tracked:
                out.append(_line("warning", where,
                                 f"AccountingStorageTRES does not list {tres} (configured at {used_at}): jobs' use of "
                                 "that type is not accounted",
                                 f"add {tres}; slurm.conf(5) AccountingStorageTRES"))
    return out


# --- billing weights --------------------------------------------------------------------------


#: The values Slurm's configuration parser reads as true for a boolean key, in any case (``s_p_handle_boolean`` in
#: src/common/parse_config.c).
SLURM_TRUE = ("yes", "up", "true", "1")


def sharing_nodes(gres: GresConf, nodes: Iterable[str]) -> list[str]:
    """The nodes of ``nodes`` whose GPUs gres.conf shares: ``shard`` or ``mps`` lines, or MIG slices (a ``gpu``
    line whose files include ``/dev/nvidia-caps``); in ``nodes`` order."""
    names = list(nodes)
    shared: set[str] = set()
    for e in gres.entries:
        mig = e.name == "gpu" and any("nvidia-caps" in f for f in (*e.files, *e.multiple_files))
        if e.name in ("shard", "mps") or mig:
            shared.update(e.nodes or names)
    return [n for n in names if n in shared]


def lint_device_constraint(cgroup: list[tuple[str, int, str, str]] | None, cgroup_source: str,
                           slurm: list[tuple[str, int, str, str]] | None, slurm_source: str, *, whole: bool,
                           sharing: list[str]) -> list[Finding]:
    """Warnings for nodes whose GPUs are shared (``sharing``) where Slurm does not confine a job to its devices:
    ``ConstrainDevices`` of cgroup.conf not ``yes`` (its default is ``no``, cgroup.conf(5)), or, in a whole
    slurm.conf, a ``TaskPlugin`` without ``task/cgroup``, which applies it (its default is ``task/none``). A job
    that sets its own ``CUDA_VISIBLE_DEVICES`` then reaches every GPU of its node, the other jobs' shares and MIG
    slices included.

    Args:
        cgroup: :func:`~slurm_gpushare.slurm.conf.slurm_conf_settings` of cgroup.conf, None when there is none.
        slurm: the same of slurm.conf, None when there is none.
        whole: slurm.conf is a whole file (a key it lacks has Slurm's default).
    """
    if not sharing:
        return []
    nodes = ", ".join(sharing)
    reach = (f"a job on {nodes} (GPUs shared) that sets its own CUDA_VISIBLE_DEVICES reaches every GPU of its "
             "node, the other jobs' shares and MIG slices included")
    out = []
    found = [(src, n, v) for src, n, k, v in cgroup or () if k.lower() == "constraindevices"]
    if cgroup is None:
        out.append(Finding("warning", cgroup_source, f"{cgroup_source} not found, so ConstrainDevices is no "
                           f"(Slurm's default): {reach}", "write ConstrainDevices=yes into cgroup.conf beside "
                                                          "slurm.conf (cgroup.conf(5))"))
    elif not found or found[-1][2].strip().lower() not in SLURM_TRUE:
        where = f"{found[-1][0]}:{found[-1][1]}" if found else cgroup_source
        said = f"ConstrainDevices={found[-1][2]}" if found else "ConstrainDevices is not set (Slurm's default: no)"
        out.append(Finding("warning", where, f"{said}: {reach}", "set ConstrainDevices=yes (cgroup.conf(5))"))
    plugins = [(src, n, v) for src, n, k, v in slurm or () if k.lower() == "taskplugin"]
    value = plugins[-1][2] if plugins else ("task/none" if whole else None)
    if value is not None and "task/cgroup" not in [p.strip().lower() for p in value.split(",")]:
        where = f"{plugins[-1][0]}:{plugins[-1][1]}" if plugins else slurm_source
        out.append(Finding("warning", where, f"TaskPlugin={value} has no task/cgroup, so ConstrainDevices is not "
                           f"applied: {reach}", "add task/cgroup to TaskPlugin (slurm.conf(5), cgroup.conf(5))"))
    return out


def lint_billing(slurm: SlurmGresConf, nodes: Iterable[NodeGres], *, mig_by: str = "memory") -> list[Finding]:
    """Lint (i): the ``TRESBillingWeights`` of every partition, and the shares they give the GPUs of
    ``nodes`` (the generated nodes being checked).

    A partition's GPU weight ``W`` is read from it: the weight of a whole-GPU type
    (``GRES/gpu:<model>``) plus the untyped ``GRES/gpu`` (a job is allocated both). The expected
    weights are :func:`~slurm_gpushare.gresconf.billing.partition_billing` of the checked nodes it
    holds with that ``W`` (nodes it holds that are not checked do not count, also for the shard count).

    Returns:
        Findings: errors for what stops slurmctld, warnings for shares that differ.
    """
    tracked = set(DEFAULT_TRES) | {t.lower() for t in slurm.accounting_tres or ()}
    checked = list(nodes)
    out: list[Finding] = []
    man = "slurm.conf(5) TRESBillingWeights"
    for part in slurm.partitions:
        items = parse_weights(part.billing_weights or "")
        for tres, weight, item in items:
            if weight is None:
                out.append(Finding("error", part.where,
                                   f"partition {part.name}: TRESBillingWeights item {item!r} is not <TRES>=<number>: "
                                   "slurmctld stops ('failed to parse tres weights str')",
                                   f"write a decimal, e.g. GRES/shard=0.0125 for 1/80; {man}"))
            elif tres.startswith("gres/") and slurm.no_slurmdbd:
                out.append(Finding("error", part.where,
                                   f"partition {part.name}: TRESBillingWeights names {item.partition('=')[0]}, and "
                                   f"there is no slurmdbd ({_storage_type(slurm)}): Slurm tracks GRES only with "
                                   "slurmdbd, so slurmctld stops ('failed to parse tres weights str')",
                                   f"remove the GRES/ items from TRESBillingWeights (gres-conf --no-slurmdbd prints "
                                   f"none); {man}"))
            elif tres not in tracked:
                out.append(Finding("error", part.where,
                                   f"partition {part.name}: TRESBillingWeights names {item.partition('=')[0]}, "
                                   "which is not tracked: slurmctld stops "
                                   "('TRES weight ... is not a configured TRES type')",
                                   f"add {tres} to AccountingStorageTRES (gres-conf prints it); {man}"))
        mine = [n for n in checked if part.has_node(n.node_name) and n.counts]
        if not mine:
            continue
        expected = partition_billing(part.name, mine)
        split = [t for t, _w in expected.weights if t not in expected.whole and t.lower() != "gres/gpu"]
        if not items and (not split or slurm.no_slurmdbd):
            # nothing split: whether whole GPUs weigh in billing is the site's own choice, not a share's price;
            # without slurmdbd GRES weights would stop slurmctld
            continue
        if not items:
            out.append(Finding("warning", part.where,
                               f"partition {part.name} has no TRESBillingWeights: its jobs are billed their CPUs, a "
                               "shard job or a MIG device as much as a whole GPU with as many CPUs",
                               f"add TRESBillingWeights={expected.value} (gres-conf --partition "
                               f"{part.name}=NODES); {man}"))
            continue
        weights = {t: w for t, w, _i in items if w is not None}
        untyped = weights.get("gres/gpu", 0.0)
        whole = [t.lower() for t in expected.whole if t.lower() in weights]
        gpu_weight = weights[whole[0]] + untyped if whole else untyped
        if gpu_weight <= 0:
            out.append(Finding("warning", part.where, f"partition {part.name}: TRESBillingWeights gives a GPU no "
                               f"weight ({part.billing_weights}): GPU jobs are billed nothing for their GPUs",
                               f"e.g. TRESBillingWeights={expected.value}; {man}"))
            continue
        expected = partition_billing(part.name, mine, BillingOptions(gpu_weight=gpu_weight, mig_by=mig_by))
        for tres, want in expected.weights:
            have = weights.get(tres.lower(), 0.0) + (untyped if tres.lower().startswith("gres/gpu:") else 0.0)
            if not math.isclose(have, want, rel_tol=1e-6, abs_tol=1e-12):
                what = "a shard" if tres == "GRES/shard" else f"one {tres.split(':', 1)[1]} device"
                out.append(Finding("warning", part.where,
                                   f"partition {part.name}: {what} bills {format_weight(have)}, expected "
                                   f"{format_weight(want)} ({format_weight(want / gpu_weight)} of a GPU, which bills "
                                   f"{format_weight(gpu_weight)})",
                                   f"TRESBillingWeights={expected.value} (gres-conf --partition {part.name}=NODES "
                                   f"--billing-gpu-weight {format_weight(gpu_weight)}); {man}"))
    return out

