"""The gpushare segment of a job's AdminComment: where the original request and the decision live.

AdminComment is set by slurmctld's job_submit plugin and by administrators only (users cannot
change it, unlike Comment, which is exported to Prolog as ``SLURM_JOB_COMMENT``), and slurmdbd
keeps it, so ``sacct -o AdminComment`` shows it. Other tools write there too: the gpushare part is
one bracketed, tagged segment, ``[gpushare:v1 key=value key=value ...]``, replaced as a whole and
leaving any other text untouched. Values contain no spaces and no ``]``. ``[gpushare:none]`` marks a
job whose GRES were later changed to something that is not a share (job_submit.lua's
slurm_job_modify writes it: Slurm reads an empty AdminComment update as "no change").
"""

from __future__ import annotations

import re

from slurm_gpushare.errors import InputError

TAG = "gpushare"
VERSION = 1
_SEGMENT = re.compile(r"\s*\[gpushare:(?:v(\d+)(?: ([^\]]*))?|none)\]")


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
    return f"[{TAG}:v{VERSION} " + " ".join(parts) + "]"


def merge(existing: str | None, segment: str) -> str:
    """Put ``segment`` into an AdminComment, replacing an earlier gpushare segment, keeping the rest."""
    rest = _SEGMENT.sub("", existing or "").strip()
    return f"{rest} {segment}" if rest else segment


def extract(admin_comment: str | None) -> dict[str, str] | None:
    """The fields of the gpushare segment, or None when there is none.

    Raises:
        InputError: a segment of a newer version than this code reads.
    """
    m = _SEGMENT.search(admin_comment or "")
    if not m or m.group(1) is None:  # none, or "[gpushare:none]": the job no longer holds a share
        return None
    if int(m.group(1)) > VERSION:
        raise InputError(f"AdminComment gpushare segment is version {m.group(1)}; this slurm-gpushare reads "
                         f"version {VERSION}", hint="upgrade slurm-gpushare on this node")
    out = {}
    for item in (m.group(2) or "").split():
        k, _, v = item.partition("=")
        out[k] = v
    return out
