"""Slurm hostlists (``node[01-04],big``) and id lists (``0-3,5``), read and written with ClusterShell (pure).

Thin functions over ``ClusterShell.NodeSet.NodeSet`` and ``ClusterShell.RangeSet.RangeSet`` that keep
Slurm's text forms (slurm.conf(5) "NODE CONFIGURATION", gres.conf(5) "File", "Cores"): ranges
``a-b``, zero padding taken from the written number (``linux[0008-0010]``), several bracket groups
in one name (``rack[0-1]_blade[0-1]``). What ClusterShell reads beyond Slurm's syntax (node groups
``@rack``, the operators ``!``, ``&``, ``^``) is refused here, and node groups are never resolved.

NodeSet is imported inside the functions, and only for a name with brackets: with its node-group
machinery it costs 7-20 ms to import (``python -X importtime``), too much for the node hooks, which start
on every job and mostly read plain names (the node's, ``File=/dev/nvidia0``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from slurm_gpushare.errors import ParseError
from slurm_gpushare.rangelist import parse_range_list, parse_ranges

_NOT_SLURM = re.compile(r"[\s@!&^]")


def expand_hostlist(expr: str) -> tuple[str, ...]:
    """Expand a Slurm hostlist expression into its names: ``lx[15,18],gpu1`` -> ``lx15 lx18 gpu1``.

    Comma-separated items keep their written order and duplicates (a hostlist may name a node
    twice); the ranges inside one bracket must ascend (``tux[3,1]`` is refused: Slurm would read
    ``File=/dev/nvidia[1,0]`` in written order, ClusterShell in numeric order, and device order matters).

    Raises:
        ParseError: unbalanced brackets, an empty item or bracket, a range that is not ``a-b`` with
            ``a <= b``, ranges out of order, ClusterShell-only syntax. ``source`` is None; callers
            add the file and line.
    """
    if _NOT_SLURM.search(expr):
        raise ParseError(f"hostlist {expr!r} has white space or one of @ ! & ^", hint="e.g. tux[1-4],big")
    names: list[str] = []
    for item in _split_items(expr):
        if not item:
            raise ParseError(f"empty name in hostlist {expr!r}")
        parts = re.split(r"(\[[^\[\]]*\])", item)
        if any("[" in p or "]" in p for p in parts[::2]):
            raise ParseError(f"unbalanced brackets in hostlist {expr!r}")
        if len(parts) == 1:  # a plain name (the node hooks' usual case): no NodeSet to import
            names.append(item)
            continue
        for body in parts[1::2]:
            _check_ranges(body[1:-1], expr)
        from ClusterShell.NodeSet import RESOLVER_NOGROUP, NodeSet, NodeSetException  # noqa: PLC0415 (import cost)

        try:
            names.extend(NodeSet(item, resolver=RESOLVER_NOGROUP))
        except NodeSetException as e:  # what Slurm reads and ClusterShell does not (odd zero padding)
            raise ParseError(f"cannot read hostlist {expr!r}: {e}") from None
    return tuple(names)


def compress_hostlist(names: Iterable[str]) -> str:
    """The usual hostlist text for ``names``: ``tux1..tux16`` -> ``tux[1-16]``; ``n008 n009`` ->
    ``n[008-009]``. Names are sorted and each named once (ClusterShell ``NodeSet.fromlist``)."""
    from ClusterShell.NodeSet import RESOLVER_NOGROUP, NodeSet  # noqa: PLC0415 (import cost, see module doc)

    return str(NodeSet.fromlist(list(names), resolver=RESOLVER_NOGROUP))


def format_ranges(ids: Iterable[int]) -> str:
    """``(0, 1, 2, 5, 7, 8)`` -> ``"0-2,5,7-8"`` (Slurm's id list; sorted, each id once)."""
    from ClusterShell.RangeSet import RangeSet  # noqa: PLC0415 (kept next to NodeSet's)

    return str(RangeSet.fromlist([str(i) for i in sorted(set(ids))]))


def parse_id_list(text: str) -> tuple[int, ...]:
    """A list of ids and ranges, ``"0-2,5"`` -> ``(0, 1, 2, 5)`` (gres.conf(5) "Cores", the ``IDX:`` of
    ``scontrol -d show job``), ascending, each id once.

    Raises:
        ParseError: an item that is not ``n`` or ``a-b`` with ``a <= b`` (:mod:`slurm_gpushare.rangelist`;
            ``source`` is None).
    """
    return tuple(sorted(set(parse_range_list(text, example="0-15,32-47"))))


def _check_ranges(body: str, expr: str) -> None:
    last = -1
    try:
        ranges = parse_ranges(body, what="number", example="[0-1,3]")
    except ParseError as e:  # the expression in the message: callers set source (the file and line)
        raise ParseError(f"{e.message} in hostlist {expr!r}", hint=e.hint) from None
    for lo, hi in ranges:
        if lo <= last:
            raise ParseError(f"ranges in [{body}] of hostlist {expr!r} are not in ascending order",
                             hint="write each bracket's ranges ascending, e.g. [0-1,3]")
        last = hi


def _split_items(expr: str) -> list[str]:
    """Split at the commas outside brackets: ``lx[15,18],gpu1`` -> ``["lx[15,18]", "gpu1"]``."""
    out: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in expr:
        depth += (ch == "[") - (ch == "]")
        if ch == "," and depth == 0:
            out.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    out.append("".join(cur))
    return out
