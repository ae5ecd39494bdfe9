"""Accounting reports: what was reserved and what was used, by user, account, partition, GPU model, mode,
node or period, per job, and the jobs that asked for far more memory than they used.

Aggregation runs in the database (SQLite or PostgreSQL, :class:`~slurm_gpushare.accounting.store.Store`):
a grouped report by user, account, partition, model or mode over whole UTC days reads the daily rollup
(:mod:`~slurm_gpushare.accounting.rollup`), any other groups the records there (``GROUP BY``), the rows read
through a cursor, so that memory does not grow with the records (a grouped report holds its groups, the per-job
report its jobs, ``--waste`` the jobs it lists); this module builds the queries (in the store's
:class:`~slurm_gpushare.accounting.backend.Dialect`), derives the ratios and renders a
:class:`Report` as an aligned table, CSV or JSON. Definitions (also in
docs/accounting.md), for each GPU record (one job on one GPU device) with ``d`` its seconds inside the
report's period:

* Jobs: those whose span in the group (first start to last end of the job's records in it) overlaps the
  period (without one: the distinct jobs with a record in the group); a job is its id, its user and the submit
  time of its first run (a requeued run belongs to the job before it, an id given again is another job).
* GPU share ``f``: 1 for a whole GPU; for a MIG device or an MPS share, its memory over the GPU's
  memory (at most 1). GPU-hours reserved: ``sum(d * f) / 3600``.
* GPU-hours used: ``sum(d * sm_mean / 100) / 3600`` over records with SM data (SM utilization is of
  the whole GPU). GPU efficiency: used over reserved, both over records with SM data only.
* SM mean: ``sum(d * sm_mean) / sum(d)`` over records with SM data: a job on two GPUs at 80% and 20%
  counts 50%, an average over its GPUs, never a sum. SM peak: the highest sample.
* Memory GiB-hours reserved: ``sum(d * granted) / 1024 / 3600``; used: the same with the peak
  (an upper bound of what was held); memory efficiency: used over reserved, over records with a peak.
* A record without SM data (MIG devices, GPUs where NVML reports no utilization, jobs the monitor
  never sampled) adds nothing to the "used" sums and is counted in ``no_sm_data``: "no data", not 0%.
"""

from __future__ import annotations

import csv
import heapq
import io
import json
import math
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime

from slurm_gpushare.accounting import rollup
from slurm_gpushare.accounting.backend import SQLITE, Dialect
from slurm_gpushare.accounting.jobstats import SuggestRule, mig_slice_mib
from slurm_gpushare.accounting.store import Store
from slurm_gpushare.errors import InputError

#: ``--by`` choices -> SQL expression of the group (SQLite's; :func:`group_sql` for a store's dialect).
GROUPS: dict[str, str] = {
    "user": '"user"',
    "account": '"account"',
    "partition": '"partition"',
    "model": '"gpu_model"',
    "mode": '"mode"',
    "node": '"node"',
    "day": "strftime('%Y-%m-%d', \"start\", 'unixepoch')",
    "month": "strftime('%Y-%m', \"start\", 'unixepoch')",
}


def group_sql(by: str, dialect: Dialect = SQLITE) -> str:
    """The SQL expression of a ``--by`` group in ``dialect`` (``day`` and ``month`` of the record's start, UTC)."""
    if by in ("day", "month"):
        return dialect.utc_date('"start"', 10 if by == "day" else 7)
    return GROUPS[by]


#: Groups that hold each job in one group only (their job counts add up to the total).
_JOB_PARTITIONING = ("user", "account", "partition")
#: Output formats.
FORMATS = ("table", "csv", "json")
#: ``--waste``: a job is listed when its peak is at most this share of what it asked for.
WASTE_USED_BELOW = 0.5
#: ``--waste``: the jobs listed unless told otherwise (the most wasteful; ``--limit 0``: all).
WASTE_LIMIT = 100

NO_DATA = "no data"
_FOREVER = 1 << 62


@dataclass(frozen=True)
class Column:
    """A report column: ``name`` (CSV/JSON key), ``title`` (table header), ``kind`` (how to print:
    ``text``, ``int``, ``hours``, ``pct``, ``mib``; ``asked``: MiB, where None means nothing was asked,
    not "no data")."""

    name: str
    title: str
    kind: str


@dataclass(frozen=True)
class Report:
    """A rendered-to-be report: columns, rows (values in column order; None = no data), a total row.

    Attributes:
        kind: ``usage`` (grouped), ``jobs`` (one row per job) or ``waste``.
        by: the group (``user``...) of a usage report, ``job`` otherwise.
        since, until: the period, epoch seconds (None: open).
    """

    kind: str
    by: str
    since: int | None
    until: int | None
    columns: tuple[Column, ...]
    rows: tuple[tuple, ...]
    total: tuple | None = None
    #: rows that qualified but were left out by a limit (``--waste --limit``); 0 when every one is shown
    left_out: int = 0


# --- periods -------------------------------------------------------------------------------------

_RELATIVE = re.compile(r"^now(?:-(\d+)(s|sec|seconds?|m|min|minutes?|h|hours?|d|days?|w|weeks?))?$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_time(text: str, *, now: float | None = None, what: str = "--since") -> int:
    """A point in time as the report options take it, in epoch seconds.

    Forms: ``2026-11-01`` or ``2026-11-01T08:00[:00]`` (local time, as ``sacct -S`` takes it; an
    explicit offset such as ``+00:00`` is honoured), ``@1764547200`` (epoch seconds), ``now``,
    ``now-7days`` / ``now-12h`` / ``now-30min`` / ``now-2weeks``.

    Raises:
        InputError: none of these forms.
    """
    s = text.strip()
    now = time.time() if now is None else now
    if s.startswith("@") and s[1:].isdigit():
        return int(s[1:])
    m = _RELATIVE.match(s)
    if m:
        if not m.group(1):
            return int(now)
        return int(now) - int(m.group(1)) * _UNIT_S[m.group(2)[0]]
    try:
        return int(datetime.fromisoformat(s).timestamp())
    except ValueError:
        raise InputError(f"{what} {text!r} is not a time",
                         hint="write 2026-11-01, 2026-11-01T08:00, @EPOCH, now or now-7days") from None


# --- queries -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Filters:
    """Which records a report reads (``report --user/--account/--job``): each a tuple of accepted values,
    empty = any. A job id matches the job's own id and, for an array, the array's id (every task)."""

    users: tuple[str, ...] = ()
    accounts: tuple[str, ...] = ()
    jobs: tuple[str, ...] = ()

    def sql(self) -> tuple[list[str], dict]:
        """WHERE terms (joined by AND) and their parameters."""
        terms: list[str] = []
        params: dict = {}
        for name, column, values in (("u", '"user"', self.users), ("a", '"account"', self.accounts)):
            if values:
                keys = [f"f_{name}{i}" for i in range(len(values))]
                terms.append(f"{column} IN ({', '.join(':' + k for k in keys)})")
                params.update(zip(keys, values, strict=True))
        if self.jobs:
            keys = [f"f_j{i}" for i in range(len(self.jobs))]
            listed = ", ".join(":" + k for k in keys)
            terms.append(f'("job_id" IN ({listed}) OR "array_job_id" IN ({listed}))')
            params.update(zip(keys, self.jobs, strict=True))
        return terms, params


#: The submit time of the first run of a record's job (:func:`~slurm_gpushare.accounting.rollup._jobs_of`): the
#: latest restart-0 run of its id and user submitted no later than it (NULL: none stored).
_EPOCH_SQL = ('CASE WHEN "restart" = 0 THEN "submit" ELSE (SELECT MAX(e."submit") FROM usage AS e '
              'WHERE e."job_id" = usage."job_id" AND e."user" = usage."user" AND e."restart" = 0 '
              'AND e."submit" <= usage."submit") END')


def _period(since: int | None, until: int | None, columns: str,
            filters: Filters | None = None, dialect: Dialect = SQLITE, also: str | None = None) -> tuple[str, dict]:
    """A subquery of ``usage`` with ``columns`` and ``d``, each record's seconds inside the period, over
    the records that overlap it (a record of zero length inside it still counts) and pass ``filters`` (and the
    condition ``also``)."""
    where, params = (filters or Filters()).sql()
    if also:
        where.append(also)
    if since is None and until is None:
        d = '"end" - "start"'
    else:
        params.update(since=-_FOREVER if since is None else since, until=_FOREVER if until is None else until)
        if params["since"] >= params["until"]:
            raise InputError(f"the period is empty: --since {_when(since)} is not before --until {_when(until)}")
        d = dialect.greatest("0", dialect.least('"end"', ":until") + " - " + dialect.greatest('"start"', ":since"))
        where.insert(0, '"start" < :until AND ("end" > :since OR "start" >= :since)')
    return f'SELECT {columns}, {d} AS d FROM usage' + (f" WHERE {' AND '.join(where)}" if where else ""), params


USAGE_COLUMNS = (
    Column("jobs", "JOBS", "int"),
    Column("gpus", "GPUS", "int"),
    Column("gpu_hours", "GPU-H", "hours"),
    Column("gpu_hours_used", "GPU-H USED", "hours"),
    Column("gpu_efficiency_pct", "GPU-H USED/RES%", "pct"),
    Column("sm_mean_pct", "SM MEAN%", "pct"),
    Column("sm_peak_pct", "SM PEAK%", "pct"),
    Column("mem_gib_hours", "MEM GiB-H", "hours"),
    Column("mem_gib_hours_used", "MEM GiB-H USED", "hours"),
    Column("mem_efficiency_pct", "MEM-H USED/RES%", "pct"),
    Column("no_sm_data", "NO SM DATA", "int"),
    Column("no_mem_data", "NO MEM DATA", "int"),
)


def usage_report(store: Store, *, by: str = "user", since: int | None = None,
                 until: int | None = None, filters: Filters | None = None, use_rollup: bool = True) -> Report:
    """Reserved vs used GPU-hours and memory GiB-hours per group (see module docstring).

    Read from the daily rollup (:mod:`~slurm_gpushare.accounting.rollup`) where it serves: by user, account,
    partition, model or mode, a period of whole UTC days or none, filtered at most by the group's own column;
    otherwise from the records. Both give the same report.

    Args:
        store: the accounting store.
        by: a key of :data:`GROUPS`.
        since, until: the period, epoch seconds; durations are clipped to it.
        filters: the users, accounts, jobs to report on (default all).
        use_rollup: False: read the records even where the rollup serves (the tests compare the two).

    Raises:
        InputError: an unknown group or an empty period.
    """
    if by not in GROUPS:
        raise InputError(f"cannot report by {by!r}", hint=f"use one of {', '.join(GROUPS)} or job")
    f = filters or Filters()
    if use_rollup and rollup.serves(store.query, by, since, until, f.users, f.accounts, f.jobs):
        _period(since, until, '"job_id"', filters, store.dialect)  # (an empty period is refused all the same)
        raw, all_jobs = rollup.usage_rows(store.query, by, since, until, f.users or f.accounts)
        return _usage_report(by, since, until, raw, lambda: all_jobs)
    # only columns of the covering indexes usage_by_user and usage_by_account (plus the group's), so that by-user
    # and by-account read their index in order
    inner, params = _period(since, until, f'{group_sql(by, store.dialect)} AS g, "gpu_share", '
                            '"sm_mean_percent", "sm_peak_percent", "mem_granted_mib", "mem_peak_mib"', filters,
                            store.dialect)
    sums = """
        COUNT(*),
        SUM(d * "gpu_share"),
        SUM(CASE WHEN "sm_mean_percent" IS NOT NULL THEN d * "gpu_share" END),
        SUM(d * "sm_mean_percent"),
        SUM(CASE WHEN "sm_mean_percent" IS NOT NULL THEN d END),
        MAX("sm_peak_percent"),
        SUM(d * "mem_granted_mib"),
        SUM(CASE WHEN "mem_peak_mib" IS NOT NULL THEN d * "mem_granted_mib" END),
        SUM(d * "mem_peak_mib"),
        COUNT(*) - COUNT("sm_mean_percent"),
        COUNT(*) - COUNT("mem_peak_mib")"""
    raw = list(store.iterate(f'SELECT g, 0, {sums} FROM ({inner}) AS p GROUP BY g', params))
    # a job is its id, its user and the submit time of its first run (_EPOCH_SQL; rollup._jobs_of)
    job = '"job_id", "user", epoch'
    columns = f'{group_sql(by, store.dialect)} AS g, "job_id", "user", {_EPOCH_SQL} AS epoch'
    if since is None or until is None:
        # a job whose span overlaps a period open at one end has a record in it: the jobs with records counted
        jobs_of, jobs_params = _period(since, until, columns, filters, store.dialect)
        jobs_sql = f"SELECT DISTINCT g, {job} FROM ({jobs_of}) AS p"
        all_sql = f"SELECT COUNT(*) FROM (SELECT DISTINCT {job} FROM ({jobs_of}) AS p) AS j"
    else:
        # a job counts where its span (first start to last end of its records in the group; a record of zero length
        # ends a second after its start) overlaps the period, as the rollup counts: a requeued job whose runs lie
        # before and after the period is one of its jobs. Only jobs with a record that ends after the period's start
        # can: those with a record that starts at most the longest record's length before it, or later.
        longest = rollup.longest_record(store.query)
        spans, jobs_params = _period(None, None, f'{columns}, "start", "end"', filters, store.dialect,
                                     also='"job_id" IN (SELECT "job_id" FROM usage WHERE "start" >= :near)')
        jobs_params.update(since=since, until=until, near=-_FOREVER if longest is None else since - longest - 1)
        overlaps = 'MIN("start") < :until AND MAX(CASE WHEN "end" > "start" THEN "end" ELSE "start" + 1 END) > :since'
        jobs_sql = f'SELECT g, {job} FROM ({spans}) AS p GROUP BY g, {job} HAVING {overlaps}'
        all_sql = f'SELECT COUNT(*) FROM (SELECT {job} FROM ({spans}) AS p GROUP BY {job} HAVING {overlaps}) AS j'
    jobs = dict(store.iterate(f"SELECT g, COUNT(*) FROM ({jobs_sql}) AS j GROUP BY g", jobs_params))
    raw = [(r[0], jobs.get(r[0], 0), *r[2:]) for r in raw]
    return _usage_report(by, since, until, raw, lambda: store.query(all_sql, jobs_params)[0][0])


def _usage_report(by: str, since: int | None, until: int | None, raw: list[tuple],
                  all_jobs: Callable[[], int]) -> Report:
    """The report of the groups' sums (``raw``: a group, its jobs, then the sums :func:`_usage_row` reads);
    ``all_jobs``: the jobs of all groups together, asked for only where a job can be in several groups."""
    rows = sorted((_usage_row(r) for r in raw), key=lambda row: (-(row[3] or 0), str(row[0])))
    total = None
    if raw:
        jobs = sum(r[1] for r in raw) if by in _JOB_PARTITIONING else all_jobs()
        acc = [jobs]
        for i in range(2, 13):
            values = [r[i] for r in raw if r[i] is not None]
            acc.append((max(values) if i == 7 else sum(values)) if values else None)
        total = _usage_row(("TOTAL", *acc))
    columns = (Column(by, by.upper(), "text"), *USAGE_COLUMNS)
    return Report("usage", by, since, until, columns, tuple(rows), total)


def _ratio(num: float | None, den: float | None, scale: float = 1.0) -> float | None:
    return None if num is None or not den else num * scale / den


def _usage_row(r: tuple) -> tuple:
    (g, jobs, gpus, gpu_s, gpu_s_data, sm_ds, d_data, sm_peak, mem_s, mem_s_data, mem_s_used,
     no_sm, no_mem) = r
    gpu_s_used = None if sm_ds is None else sm_ds / 100.0
    return (g, jobs, gpus, (gpu_s or 0) / 3600.0, _ratio(gpu_s_used, 3600.0),
            _ratio(gpu_s_used, gpu_s_data, 100.0), _ratio(sm_ds, d_data), sm_peak,
            (mem_s or 0) / 1024.0 / 3600.0, _ratio(mem_s_used, 1024.0 * 3600.0),
            _ratio(mem_s_used, mem_s_data, 100.0), no_sm, no_mem)


# One row per job, in job order. A job's hours are the sum of its runs' (a requeued job's runs, ``restart``,
# are each as long as their own devices say, and the pending time between them is no part of the job):
# last end minus first start for a job of one run; :func:`_run_hours` adds up the runs of the others.
_JOB_SQL = """
    SELECT "job_id", MIN("user"), MIN("account"), MIN("partition"),
           {models}, {modes}, {shares},
           CAST(ROUND(COUNT(*) * 1.0 / COUNT(DISTINCT "restart")) AS INTEGER), COUNT(DISTINCT "node"),
           MAX("end") - MIN("start"),
           MAX(COALESCE("mem_asked_mib", "mem_granted_mib")), MAX("mem_granted_mib"), MAX("mem_peak_mib"),
           SUM(d * "sm_mean_percent"), SUM(CASE WHEN "sm_mean_percent" IS NOT NULL THEN d END),
           MAX("sm_peak_percent"), MIN("exit_state"),
           SUM(CASE WHEN "mem_peak_mib" IS NOT NULL
                    THEN d * {waste} END),
           MAX("mem_asked_mib"), MIN("array_job_id"), MIN("array_task_id"), COUNT(DISTINCT "restart"),
           MAX("gpu_memory_mib")
    FROM ({inner}) AS p GROUP BY "job_id" {having}
    ORDER BY {job_order}
"""
# the runs of the jobs that had more than one, each last end minus first start
_RUNS_SQL = """
    SELECT "job_id", SUM(run_s) FROM (
        SELECT "job_id", MAX("end") - MIN("start") AS run_s FROM ({inner}) AS p GROUP BY "job_id", "restart"
    ) AS runs GROUP BY "job_id" HAVING COUNT(*) > 1
"""
_JOB_COLUMNS_READ = ('"job_id", "restart", "user", "account", "partition", "gpu_model", "mode", "share", "node", '
                     '"start", "end", "mem_asked_mib", "mem_granted_mib", "mem_peak_mib", "sm_mean_percent", '
                     '"sm_peak_percent", "exit_state", "array_job_id", "array_task_id", "gpu_memory_mib"')


def _job_sql(store: Store, inner: str, having: str = "") -> str:
    d = store.dialect
    job = '"job_id"'
    return _JOB_SQL.format(
        inner=inner, having=having, models=d.concat_distinct('"gpu_model"'), modes=d.concat_distinct('"mode"'),
        shares=d.concat_distinct('"share"'),
        waste=d.greatest("0", 'COALESCE("mem_asked_mib", "mem_granted_mib") - "mem_peak_mib"'),
        job_order=f"{d.numeric_order(job)}, {d.text_order(job)}")


def _run_hours(store: Store, inner: str, params: dict) -> dict[str, int]:
    """Seconds per job of the requeued jobs (more than one run in the period): the sum of their runs'."""
    return dict(store.iterate(_RUNS_SQL.format(inner=inner), params))


JOB_COLUMNS = (
    Column("job", "JOB", "text"),
    Column("array", "ARRAY", "text"),
    Column("user", "USER", "text"),
    Column("account", "ACCOUNT", "text"),
    Column("partition", "PARTITION", "text"),
    Column("model", "MODEL", "text"),
    Column("mode", "MODE", "text"),
    Column("share", "SHARE", "text"),
    Column("gpus", "GPUS", "int"),
    Column("hours", "HOURS", "hours"),
    Column("mem_asked_mib", "MEM ASKED MiB", "asked"),
    Column("mem_granted_mib", "MEM GRANTED MiB", "mib"),
    Column("mem_peak_mib", "MEM PEAK MiB", "mib"),
    Column("mem_used_pct", "MEM USED%", "pct"),
    Column("sm_mean_pct", "SM MEAN%", "pct"),
    Column("sm_peak_pct", "SM PEAK%", "pct"),
    Column("exit_state", "EXIT", "text"),
)


def _job_base(r: tuple, runs: dict[str, int]) -> tuple:
    (job, user, account, partition, models, modes, shares, gpus, nodes, elapsed, asked, granted, peak,
     sm_ds, d_data, sm_peak, exit_state, _wasted, asked_raw, array_job, array_task, restarts, _gpu_mib) = r
    if restarts > 1:
        elapsed = runs[job]
    # an array task as sacct shows it (<array job>_<task>); its own job id stays in "job"
    array = f"{array_job}_{array_task}" if array_job and array_task is not None else ""
    # what was used is judged against the request, or against the grant when no size was asked
    return (job, array, user, account, partition, models, modes, shares, gpus, elapsed / 3600.0,
            asked_raw, granted, peak, _ratio(peak, asked, 100.0), _ratio(sm_ds, d_data), sm_peak, exit_state)


def job_report(store: Store, *, since: int | None = None, until: int | None = None,
               filters: Filters | None = None) -> Report:
    """One row per job that overlaps the period: what it asked for (per GPU device: ``gpushare:mem=``,
    or what it was granted when it asked for no size), was granted, its peak memory (the highest of its
    devices), its SM utilization averaged over its GPUs, its exit state.

    Raises:
        InputError: an empty period.
    """
    inner, params = _period(since, until, _JOB_COLUMNS_READ, filters, store.dialect)
    runs = _run_hours(store, inner, params)
    rows = tuple(_job_base(r, runs) for r in store.iterate(_job_sql(store, inner), params))
    return Report("jobs", "job", since, until, JOB_COLUMNS, rows)


WASTE_COLUMNS = (
    *JOB_COLUMNS[:11], JOB_COLUMNS[12], JOB_COLUMNS[13],
    Column("wasted_gib_hours", "WASTED GiB-H", "hours"),
    Column("would_fit", "WOULD FIT", "text"),
)


def waste_report(store: Store, *, since: int | None = None, until: int | None = None,
                 used_below: float = WASTE_USED_BELOW, rule: SuggestRule | None = None,
                 filters: Filters | None = None, limit: int | None = WASTE_LIMIT) -> Report:
    """Jobs whose peak memory was at most ``used_below`` of what they asked for (per device), with the
    request that would have fit, most wasted GiB-hours first. The request is jobstats' suggestion, by the site's
    one ``rule`` (:class:`~slurm_gpushare.accounting.jobstats.SuggestRule`: the peak plus the headroom, rounded to
    the model's MIG slices for a job on MIG, else to shard units, a whole GPU from the threshold on). Jobs
    without a measured peak are not judged, nor jobs that did not complete (``FAILED``, ``SIGNALED``: an
    out-of-memory failure must not be told to ask for less). A job whose request that fits would be no smaller
    is not listed. ``rule``: the defaults of :class:`SuggestRule` when None.

    ``limit``: list only that many jobs, the most wasteful (:attr:`Report.left_out` counts the others); None or 0
    lists every one. The jobs are read through a cursor and only the ``limit`` most wasteful so far are kept (a
    heap), so memory is bounded by the limit, not by the records or the jobs that qualify.

    Raises:
        InputError: an empty period or a negative limit.
    """
    if limit is not None and limit < 0:
        raise InputError(f"--limit {limit} is not a number of jobs", hint="give 1 or more, or 0 for all")
    keep = limit or None
    rule = rule if rule is not None else SuggestRule()
    inner, params = _period(since, until, _JOB_COLUMNS_READ, filters, store.dialect)
    # a job that failed or was killed may have failed for want of memory: it is not judged
    having = ('HAVING MAX("mem_peak_mib") IS NOT NULL AND '
              'MAX("mem_peak_mib") <= :used_below * MAX(COALESCE("mem_asked_mib", "mem_granted_mib")) AND '
              'SUM(CASE WHEN "exit_state" NOT IN (\'COMPLETED\', \'\') THEN 1 ELSE 0 END) = 0')
    runs = _run_hours(store, inner, params)
    qualified = 0

    def listed() -> Iterator[tuple]:
        nonlocal qualified
        for r in store.iterate(_job_sql(store, inner, having), {**params, "used_below": used_below}):
            base = _job_base(r, runs)
            models, modes, shares, gpus, nodes, asked, granted, peak, gpu_mib = (r[4], r[5], r[6], r[7], r[8], r[10],
                                                                                 r[11], r[12], r[22])
            on_mig = modes == "mig"
            slices = [mig_slice_mib(share, granted) for share in (shares or "").split(",") if share] if on_mig else []
            fit = rule.suggest(peak, rule.offer(models or "", gpu_mib or granted, slices), on_mig=on_mig,
                               count=max(1, gpus // max(1, nodes)))
            if fit.mib >= asked:
                continue
            qualified += 1
            yield (*base[:11], base[12], base[13], (r[17] or 0) / 1024.0 / 3600.0, fit.request)

    def order(row: tuple) -> tuple:  # most wasted GiB-hours first, then by job id
        return -row[13], str(row[0])

    # with a limit, nsmallest keeps only that many (a heap) while the jobs stream
    rows = sorted(listed(), key=order) if keep is None else heapq.nsmallest(keep, listed(), key=order)
    return Report("waste", "job", since, until, WASTE_COLUMNS, tuple(rows), left_out=qualified - len(rows))


# --- rendering -----------------------------------------------------------------------------------

def _cell(value, kind: str) -> str:
    if value is None:
        return NO_DATA if kind in ("hours", "pct", "mib") else "-"  # "asked": nothing was asked
    if kind == "hours":
        # short jobs (seconds, minutes) would all read 0.00 next to their efficiencies: show 2 significant digits
        if value == 0 or value >= 0.01:
            return f"{value:.2f}"
        return f"{value:.{1 - math.floor(math.log10(value))}f}"  # 0.0028, 0.000035
    if kind == "pct":
        return f"{value:.1f}"
    if kind in ("int", "mib", "asked"):
        return str(int(value))
    return str(value) if value != "" else "-"


def _plain(value, kind: str):
    if value is None:
        return None
    if kind == "hours":
        return round(value, 4)
    if kind == "pct":
        return round(value, 2)
    if kind in ("int", "mib", "asked"):
        return int(value)
    return value


def _when(t: int | None) -> str:
    return "-" if t is None else time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(t))


def to_table(report: Report) -> str:
    """Aligned columns (numbers right-aligned, "no data" where there is none), a title line naming the
    report and its period, and a TOTAL row for grouped reports."""
    title = {"usage": f"GPU usage by {report.by}", "jobs": "GPU usage by job",
             "waste": f"Jobs that used at most {WASTE_USED_BELOW:.0%} of the memory they asked for"}[report.kind]
    if report.since is not None or report.until is not None:
        title += f", {_when(report.since)} to {_when(report.until)} (local time)"
    rows = [tuple(_cell(v, c.kind) for v, c in zip(row, report.columns, strict=True)) for row in report.rows]
    if report.total is not None:
        rows.append(tuple(_cell(v, c.kind) for v, c in zip(report.total, report.columns, strict=True)))
    header = tuple(c.title for c in report.columns)
    widths = [max(len(x) for x in col) for col in zip(header, *rows, strict=True)]

    def line(cells: tuple[str, ...]) -> str:
        return "  ".join(cell.ljust(w) if c.kind == "text" else cell.rjust(w)
                         for cell, w, c in zip(cells, widths, report.columns, strict=True)).rstrip()

    out = [title, line(header)]
    out += [line(r) for r in rows]
    if not report.rows:
        out.append("(no records)")
    if report.left_out:
        out.append(f"({report.left_out} more {'job' if report.left_out == 1 else 'jobs'} wasted less; "
                   "--limit N shows N, --limit 0 all)")
    return "\n".join(out) + "\n"


def to_csv(report: Report) -> str:
    """A header of column names, then one line per row; "no data" is an empty cell; no total row."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow([c.name for c in report.columns])
    for row in report.rows:
        w.writerow(["" if v is None else _plain(v, c.kind) for v, c in zip(row, report.columns, strict=True)])
    return buf.getvalue()


def to_json(report: Report) -> str:
    """``{"report", "by", "since", "until", "columns", "rows": [{...}], "total": {...} | null, "left_out": N}``;
    "no data" is ``null``; ``left_out``: the rows a limit left out (``--waste --limit``), 0 when none."""
    names = [c.name for c in report.columns]

    def obj(row: tuple) -> dict:
        return {c.name: _plain(v, c.kind) for v, c in zip(row, report.columns, strict=True)}

    return json.dumps({"report": report.kind, "by": report.by, "since": report.since, "until": report.until,
                       "columns": names, "rows": [obj(r) for r in report.rows],
                       "total": obj(report.total) if report.total is not None else None,
                       "left_out": report.left_out}, indent=1) + "\n"


def render(report: Report, fmt: str = "table") -> str:
    """The report as ``table``, ``csv`` or ``json`` text.

    Raises:
        InputError: an unknown format.
    """
    if fmt not in FORMATS:
        raise InputError(f"unknown report format {fmt!r}", hint=f"use one of {', '.join(FORMATS)}")
    return {"table": to_table, "csv": to_csv, "json": to_json}[fmt](report)
