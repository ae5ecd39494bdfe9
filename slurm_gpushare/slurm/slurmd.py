"""What ``slurmd -G`` prints: the GRES slurmd detected (AutoDetect) merged with gres.conf.

``slurmd -G`` logs one line per GRES record and exits. This is what an administrator has at hand
when a node drains with "gres/gpu count reported lower than configured" or a GRES type mismatch,
and what ``gres-conf --check --slurmd-g FILE`` compares with the generated gres.conf.

Format (``_log_gres_slurmd_conf`` in ``src/interfaces/gres.c``; ``src/common/gres.c`` in 22.05):

- 23.02 and later: ``Gres Name=<n> Type=<t> Count=<c> Index=<i> ID=<id> File=<files>
  [Cores=<ids> CoreCnt=<k>] Links=<links> Flags=<flags>``;
- 22.05: the same up to ``File=`` (and ``Cores=``/``CoreCnt=``), then ``Links=<links>`` or a bare
  ``(null)``, and no ``Flags=``;
- ``Index=`` is not a field of its own: slurmd prints the decimal number that ends ``File=`` (so
  ``/dev/nvidia3`` gives 3, ``/dev/nvidia-caps/nvidia-cap291`` gives 291, and a comma-separated
  ``File=`` list gives the number of its last file); a record without ``File=`` has no ``Index=``;
- ``Type=(null)`` / ``Links=(null)``: not set.

Each line starts with the log prefix ``slurmd-<host>: `` (``slurmd: `` when no host name is known,
and possibly a ``[timestamp]``), which is dropped. Recordings copied from web pages often have long
lines wrapped (the recorded H100 print in ``tests/data/slurmd`` breaks inside ``Flags=``): a line
without spaces right after a record line is taken as the rest of that record and joined back
(directly, or with one space when it starts a new ``Key=``); text that cannot be rejoined that way is
refused with the line named.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from slurm_gpushare.errors import ParseError

_RECORD = re.compile(r"^(?:\[[^\]]*\]\s*)?(?:slurmd(?:-(?P<host>[^\s:]+))?:\s+)?(?:\[[^\]]*\]\s*)?"
                     r"Gres\s+(?P<rest>Name=.*)$")
_KEYS = ("Name", "Type", "Count", "Index", "ID", "File", "Cores", "CoreCnt", "Links", "Flags")
_TRAILING_NUMBER = re.compile(r"(\d+)$")


@dataclass(frozen=True)
class DetectedGres:
    """One ``Gres Name=...`` line of ``slurmd -G``.

    Attributes:
        name: ``Name=`` (``gpu``, ``shard``, ...).
        type: ``Type=``, ``""`` for ``(null)``; AutoDetect=nvml names GPUs ``nvidia_h100_80gb_hbm3``
            (the NVML name in lower case with ``_`` for spaces, ``gpu_nvml.c``) and MIG devices
            ``<that name cut at its first '-'>_<MIG profile>``.
        count: ``Count=``.
        index: ``Index=`` (the number ending ``File=``), None when not printed.
        files: ``File=`` split at commas; empty when not printed.
        cores: ``Cores=`` as printed, or None.
        links: ``Links=`` as printed, ``""`` for ``(null)`` or absent.
        flags: ``Flags=`` items (23.02 and later), empty when not printed.
        line: the line number (1-based) where the record starts.
        host: the node name of the ``slurmd-<host>:`` log prefix, ``""`` when the line has none.
    """

    name: str
    type: str
    count: int
    index: int | None
    files: tuple[str, ...]
    cores: str | None
    links: str
    flags: tuple[str, ...]
    line: int
    host: str = ""


def _join(record: str, more: str) -> str:
    """Rejoin a wrapped line: directly at a comma or '=' boundary, with a space before a new Key=."""
    if not record.endswith((",", "=")) and not more.startswith(",") and re.match(r"[A-Za-z]+=", more):
        return f"{record} {more}"
    return record + more


def parse_slurmd_g(text: str, *, source: str = "<slurmd -G>") -> tuple[DetectedGres, ...]:
    """Read the ``Gres Name=...`` records of ``slurmd -G`` output (see the module docstring).

    Other lines (shell prompts, ``#`` comments, other log lines) are skipped.

    Returns:
        The records in printed order.

    Raises:
        ParseError: a record with an unknown or repeated key, a value that is not a number where
            one is needed (``Count=``, ``Index=``), an ``Index=`` that is not the number ending
            ``File=`` (a line joined wrongly), text that continues a record but cannot be rejoined,
            or no record at all.
    """
    pending: list[tuple[int, str]] = []
    hosts: dict[int, str] = {}
    lines = text.splitlines()
    for at, raw in enumerate(lines, start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = _RECORD.match(line)
        if m is not None:
            pending.append((at, m["rest"]))
            hosts[at] = m["host"] or ""
            continue
        if pending and " " not in line and (at - 1 == pending[-1][0] or _continues(lines, pending[-1][0], at)):
            start, rest = pending[-1]
            pending[-1] = (start, _join(rest, line))
    if not pending:
        raise ParseError("no 'Gres Name=...' line found", source=f"{source}:1",
                         hint="record what 'sudo slurmd -G' prints on the node (it needs root to read NVML "
                              "and the nvidia-caps devices)")
    return tuple(replace(_record(rest, f"{source}:{at}", at), host=hosts[at]) for at, rest in pending)


def _continues(lines: list[str], start: int, at: int) -> bool:
    """Whether every line between the record at ``start`` and line ``at`` is a wrapped piece of it."""
    return all(lines[k - 1].strip() and " " not in lines[k - 1].strip() for k in range(start + 1, at))


def _record(rest: str, where: str, at: int) -> DetectedGres:
    values: dict[str, str] = {}
    for token in rest.split():
        key, eq, value = token.partition("=")
        if not eq:
            if token == "(null)":  # 22.05: the Links= slot printed as a bare "(null)"
                continue
            raise ParseError(f"cannot read {token!r} in a slurmd -G record", source=where,
                             hint="a record is 'Gres Name=.. Type=.. Count=.. Index=.. ID=.. File=.. Links=.. "
                                  "Flags=..'; rejoin lines the copy wrapped, or record the output again")
        if key not in _KEYS:
            raise ParseError(f"unknown key {key}= in a slurmd -G record", source=where,
                             hint=f"slurmd -G prints {', '.join(k + '=' for k in _KEYS)}; a wrapped line "
                                  "joined in the wrong place reads like this: record the output again")
        if key in values:
            raise ParseError(f"{key}= appears twice in one slurmd -G record", source=where,
                             hint="two records were joined into one: keep each 'Gres Name=' on its own line")
        values[key] = value
    for key in ("Count", "Index"):
        if key in values and not values[key].isdigit():
            raise ParseError(f"{key}={values[key]} is not a number", source=where,
                             hint="slurmd prints Count= and Index= as decimal numbers")
    if "Count" not in values:
        raise ParseError("a slurmd -G record without Count=", source=where,
                         hint="record the whole line; wrapped lines are joined back only when nothing else "
                              "comes between them")
    files = tuple(f for f in values.get("File", "").split(",") if f and f != "(null)")
    index = int(values["Index"]) if "Index" in values else None
    if index is not None and files:
        tail = _TRAILING_NUMBER.search(files[-1])
        if tail is None or int(tail.group(1)) != index:
            raise ParseError(f"Index={index} is not the number that ends File={values['File']}", source=where,
                             hint="slurmd prints as Index= the number ending File=; this record was joined "
                                  "wrongly or edited: record the output again")
    flags = tuple(f for f in values.get("Flags", "").split(",") if f)

    def _null(v: str) -> str:
        return "" if v == "(null)" else v

    return DetectedGres(name=values["Name"], type=_null(values.get("Type", "")), count=int(values["Count"]),
                        index=index, files=files, cores=values.get("Cores"), links=_null(values.get("Links", "")),
                        flags=flags, line=at)
