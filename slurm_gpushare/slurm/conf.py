r"""Installed Slurm configuration, read: gres.conf and the GRES part of slurm.conf, as plain data (pure).

This is an inputs-layer module: it turns the text of a site's ``gres.conf`` and ``slurm.conf`` into
frozen dataclasses for the checks in :mod:`slurm_gpushare.gresconf.check`. It reads no files (callers
pass the text and a ``source`` name used in errors as ``source:line``) and judges nothing that
parses: a ``Links=`` with an empty field, a ``Cores=`` with hyperthread ids or a count that does not
match slurm.conf are read as written and left to the linter.

The syntax is Slurm 22.05's, from gres.conf(5) and slurm.conf(5):

* ``Key=Value`` pairs separated by white space; key names are case insensitive; ``#`` starts a
  comment that runs to the end of the line; a line ending in ``\`` continues on the next one.
* gres.conf keys: ``NodeName``, ``Name``, ``Type``, ``File``, ``MultipleFiles``, ``Count``,
  ``Cores``, ``CPUs`` (the old name of ``Cores``, kept so that it can be linted), ``Links``,
  ``Flags``, ``AutoDetect``. Any other key is a :class:`~slurm_gpushare.errors.ParseError`.
* ``NodeName`` (both files) and ``File``/``MultipleFiles`` (gres.conf) take Slurm hostlist
  expressions: ``tux[0-15]``, ``lx[15,18,32-33]``, ``linux[0000-1023]``, ``alpha,beta``,
  ``/dev/nvidia[0,2-3]`` (see :func:`slurm_gpushare.slurm.hostlist.expand_hostlist`).
* Counts take a ``K``/``M``/``G``/``T``/``P`` suffix (powers of 1024; gres.conf(5) "Count",
  slurm.conf(5) "Gres").
* slurm.conf ``Gres=`` is ``<name>[:<type>][:no_consume]:<count>`` items, comma separated
  (slurm.conf(5) "Gres"); an optional socket binding ``(S:0-1)`` after an item is kept as text.
* ``Include FILE`` (slurm.conf(5) "INCLUDE MODIFIERS"; the same parser reads gres.conf): a line that
  starts with the word ``include`` (any case) and white space reads FILE in its place. How Slurm
  finds FILE (``_parse_include_directive`` in src/common/parse_config.c and ``get_extra_conf_path``
  in src/common/read_config.c, the same at slurm-22-05-8-1, slurm-24-11-5-1 and slurm-26-05-3-1):
  an absolute name as written, a relative one in the directory of slurm.conf (never of the
  including file); ``%c`` is the ``ClusterName`` set above it, in lower case; a name with ``*`` is
  skipped with an error from 23.02 on ("Slurm does not support glob parsing") and is a file that
  does not exist before; a missing file fails the include (after retrying for 60 s). Slurm has no
  depth limit: an include cycle recurses until slurmd crashes. The parsers follow includes only
  when given an ``include`` loader (:data:`IncludeLoader`), and raise
  :class:`~slurm_gpushare.errors.ParseError` for a cycle, a glob or a ``%c`` without ``ClusterName``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from slurm_gpushare.errors import GpushareError, InputError, ParseError
from slurm_gpushare.hardware.machine import CpuLayout
from slurm_gpushare.slurm.gres import COUNT_SUFFIXES, GresItem, parse
from slurm_gpushare.slurm.hostlist import expand_hostlist, parse_id_list

#: gres.conf keys, as gres.conf(5) of Slurm 22.05 spells them (``CPUs`` is the undocumented old name
#: of ``Cores`` that Slurm still reads).
GRES_CONF_KEYS = ("NodeName", "Name", "Type", "File", "MultipleFiles", "Count", "Cores", "CPUs", "Links",
                  "Flags", "AutoDetect")

#: ``NodeName=`` keys of slurm.conf that describe GRES and the CPU layout (slurm.conf(5) "NODE
#: CONFIGURATION"); the other keys of a ``NodeName=`` line are skipped.
SLURM_NODE_KEYS = ("NodeName", "Gres", "Sockets", "SocketsPerBoard", "CoresPerSocket", "ThreadsPerCore",
                   "Boards", "CPUs")

_GRES_KEYS = {k.lower(): k for k in GRES_CONF_KEYS}
_NODE_KEYS = {k.lower(): k for k in SLURM_NODE_KEYS}
_INCLUDE = re.compile(r"include\s+(\S+)", re.IGNORECASE)
_CLUSTER = re.compile(r"(?:^|\s)ClusterName[ \t]*=[ \t]*(\S+)", re.IGNORECASE)

#: ``include(name, where) -> (source, text)``: the text of the file an ``Include`` line names
#: (``name`` as written after ``%c``, ``where`` the ``file:line`` of the line), and the source name
#: its entries get. Raises :class:`~slurm_gpushare.errors.ConfigError` when it cannot be read.
IncludeLoader = Callable[[str, str], tuple[str, str]]

# Slurm's parse_config.c allows white space on both sides of "=" (its key-value pattern), so "NodeName = gpu01"
# is one Key=Value token, as is "Key= value"
_TOKEN = re.compile(r"""([^\s=]+)[ \t]*=[ \t]*("[^"]*"|'[^']*'|\S*)|(\S+)""")
_COUNT = re.compile(r"(\d+)([KMGTP]?)", re.IGNORECASE)


# --- value syntax -----------------------------------------------------------------------------


def parse_count(text: str) -> int:
    """A GRES count with an optional ``K``/``M``/``G``/``T``/``P`` suffix: ``"4G"`` -> 4294967296.

    gres.conf(5) "Count" and slurm.conf(5) "Gres": the suffixes multiply by 1024, 1048576, ...

    Raises:
        ParseError: not a non-negative integer with an optional suffix (``source`` is None).
    """
    m = _COUNT.fullmatch(text.strip())
    if m is None:
        raise ParseError(f"count {text!r} is not a number", hint="write an integer, optionally with K, M, G, T or P")
    return int(m.group(1)) * COUNT_SUFFIXES.get(m.group(2).upper(), 1)


def _logical_lines(text: str) -> Iterator[tuple[int, str]]:
    r"""``(first line number, text without comment)`` per logical line; ``\`` joins lines."""
    pending: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].rstrip()
        if not pending:
            start = number
        if line.endswith("\\"):
            pending.append(line[:-1])
            continue
        pending.append(line)
        joined = " ".join(pending).strip()
        pending = []
        if joined:
            yield start, joined
    if pending and " ".join(pending).strip():
        yield start, " ".join(pending).strip()


def _expanded_lines(text: str, source: str, include: IncludeLoader | None,
                    stack: tuple[str, ...] = (), state: dict | None = None) -> Iterator[tuple[str, int, str]]:
    """``(source, line number, text)`` per logical line, ``Include`` lines replaced by the included
    file's lines (see the module doc), or skipped when ``include`` is None."""
    state = {} if state is None else state
    for number, line in _logical_lines(text):
        m = _INCLUDE.match(line)
        if m is None:
            cluster = _CLUSTER.search(line)
            if cluster:
                state["cluster"] = cluster.group(1)
            yield source, number, line
            continue
        if include is None:
            continue
        where = f"{source}:{number}"
        name = m.group(1)
        if "%c" in name:
            if "cluster" not in state:
                raise ParseError(f"Include {name}: %c is the ClusterName, and none is set above this line",
                                 hint="set ClusterName= before the Include line, or write the name out",
                                 source=where)
            name = name.replace("%c", state["cluster"].lower())
        if "*" in name:
            raise ParseError(f"Include {name}: Slurm does not expand '*' (23.02 and later skip the line with "
                             "'Slurm does not support glob parsing', 22.05 looks for a file of that name)",
                             hint="write one Include line per file", source=where)
        inc_source, inc_text = include(name, where)
        chain = (*stack, source)
        if inc_source in chain:
            raise ParseError(f"Include cycle: {' -> '.join((*chain, inc_source))}: Slurm has no depth limit and "
                             "recurses until the daemon crashes", hint="remove one of the Include lines",
                             source=where)
        yield from _expanded_lines(inc_text, inc_source, include, chain, state)


def _tokens(line: str) -> Iterator[tuple[str | None, str]]:
    """``(key, value)`` per ``Key=Value`` token (quotes removed); ``(None, word)`` for a bare word."""
    for m in _TOKEN.finditer(line):
        if m.group(3) is not None:
            yield None, m.group(3)
            continue
        value = m.group(2)
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        yield m.group(1), value


def _at(source: str, line: int, error: ParseError) -> ParseError:
    return ParseError(error.message, hint=error.hint, source=f"{source}:{line}")


# --- gres.conf --------------------------------------------------------------------------------


@dataclass(frozen=True)
class GresEntry:
    """One logical line of gres.conf, as written (hostlists and ranges expanded).

    Attributes:
        source: the file name given to :func:`parse_gres_conf`.
        line: line number (1-based) where the entry starts.
        nodes: ``NodeName=`` expanded; empty when the line has no ``NodeName`` (it applies to every
            node that reads the file).
        name: ``Name=`` (``gpu``, ``mps``, ``shard``, ...); ``""`` on a line that only sets
            ``AutoDetect``.
        type: ``Type=``, or ``""``.
        files: ``File=`` expanded (``/dev/nvidia[0-1]`` -> two paths).
        multiple_files: ``MultipleFiles=`` expanded (one GRES made of all of them).
        count: ``Count=`` with its suffix applied, or None when not written.
        cores: ``Cores=`` (or ``CPUs=``) ids in written order, or None when not written.
        cores_key: ``"Cores"``, or ``"CPUs"`` when the old name was written.
        links: ``Links=`` exactly as written (checked by the linter, not here), or None.
        flags: ``Flags=`` items.
        autodetect: ``AutoDetect=`` on this line, lower case, or None.
        params: every ``Key=Value`` of the line with canonical key names and values as written, in
            written order (for diffs and messages).
    """

    source: str
    line: int
    nodes: tuple[str, ...] = ()
    name: str = ""
    type: str = ""
    files: tuple[str, ...] = ()
    multiple_files: tuple[str, ...] = ()
    count: int | None = None
    cores: tuple[int, ...] | None = None
    cores_key: str = "Cores"
    links: str | None = None
    flags: tuple[str, ...] = ()
    autodetect: str | None = None
    params: tuple[tuple[str, str], ...] = ()

    @property
    def where(self) -> str:
        """``source:line``."""
        return f"{self.source}:{self.line}"

    @property
    def devices(self) -> int:
        """GRES devices the line describes: one per ``File=`` path, one for ``MultipleFiles=``, else 0."""
        if self.files:
            return len(self.files)
        return 1 if self.multiple_files else 0

    @property
    def effective_count(self) -> int:
        """``Count=``, else the number of files, else 1 (gres.conf(5) "Count" default)."""
        if self.count is not None:
            return self.count
        return self.devices or 1

    def param(self, key: str) -> str | None:
        """The value written for canonical ``key`` (``"Links"``), or None."""
        for k, v in self.params:
            if k == key:
                return v
        return None

    def applies_to(self, node: str | None) -> bool:
        """Whether the line configures ``node`` (None: the file read without a node name)."""
        return not self.nodes or (node is not None and node in self.nodes)


@dataclass(frozen=True)
class GresConf:
    """A parsed gres.conf.

    Attributes:
        source: the file name given to :func:`parse_gres_conf`.
        entries: every non-empty line in file order, ``AutoDetect``-only lines included.
    """

    source: str
    entries: tuple[GresEntry, ...]

    @property
    def node_names(self) -> tuple[str, ...]:
        """Every node named by a ``NodeName=``, in first-appearance order."""
        return tuple(dict.fromkeys(n for e in self.entries for n in e.nodes))

    @property
    def autodetect(self) -> str | None:
        """The global ``AutoDetect`` (the last one on a line without ``NodeName``), or None."""
        value = None
        for e in self.entries:
            if not e.nodes and e.autodetect is not None:
                value = e.autodetect
        return value

    def autodetect_for(self, node: str | None) -> str | None:
        """The ``AutoDetect`` in force on ``node``: node-specific beats global (gres.conf(5) "AutoDetect")."""
        if node is not None:
            for e in self.entries:
                if node in e.nodes and e.autodetect is not None:
                    return e.autodetect
        return self.autodetect

    def records_for(self, node: str | None) -> tuple[GresEntry, ...]:
        """The GRES lines (those with ``Name=``) that configure ``node``, in file order.

        ``node`` None gives the lines without ``NodeName`` (a file read without knowing the node).
        """
        return tuple(e for e in self.entries if e.name and e.applies_to(node))


def parse_gres_conf(text: str, *, source: str, include: IncludeLoader | None = None) -> GresConf:
    """Parse gres.conf text (gres.conf(5), Slurm 22.05 to 26.05).

    Args:
        text: the whole file.
        source: its name, used in errors and in each entry's ``where`` (``gres.conf:12``).
        include: reads the files of ``Include`` lines (their entries get the included file's
            source); None skips ``Include`` lines.

    Returns:
        The entries in file order.

    Raises:
        ParseError: an unknown key (the message names it and lists :data:`GRES_CONF_KEYS`), a word
            that is not ``Key=Value``, a key given twice on one line, a bad hostlist, ``Count``,
            ``Cores``/``CPUs`` or ``Flags`` value; an ``Include`` cycle, glob or ``%c``.
            ``source`` is ``file:line``.
        ConfigError: from ``include``, an included file that cannot be read.
    """
    entries = []
    for src, number, line in _expanded_lines(text, source, include):
        try:
            entries.append(_gres_entry(line, src, number))
        except ParseError as e:
            raise _at(src, number, e) from None
    return GresConf(source, tuple(entries))


def _gres_entry(line: str, source: str, number: int) -> GresEntry:
    params: dict[str, str] = {}
    for key, value in _tokens(line):
        if key is None:
            raise ParseError(f"{value!r} is not a Key=Value pair", hint="gres.conf lines are Key=Value pairs")
        canon = _GRES_KEYS.get(key.lower())
        if canon is None:
            raise ParseError(f"unknown gres.conf key {key!r}",
                             hint=f"known keys, in any case: {', '.join(GRES_CONF_KEYS)}")
        if canon in params or (canon in ("Cores", "CPUs") and {"Cores", "CPUs"} & params.keys()):
            raise ParseError(f"{key}= is given twice on one line")
        params[canon] = value
    fields: dict = {"source": source, "line": number, "params": tuple(params.items())}
    for key, value in params.items():
        if key == "NodeName":
            fields["nodes"] = expand_hostlist(value)
        elif key == "Name":
            fields["name"] = value
        elif key == "Type":
            fields["type"] = value
        elif key == "File":
            fields["files"] = expand_hostlist(value)
        elif key == "MultipleFiles":
            fields["multiple_files"] = expand_hostlist(value)
        elif key == "Count":
            fields["count"] = parse_count(value)
        elif key in ("Cores", "CPUs"):
            fields["cores"] = parse_id_list(value)
            fields["cores_key"] = key
        elif key == "Links":
            fields["links"] = value
        elif key == "Flags":
            fields["flags"] = tuple(f for f in value.split(",") if f)
        elif key == "AutoDetect":
            fields["autodetect"] = value.lower()
    if "name" not in fields and "autodetect" not in fields:
        raise ParseError("a gres.conf line needs Name= (or AutoDetect=)",
                         hint="e.g. NodeName=tux1 Name=gpu File=/dev/nvidia0")
    return GresEntry(**fields)


# --- slurm.conf -------------------------------------------------------------------------------


@dataclass(frozen=True)
class SlurmNode:
    """The GRES and CPU layout of one node from its slurm.conf ``NodeName=`` line (defaults applied).

    Attributes:
        name: the node name (one per node of a hostlist).
        source: the file name given to :func:`parse_slurm_conf_gres`.
        line: number of the ``NodeName=`` line.
        gres: the ``Gres=`` items (count suffixes applied, a socket binding ``S:0-1`` in ``detail``),
            or None when the node has no ``Gres=``.
        sockets, sockets_per_board, cores_per_socket, threads_per_core, boards, cpus: as written
            (None when neither the line nor a ``NodeName=DEFAULT`` line gives them).
    """

    name: str
    source: str
    line: int
    gres: tuple[GresItem, ...] | None = None
    sockets: int | None = None
    sockets_per_board: int | None = None
    cores_per_socket: int | None = None
    threads_per_core: int | None = None
    boards: int | None = None
    cpus: int | None = None

    @property
    def where(self) -> str:
        """``source:line``."""
        return f"{self.source}:{self.line}"

    @property
    def gres_counts(self) -> dict[tuple[str, str], int]:
        """``Gres=`` counts keyed by ``(name, type)``, summed over repeated items."""
        out: dict[tuple[str, str], int] = {}
        for g in self.gres or ():
            out[g.key] = out.get(g.key, 0) + g.amount
        return out

    @property
    def layout(self) -> CpuLayout | None:
        """The node's CPU layout as slurm.conf(5) derives it, or None when ``CoresPerSocket`` is not given.

        ``Sockets`` is read as sockets per board when ``Boards`` is given; a missing ``Sockets`` is
        inferred from ``CPUs / (CoresPerSocket * ThreadsPerCore)``, else 1 (slurm.conf(5) "Sockets").
        """
        if self.cores_per_socket is None:
            return None
        threads = self.threads_per_core or 1
        boards = self.boards or 1
        per_board = self.sockets_per_board or self.sockets
        if per_board is None:
            total = self.cpus // (self.cores_per_socket * threads) if self.cpus else 1
            per_board = max(1, total // boards)
        return CpuLayout(sockets=boards * per_board, cores_per_socket=self.cores_per_socket,
                         threads_per_core=threads)


@dataclass(frozen=True)
class SlurmPartition:
    """One ``PartitionName=`` line of slurm.conf, as far as billing goes.

    Attributes:
        name: the partition's name.
        nodes: its ``Nodes=`` names, hostlists expanded (``("ALL",)`` as written for every node).
        billing_weights: ``TRESBillingWeights=`` as written (quotes removed), or None when not set.
        where: ``file:line`` of the line.
    """

    name: str
    nodes: tuple[str, ...]
    billing_weights: str | None
    where: str

    def has_node(self, name: str) -> bool:
        """Whether the partition holds node ``name`` (``Nodes=ALL`` holds every node)."""
        return name in self.nodes or any(n.upper() == "ALL" for n in self.nodes)


@dataclass(frozen=True)
class SlurmGresConf:
    """The GRES part of a slurm.conf.

    Attributes:
        source: the file name given to :func:`parse_slurm_conf_gres`.
        gres_types: ``GresTypes=`` items, or None when not set.
        gres_types_line: its line number, or None.
        accounting_tres: ``AccountingStorageTRES=`` items, or None when not set.
        accounting_tres_line: its line number, or None.
        nodes: one entry per node name (hostlists expanded), in file order; a node named twice keeps
            its first line (slurm.conf(5): duplicate node name records are ignored).
        accounting_storage_type: ``AccountingStorageType=`` as written (``accounting_storage/slurmdbd``),
            or None when not set.
        accounting_storage_type_line: its line number, or None.
        partitions: the ``PartitionName=`` lines (not ``DEFAULT``, whose values they inherit), in file
            order.
        whole: the text names its controller (``SlurmctldHost`` or the older ``ControlMachine``, which
            slurmctld requires): a whole slurm.conf, not a snippet, so a key it lacks has Slurm's default.
    """

    source: str
    gres_types: tuple[str, ...] | None = None
    gres_types_line: int | None = None
    accounting_tres: tuple[str, ...] | None = None
    accounting_tres_line: int | None = None
    nodes: tuple[SlurmNode, ...] = ()
    accounting_storage_type: str | None = None
    accounting_storage_type_line: int | None = None
    origins: dict[str, str] = field(default_factory=dict, compare=False)
    partitions: tuple[SlurmPartition, ...] = ()
    whole: bool = False

    @property
    def no_slurmdbd(self) -> bool:
        """Whether this slurm.conf runs without slurmdbd: ``AccountingStorageType`` set to another plugin, or not
        set in a whole file (its default is ``accounting_storage/none``, slurm.conf(5)). A snippet without the key
        says nothing."""
        return not self.slurmdbd and (self.accounting_storage_type is not None or self.whole)

    def where(self, key: str) -> str:
        """``file:line`` of ``GresTypes``, ``AccountingStorageTRES`` or ``AccountingStorageType`` (the
        included file's name when an ``Include`` set it); ``source`` alone when the key is not set."""
        line = {"GresTypes": self.gres_types_line, "AccountingStorageTRES": self.accounting_tres_line,
                "AccountingStorageType": self.accounting_storage_type_line}[key]
        if line is None:
            return self.source
        return f"{self.origins.get(key, self.source)}:{line}"

    @property
    def slurmdbd(self) -> bool:
        """Whether the cluster records accounting in slurmdbd.

        ``AccountingStorageType=accounting_storage/slurmdbd``; anything else, or the key missing (its
        default is ``accounting_storage/none``, slurm.conf(5)), means no slurmdbd. Without slurmdbd
        slurmctld 22.05 refuses GRES in ``AccountingStorageTRES`` ("slurmdbd is required to run with
        TRES gres/gpu"). A type set in an included file is seen only when the parser was given an
        ``include`` loader.
        """
        return (self.accounting_storage_type or "").strip().lower() == "accounting_storage/slurmdbd"

    def node(self, name: str) -> SlurmNode | None:
        """The node called ``name``, or None."""
        for n in self.nodes:
            if n.name == name:
                return n
        return None


def parse_gres_value(text: str) -> tuple[GresItem, ...]:
    """Parse a slurm.conf ``Gres=`` value: ``gpu:a100:8,shard:640``, ``gpu:tesla:2(S:0-1)``.

    Grammar (slurm.conf(5) "Gres"): comma-separated ``<name>[:<type>][:no_consume]:<count>[K|M|G|T|P]``,
    the count may be left out (1), a socket binding may follow in parentheses; read by
    :func:`slurm_gpushare.slurm.gres.parse` with ``units=True``. Empty items (a trailing comma, ``,,``) are
    skipped, as slurmctld's ``strtok_r`` skips them (``_get_gres_cnt`` in src/common/gres.c).

    Raises:
        ParseError: no item at all, an empty name, a bad count, more fields than the grammar allows
            (``source`` is None).
    """
    hint = "write <name>[:<type>][:no_consume]:<count>, e.g. Gres=gpu:a100:8,shard:640"
    try:
        items = parse(text, units=True, allow_empty=True)
    except ParseError as e:
        raise ParseError(f"{e.message} in Gres={text}", hint=hint) from None
    if not items:
        raise ParseError(f"no GRES item in Gres={text}", hint=hint)
    return items


def parse_slurm_conf_gres(text: str, *, source: str, include: IncludeLoader | None = None) -> SlurmGresConf:
    """Read ``GresTypes``, ``AccountingStorageTRES``, ``AccountingStorageType``, every node's ``Gres=``
    and CPU layout, and every partition's ``Nodes=`` and ``TRESBillingWeights=``.

    Key names are case insensitive (slurm.conf(5): real files write ``gres=``). Lines with other
    keys are skipped. ``Include`` lines are followed with ``include`` (see the module doc) and
    skipped without it. ``NodeName=DEFAULT`` lines add to the defaults of the lines after them
    (slurm.conf(5) "NODE CONFIGURATION"), ``PartitionName=DEFAULT`` lines likewise for partitions
    (slurm.conf(5) "PARTITION CONFIGURATION").

    Args:
        text: the slurm.conf text (a whole file or a snippet).
        source: its name, used in errors and in each node's ``where``.
        include: reads the files of ``Include`` lines; None skips them.

    Raises:
        ParseError: a bad hostlist, ``Gres=`` value or layout number; an ``Include`` cycle, glob or
            ``%c`` (``source`` is ``file:line``).
        ConfigError: from ``include``, an included file that cannot be read.
    """
    gres_types = tres = storage_type = None
    gres_types_line = tres_line = storage_type_line = None
    whole = False
    defaults: dict[str, str] = {}
    nodes: dict[str, SlurmNode] = {}
    origins: dict[str, str] = {}
    part_defaults: dict[str, str] = {}
    partitions: list[SlurmPartition] = []
    for src, number, line in _expanded_lines(text, source, include):
        pairs = [(k, v) for k, v in _tokens(line) if k is not None]
        if not pairs:
            continue
        first = pairs[0][0].lower()
        try:
            if first == "nodename":
                values = {}
                for key, value in pairs:
                    canon = _NODE_KEYS.get(key.lower())
                    if canon is not None:
                        values[canon] = value
                if values["NodeName"].upper() == "DEFAULT":
                    defaults.update({k: v for k, v in values.items() if k != "NodeName"})
                    continue
                merged = {**defaults, **values}
                for name in expand_hostlist(values["NodeName"]):
                    if name not in nodes:
                        nodes[name] = _slurm_node(name, merged, src, number)
                continue
            if first == "partitionname":
                values = {k.lower(): v.strip('"') for k, v in pairs}
                if values["partitionname"].upper() == "DEFAULT":
                    part_defaults.update({k: v for k, v in values.items() if k != "partitionname"})
                    continue
                merged = {**part_defaults, **values}
                hosts = merged.get("nodes", "")
                names = (hosts,) if hosts.upper() == "ALL" else expand_hostlist(hosts) if hosts else ()
                partitions.append(SlurmPartition(values["partitionname"], names, merged.get("tresbillingweights"),
                                                 f"{src}:{number}"))
                continue
            for key, value in pairs:
                if key.lower() == "grestypes":
                    gres_types, gres_types_line = tuple(v for v in value.split(",") if v), number
                    origins["GresTypes"] = src
                elif key.lower() == "accountingstoragetres":
                    tres, tres_line = tuple(v for v in value.split(",") if v), number
                    origins["AccountingStorageTRES"] = src
                elif key.lower() == "accountingstoragetype":
                    storage_type, storage_type_line = value, number
                    origins["AccountingStorageType"] = src
                elif key.lower() in ("slurmctldhost", "controlmachine"):
                    whole = True
        except ParseError as e:
            raise _at(src, number, e) from None
    return SlurmGresConf(source, gres_types, gres_types_line, tres, tres_line, tuple(nodes.values()),
                         accounting_storage_type=storage_type, accounting_storage_type_line=storage_type_line,
                         origins=origins, partitions=tuple(partitions), whole=whole)


def _slurm_node(name: str, values: dict[str, str], source: str, number: int) -> SlurmNode:
    numbers = {}
    for key, attr in (("Sockets", "sockets"), ("SocketsPerBoard", "sockets_per_board"),
                      ("CoresPerSocket", "cores_per_socket"), ("ThreadsPerCore", "threads_per_core"),
                      ("Boards", "boards"), ("CPUs", "cpus")):
        if key in values:
            if not values[key].isdigit():
                raise ParseError(f"{key}={values[key]} is not a number")
            numbers[attr] = int(values[key])
    gres = parse_gres_value(values["Gres"]) if values.get("Gres") else None
    return SlurmNode(name, source, number, gres, **numbers)


# --- any setting ------------------------------------------------------------------------------

def slurm_conf_settings(text: str, *, source: str, include: IncludeLoader | None = None
                        ) -> list[tuple[str, int, str, str]]:
    """Every ``Key=Value`` token of a slurm.conf, ``Include`` files followed as slurmctld follows them:
    ``(file, line number, key, value)`` in file order, keys as written (slurm.conf(5) reads them
    case-insensitively). A ``Prolog=``/``Epilog=`` given on several lines (24.11 and later run each) appears
    once per line.

    Raises:
        ParseError: an ``Include`` line that cannot be followed (see :func:`parse_slurm_conf_gres`).
    """
    out = []
    for src, number, line in _expanded_lines(text, source, include):
        for key, value in _tokens(line):
            if key is not None:
                out.append((src, number, key, value))
    return out


# --- writers: one node's lines changed, the rest of the file kept as it is ----------------------------------


def _names_node(value: str, node: str) -> bool:
    try:
        return node in expand_hostlist(value)
    except GpushareError:
        return value == node


def _gres_names(lines: Sequence[str]) -> set[str]:
    return {m.group(1).lower() for ln in lines for m in [re.search(r"(?:^|\s)Name=(\S+)", ln)] if m}


def replace_gres_lines(text: str, node: str, new_lines: Sequence[str], *, source: str) -> str:
    """gres.conf ``text`` with the node's lines (``NodeName=NODE ...`` and the ``# NODE:`` comments before
    them, as ``gres-conf`` writes them) replaced by ``new_lines``, where the first of them was.

    A line ``Name=... NodeName=NODE ...`` (NodeName= not first, gres.conf(5) reads it the same) is one of the
    node's lines too. A ``Name=`` line without ``NodeName=`` applies to every node (gres.conf(5)): one of a
    GRES name that ``new_lines`` define (``gpu``, ``shard``) would add its devices to the node's new ones.

    Raises:
        InputError: a line names the node among others (``NodeName=gpu[01-04]``): it cannot be changed
            for one node; a ``Name=`` line for every node of a GRES name the new lines define; or the file
            has no line of the node but ``Include`` lines (its lines may be in an included file, which
            apply does not rewrite: new lines here would duplicate them).
    """
    out: list[str] = []
    at: int | None = None
    lines = text.splitlines()
    names = _gres_names(new_lines)
    for k, line in enumerate(lines):
        m = re.match(r"\s*NodeName=(\S+)", line, re.I) or \
            (re.match(r"\s*Name=", line, re.I) and re.search(r"\sNodeName=(\S+)", line, re.I))
        if m and m.group(1) == node:
            at = len(out) if at is None else at
            continue
        if m and _names_node(m.group(1), node):
            raise InputError(f"{source}:{k + 1}: NodeName={m.group(1)} names {node} among other nodes",
                             hint=f"give {node} lines of its own (slurm-gpushare gres-conf writes them)")
        g = None if m else re.match(r"\s*Name=(\S+)", line, re.I)
        if g and g.group(1).lower() in names:
            raise InputError(f"{source}:{k + 1}: Name={g.group(1)} without NodeName= applies to every node, "
                             f"{node} too: its devices would add to {node}'s new MIG lines",
                             hint=f"give that line NodeName= of the nodes it is for (not {node}), or give "
                                  "every node lines of its own (slurm-gpushare gres-conf writes them)")
        if line.startswith(f"# {node}: "):
            continue  # our own header of the node's block, rewritten below
        out.append(line)
    if at is None and any(re.match(r"\s*include\s", ln, re.I) for ln in lines):
        raise InputError(f"{source} has no NodeName={node} line but Include lines: {node}'s lines may be in an "
                         "included file, which is not rewritten here",
                         hint=f"give that file with --gres-conf, or move {node}'s lines into {source}")
    if at is None:
        if out and out[-1].strip():
            out.append("")
        at = len(out)
    out[at:at] = list(new_lines)
    return "\n".join(out) + "\n"


def replace_slurm_gres(text: str, node: str, gres_value: str, *, source: str) -> str:
    """slurm.conf ``text`` with ``Gres=`` of the ``NodeName=NODE`` line set to ``gres_value``.

    Raises:
        InputError: the node is in a hostlist line with other nodes (``NodeName=gpu[01-04]``: its ``Gres=``
            is theirs too), or it has no line here (with ``Include`` lines: it may be in an included file).
    """
    lines = text.splitlines()
    for k, line in enumerate(lines):
        m = re.match(r"\s*NodeName=(\S+)", line, re.I)
        if not m:
            continue
        if m.group(1) != node:
            if _names_node(m.group(1), node):
                raise InputError(f"{source}:{k + 1}: NodeName={m.group(1)} names {node} among other nodes: "
                                 f"its Gres= is theirs too",
                                 hint=f"give {node} a NodeName={node} line of its own and take it out of "
                                      f"{m.group(1)}, then rerun (scontrol reconfigure after the edit)")
            continue
        if re.search(r"\sGres=\S*", line):
            lines[k] = re.sub(r"(\s)Gres=\S*", lambda mm: f"{mm.group(1)}Gres={gres_value}", line, count=1)
        else:
            lines[k] = f"{line.rstrip()} Gres={gres_value}"
        return "\n".join(lines) + "\n"
    if any(re.match(r"\s*include\s", ln, re.I) for ln in lines):
        raise InputError(f"{source} has no NodeName={node} line but Include lines: it may be in an included "
                         "file, which is not rewritten here",
                         hint=f"give that file with --slurm-conf, or move {node}'s line into {source}")
    raise InputError(f"{source} has no NodeName={node} line of its own",
                     hint="apply rewrites that line's Gres=; a node in a hostlist line needs a line of its own")
