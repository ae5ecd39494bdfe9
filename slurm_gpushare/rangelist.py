r"""Lists of non-negative integers written as ids and ascending ranges, ``0-3,6``: one grammar and one error
for every such list the product reads.

Where they come from: the kernel's cpulist format (``Documentation/admin-guide/cputopology.rst``), which
``nvidia-smi topo -m`` prints in its ``CPU Affinity`` cell; gres.conf(5) ``Cores=``; the ``IDX:`` of
``scontrol -d show job``; the numbers in a hostlist's brackets (``gpu[01-04,07]``); GPU indices given on the
command line (``--free 0-3,6``). Each caller decides what a repeat or the order means (sorted and unique for
a CPU list, in the order given and refused when repeated for GPUs, ascending for a hostlist bracket).

Only ASCII digits count (``str.isdigit`` and ``re``'s ``\d`` also take other scripts' digits, which no kernel
or Slurm writes), and a list may name at most :data:`MAX_IDS` ids, so a typo such as ``0-4294967295`` is an
error, not a list of four billion numbers.
"""

from __future__ import annotations

import re

from slurm_gpushare.errors import ParseError

#: One item: ``n`` or ``a-b``.
_ITEM = re.compile(r"([0-9]+)(?:-([0-9]+))?")
#: The most ids a list may expand to (the largest nodes have a few thousand CPUs).
MAX_IDS = 1 << 20


def parse_ranges(text: str, *, what: str = "id", example: str = "0-3,6",
                 source: str | None = None) -> list[tuple[int, int]]:
    """``"0-3,6"`` -> ``[(0, 3), (6, 6)]``: each item's first and last id, in the order written. Spaces around
    an item are allowed.

    Args:
        what: what the ids are, for the message (``CPU id``, ``GPU index``).
        example: a list of that kind, for the hint.
        source: where the list came from (a file and line), for the message.

    Raises:
        ParseError: an empty list or item, an item that is not ``n`` or ``a-b`` with ``a <= b``, or more than
            :data:`MAX_IDS` ids in all.
    """
    out: list[tuple[int, int]] = []
    count = 0
    for piece in text.split(","):
        m = _ITEM.fullmatch(piece.strip())
        if m is None or (m.group(2) is not None and int(m.group(2)) < int(m.group(1))):
            article = "an" if what[:1] in "aeiou" else "a"
            raise ParseError(f"{piece.strip()!r} in {text!r} is not {article} {what} or an ascending range a-b",
                             hint=f"e.g. {example}", source=source)
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) is not None else lo
        count += hi - lo + 1
        if count > MAX_IDS:
            raise ParseError(f"{text!r} names more than {MAX_IDS} ids", hint=f"e.g. {example}", source=source)
        out.append((lo, hi))
    return out


def parse_range_list(text: str, *, what: str = "id", example: str = "0-3,6", source: str | None = None) -> list[int]:
    """``"0-3,6"`` -> ``[0, 1, 2, 3, 6]``: every id, in the order written, an id written twice listed twice.

    Raises:
        ParseError: as :func:`parse_ranges`.
    """
    return [i for lo, hi in parse_ranges(text, what=what, example=example, source=source) for i in range(lo, hi + 1)]
