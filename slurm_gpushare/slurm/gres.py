"""The one GRES/TRES grammar: Slurm's ``name[:type][:count][(detail)]`` items and comma lists of them (pure).

Every place that reads or writes GRES text goes through this module: the TRES strings job_submit
sees (``job_desc.tres_per_node``), the ``TresPerNode=`` and per-node ``GRES=`` detail of ``scontrol
-d show job``, ``GresUsed=`` of ``scontrol -d show node``, the ``gres`` of ``sinfo --json`` and the
``Gres=`` value of slurm.conf. The forms, as Slurm writes them:

* an optional prefix: ``gres:`` (Slurm 22.05, ``TresPerNode=gres:shard:10``) or ``gres/`` (Slurm
  23.x and later, ``TresPerNode=gres/gpu:1``; seen on 24.11 and 26.05); items without
  one are the GRES forms of sinfo, scontrol and slurm.conf. The prefix an item came with is kept.
* ``name``, then up to two ``:`` fields: ``gpu``, ``gpu:2``, ``gpu:a100``, ``gpu:a100:2``. A lone
  second field is the count when it is a number, else the type (``gres:gpushare:mem=10G`` has type
  ``mem=10G``: the gpushare knobs travel in the type field).
* an optional detail in parentheses at the end: device indices ``(IDX:0,2-3)``, ``(IDX:N/A)`` when
  Slurm has none (``mps:a100:0(IDX:N/A)``), a socket binding ``(S:0-1)``, per-device shard use
  ``(2/80,0/80)``. Commas inside the parentheses do not split the list. Shared GRES (``shard``, ``mps``)
  carry their devices as ``IDX:`` on Slurm 22.05 and as per-device ``allocated/available`` counts from
  Slurm 23.11.2 on (``shard:10(10/80,0/80)``: the job's ``GRES=`` detail, ``_build_shared_gres_details``
  in src/slurmctld/gres_ctld.c at slurm-23-11-2-1; ``GresUsed=`` of a node, ``_node_gres_used`` in
  src/interfaces/gres.c at slurm-24-11-5-1; measured on 24.11.5 and 26.05.5): :attr:`GresItem.shares`
  reads the counts, :attr:`GresItem.indices` the devices of either form.
* slurm.conf only (``units=True``; slurm.conf(5) "Gres"): a ``no_consume`` field before the count
  and a ``K``/``M``/``G``/``T``/``P`` count suffix (powers of 1024).

:func:`render` gives back the text :func:`parse` read (``render(parse(x)) == x``), except that a
count is written as its number: ``gpu:02`` comes back as ``gpu:2``, ``mps:4K`` as ``mps:4096``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, replace

from slurm_gpushare.errors import ParseError
from slurm_gpushare.slurm.hostlist import parse_id_list

#: TRES prefixes: ``gres:`` in Slurm 22.05, ``gres/`` in newer releases.
PREFIXES = ("gres:", "gres/")
#: The prefix written on an item that came without one (what slurmctld 22.05 accepts in tres_per_node).
DEFAULT_PREFIX = "gres:"
#: Count suffixes of slurm.conf ``Gres=`` (slurm.conf(5) "Gres"): powers of 1024.
COUNT_SUFFIXES = {"K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4, "P": 1024**5}

_NAME = re.compile(r"[A-Za-z0-9_.-]+")
_TYPE = re.compile(r"[^\s:,()]+")
_COUNT = re.compile(r"[0-9]+")
_COUNT_UNITS = re.compile(r"([0-9]+)([KMGTP]?)", re.IGNORECASE)
_DETAIL = re.compile(r"[^()]+")


class GresSyntaxError(ParseError):
    """GRES text that is not ``[prefix]name[:type][:count][(detail)]``.

    Attributes:
        item: the item as written (prefix included).
        part: which part is wrong: ``"count"`` (a third field that is not a number) or ``"item"``.
        value: the wrong part's text (for ``"count"``), else the item.
    """

    def __init__(self, message: str, *, item: str, part: str = "item", value: str | None = None,
                 hint: str | None = None, source: str | None = None):
        super().__init__(message, hint=hint or "write name[:type][:count], e.g. gpu:a100:2 or shard:10",
                         source=source)
        self.item = item
        self.part = part
        self.value = item if value is None else value

    def with_context(self, context: str) -> GresSyntaxError:
        """The same error with ``context`` (where the text came from) before its source."""
        source = f"{context}: {self.source}" if self.source else context
        return GresSyntaxError(self.message, item=self.item, part=self.part, value=self.value, hint=self.hint,
                               source=source)


@dataclass(frozen=True)
class GresItem:
    """One GRES item: ``gres:gpu:a100:2``, ``shard:10(IDX:0)``, ``gpu:tesla:2(S:0-1)``.

    Attributes:
        name: GRES name (``gpu``, ``shard``, ``mps``, ``gpushare``, ``nic``, ...).
        type: GRES type (``a100``, ``h100_1g.10gb``; the knobs for ``gpushare``), ``""`` when none.
        count: the count (suffix applied), or None when not written (Slurm's default is 1).
        detail: the text inside the trailing parentheses (``IDX:0-1``, ``IDX:N/A``, ``S:0``,
            ``2/80,0/80``), ``""`` when none.
        prefix: ``gres:``, ``gres/`` or ``""``: the prefix the item came with.
        no_consume: slurm.conf's ``no_consume`` field was given.

    Raises:
        GresSyntaxError: fields that cannot be written back as one item (an empty or odd name, a type
            with ``:``, ``,`` or parentheses, a type that would read as a count, a negative count, an
            unknown prefix).
    """

    name: str
    type: str = ""
    count: int | None = None
    detail: str = ""
    prefix: str = ""
    no_consume: bool = False

    def __post_init__(self):
        shown = f"{self.name}:{self.type}:{self.count}"
        if not _NAME.fullmatch(self.name) or self.name == "gres":  # "gres" would read as the TRES prefix
            raise GresSyntaxError(f"GRES name {self.name!r} is not a name", item=shown)
        if self.type and (not _TYPE.fullmatch(self.type) or (self.count is None and _COUNT.fullmatch(self.type))):
            raise GresSyntaxError(f"GRES type {self.type!r} cannot be written", item=shown)
        if self.count is not None and self.count < 0:
            raise GresSyntaxError(f"GRES count {self.count} is negative", item=shown)
        if self.detail and not _DETAIL.fullmatch(self.detail):
            raise GresSyntaxError(f"GRES detail {self.detail!r} has parentheses", item=shown)
        if self.prefix and self.prefix not in PREFIXES:
            raise GresSyntaxError(f"TRES prefix {self.prefix!r} is neither gres: nor gres/", item=shown)

    @property
    def body(self) -> str:
        """The item without its prefix: ``gres/gpu:a100:2`` -> ``gpu:a100:2``."""
        text = self.name + (f":{self.type}" if self.type else "") + (":no_consume" if self.no_consume else "")
        if self.count is not None:
            text += f":{self.count}"
        return text + (f"({self.detail})" if self.detail else "")

    @property
    def text(self) -> str:
        """The item as text, prefix included (what :func:`parse_item` read, counts as numbers)."""
        return self.prefix + self.body

    @property
    def amount(self) -> int:
        """The count, 1 when none was written (Slurm's default)."""
        return 1 if self.count is None else self.count

    @property
    def key(self) -> tuple[str, str]:
        """``(name, type)``, the key of the ``Gres=`` counts."""
        return (self.name, self.type)

    @property
    def shares(self) -> tuple[tuple[int | None, int], ...]:
        """The per-device ``(allocated, available)`` counts of a shared GRES detail (Slurm 23.11.2 and
        later: ``shard:10(10/80,0/80)`` -> ``((10, 80), (0, 80))``, one pair per device in slurmd's
        order); allocated is None for ``-/80``, a device allocated whole as a GPU (``GresUsed=`` from
        26.05 on: ``_xstrfmtcat_shared_gres_used`` in src/interfaces/gres.c at slurm-26-05-0-1, measured on
        26.05.5); ``()`` for any other detail.

        Raises:
            GresSyntaxError: a detail with ``/`` that is not a comma list of ``N/M`` or ``-/M``.
        """
        if "/" not in self.detail or self.detail.startswith("IDX:"):
            return ()
        pairs: list[tuple[int | None, int]] = []
        for part in self.detail.split(","):
            alloc, sep, avail = part.partition("/")
            if not (sep and (alloc == "-" or _COUNT.fullmatch(alloc)) and _COUNT.fullmatch(avail)):
                raise GresSyntaxError(f"bad per-device count {part!r} in {self.text!r}: expected "
                                      "allocated/available, e.g. 10/80", item=self.text)
            pairs.append((None if alloc == "-" else int(alloc), int(avail)))
        return tuple(pairs)

    @property
    def indices(self) -> tuple[int, ...]:
        """slurmd device indices of an ``IDX:`` detail (``IDX:0,2-3`` -> ``(0, 2, 3)``), or of the
        devices with an allocated count in a shared detail (``10/80,0/80,5/80,-/80`` -> ``(0, 2)``: positions
        in the detail's device list; a ``-`` device is the GPU item's); ``()`` for ``IDX:N/A``, for an empty
        ``IDX:`` (22.05 gives the types of a ``--gpus`` job's GRES that it got none of:
        ``gpu:h100:1(IDX:0),gpu:h100_4g.40gb:0(IDX:)``, measured on 22.05.8) and for any other detail.

        Raises:
            GresSyntaxError: an ``IDX:`` list that is not ids and ``a-b`` ranges, or a shared detail
                that is not ``N/M`` pairs.
        """
        if self.shares:
            return tuple(i for i, (alloc, _avail) in enumerate(self.shares) if alloc)
        if not self.detail.startswith("IDX:") or self.detail in ("IDX:N/A", "IDX:"):
            return ()
        try:
            return parse_id_list(self.detail[4:])
        except ParseError as e:
            raise GresSyntaxError(f"bad device index list in {self.text!r}: {e.message}", item=self.text) from None

    def strict(self, prefix: str = DEFAULT_PREFIX) -> str:
        """This item as job_submit writes it back: a prefix (its own, else ``prefix``), a count (1 when
        none was written), no detail: ``nic`` -> ``gres:nic:1`` (slurmctld 22.05 refuses
        tres_per_node items without the ``gres:`` prefix, measured on 22.05.8). ``prefix=""``
        gives the strict form without a prefix (``gpu:1``), as slurm.conf writes it."""
        return replace(self, prefix=self.prefix or prefix, count=self.amount, detail="").text


def prefix_of(text: str) -> str:
    """``gres:`` or ``gres/`` when ``text`` starts with one, else ``""`` (never raises)."""
    for p in PREFIXES:
        if text.startswith(p):
            return p
    return ""


def item_name(text: str) -> str:
    """The GRES name of one item, cheaply and without validation: ``gres:gpushare:mem=10G`` -> ``gpushare``
    (never raises; for deciding whether a job is any of our business before reading it)."""
    return text[len(prefix_of(text)):].split(":", 1)[0].split("(", 1)[0]


def parse_item(text: str, *, units: bool = False) -> GresItem:
    """Read one item, ``[prefix]name[:type][:count][(detail)]``.

    Args:
        text: the item as written (not stripped: white space is an error).
        units: slurm.conf ``Gres=`` syntax: a ``no_consume`` field before the count and count
            suffixes ``K``..``P`` (slurm.conf(5) "Gres").

    Raises:
        GresSyntaxError: anything else; ``part`` is ``"count"`` when only the last of three fields is
            not a number (``gpushare:mem=10G:x``).
    """
    prefix = prefix_of(text)
    head, detail = text[len(prefix):], ""
    if "(" in head or ")" in head:
        m = re.fullmatch(r"([^()]*)\(([^()]+)\)", head)
        if m is None:
            raise GresSyntaxError(f"cannot read the GRES item {text!r}: parentheses only around a detail "
                                  "at the end", item=text, hint="e.g. gpu:a100:2(IDX:0-1)")
        head, detail = m.groups()
    fields = head.split(":")
    name, rest = fields[0], fields[1:]
    count = None
    if rest and (_COUNT_UNITS if units else _COUNT).fullmatch(rest[-1]):
        count = _count(rest.pop(), units)
    no_consume = bool(units and rest and rest[-1].lower() == "no_consume")
    if no_consume:
        rest.pop()
    if len(rest) == 2 and count is None and not units:
        raise GresSyntaxError(f"the count {rest[1]!r} in {text!r} is not a whole number", item=text,
                              part="count", value=rest[1], hint="write the count last, e.g. gpu:a100:2")
    if len(rest) > 1:
        raise GresSyntaxError(f"GRES item {text!r} has too many fields", item=text,
                              hint="write name[:type][:count], e.g. gpu:a100:2")
    type_ = rest[0] if rest else ""
    if rest and not type_:
        raise GresSyntaxError(f"GRES item {text!r} has an empty field", item=text)
    if not _NAME.fullmatch(name) or (type_ and not _TYPE.fullmatch(type_)):
        raise GresSyntaxError(f"cannot read the GRES item {text!r}", item=text)
    return GresItem(name, type_, count, detail, prefix, no_consume)


def parse(text: str, *, units: bool = False, allow_empty: bool = True) -> tuple[GresItem, ...]:
    """Read a comma list of items; commas inside parentheses do not split it:
    ``gpu:a100:2(IDX:0-1),shard:10(2/80,0/80)`` -> two items.

    Args:
        text: the list as written; ``""`` is the empty list.
        units: slurm.conf syntax (see :func:`parse_item`).
        allow_empty: skip empty items (``a,,b``, and a prefix alone: ``gres:,gres:gpu:1``, as Slurm's TRES
            strings allow); when False an empty item is an error (slurm.conf ``Gres=``).

    Raises:
        GresSyntaxError: an item :func:`parse_item` cannot read, unbalanced parentheses, or an
            empty item where none is allowed.
    """
    items = []
    for piece in split_items(text):
        if piece == prefix_of(piece):  # "" or a bare "gres:" (what Slurm's client makes of ",,gpu:1")
            if allow_empty:
                continue
            raise GresSyntaxError(f"empty GRES item in {text!r}", item=text)
        items.append(parse_item(piece, units=units))
    return tuple(items)


def split_items(text: str) -> list[str]:
    """Split a GRES list at the commas outside parentheses: ``a(1,2),b`` -> ``["a(1,2)", "b"]``;
    ``""`` -> ``[]``.

    Raises:
        GresSyntaxError: unbalanced parentheses.
    """
    if text == "":
        return []
    out, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth < 0:
                break
        elif ch == "," and depth == 0:
            out.append(text[start:i])
            start = i + 1
    if depth != 0:
        raise GresSyntaxError(f"unbalanced parentheses in GRES list {text!r}", item=text)
    out.append(text[start:])
    return out


def render(items: Iterable[GresItem]) -> str:
    """The comma list of ``items`` (each with the prefix it came with): the inverse of :func:`parse`."""
    return ",".join(it.text for it in items)


def render_counts(counts: dict[tuple[str, str], int]) -> str:
    """``{("gpu", "h100"): 2, ("shard", ""): 160}`` -> ``gpu:h100:2,shard:160`` (the slurm.conf
    ``Gres=`` value and the inventory's messages), in the dict's order."""
    return render(GresItem(n, t, c) for (n, t), c in counts.items())


def _count(text: str, units: bool) -> int:
    if not units:
        return int(text)
    m = _COUNT_UNITS.fullmatch(text)
    assert m is not None
    return int(m.group(1)) * COUNT_SUFFIXES.get(m.group(2).upper(), 1)
