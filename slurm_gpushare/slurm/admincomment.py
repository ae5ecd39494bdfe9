"""Every segment the product writes into a job's AdminComment, in one place: their tags, versions and grammar.

AdminComment is set by slurmctld's job_submit plugin and by administrators only (users cannot
change it, unlike Comment, which is exported to Prolog as ``SLURM_JOB_COMMENT``), and slurmdbd
keeps it, so ``sacct -o AdminComment`` shows it. Other tools write there too: each product segment is
one bracketed, tagged, versioned group of space-separated tokens, ``[<tag><version> token token ...]``,
replaced as a whole and leaving any other text untouched. Tokens contain no spaces and no brackets.

=========================  ==========================  =================================================
segment                    written by                  read by
=========================  ==========================  =================================================
:data:`AUDIT`              filterd's answer, set by    the Prolog and monitor (the decision), reports
``[gpushare:v1 k=v ...]``  job_submit.lua at submit    (what was asked); ``[gpushare:none]``
                           and on a job update         (:data:`AUDIT_NONE`): GRES later changed to no share
:data:`RUNNING`            the node monitor, per node  ``sacct`` readers while the job runs; replaced
``[gpushare-usage:v1 ...]``  while the job runs         by the final segment
:data:`FINAL`              EpilogSlurmctld through     jobstats and ``report --from-sacct``
``[gpushare:u1 ...]``      sacctmgr when the run ends  (:mod:`slurm_gpushare.accounting.sacct`)
=========================  ==========================  =================================================

The tokens of the audit are ``key=value`` (:func:`format_segment`, :func:`extract`); those of the running
and final segments are their modules' (:func:`slurm_gpushare.accounting.record.summary_segment`,
:func:`slurm_gpushare.accounting.sacct.final_segment`). ``job_submit.lua`` finds and removes the audit by
the same tag (``tests/test_admincomment.py`` reads its patterns against :data:`AUDIT`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from slurm_gpushare.errors import InputError


@dataclass(frozen=True)
class Segment:
    """One kind of AdminComment segment: ``[<tag><version> <tokens>]``.

    Attributes:
        name: what it holds, for messages.
        tag: the text between ``[`` and the version number (``gpushare:v``).
        version: the version this code writes; it reads that one and older ones.
    """

    name: str
    tag: str
    version: int
    pattern: re.Pattern = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "pattern", re.compile(r"\s*\[" + re.escape(self.tag) + r"(\d+)(?: ([^\]]*))?\]"))

    def format(self, tokens: Iterable[str]) -> str:
        """``[<tag><version> token token ...]`` (tokens already checked by their writer)."""
        return f"[{self.tag}{self.version} " + " ".join(tokens) + "]"

    def find(self, text: str | None) -> str | None:
        """The tokens of the first segment of this kind in ``text`` (one string), None when there is none.

        Raises:
            InputError: the segment is of a newer version than this code reads.
        """
        m = self.pattern.search(text or "")
        if not m:
            return None
        if int(m.group(1)) > self.version:
            raise InputError(f"AdminComment {self.name} segment is version {m.group(1)}; this slurm-gpushare reads "
                             f"version {self.version}", hint="upgrade slurm-gpushare")
        return m.group(2) or ""

    def strip(self, text: str | None) -> str:
        """``text`` without any segment of this kind (surrounding spaces trimmed)."""
        return self.pattern.sub("", text or "").strip()


#: The request audit: what was asked and what was granted (``[gpushare:v1 req=... grant=...]``).
AUDIT = Segment("gpushare", "gpushare:v", 1)
#: The audit's stand-in for "no share any more": Slurm reads an empty AdminComment update as "no change", so
#: job_submit.lua's slurm_job_modify writes this instead.
AUDIT_NONE = "[gpushare:none]"
#: A node's usage summary while the job runs (the node monitor).
RUNNING = Segment("gpushare-usage", "gpushare-usage:v", 1)
#: A run's final usage, every node and device (EpilogSlurmctld).
FINAL = Segment("usage", "gpushare:u", 1)
#: Every segment the product writes.
SEGMENTS = (AUDIT, RUNNING, FINAL)


def format_segment(fields: dict[str, object]) -> str:
    """``{"req": "mem=10G", "grant": "gres:shard:10"}`` -> ``[gpushare:v1 req=mem=10G grant=gres:shard:10]``.

    Raises:
        InputError: a key or value with a space, ``]`` or ``[`` (it would break the segment).
    """
    parts = []
    for k, v in fields.items():
        text = "" if v is None else str(v)
        if any(c in f"{k}{text}" for c in " []\n\t") or "=" in k:
            raise InputError(f"AdminComment field {k}={text!r} contains a space, '=' in the key, or a bracket")
        parts.append(f"{k}={text}")
    return AUDIT.format(parts)


#: The audit or its "no share" stand-in, whichever comes first.
_AUDIT_OR_NONE = re.compile(AUDIT.pattern.pattern + r"|\s*" + re.escape(AUDIT_NONE))


def merge(existing: str | None, segment: str) -> str:
    """Put an audit ``segment`` into an AdminComment, replacing an earlier audit (or :data:`AUDIT_NONE`),
    keeping the rest."""
    rest = without_audit(existing)
    return f"{rest} {segment}" if rest else segment


def audit_text(admin_comment: str | None) -> str | None:
    """The first audit segment, or :data:`AUDIT_NONE`, as written (None: neither)."""
    m = _AUDIT_OR_NONE.search(admin_comment or "")
    return m.group(0).strip() if m else None


def without_audit(admin_comment: str | None) -> str:
    """``admin_comment`` without its audit segments and :data:`AUDIT_NONE` (surrounding spaces trimmed)."""
    return _AUDIT_OR_NONE.sub("", admin_comment or "").strip()


def extract(admin_comment: str | None) -> dict[str, str] | None:
    """The fields of the audit segment, or None when there is none (or :data:`AUDIT_NONE` comes first: the job
    no longer holds a share).

    Raises:
        InputError: a segment of a newer version than this code reads.
    """
    m = _AUDIT_OR_NONE.search(admin_comment or "")
    if m is None or m.group(1) is None:
        return None
    out = {}
    for item in (AUDIT.find(m.group(0)) or "").split():
        k, _, v = item.partition("=")
        out[k] = v
    return out
