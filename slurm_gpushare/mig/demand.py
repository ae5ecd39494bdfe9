"""What a MIG plan serves: requests by size, each with how many run at once on average.

A demand is a list of :class:`Request` kinds: a memory size (MiB), optionally a compute share (percent
of a whole GPU, ``gpushare:sm=``), or a whole GPU; each with a weight, the mean number of such requests
running at once. It comes from

- the accounting store (:func:`demand_from_store`): the records of a partition and a period; a record
  with ``mem_asked_mib`` is a request of that size (MIG slice or MPS share alike: both asked for
  memory), one with ``mode`` ``gpu`` and nothing asked a whole-GPU request. Its weight is its run time
  within the period over the period's length, so the weights sum to the mean number of devices in use;
- a demand file (:func:`read_demand_file`), CSV or JSON, written by hand or by another tool::

      # mem,count[,sm]   (count: requests at once; mem with its unit, or "gpu" for a whole GPU)
      mem,count,sm
      10G,6,
      20G,2,30
      gpu,1,

  or ``{"requests": [{"mem": "10G", "count": 6}, {"mem": "20G", "count": 2, "sm": 30},
  {"gpu": true, "count": 1}]}``. Counts may be fractions (mean concurrency); sizes use the product's
  memory units (:func:`~slurm_gpushare.memsize.parse_mib`, base 1024, a bare number is MiB).
"""

from __future__ import annotations

import csv
import io
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from slurm_gpushare.accounting.store import Store
from slurm_gpushare.errors import InputError, ParseError
from slurm_gpushare.memsize import MAX_MEMORY_MIB, parse_mib
from slurm_gpushare.textdoc import kind, parse_json


@dataclass(frozen=True)
class Request:
    """One kind of request.

    Attributes:
        mem_mib: memory asked, MiB (0 for a whole GPU).
        weight: mean number of such requests running at once (> 0).
        sm_percent: compute asked, percent of a whole GPU (1-100), or None when not asked.
        whole: a whole GPU (MIG off) is asked.
    """

    mem_mib: int
    weight: float
    sm_percent: int | None = None
    whole: bool = False

    def label(self) -> str:
        """``10G``, ``20G sm=30``, ``gpu``, for tables."""
        if self.whole:
            return "gpu"
        mem = f"{self.mem_mib // 1024}G" if self.mem_mib % 1024 == 0 else f"{self.mem_mib}M"
        return mem + (f" sm={self.sm_percent}" if self.sm_percent is not None else "")


def merge(requests: list[Request]) -> tuple[Request, ...]:
    """Requests of one kind summed into one, sorted largest first (whole GPUs, then memory, then sm)."""
    acc: dict[tuple[int, int | None, bool], float] = defaultdict(float)
    for r in requests:
        acc[(r.mem_mib, r.sm_percent, r.whole)] += r.weight
    out = [Request(mem_mib=m, weight=w, sm_percent=s, whole=wh) for (m, s, wh), w in acc.items() if w > 0]
    return tuple(sorted(out, key=lambda r: (not r.whole, -r.mem_mib, -(r.sm_percent or 0))))


def records_in_period(store: Store, partitions: tuple[str, ...], since: int | None, until: int | None,
             models: tuple[str, ...]) -> tuple[list[tuple], int, int]:
    """The ``(mode, mem_asked_mib, sm_asked_percent, start, end)`` rows of the records of ``partitions`` and
    ``models`` (all when empty) that run in ``[since, until)``, and that period ``(lo, hi)``, epoch seconds
    (the records' first start and last end where not given).

    Raises:
        InputError: as :func:`demand_from_store`.
    """
    conds: list[tuple[str, list[object]]] = []
    for column, values in (("partition", partitions), ("gpu_model", models)):
        if values:
            conds.append((f'"{column}" IN ({", ".join("?" * len(values))})', list(values)))
    if since is not None:
        conds.append(('"end" > ?', [since]))
    if until is not None:
        conds.append(('"start" < ?', [until]))
    sql = ('SELECT "mode", "mem_asked_mib", "sm_asked_percent", "start", "end" FROM usage'
           + (" WHERE " + " AND ".join(c for c, _v in conds) if conds else ""))
    params = [v for _c, values in conds for v in values]
    rows = store.query(sql, tuple(params))
    what = (f"partition(s) {', '.join(partitions)}" if partitions else "any partition") + \
        (f", model(s) {', '.join(models)}" if models else "")
    if not rows:
        raise InputError(f"no accounting records of {what} in the period",
                         hint="check --partition, --since and --until ('slurm-gpushare report --by partition' "
                              "lists what the store holds), or give --demand FILE")
    lo = since if since is not None else min(r[3] for r in rows)
    hi = until if until is not None else max(r[4] for r in rows)
    if hi <= lo:
        raise InputError(f"the period of {what} is empty ({lo}..{hi})",
                         hint="give --since and --until a period of some length")
    return rows, lo, hi


def demand_from_store(store: Store, *, partitions: tuple[str, ...] = (), since: int | None = None,
                      until: int | None = None, models: tuple[str, ...] = ()) -> tuple[Request, ...]:
    """The demand of the store's records of ``partitions`` (all when empty) within ``[since, until)``.

    Each record (one device of one job run) weighs its run time inside the period over the period's
    length; the period is ``since``..``until``, or the records' own first start and last end where not
    given. Records of other GPU models than ``models`` (when given) are left out.

    Raises:
        InputError: no record in the period (the hint names what was asked), or an empty period.
    """
    rows, lo, hi = records_in_period(store, partitions, since, until, models)
    out = []
    for mode, mem, sm, start, end in rows:
        run = max(0, min(end, hi) - max(start, lo))
        if run == 0 and end > start:
            continue
        weight = (run if end > start else 1) / (hi - lo)
        if mem is None:
            if mode == "gpu":
                out.append(Request(mem_mib=0, weight=weight, whole=True))
            continue
        out.append(Request(mem_mib=int(mem), weight=weight, sm_percent=sm))
    return merge(out)


def read_demand_file(path: str | Path) -> tuple[Request, ...]:
    """A demand file, CSV or JSON (see the module docstring): JSON when its name ends in ``.json`` or, unless it ends
    in ``.csv``, when its first non-blank character is ``{`` or ``[`` (no CSV row starts so), so that a truncated
    JSON document is reported as JSON, not as a bad CSV row.

    Raises:
        InputError: unreadable file.
        ParseError: a malformed row or entry (file and line or entry named), not valid JSON (line and column),
            JSON nested deeper than the parser goes, a CSV field past the csv module's limit, or no request at all.
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise InputError(f"cannot read demand file {p}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise InputError(f"demand file {p} is not text (UTF-8)") from None
    is_json = kind(p, text, json_starts="{[", other="CSV") == "JSON"
    out = _json_demand(text, p.name) if is_json else _csv_demand(text, p.name)
    if not out:
        raise ParseError("the demand file holds no request", source=p.name,
                         hint="one row per request size: mem,count[,sm] (e.g. 10G,6), or gpu,N for whole GPUs")
    return merge(out)


_HINT = 'rows are mem,count[,sm]: e.g. "10G,6" or "20G,2,30" or "gpu,1" (count: requests at once)'


def _request(mem: object, count: object, sm: object, where: str) -> Request:
    try:
        if isinstance(count, bool):  # JSON true is no count (float(True) would take it as 1)
            raise TypeError
        weight = float(count)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ParseError(f"count {count!r} is not a number", source=where, hint=_HINT) from None
    if not weight > 0 or weight > 1e6:
        raise ParseError(f"count {count!r} must be above 0 (and at most 1e6)", source=where, hint=_HINT)
    sm_percent = None
    if sm not in (None, ""):
        try:
            sm_percent = int(str(sm))
        except ValueError:
            raise ParseError(f"sm {sm!r} is not a whole percent", source=where, hint=_HINT) from None
        if not 1 <= sm_percent <= 100:
            raise ParseError(f"sm {sm_percent} is outside 1-100 (percent of a whole GPU)", source=where, hint=_HINT)
    if str(mem).strip().lower() == "gpu":
        return Request(mem_mib=0, weight=weight, whole=True)
    if isinstance(mem, bool) or isinstance(mem, (int, float)) or str(mem).strip().replace(".", "", 1).isdigit():
        raise ParseError(f"mem {mem!r} has no unit: write {str(mem).strip()}G (GiB) or {str(mem).strip()}M (MiB)",
                         source=where, hint='e.g. "10G,6": 10 GiB, 6 requests at once')
    try:
        mem_mib = parse_mib(str(mem), what="mem", maximum=MAX_MEMORY_MIB)
    except InputError as e:
        raise ParseError(e.message, source=where, hint=e.hint or _HINT) from None
    if mem_mib <= 0:
        raise ParseError(f"mem {mem!r} must be above 0", source=where, hint=_HINT)
    return Request(mem_mib=mem_mib, weight=weight, sm_percent=sm_percent)


def _csv_demand(text: str, name: str) -> list[Request]:
    out: list[Request] = []
    rows = csv.reader(io.StringIO(text))
    lineno = 0
    try:
        for lineno, row in enumerate(rows, start=1):
            _csv_row(row, lineno, name, out)
    except csv.Error as e:  # a field past the csv module's limit, a NUL byte
        raise ParseError(f"not a CSV row ({e})", source=f"{name}:{lineno + 1}", hint=_HINT) from None
    return out


def _csv_row(row: list[str], lineno: int, name: str, out: list[Request]) -> None:
    cells = [c.strip() for c in row]
    if not cells or not any(cells) or cells[0].startswith("#") or cells[0].lower() == "mem":
        return  # blank, a comment, the header
    if len(cells) not in (2, 3):
        raise ParseError(f"{len(cells)} columns, expected 2 or 3", source=f"{name}:{lineno}", hint=_HINT)
    out.append(_request(cells[0], cells[1], cells[2] if len(cells) == 3 else None, f"{name}:{lineno}"))


def _json_demand(text: str, name: str) -> list[Request]:
    data = parse_json(text, source=name)
    entries = data.get("requests") if isinstance(data, dict) else None
    if not isinstance(entries, list) or set(data) - {"requests"}:
        raise ParseError('a JSON demand file is {"requests": [...]}', source=name,
                         hint='e.g. {"requests": [{"mem": "10G", "count": 6}, {"gpu": true, "count": 1}]}')
    out = []
    for i, entry in enumerate(entries):
        where = f"{name}: requests[{i}]"
        if not isinstance(entry, dict) or set(entry) - {"mem", "count", "sm", "gpu"} or "count" not in entry \
                or ("mem" in entry) == bool(entry.get("gpu")):
            raise ParseError("each request has count and either mem or \"gpu\": true (and optionally sm)",
                             source=where, hint='e.g. {"mem": "10G", "count": 6, "sm": 30}')
        out.append(_request("gpu" if entry.get("gpu") else entry["mem"], entry["count"], entry.get("sm"), where))
    return out
