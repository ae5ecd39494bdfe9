"""``sinfo --json`` of any supported release as one list of nodes (pure): the adapter the inventory reads.

The document says which release wrote it (``meta``, :func:`slurm_gpushare.slurm.release.of_meta`), and
the shape follows from the release, never from guessing at the keys:

* Slurm 22.05 (openapi/v0.0.38): top-level ``nodes``, one entry per node with ``name``, ``gres`` (the
  configured GRES, sinfo's ``%G`` form ``gpu:a100:8(S:0-1),shard:a100:640(S:0-1)``), ``partitions``
  (list of names), ``state`` (``idle``) and ``state_flags`` (``["DRAIN"]``). Measured on 22.05.8.
* Slurm 23.02 and later (data_parser v0.0.39+; v0.0.42 on 24.11, v0.0.45 on 26.05): top-level ``sinfo``,
  one entry per partition and group of nodes that sinfo would print on one line (src/sinfo/sinfo.c
  ``_match_node_data``: nodes of one partition with equal state, GRES, GRES used... share an entry),
  with ``nodes.nodes`` (the node names), ``gres.total`` (the configured GRES, same form as 22.05's
  ``gres``), ``partition.name`` and ``node.state`` (``["IDLE", "DRAIN"]``). A node in several
  partitions appears once per partition. Measured on 24.11.5 and 26.05.5.

:func:`sinfo_nodes` gives both as the same :class:`SinfoNode` tuple, sorted by name, so that the same
cluster reads the same on every release.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass

from slurm_gpushare.errors import SlurmError
from slurm_gpushare.slurm.hostlist import expand_hostlist
from slurm_gpushare.slurm.release import DATA_PARSER, Release, missing, of_meta

SOURCE = "sinfo --json"


@dataclass(frozen=True)
class SinfoNode:
    """One node as ``sinfo --json`` reports it, the same on every release.

    Attributes:
        name: Slurm node name.
        gres: configured GRES in sinfo's ``%G`` form (``gpu:a100:8(S:0-1),shard:a100:640(S:0-1)``);
            ``""`` when none (Slurm writes ``(null)`` on some releases: kept as written).
        partitions: the partitions the node is in, in the order sinfo listed them.
        state: the node state in lower case, flags joined by ``+`` (``idle``, ``idle+drain``,
            ``mixed``): 22.05's ``state`` and ``state_flags``, or 23.02+'s ``node.state`` list.
    """

    name: str
    gres: str
    partitions: tuple[str, ...]
    state: str


def sinfo_nodes(text: str) -> tuple[SinfoNode, ...]:
    """Every node of ``sinfo --json`` output (any supported release), sorted by name.

    Raises:
        SlurmError: not JSON, no ``meta`` version (:func:`~slurm_gpushare.slurm.release.of_meta`), or a
            field the release's shape has that is not there (the error names the release and the field).
    """
    try:
        doc = load_piecewise(text)
    except ValueError as e:
        raise SlurmError(f"{SOURCE} output is not JSON ({e})", source=SOURCE) from None
    release = of_meta(doc, SOURCE)
    nodes = _from_entries(doc, release) if release >= DATA_PARSER else _from_nodes(doc, release)
    drop_piecewise(doc)
    return tuple(nodes[n] for n in sorted(nodes))


def drop_piecewise(doc: object) -> None:
    """Empty a decoded document (one this module decoded and no one else holds) list element by list element.

    Freeing a 10,000-node ``sinfo --json`` document at once is one cascade of deallocations that holds the
    interpreter lock for 30-50 ms (measured on the 2-core dev VM, at the return of :func:`sinfo_nodes`); popped
    one entry at a time (a node; from 23.02 an ``sinfo`` entry of nodes alike), it is thousands of small frees
    with a bytecode between each, where the filter service's socket thread can take the lock
    (:func:`load_piecewise` does the same for the decoding).
    What the nodes kept of the document (strings, numbers) stays alive through them.
    """
    if isinstance(doc, dict):
        for value in doc.values():
            if isinstance(value, list):
                while value:
                    value.pop()
        doc.clear()


_DECODER = json.JSONDecoder()
_WS = re.compile(r"[ \t\n\r]*")  # JSON's white space (RFC 8259, section 2)


def load_piecewise(text: str):
    """``json.loads(text)``, the same value and the same errors, with each element of a top-level object's
    lists decoded on its own: a 10,000-node ``sinfo --json`` (10 MB) is then ten thousand short decodes,
    not one call of ~100 ms that holds the interpreter lock, so the filter service's socket thread answers
    while its refresh thread reads Slurm's view.

    Raises:
        ValueError: not JSON (``json.JSONDecodeError``, as ``json.loads`` raises it).
    """
    try:
        return _piecewise(text)
    except (ValueError, IndexError, TypeError):
        return json.loads(text)  # not the shape read piecewise, or not JSON: json.loads answers and raises


def _skip(text: str, pos: int) -> int:
    """The position of the first character at or after ``pos`` that is not JSON white space."""
    m = _WS.match(text, pos)
    return m.end() if m else pos


def _piecewise(text: str) -> object:
    decode = _DECODER.raw_decode
    pos = _skip(text, 0)
    if text[pos] != "{":
        raise ValueError("not an object")
    out: dict = {}
    pos, done = _first(text, pos, "}")
    while not done:
        if text[pos] != '"':
            raise ValueError("key")
        key, pos = decode(text, pos)
        pos = _skip(text, pos)
        if text[pos] != ":":
            raise ValueError("colon")
        pos = _skip(text, pos + 1)
        if text[pos] == "[":
            items: list = []
            pos, end = _first(text, pos, "]")
            while not end:
                item, pos = decode(text, pos)
                items.append(item)
                pos, end = _then(text, pos, "]")
            out[key] = items
        else:
            out[key], pos = decode(text, pos)
        pos, done = _then(text, pos, "}")
    if _skip(text, pos) != len(text):
        raise ValueError("extra data")
    return out


def _first(text: str, pos: int, close: str) -> tuple[int, bool]:
    """After the ``[``/``{`` at ``pos``: where the first element starts, or past ``close`` for an empty one."""
    pos = _skip(text, pos + 1)
    return (pos + 1, True) if text[pos] == close else (pos, False)


def _then(text: str, pos: int, close: str) -> tuple[int, bool]:
    """After an element: where the next starts (past ``,``), or past ``close`` when it was the last."""
    pos = _skip(text, pos)
    if text[pos] == ",":
        return _skip(text, pos + 1), False
    if text[pos] == close:
        return pos + 1, True
    raise ValueError(f"expected ',' or {close!r}")


def _from_nodes(doc: Mapping, release: Release) -> dict[str, SinfoNode]:
    """Slurm 22.05: ``{"nodes": [{"name", "gres", "partitions", "state", "state_flags"}]}``."""
    raw_nodes = _list(doc, "nodes", release, "nodes")
    out: dict[str, SinfoNode] = {}
    for i, raw in enumerate(raw_nodes):
        if not isinstance(raw, Mapping) or not isinstance(raw.get("name"), str):
            raise missing(release, SOURCE, f"nodes[{i}].name")
        state = _text(raw.get("state"), release, f"nodes[{i}].state")
        flags = raw.get("state_flags") or []
        if not isinstance(flags, list):
            raise missing(release, SOURCE, f"nodes[{i}].state_flags (a list)")
        parts = raw.get("partitions") or []
        if not isinstance(parts, list):
            raise missing(release, SOURCE, f"nodes[{i}].partitions (a list)")
        out[raw["name"]] = SinfoNode(raw["name"], _text(raw.get("gres", ""), release, f"nodes[{i}].gres"),
                                     tuple(str(p) for p in parts),
                                     "+".join([state.lower(), *(str(f).lower() for f in flags)]))
    return out


def _from_entries(doc: Mapping, release: Release) -> dict[str, SinfoNode]:
    """Slurm 23.02+: ``{"sinfo": [{"nodes": {"nodes": [...]}, "gres": {"total"}, "partition": {"name"},
    "node": {"state": [...]}}]}``; a node's partitions are gathered from every entry naming it."""
    entries = _list(doc, "sinfo", release, "sinfo")
    gres: dict[str, str] = {}
    state: dict[str, str] = {}
    parts: dict[str, list[str]] = {}
    for i, e in enumerate(entries):
        where = f"sinfo[{i}]"
        names = _get(e, ("nodes", "nodes"), release, where)
        if not isinstance(names, list):
            raise missing(release, SOURCE, f"{where}.nodes.nodes (a list)")
        total = _text(_get(e, ("gres", "total"), release, where), release, f"{where}.gres.total")
        flags = _get(e, ("node", "state"), release, where)
        if not isinstance(flags, list) or not flags:
            raise missing(release, SOURCE, f"{where}.node.state (a list of states)")
        part = _text(_get(e, ("partition", "name"), release, where), release, f"{where}.partition.name")
        for expr in names:
            for name in expand_hostlist(str(expr)):
                gres[name] = total
                state[name] = "+".join(str(f).lower() for f in flags)
                lst = parts.setdefault(name, [])
                if part and part not in lst:
                    lst.append(part)
    return {n: SinfoNode(n, gres[n], tuple(parts[n]), state[n]) for n in gres}


def _list(doc: Mapping, key: str, release: Release, field: str) -> list:
    value = doc.get(key)
    if not isinstance(value, list):
        raise missing(release, SOURCE, f"top-level '{field}' list")
    return value


def _get(entry: object, path: tuple[str, ...], release: Release, where: str) -> object:
    value = entry
    for key in path:
        if not isinstance(value, Mapping) or key not in value:
            raise missing(release, SOURCE, f"{where}.{'.'.join(path)}")
        value = value[key]
    return value


def _text(value: object, release: Release, field: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise missing(release, SOURCE, f"{field} (a string)")
    return value
