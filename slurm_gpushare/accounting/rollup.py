"""The daily rollup of the usage records: what the grouped reports read instead of the records, kept by ingest.

A report by user, account, partition, GPU model or mode over 10 million records reads every record's row when it
scans them (seconds: :mod:`~slurm_gpushare.accounting.report`); the rollup holds sums per UTC day and group, a few
rows per group and day, kept exact in the same transaction as the records they sum.

Two tables (created with the store's others; layout 6):

``usage_day``, one row per ``(day, user, account, partition, gpu_model, mode)``, ``day`` the UTC day number (epoch
seconds // 86400). A record is cut at UTC midnights into pieces, one per day its ``[start, end)`` overlaps (a record
of zero length: one piece, on its start day); ``d`` is a piece's seconds. A row sums its pieces:

* ``starts``, ``carries``: the records whose piece it is that start on that day / started before it (so the records
  that overlap a period of whole days are the ``starts`` of its days plus the ``carries`` of its first day);
  ``nosm_*`` and ``nomem_*`` the same for records without SM data and without a memory peak;
* ``gpu_s`` = sum ``d * share``, ``gpu_s_data`` the same over records with SM data, ``sm_ds`` = sum
  ``d * sm_mean``, ``d_data`` = sum ``d`` over records with SM data, ``sm_n`` their pieces (0: no data), ``sm_peak``
  the highest SM peak; ``mem_s`` = sum ``d * granted``, ``mem_s_data`` the same over records with a peak,
  ``mem_s_used`` = sum ``d * peak``, ``mem_n`` their pieces.

``usage_day_jobs``, one row per ``(dim, day, value)``: a job (its id, its user and the submit time of its first run,
:func:`_jobs_of`: an id Slurm gives again is another job, a requeued job's runs are one) has a *span* in a
group, its records' first start to last end among
those of the group's value (a record of zero length ends a second after its start; ``dim`` ``user``, ``account``,
``partition``, ``model``, ``mode``, or
``''`` for all of the job's records); spans are cut into days as records are, ``job_starts`` counting the span on
its first day and ``job_carries`` on each later one. The jobs of a group in a period of whole days are the
``job_starts`` of its days plus the ``job_carries`` of its first day: the jobs whose span overlaps the period, the
definition of the JOBS column (the scan of the records counts the same way).

Kept by :func:`apply`: the store reads the rows of every job a batch touches before and after its upsert
(:func:`job_rows`), and the difference (records added, records replaced by one that saw more, spans that moved)
goes into the tables, in the batch's transaction. A record or span of more than :data:`MAX_DAYS` days is not
rolled up; it is counted in ``meta`` (``rollup_unrolled``) and reports scan the records while any is stored.
"""

from __future__ import annotations

import bisect
import operator
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from slurm_gpushare.accounting.backend import Dialect

DAY = 86400
#: Records and job spans longer than this many days are not rolled up (a corrupt end time would make millions of
#: pieces); reports scan the records while one is stored.
MAX_DAYS = 3660
#: The report groups the rollup holds, as ``report --by`` names them -> the record column.
GROUP_COLUMNS = {"user": "user", "account": "account", "partition": "partition", "model": "gpu_model",
                 "mode": "mode"}
#: The dimensions jobs are counted by: the report groups and ``''`` (all of a job's records).
JOB_DIMS = (*GROUP_COLUMNS, "")
#: The record columns the rollup reads, in this order (:func:`job_rows`).
ROW_COLUMNS = ("job_id", "restart", "submit", "user", "step", "node", "gpu_index", "gpu_uuid", "v", "account",
               "partition", "gpu_model", "mode", "start", "end", "gpu_memory_mib", "mem_granted_mib", "mem_peak_mib",
               "sm_mean_percent", "sm_peak_percent")
_KEY = ("job_id", "restart", "submit", "user", "step", "node", "gpu_index", "gpu_uuid", "v")
_GROUP = tuple(GROUP_COLUMNS.values())


class _Layout:
    """Where a row of some column order holds what the rollup reads (:data:`ROW_COLUMNS` from the database, the
    store's record fields in a parse worker)."""

    def __init__(self, columns: Sequence[str]):
        at = {name: i for i, name in enumerate(columns)}
        self.values = operator.itemgetter(*(at[c] for c in ("start", "end", "mode", "gpu_memory_mib",
                                                             "mem_granted_mib", "mem_peak_mib", "sm_mean_percent",
                                                             "sm_peak_percent")))
        self.group = operator.itemgetter(*(at[c] for c in _GROUP))
        self.key = operator.itemgetter(*(at[c] for c in _KEY))
        self.job, self.start, self.end = at["job_id"], at["start"], at["end"]
        self.user, self.restart, self.submit = at["user"], at["restart"], at["submit"]


_ROWS = _Layout(ROW_COLUMNS)
_LAYOUTS: dict[tuple[str, ...], _Layout] = {}


def _layout(columns: Sequence[str]) -> _Layout:
    found = _LAYOUTS.get(tuple(columns))
    if found is None:
        found = _LAYOUTS[tuple(columns)] = _Layout(columns)
    return found


_COUNTS = ("starts", "carries", "nosm_starts", "nosm_carries", "nomem_starts", "nomem_carries", "sm_n", "mem_n")
_SUMS = ("gpu_s", "gpu_s_data", "sm_ds", "d_data", "mem_s", "mem_s_data", "mem_s_used")
_VALUES = (*_COUNTS, *_SUMS)
_PAGE = 20000
_UNROLLED = "rollup_unrolled"
_MAX_SPAN = "rollup_max_span"


def schema(dialect: Dialect) -> str:
    """The rollup's tables (``CREATE TABLE IF NOT EXISTS``) in ``dialect``."""
    integer, real = dialect.sql_type("INTEGER"), dialect.sql_type("REAL")
    counts = ", ".join(f"{c} {integer} NOT NULL DEFAULT 0" for c in _COUNTS)
    sums = ", ".join(f"{c} {real} NOT NULL DEFAULT 0" for c in _SUMS)
    return f"""
CREATE TABLE IF NOT EXISTS usage_day (
    day {integer} NOT NULL, "user" TEXT NOT NULL, "account" TEXT NOT NULL, "partition" TEXT NOT NULL,
    "gpu_model" TEXT NOT NULL, "mode" TEXT NOT NULL, {counts}, {sums}, sm_peak {real},
    PRIMARY KEY (day, "user", "account", "partition", "gpu_model", "mode")
);
CREATE TABLE IF NOT EXISTS usage_day_jobs (
    day {integer} NOT NULL, dim TEXT NOT NULL, value TEXT NOT NULL,
    job_starts {integer} NOT NULL DEFAULT 0, job_carries {integer} NOT NULL DEFAULT 0,
    PRIMARY KEY (dim, day, value)
);
"""


def job_rows(db, job_ids: Iterable[str]) -> list[tuple]:
    """Every stored record of these jobs as a tuple of :data:`ROW_COLUMNS` (in the open transaction)."""
    ids = sorted(set(job_ids))
    columns = ", ".join(f'"{c}"' for c in ROW_COLUMNS)
    out: list[tuple] = []
    for k in range(0, len(ids), 500):
        part = ids[k:k + 500]
        out += db.execute(f'SELECT {columns} FROM usage WHERE "job_id" IN ({", ".join("?" * len(part))})', part)
    return out


def _days(start: int, end: int) -> range:
    """The UTC day numbers of ``[start, end)``'s pieces (a zero-length interval: its start day)."""
    first = start // DAY
    return range(first, max(first, (end - 1) // DAY) + 1)


def _add_record(cells: dict, peaks: dict, taken: dict, row: Sequence, sign: int, layout: _Layout) -> bool:
    """Add (``sign`` 1) or take away (-1) a record's pieces; False when it is too long to roll up. The GPU share
    is the store's ``gpu_share`` column: 1 for a whole GPU, else the device's memory over the GPU's (at most 1)."""
    start, end, mode, gpu_mib, granted, peak, sm, sm_peak = layout.values(row)
    days = _days(start, end)
    if len(days) > MAX_DAYS:
        return False
    share = 1.0 if mode == "gpu" or gpu_mib <= 0 else min(1.0, granted * 1.0 / gpu_mib)
    group = layout.group(row)
    has_sm, has_mem = sm is not None, peak is not None
    for day in days:
        d = min(end, (day + 1) * DAY) - max(start, day * DAY)
        cell = cells.get((day, *group))
        if cell is None:
            cell = cells[(day, *group)] = [0] * 8 + [0.0] * 7
        first = 0 if day == days[0] else 1
        cell[first] += sign
        if not has_sm:
            cell[2 + first] += sign
        if not has_mem:
            cell[4 + first] += sign
        cell[8] += sign * d * share
        if has_sm:
            cell[6] += sign
            cell[9] += sign * d * share
            cell[10] += sign * d * sm
            cell[11] += sign * d
        cell[12] += sign * d * granted
        if has_mem:
            cell[7] += sign
            cell[13] += sign * d * granted
            cell[14] += sign * d * peak
        if sm_peak is not None:
            key = (day, *group)
            into = peaks if sign > 0 else taken
            known = into.get(key)
            into[key] = sm_peak if known is None else max(known, sm_peak)
    return True


def _jobs_of(rows: Sequence[Sequence], layout: _Layout) -> list[tuple]:
    """Each row's job: ``(job_id, user, epoch)``. Slurm gives a requeued job a new submit time and counts the
    restart, and may give an id to the same user again (MaxJobId wrapped, state lost): a run with restart 0 begins
    a job, identified by its submit time (its ``epoch``); a later run (restart 1 and on) belongs to the job of the
    latest restart-0 run submitted before it. None where no such run is stored. All records of a run have its
    submit time, so they are one job."""
    firsts: dict[tuple[str, str], list[int]] = {}
    job, user, restart, submit = layout.job, layout.user, layout.restart, layout.submit
    for row in rows:
        if row[restart] == 0:
            firsts.setdefault((row[job], row[user]), []).append(row[submit])
    for known in firsts.values():
        known.sort()
    out = []
    for row in rows:
        who = (row[job], row[user])
        submits = firsts.get(who)
        if row[restart] == 0:
            out.append((*who, row[submit]))
        elif not submits:
            out.append((*who, None))
        else:
            at = bisect.bisect_right(submits, row[submit]) - 1
            out.append((*who, submits[at] if at >= 0 else None))
    return out


def _spans(rows: Iterable[Sequence], layout: _Layout = _ROWS) -> dict[tuple[tuple, str, str], tuple[int, int]]:
    """``((job_id, user, epoch), dim, value) -> (first start, last end)`` of the rows (the end of a record of zero
    length one second after its start; the job as :func:`_jobs_of` says)."""
    rows = list(rows)
    per_group: dict[tuple, tuple[int, int]] = {}  # first by job and group: most jobs are in one group
    start_at, end_at, group = layout.start, layout.end, layout.group
    for row, who in zip(rows, _jobs_of(rows, layout), strict=True):
        key = (who, group(row))
        start = row[start_at]
        end = max(row[end_at], start + 1)  # a record of zero length is in the periods that hold its start
        old = per_group.get(key)
        per_group[key] = (start, end) if old is None else (min(old[0], start), max(old[1], end))
    out: dict[tuple[tuple, str, str], tuple[int, int]] = {}
    for (who, values), (start, end) in per_group.items():
        for dim, value in zip(JOB_DIMS, (*values, ""), strict=True):
            span = out.get((who, dim, value))
            out[(who, dim, value)] = (start, end) if span is None else (min(span[0], start), max(span[1], end))
    return out


@dataclass
class Delta:
    """What a change does to the rollup: ``cells`` (``usage_day`` key -> its counts and sums, :data:`_VALUES`
    order), ``peaks`` (key -> the highest SM peak added), ``taken`` (key -> the highest SM peak of the records
    taken away: where it may have been the cell's, the peak is found again from the records), ``jobs``
    (``usage_day_jobs`` key -> ``[job_starts, job_carries]``), ``unrolled`` (records and spans too long to roll
    up, added less taken away), ``longest`` (the longest record rolled up, seconds)."""

    cells: dict = field(default_factory=dict)
    peaks: dict = field(default_factory=dict)
    jobs: dict = field(default_factory=dict)
    unrolled: int = 0
    longest: int = 0
    taken: dict = field(default_factory=dict)

    def add_records(self, rows: Iterable[Sequence], sign: int, layout: _Layout = _ROWS) -> None:
        """Add (1) or take away (-1) the pieces of records (:data:`ROW_COLUMNS` tuples, or as ``layout`` says)."""
        for row in rows:
            if not _add_record(self.cells, self.peaks, self.taken, row, sign, layout):
                self.unrolled += sign
            elif sign > 0:
                self.longest = max(self.longest, row[layout.end] - row[layout.start])

    def add_spans(self, spans: dict[tuple[tuple, str, str], tuple[int, int]], sign: int,
                  unless: dict | None = None) -> None:
        """Add or take away job spans (:func:`_spans`), but those ``unless`` holds alike."""
        for key, span in spans.items():
            if unless is not None and unless.get(key) == span:
                continue
            days = _days(*span)
            if len(days) > MAX_DAYS:
                self.unrolled += sign
                continue
            for day in days:
                cell = self.jobs.get((day, key[1], key[2]))
                if cell is None:
                    cell = self.jobs[(day, key[1], key[2])] = [0, 0]
                cell[0 if day == days[0] else 1] += sign

    def marshalled(self) -> tuple:
        """As plain containers (``marshal``: a parse worker's answer; nothing is taken away there)."""
        return self.cells, self.peaks, self.jobs, self.unrolled, self.longest


def apply(db, before: list[tuple], after: list[tuple]) -> None:
    """Bring the rollup from the records ``before`` to ``after`` (:func:`job_rows` of the same jobs before and
    after a change), in the open transaction. Records in both alike change nothing."""
    old, new = Counter(before), Counter(after)
    removed, added = old - new, new - old
    if not removed and not added:
        return
    delta = Delta()
    delta.add_records(removed.elements(), -1)
    delta.add_records(added.elements(), 1)
    user = _ROWS.user
    jobs = {(row[0], row[user]) for row in (*removed, *added)}
    spans_before = _spans(r for r in before if (r[0], r[user]) in jobs)
    spans_after = _spans(r for r in after if (r[0], r[user]) in jobs)
    delta.add_spans(spans_before, -1, unless=spans_after)
    delta.add_spans(spans_after, 1, unless=spans_before)
    write(db, delta)


def batch_delta(rows: list[tuple], fields: Sequence[str]) -> tuple[tuple, list[str]]:
    """In a parse worker: the rollup's change if every record of a batch (rows in ``fields`` order) were new
    and its jobs had no other record (:meth:`Delta.marshalled`), and the jobs of which the batch holds one key
    twice (for those that assumption fails: :func:`take_out`)."""
    layout = _layout(fields)
    delta = Delta()
    delta.add_records(rows, 1, layout)
    delta.add_spans(_spans(rows, layout), 1)
    keys: set[tuple] = set()
    twice: set[str] = set()
    for row in rows:
        key = layout.key(row)
        if key in keys:
            twice.add(row[layout.job])
        keys.add(key)
    return delta.marshalled(), sorted(twice)


def take_out(marshalled: tuple, rows: list[tuple], slow: set[str], fields: Sequence[str]) -> Delta:
    """A worker's :func:`batch_delta` without the records of the ``slow`` jobs (jobs with records stored
    before, or a key twice in the batch: :func:`apply` takes care of them), ``rows`` the batch's in ``fields``
    order. The SM peak of a cell those records touched is found again from the batch's other records."""
    delta = Delta(*marshalled)
    if not slow:
        return delta
    layout = _layout(fields)
    at = layout.job
    theirs = [row for row in rows if row[at] in slow]
    delta.add_records(theirs, -1, layout)  # their peaks go to ``taken``: not taken from the database, but from the sums
    delta.add_spans(_spans(theirs, layout), -1)
    touched = set(delta.taken)
    delta.taken = {}
    if touched:
        for key in touched:
            delta.peaks.pop(key, None)
        groups = {key[1:] for key in touched}
        others = Delta()
        for row in rows:
            if row[at] not in slow and layout.group(row) in groups:
                others.add_records([row], 1, layout)
        for key in touched:
            if others.peaks.get(key) is not None:
                delta.peaks[key] = others.peaks[key]
    return delta


def write(db, delta: Delta) -> None:
    """Add a :class:`Delta` to the rollup's tables (in the open transaction)."""
    d = db.dialect
    values = ", ".join(_VALUES)
    update = ", ".join(f"{c} = usage_day.{c} + excluded.{c}" for c in _VALUES)
    peak = d.greatest("COALESCE(usage_day.sm_peak, excluded.sm_peak)", "COALESCE(excluded.sm_peak, usage_day.sm_peak)")
    if delta.unrolled:
        _meta_add(db, _UNROLLED, delta.unrolled, "+")
    if delta.longest:
        _meta_add(db, _MAX_SPAN, delta.longest, "max")  # before the peaks are looked for: it bounds that search
    stale = []
    for key, gone in delta.taken.items():
        # the cell's peak can only have dropped if a record taken away held it
        held = db.execute('SELECT sm_peak FROM usage_day WHERE day = ? AND "user" = ? AND "account" = ? '
                          'AND "partition" = ? AND "gpu_model" = ? AND "mode" = ?', key)
        if not held or held[0][0] is None or gone >= held[0][0]:
            stale.append(key)
    if delta.cells:
        db.executemany(
            f'INSERT INTO usage_day (day, "user", "account", "partition", "gpu_model", "mode", {values}, sm_peak) '
            f"VALUES ({', '.join('?' * (6 + len(_VALUES) + 1))}) "
            f'ON CONFLICT (day, "user", "account", "partition", "gpu_model", "mode") DO UPDATE SET {update}, '
            f"sm_peak = {peak}",
            [(*key, *cell, delta.peaks.get(key)) for key, cell in delta.cells.items()])
    if stale:
        _find_peaks(db, stale)
    if delta.jobs:
        db.executemany("INSERT INTO usage_day_jobs (day, dim, value, job_starts, job_carries) VALUES (?, ?, ?, ?, ?) "
                       "ON CONFLICT (dim, day, value) DO UPDATE SET "
                       "job_starts = usage_day_jobs.job_starts + excluded.job_starts, "
                       "job_carries = usage_day_jobs.job_carries + excluded.job_carries",
                       [(*key, *cell) for key, cell in delta.jobs.items() if cell != [0, 0]])


def _meta_add(db, key: str, value: int, how: str) -> None:
    current = db.execute("SELECT value FROM meta WHERE key = ?", (key,))
    now = int(current[0][0]) if current else 0
    result = now + value if how == "+" else max(now, value)
    if result != now or not current:
        db.execute("INSERT INTO meta VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                   (key, str(result)))


def _meta_int(query, key: str) -> int:
    row = query("SELECT value FROM meta WHERE key = ?", (key,))
    return int(row[0][0]) if row else 0


def _find_peaks(db, keys: list[tuple]) -> None:
    """The SM peak of these cells again from the records (a record that held one was taken away)."""
    longest = _meta_int(db.execute, _MAX_SPAN)
    for day, user, account, partition, model, mode in keys:
        lo, hi = day * DAY, (day + 1) * DAY
        # the records with a piece on that day (a rolled-up record is at most ``longest`` seconds long)
        found = db.execute('SELECT "start", "end", "sm_peak_percent" FROM usage WHERE "start" >= ? AND "start" < ? '
                           'AND ("end" > ? OR "start" >= ?) AND "user" = ? AND "account" = ? AND "partition" = ? '
                           'AND "gpu_model" = ? AND "mode" = ? AND "sm_peak_percent" IS NOT NULL',
                           (lo - longest - 1, hi, lo, lo, user, account, partition, model, mode))
        peak = max((p for start, end, p in found if len(_days(start, end)) <= MAX_DAYS), default=None)
        db.execute('UPDATE usage_day SET sm_peak = ? WHERE day = ? AND "user" = ? AND "account" = ? '
                   'AND "partition" = ? AND "gpu_model" = ? AND "mode" = ?',
                   (peak, day, user, account, partition, model, mode))


def rebuild(db) -> None:
    """Make the rollup anew from every stored record (a database of layout 5; in the open transaction)."""
    db.execute("DELETE FROM usage_day")
    db.execute("DELETE FROM usage_day_jobs")
    db.execute("DELETE FROM meta WHERE key IN (?, ?)", (_UNROLLED, _MAX_SPAN))
    columns = ", ".join(f'"{c}"' for c in ROW_COLUMNS)
    after = ""
    while True:
        # keyset pages in job order (the unique key's index), whole jobs only: a page's last job may go on
        rows = db.execute(f'SELECT {columns} FROM usage WHERE "job_id" > ? ORDER BY "job_id" LIMIT ?',
                          (after, _PAGE))
        if not rows:
            return
        last = rows[-1][0]
        if len(rows) == _PAGE:
            whole = [row for row in rows if row[0] != last]
            rows = whole or job_rows(db, [last])  # a job of a page or more on its own
        apply(db, [], rows)
        after = rows[-1][0]


def longest_record(query) -> int | None:
    """The longest stored record's length, seconds (None: a record or span too long to roll up is stored, so no
    bound is known). ``query`` as :func:`serves` takes it."""
    if _meta_int(query, _UNROLLED):
        return None
    return _meta_int(query, _MAX_SPAN)


def serves(query, by: str, since: int | None, until: int | None, users: Sequence[str], accounts: Sequence[str],
           jobs: Sequence[str]) -> bool:
    """Whether a usage report can be read from the rollup: grouped by one of :data:`GROUP_COLUMNS`, a period of
    whole UTC days (or none), filtered at most by the group's own column, and no record too long to roll up.
    ``query``: runs SQL with parameters and returns its rows (the store's ``query``)."""
    if by not in GROUP_COLUMNS or jobs or (users and by != "user") or (accounts and by != "account"):
        return False
    if any(t is not None and t % DAY for t in (since, until)):
        return False
    return _meta_int(query, _UNROLLED) == 0


def usage_rows(query, by: str, since: int | None, until: int | None,
               values: Sequence[str] = ()) -> tuple[list[tuple], int]:
    """The rows of a usage report from the rollup, as the report's scan makes them: ``(group, jobs, records,
    gpu_s, gpu_s_data, sm_ds, d_data, sm_peak, mem_s, mem_s_data, mem_s_used, no_sm, no_mem)`` (None where there
    is no data), for the groups with records in the period; and the jobs of all groups together (their spans in
    the period)."""
    column = GROUP_COLUMNS[by]
    lo = -(1 << 62) if since is None else since // DAY
    hi = (1 << 62) if until is None else until // DAY
    params: dict = {"lo": lo, "hi": hi}
    only = jobs_only = ""
    if values:
        names = ", ".join(f":v{i}" for i in range(len(values)))
        only, jobs_only = f' AND "{column}" IN ({names})', f" AND value IN ({names})"
        params.update((f"v{i}", v) for i, v in enumerate(values))

    def first(c: str) -> str:
        return f"SUM(CASE WHEN day = :lo THEN {c} ELSE 0 END)"

    sums = ", ".join(f"SUM({c})" for c in _SUMS)
    grouped = query(
        f'SELECT "{column}", SUM(starts) + {first("carries")}, SUM(nosm_starts) + {first("nosm_carries")}, '
        f'SUM(nomem_starts) + {first("nomem_carries")}, SUM(sm_n), SUM(mem_n), {sums}, MAX(sm_peak) '
        f'FROM usage_day WHERE day >= :lo AND day < :hi{only} GROUP BY "{column}"', params)
    jobs = dict(query(
        "SELECT value, SUM(job_starts) + SUM(CASE WHEN day = :lo THEN job_carries ELSE 0 END) FROM usage_day_jobs "
        f"WHERE dim = :dim AND day >= :lo AND day < :hi{jobs_only} "
        "GROUP BY value", {**params, "dim": by}))
    total = query("SELECT SUM(job_starts) + SUM(CASE WHEN day = :lo THEN job_carries ELSE 0 END) "
                  "FROM usage_day_jobs WHERE dim = '' AND day >= :lo AND day < :hi", params)
    rows = []
    for g, records, no_sm, no_mem, sm_n, mem_n, gpu_s, gpu_s_data, sm_ds, d_data, mem_s, mem_s_data, mem_s_used, \
            sm_peak in grouped:
        if not records:
            continue
        sm = bool(sm_n)
        mem = bool(mem_n)
        rows.append((g, int(jobs.get(g) or 0), int(records), gpu_s, gpu_s_data if sm else None,
                     sm_ds if sm else None, d_data if sm else None, sm_peak, mem_s, mem_s_data if mem else None,
                     mem_s_used if mem else None, int(no_sm), int(no_mem)))
    return rows, int(total[0][0] or 0) if total else 0
