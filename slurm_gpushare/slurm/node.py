"""What ``scontrol show node NODE`` says of one node (scontrol(1)), read in one place.

The text is ``Key=Value`` pairs separated by spaces and newlines; ``Reason=`` is the one value with spaces
(``Reason=gpushare mig apply: ... [root@2026-12-07T14:12:05]``). ``-d`` adds ``GresUsed=``, the GRES in use
with their device indices (read by :func:`~slurm_gpushare.slurm.job.used_devices`). ``Gres=`` items are read
with the one GRES grammar of :mod:`slurm_gpushare.slurm.gres`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from slurm_gpushare.errors import InputError
from slurm_gpushare.slurm.gres import parse as parse_gres


@dataclass(frozen=True)
class NodeState:
    """What ``scontrol [-d] show node`` says of a node.

    Attributes:
        state: ``State=`` (``IDLE+DRAIN``, ``MIXED``, ...).
        reason: the drain reason without its ``[user@time]`` suffix, or None.
        gres: ``Gres=`` as shown (``gpu:h100:2(S:0),shard:h100:158(S:0)``).
        slurmd_start: ``SlurmdStartTime=`` (changes when slurmd registers after a restart).
        gres_used: ``GresUsed=`` as shown (``-d`` only; "" when absent).
    """

    state: str
    reason: str | None
    gres: str
    slurmd_start: str
    gres_used: str = ""

    @property
    def drained(self) -> bool:
        """``DRAIN`` in the state (draining or drained)."""
        return "DRAIN" in self.state


def parse_node(text: str) -> NodeState:
    """The fields of :class:`NodeState` from ``scontrol [-d] show node NODE`` text (scontrol(1)); a field
    the text lacks is ""."""
    def field_(name: str) -> str:
        m = re.search(rf"(?:^|\s){name}=(\S*)", text)
        return m.group(1) if m else ""

    m = re.search(r"(?:^|\s)Reason=(.*?) \[[^\]\s]*@[^\]\s]*\]", text)
    return NodeState(field_("State"), m.group(1) if m else None, field_("Gres"), field_("SlurmdStartTime"),
                     field_("GresUsed"))


def responding(state: str) -> bool:
    """Whether ``State=`` says slurmctld hears the node's slurmd: no ``NOT_RESPONDING`` flag
    (``IDLE+DRAIN+NOT_RESPONDING``), no ``*`` (the short form, ``IDLE*``), not ``DOWN``."""
    flags = state.split("+")
    return "NOT_RESPONDING" not in flags and not flags[0].endswith("*") and not flags[0].startswith("DOWN")


def _gres_counts(value: str) -> dict[tuple[str, str], int] | None:
    """``(name, type) -> count`` of a ``Gres=`` value (type "" for an untyped item); socket suffixes are
    dropped and so are zero counts; empty text (``(null)``) has none; None for text the GRES grammar does not
    read (with memory units, as slurm.conf writes ``no_consume`` counts: ``gpu:4G``)."""
    if value.strip() in ("", "(null)", "N/A"):
        return {}
    try:
        items = parse_gres(value, units=True)
    except InputError:
        return None
    return {(it.name, it.type): it.count for it in items if it.count}


def gres_matches(shown: str, want: str) -> bool:
    """Whether slurmctld's ``Gres=`` (``scontrol show node``) is the ``Gres=`` value written to slurm.conf: every
    typed item with its count, an untyped item as the sum over its types (slurmctld shows ``shard:h100:158``
    for ``shard:158``), and no other type of a written name with a count. Text on either side that the GRES
    grammar does not read matches nothing."""
    have, need = _gres_counts(shown), _gres_counts(want)
    if have is None or need is None:
        return False
    for (name, type_), n in need.items():
        got = have.get((name, type_), 0) if type_ else sum(v for (nm, _t), v in have.items() if nm == name)
        if got != n:
            return False
    typed_names = {name for name, type_ in need if type_}
    return all(k in need for k in have if k[1] and k[0] in typed_names)  # no type left over from before
