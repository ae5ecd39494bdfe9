"""The accounting store: spool files ingested into one SQLite file (stdlib ``sqlite3``, the default) or a
PostgreSQL database (a ``postgresql://`` URL; :mod:`~slurm_gpushare.accounting.backend`), the same tables in both.

One table, ``usage``, one row per record (columns named as the record's JSON keys, plus the computed
``gpu_share``), unique on ``(job_id, restart, submit, user, step, node, gpu_index, gpu_uuid, v)``: a record ingested
twice is stored once (of two records of one key, the one that saw more of the run:
:meth:`~slurm_gpushare.accounting.record.UsageRecord.saw_more`), and each run of a requeued job is a
row of its own. Ingest is resumable and exact:

* spool files are read in chunks of whole lines; the rows of a batch of chunks (about 16 MiB of text,
  several small files share one), their skipped lines and each file's new read position (table
  ``spool_progress``: byte offset, lines before it, fingerprints of the file's first 4 KiB and of the
  4 KiB before the offset) are committed in one transaction. A killed ingest leaves the database as of
  its last commit; the next run continues from the recorded offsets, and the unique key absorbs
  anything read twice, so nothing is lost and nothing is doubled;
* progress is by content, not by line number: a file whose first bytes or whose bytes before the
  recorded offset are not those read before (replaced, rotated, truncated, or edited: a line deleted
  or added before the offset shifts them) is read again from the start, and duplicates are dropped by
  the record key; a later record is never skipped;
* a line that is not a valid record (corrupt, an unknown version) is skipped, named by file and line
  in the result and kept in table ``skipped``; the rest of the file is ingested;
* an unterminated last line is not consumed (:attr:`IngestResult.incomplete`): a spool being copied or
  read over NFS may not have all of it yet, and the next ingest reads it once it ends in a newline
  (a local writer that died mid-line is closed by the next writer's newline, then skipped as corrupt);
* one ingest at a time per database (``<db>.ingest-lock``); reports may read meanwhile (WAL);
* the database, its directory and lock are the owner's only (0600/0700): records name users and
  accounts. Parse workers die with the ingest (``PR_SET_PDEATHSIG``, and they watch their parent).

Speed (docs/performance.md): worker processes parse and check batches (JSON, strict record checks
column by column) while this process inserts them with ``executemany``; WAL, ``synchronous=NORMAL``
(a committed transaction survives a crash of the process; a power loss may lose the last ones, which
the next ingest reads again from the spool), 8 KiB pages. The daily rollup the grouped reports read is kept in
the transaction of each batch (:mod:`~slurm_gpushare.accounting.rollup`). The indexes ``usage_by_user`` and
``usage_by_account`` cover the by-user and by-account reports the rollup does not serve, so that they read one
index in order instead of sorting the table; ``usage_by_start`` serves a report's period. Reports read through a cursor
(:meth:`Store.iterate`), and SQLite sorts what an index does not order in temporary files, not in memory.

PostgreSQL: one transaction per batch as with SQLite; the rows go in by ``COPY`` into a temporary table and
one ``INSERT ... SELECT ... ON CONFLICT`` from it (the same upsert); one ingest at a time per database
(a session advisory lock); a committed batch is as durable as the server makes commits (``synchronous_commit``,
on by default: flushed to its WAL before the commit returns).
"""

from __future__ import annotations

import ctypes
import gc
import hashlib
import marshal
import multiprocessing
import os
import re
import signal
import sqlite3
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path

from slurm_gpushare.accounting import rollup
from slurm_gpushare.accounting.backend import SQLITE, Dialect, PostgresDb, SqliteDb, is_url
from slurm_gpushare.accounting.record import FIELDS, SAW_MORE_SQL, UsageRecord, rows_from_lines, series_from_text
from slurm_gpushare.accounting.spool import DEFAULT_SPOOL_DIR, complete_size, spool_files
from slurm_gpushare.atomicfile import locked
from slurm_gpushare.errors import GpushareError, InputError

#: Where ``accounting ingest`` and ``report`` keep the database unless told otherwise.
DEFAULT_DB = "/var/lib/slurm-gpushare/accounting.db"
#: Version of the database layout (table ``meta``, key ``schema``). 2: records have ``restart`` (part of
#: the unique key); ``spool_progress`` has ``tail_sha1``. 3: records have the memory series
#: (``mem_series_mib`` as text ``"512,2048"``, ``mem_series_width``) and are all ``v`` 3. 4: the unique key
#: has the job's ``user`` (a job id Slurm gives another user again, after a lost StateSaveLocation or MaxJobId
#: wrapping, is another run, never a replacement of the first user's record). 5: records have ``submit``
#: (slurmctld's submit time of the run, 0 unknown), in the unique key too, and are all ``v`` 4: a job id Slurm
#: gives the same user again is another run as well (the start cannot serve: an Epilog run again without the
#: Prolog's run record writes the same run with another start). A database of an earlier layout is upgraded
#: in place. 6: the daily rollup the grouped reports read (:mod:`~slurm_gpushare.accounting.rollup`: tables
#: ``usage_day`` and ``usage_day_jobs``), made from the records when a database of layout 5 is opened.
SCHEMA_VERSION = 6
#: Bytes of spool text per transaction.
BATCH_BYTES = 16 << 20
#: Above this much unread spool text, chunks are parsed by worker processes while this one inserts.
PARALLEL_BYTES = 64 << 20
_HEAD = 4096  # bytes fingerprinted to recognise a file seen before

_SQL_TYPES = {
    "v": "INTEGER NOT NULL", "job_id": "TEXT NOT NULL", "restart": "INTEGER NOT NULL",
    "submit": "INTEGER NOT NULL DEFAULT 0",
    "array_job_id": "TEXT", "array_task_id": "INTEGER",
    "step": "TEXT NOT NULL", "user": "TEXT NOT NULL", "account": "TEXT NOT NULL", "partition": "TEXT NOT NULL",
    "node": "TEXT NOT NULL", "gpu_index": "INTEGER NOT NULL", "gpu_uuid": "TEXT NOT NULL",
    "gpu_model": "TEXT NOT NULL", "gpu_memory_mib": "INTEGER NOT NULL", "mode": "TEXT NOT NULL",
    "share": "TEXT NOT NULL", "mem_asked_mib": "INTEGER", "sm_asked_percent": "INTEGER",
    "mem_granted_mib": "INTEGER NOT NULL", "start": "INTEGER NOT NULL", "end": "INTEGER NOT NULL",
    "mem_peak_mib": "INTEGER", "sm_mean_percent": "REAL", "sm_peak_percent": "REAL",
    "samples": "INTEGER NOT NULL", "mem_series_mib": "TEXT", "mem_series_width": "INTEGER",
    "exit_state": "TEXT NOT NULL", "exit_code": "TEXT NOT NULL",
    "placement_cost": "REAL",
}
_COLUMNS = ", ".join(f'"{name}"' for name in FIELDS)
#: The share of its GPU a record held: 1 for a whole GPU, else its memory over the GPU's (at most 1).
GPU_SHARE_SQL = ('CASE WHEN "mode" = \'gpu\' OR "gpu_memory_mib" <= 0 THEN 1.0 '
                 'ELSE MIN(1.0, "mem_granted_mib" * 1.0 / "gpu_memory_mib") END')
#: :data:`GPU_SHARE_SQL` in PostgreSQL (a stored column there: PostgreSQL before 18 has no virtual ones)
_GPU_SHARE_PG = ('CASE WHEN "mode" = \'gpu\' OR "gpu_memory_mib" <= 0 THEN 1.0 '
                 'ELSE LEAST(1.0, CAST("mem_granted_mib" AS DOUBLE PRECISION) / "gpu_memory_mib") END')
_KEY = '"job_id", "restart", "submit", "user", "step", "node", "gpu_index", "gpu_uuid", "v"'
#: the report indexes: the group first, then every column the grouped report reads (covering)
_REPORT_COLUMNS = ('"job_id", "start", "end", "gpu_share", "mem_granted_mib", "mem_peak_mib", "sm_mean_percent", '
                   '"sm_peak_percent"')


def _usage_table(dialect: Dialect) -> str:
    columns = ", ".join(f'"{name}" {dialect.sql_type(_SQL_TYPES[name])}' for name in FIELDS)
    share = (f'"gpu_share" DOUBLE PRECISION GENERATED ALWAYS AS ({_GPU_SHARE_PG}) STORED' if dialect.postgres
             else f'"gpu_share" REAL GENERATED ALWAYS AS ({GPU_SHARE_SQL}) VIRTUAL')
    return f"({columns},\n    {share},\n    UNIQUE ({_KEY})\n)"


def _schema(dialect: Dialect) -> str:
    integer = dialect.sql_type("INTEGER")
    return f"""
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS usage {_usage_table(dialect)};
-- cover the by-user and by-account reports: each reads its index in group order, without sorting or
-- touching the table
CREATE INDEX IF NOT EXISTS usage_by_user ON usage ("user", {_REPORT_COLUMNS});
CREATE INDEX IF NOT EXISTS usage_by_account ON usage ("account", {_REPORT_COLUMNS});
-- a report's period: the records that start before its end
CREATE INDEX IF NOT EXISTS usage_by_start ON usage ("start");
CREATE TABLE IF NOT EXISTS spool_progress (
    file TEXT PRIMARY KEY, "offset" {integer} NOT NULL, lines {integer} NOT NULL,
    head_len {integer} NOT NULL, head_sha1 TEXT NOT NULL, tail_sha1 TEXT NOT NULL DEFAULT ''
);
CREATE TABLE IF NOT EXISTS skipped (
    file TEXT NOT NULL, line {integer} NOT NULL, reason TEXT NOT NULL, PRIMARY KEY (file, line)
);
{rollup.schema(dialect)}"""


_USAGE_TABLE = _usage_table(SQLITE)
_SCHEMA = _schema(SQLITE)
_COLUMNS_V1 = ", ".join(f'"{name}"' for name in FIELDS
                        if name not in ("restart", "submit", "v", "mem_series_mib", "mem_series_width"))
#: the columns layouts 3 and 4 share with this one, less ``v``
_COLUMNS_V4 = ", ".join(f'"{name}"' for name in FIELDS if name not in ("submit", "v"))
# layout 1 -> 3: rows get restart 0, no series and v 3 (what reading their version-1 lines now gives), the
# unique key gets restart, spool_progress gets tail_sha1 ('' = unknown: the file is read again, by key)
_UPGRADE_1 = f"""
CREATE TABLE usage_2 {_USAGE_TABLE};
INSERT OR IGNORE INTO usage_2 ("v", "restart", {_COLUMNS_V1}) SELECT 3, 0, {_COLUMNS_V1} FROM usage;
DROP TABLE usage;
ALTER TABLE usage_2 RENAME TO usage;
ALTER TABLE spool_progress ADD COLUMN tail_sha1 TEXT NOT NULL DEFAULT '';
UPDATE meta SET value = '3' WHERE key = 'schema';
"""
# layout 2 -> 3: the series columns (null: no series) and v 3 on every row, as reading their version-2
# lines now gives (so that ingesting such a line again is a duplicate, not a second row)
_UPGRADE_2 = """
ALTER TABLE usage ADD COLUMN "mem_series_mib" TEXT;
ALTER TABLE usage ADD COLUMN "mem_series_width" INTEGER;
UPDATE usage SET "v" = 3;
UPDATE meta SET value = '3' WHERE key = 'schema';
"""
# layout 3 or 4 -> 5 (SQLite): the table again with submit (0: unknown) in its unique key and v 4 on every row, as
# reading their version-3 lines now gives (indexes made again by _SCHEMA); layout 3 -> 4 only put the job's user
# into the unique key, which this table has too
_UPGRADE_4 = f"""
CREATE TABLE usage_5 {_USAGE_TABLE};
INSERT OR IGNORE INTO usage_5 ("submit", "v", {_COLUMNS_V4}) SELECT 0, 4, {_COLUMNS_V4} FROM usage;
DROP TABLE usage;
ALTER TABLE usage_5 RENAME TO usage;
UPDATE meta SET value = '5' WHERE key = 'schema';
"""
#: a record of a key already stored replaces it only where it saw more of the run (an Epilog run twice for
#: one run: :meth:`~slurm_gpushare.accounting.record.UsageRecord.saw_more`, as the sacct segment chooses);
#: the same record ingested again changes nothing
_UPSERT = (f'ON CONFLICT ({_KEY}) DO UPDATE SET ' + ", ".join(f'"{name}" = excluded."{name}"' for name in FIELDS)
           + " WHERE " + re.sub(r'(?<!excluded\.)"(\w+)"', r'usage."\1"', SAW_MORE_SQL))
# (the stored row's columns qualified: PostgreSQL finds them ambiguous beside excluded's)
_INSERT = f"INSERT INTO usage ({_COLUMNS}) VALUES ({', '.join('?' * len(FIELDS))}) {_UPSERT}"
# PostgreSQL: a batch is COPY'd into this temporary table, then upserted from it in one statement
_PG_BATCH = "CREATE TEMPORARY TABLE IF NOT EXISTS usage_batch (LIKE usage INCLUDING DEFAULTS) ON COMMIT DELETE ROWS"
_PG_INSERT = f"INSERT INTO usage ({_COLUMNS}) SELECT {_COLUMNS} FROM usage_batch {_UPSERT}"
_KEY_AT = tuple(FIELDS.index(name.strip('"')) for name in _KEY.split(", "))
_JOB_AT = FIELDS.index("job_id")
# one ingest at a time per PostgreSQL database: pg_advisory_lock's key ("gpushare" in ASCII)
_PG_LOCK = 0x6770757368617265


class StoreError(GpushareError):
    """The database cannot be opened, has another layout version, or SQLite failed. ``source`` is its path."""


@dataclass(frozen=True)
class Skipped:
    """A spool line that was not ingested: ``file:line: reason``."""

    file: str
    line: int
    reason: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.reason}"


@dataclass(frozen=True)
class IngestResult:
    """What one ingest did.

    Attributes:
        ingested: records newly stored.
        duplicates: valid records already stored (read again after a kill, or ingested twice).
        skipped: lines that were not valid records, in file order (also kept in table ``skipped``).
        files: spool files looked at.
        incomplete: unterminated last lines, not consumed: read by a later ingest once complete.
    """

    ingested: int = 0
    duplicates: int = 0
    skipped: tuple[Skipped, ...] = ()
    files: int = 0
    incomplete: tuple[Skipped, ...] = ()


@dataclass
class IngestProgress:
    """Passed to ``on_commit`` after each committed transaction: running totals of this ingest, the
    last file and offset committed, and the lines skipped in that transaction."""

    file: str
    offset: int
    ingested: int = 0
    duplicates: int = 0
    skipped: list[Skipped] = field(default_factory=list)
    new_skipped: list[Skipped] = field(default_factory=list)
    incomplete: list[Skipped] = field(default_factory=list)


class Store:
    """The accounting database.

    Args:
        path: the SQLite file, ``":memory:"`` (tests), or a PostgreSQL server's URL
            (``postgresql://[user@][host][:port]/dbname[?...]``, libpq's form: a password from ``~/.pgpass`` or
            ``PGPASSFILE`` rather than in the URL; needs the extra ``slurm-gpushare[postgresql]``).
        create: create the database's tables when missing (and, for SQLite, the file and its directory's
            last component); otherwise a missing file or one without them is an error (``report`` must not
            invent an empty database, and reads without taking the write lock). A PostgreSQL database
            itself is the site's to create (``createdb``).

    Raises:
        StoreError: missing file (without ``create``), not an SQLite database, another layout version, a
            server that cannot be reached or refuses, psycopg not installed.
    """

    def __init__(self, path: str | Path = ":memory:", *, create: bool = True):
        self.path = str(path)
        self.url = is_url(self.path)
        #: where the store is, for messages (a URL without its password)
        self.where = _redact(self.path) if self.url else self.path
        db: SqliteDb | PostgresDb | None = None
        if self.url:
            try:
                db = PostgresDb(self.path)
            except ImportError:
                raise StoreError("a PostgreSQL store needs psycopg 3, which is not installed",
                                 hint="pip install 'slurm-gpushare[postgresql]' (or psycopg[binary])") from None
            except Exception as e:  # psycopg.Error (not importable without psycopg)
                raise StoreError(f"cannot connect to the accounting database: {_one_line(e)}",
                                 source=self.where) from None
            self._db: SqliteDb | PostgresDb = db
            try:
                self._prepare(create)
            except (StoreError, db.errors[0]) as e:
                db.close()
                if isinstance(e, StoreError):
                    raise
                raise StoreError(f"cannot open the accounting database: {_one_line(e)}", source=self.where) from None
            return
        memory = self.path == ":memory:"
        if not memory:
            p = Path(self.path)
            if not p.exists():
                if not create:
                    raise StoreError(f"no accounting database at {p}",
                                     hint="run 'slurm-gpushare accounting ingest' first, or give --db")
                if not p.parent.is_dir():
                    if not p.parent.parent.is_dir():
                        raise StoreError(f"cannot create {p}: {p.parent.parent} does not exist")
                    p.parent.mkdir(mode=0o700)
                # sqlite creates the file (and -wal, -shm) with 0644 less the umask: others' records
                os.close(os.open(p, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600))
        try:
            lite = db = SqliteDb(self.path)
            self._db = lite
            db.execute("PRAGMA busy_timeout = 30000")
            # a new database only: 8 KiB pages made ingest ~15% faster than 4 KiB (fewer B-tree splits)
            db.execute("PRAGMA page_size = 8192")
            if not memory:
                db.execute("PRAGMA journal_mode = WAL")
            # temp_store stays FILE: a report's sort of more rows than the cache holds spills to a
            # temporary file instead of growing this process (bounded memory at any size)
            db.script("PRAGMA synchronous = NORMAL; PRAGMA cache_size = -65536; PRAGMA threads = 2;")
            if self._layout() in ("1", "2", "3", "4", "5"):
                # under the ingest lock: an ingest of the release before, running, would add records the rollup
                # does not know; and checked again inside it (another process may have upgraded meanwhile)
                with nullcontext() if memory else locked(f"{self.path}.ingest-lock"):
                    layout = self._layout()
                    if layout in ("1", "2", "3", "4"):
                        steps = {"1": _UPGRADE_1, "2": _UPGRADE_2, "3": "", "4": ""}[layout]
                        db.script("BEGIN IMMEDIATE;" + steps + _UPGRADE_4 + _SCHEMA + "COMMIT;")
                    if self._layout() == "5":
                        db.script("BEGIN IMMEDIATE;" + _SCHEMA)  # (executescript commits a transaction begun before)
                        self._upgrade_5()
                        db.commit()
            self._prepare(create)
        except (sqlite3.Error, StoreError, OSError) as e:
            if db is not None:
                db.close()
            if isinstance(e, StoreError):
                raise
            if isinstance(e, OSError):  # the ingest lock of an upgrade
                raise StoreError(f"cannot take the ingest lock to upgrade the database's layout: {e.strerror or e}",
                                 source=self.path, hint="run 'slurm-gpushare accounting ingest' once as the "
                                 "database's owner") from None
            raise StoreError(f"cannot open the accounting database: {e}", source=self.path) from None

    def _layout(self) -> str | None:
        """An SQLite database's layout version (None: no table ``meta`` yet)."""
        db = self._db
        found = db.execute("SELECT 1 FROM sqlite_master WHERE name = 'meta'") and \
            db.execute("SELECT value FROM meta WHERE key = 'schema'")
        return found[0][0] if found else None

    @property
    def dialect(self) -> Dialect:
        """The SQL dialect of this store's database (reports build their queries with it)."""
        return self._db.dialect

    def _prepare(self, create: bool) -> None:
        """Create the tables (``create``) or check they are there, and check the layout version."""
        db = self._db
        if create:
            if self.url:
                db.begin()
                db.execute("SELECT pg_advisory_xact_lock(?)", (_PG_LOCK,))  # two first ingests at once
                db.script(_schema(db.dialect))
                db.commit()
            else:
                db.script("BEGIN IMMEDIATE;" + _SCHEMA + "COMMIT;")
        elif not self._has_meta():
            raise StoreError("not an accounting database (no table meta)", source=self.where,
                             hint="run 'slurm-gpushare accounting ingest' with this --db first" if self.url else None)
        row = db.execute("SELECT value FROM meta WHERE key = 'schema'")
        if self.url and row and row[0][0] in ("3", "4", "5"):
            self._upgrade_pg()
            row = db.execute("SELECT value FROM meta WHERE key = 'schema'")
        if not row:
            if not create:
                raise StoreError("not an accounting database (no layout version)", source=self.where)
            db.execute("INSERT INTO meta VALUES ('schema', ?) ON CONFLICT DO NOTHING", (str(SCHEMA_VERSION),))
        elif row[0][0] != str(SCHEMA_VERSION):
            raise StoreError(f"database layout version {row[0][0]}; this slurm-gpushare uses {SCHEMA_VERSION}",
                             source=self.where, hint="use the slurm-gpushare release that created it")

    def _upgrade_pg(self) -> None:
        """PostgreSQL layout 3, 4 or 5 -> 6 (one transaction, under the ingest lock): the column ``submit`` (0:
        unknown) and ``v`` 4 on every row, as reading their version-3 lines now gives; the unique key gets
        ``submit`` (and, from layout 3, the job's user); then the rollup (:meth:`_upgrade_5`)."""
        db = self._db
        db.begin()
        db.execute("SELECT pg_advisory_xact_lock(?)", (_PG_LOCK,))
        if db.execute("SELECT value FROM meta WHERE key = 'schema'") in ([("3",)], [("4",)]):
            for (name,) in db.execute("SELECT conname FROM pg_constraint WHERE conrelid = 'usage'::regclass "
                                      "AND contype = 'u'"):
                db.execute(f'ALTER TABLE usage DROP CONSTRAINT "{name}"')
            db.execute(f'ALTER TABLE usage ADD COLUMN "submit" {db.dialect.sql_type(_SQL_TYPES["submit"])}')
            db.execute('UPDATE usage SET "v" = 4')
            db.execute(f"ALTER TABLE usage ADD UNIQUE ({_KEY})")
            db.execute("UPDATE meta SET value = '5' WHERE key = 'schema'")
        if db.execute("SELECT value FROM meta WHERE key = 'schema'") == [("5",)]:
            db.script(rollup.schema(db.dialect))
            self._upgrade_5()
        db.commit()

    def _upgrade_5(self) -> None:
        """Layout 5 -> 6 (in the open transaction): the rollup made from every stored record."""
        rollup.rebuild(self._db)
        self._db.execute("UPDATE meta SET value = '6' WHERE key = 'schema'")

    def _has_meta(self) -> bool:
        if self.url:
            return bool(self._db.execute("SELECT 1 FROM information_schema.tables WHERE table_name = 'meta' "
                                         "AND table_schema = current_schema()"))
        return bool(self._db.execute("SELECT 1 FROM sqlite_master WHERE name = 'meta'"))

    # --- lifecycle -------------------------------------------------------------------------------

    def close(self) -> None:
        """Close the connection."""
        self._db.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- writing ---------------------------------------------------------------------------------

    def add(self, records: Iterable[UsageRecord]) -> tuple[int, int]:
        """Store records directly (tests, tools); returns ``(inserted, duplicates)``.

        Raises:
            StoreError: the database failed (nothing of this call is stored).
        """
        rows = [r.row() for r in records]
        try:
            self._db.begin()
            inserted = self._upsert(rows)
            self._db.commit()
        except self._db.errors as e:
            self._rollback()
            raise StoreError(f"cannot store records: {_one_line(e)}", source=self.where) from None
        return inserted, len(rows) - inserted

    def _upsert(self, rows: list[tuple], pre: tuple | None = None) -> int:
        """Store rows (in the open transaction), a record of a key already stored replacing it only where it
        saw more; the rows changed (inserted or replaced). SQLite: ``executemany`` of the upsert. PostgreSQL:
        ``COPY`` into a temporary table and one upsert from it; a batch holding one key twice (an Epilog run
        twice, both lines in one batch) goes row by row instead, so that the two meet as they do in SQLite. The
        rollup follows in the same transaction: the rows of the batch's jobs before and after
        (:func:`~slurm_gpushare.accounting.rollup.apply`), or ``pre``, a parse worker's sums of the batch
        (:func:`~slurm_gpushare.accounting.rollup.batch_delta`), less what it could not know."""
        db = self._db
        jobs = {row[_JOB_AT] for row in rows}
        before = rollup.job_rows(db, jobs)
        changed = self._upsert_rows(rows)
        if pre is None:
            if changed:
                rollup.apply(db, before, rollup.job_rows(db, jobs))
            return changed
        # a parse worker summed the batch as if every record were new and its jobs had no other: so it is but for
        # the jobs with records stored before or a key twice in the batch, which go the long way
        marshalled, twice = pre
        slow = {row[0] for row in before} | set(twice)
        delta = rollup.take_out(marshalled, rows, slow, FIELDS)
        if slow:
            rollup.apply(db, [row for row in before if row[0] in slow], rollup.job_rows(db, slow))
        rollup.write(db, delta)
        return changed

    def _upsert_rows(self, rows: list[tuple]) -> int:
        db = self._db
        if isinstance(db, SqliteDb):
            with _gc_paused():
                return db.executemany(_INSERT, rows)
        if len({tuple(row[i] for i in _KEY_AT) for row in rows}) < len(rows):
            return db.executemany(_INSERT, rows)
        db.execute(_PG_BATCH)
        db.copy_rows("usage_batch", _COLUMNS, rows)
        changed = db.execute(_PG_INSERT + " RETURNING 1")
        db.execute("DELETE FROM usage_batch")
        return len(changed)

    def ingest(self, sources: str | Path | Iterable[str | Path], *,
               on_skip: Callable[[Skipped], None] | None = None,
               on_commit: Callable[[IngestProgress], None] | None = None,
               batch_bytes: int = BATCH_BYTES, workers: int | None = None,
               parallel_bytes: int = PARALLEL_BYTES) -> IngestResult:
        """Load spool files (see module docstring).

        Args:
            sources: spool directories (every ``*.jsonl`` in them) and/or files.
            on_skip: called for each skipped line once it is committed (the CLI prints a warning).
            on_commit: called after each committed transaction with running totals (progress display;
                an exception raised there stops the ingest after that commit).
            batch_bytes: spool text per transaction (small files share one).
            workers: processes that parse and check chunks while this one inserts (default: one per
                CPU, at most 4); ``0`` or ``1``: parse here.
            parallel_bytes: use the workers only when more unread text than this is waiting.

        Returns:
            Counts of this run: records ingested, duplicates, skipped lines, files.

        Raises:
            InputError: a spool directory or file that does not exist.
            StoreError: SQLite failed, or a spool file cannot be read (``source`` names it); whatever
                was committed before stays, and the next ingest continues from there.
        """
        if isinstance(sources, (str, Path)):
            sources = [sources]
        paths: list[Path] = []
        for s in sources:
            p = Path(s)
            if not p.exists():
                raise InputError(f"spool directory or file {p} does not exist",
                                 hint=f"the Epilog writes to {DEFAULT_SPOOL_DIR} unless configured otherwise")
            paths.extend(spool_files(p) if p.is_dir() else [p])
        if workers is None:
            workers = min(4, os.cpu_count() or 1)
        progress = IngestProgress(file="", offset=0)
        pool: ProcessPoolExecutor | None = None
        with self._ingest_lock():
            try:
                files = [self._open(p) for p in paths]
                if workers > 1 and sum(f.size - f.offset for f in files) > parallel_bytes:
                    pool = _parse_pool(workers)
                self._run(files, progress, on_skip, on_commit, max(batch_bytes, 1), pool,
                          2 * workers if pool else 1)
            except self._db.errors as e:
                self._rollback()
                raise StoreError(f"ingest of {progress.file or 'spool files'} failed: {_one_line(e)}",
                                 source=self.where) from None
            finally:
                if pool is not None:
                    pool.shutdown(wait=True, cancel_futures=True)
        return IngestResult(progress.ingested, progress.duplicates, tuple(progress.skipped), len(paths),
                            tuple(progress.incomplete))

    @contextmanager
    def _ingest_lock(self) -> Iterator[None]:
        """One ingest at a time per database (a second one waits): ``<db>.ingest-lock``, flock'ed.
        (Not the database file itself: closing another descriptor of it would drop SQLite's own locks.)
        PostgreSQL: a session advisory lock of the database, held by this connection."""
        if self.url:
            self._db.execute("SELECT pg_advisory_lock(?)", (_PG_LOCK,))
            try:
                yield
            finally:
                self._db.execute("SELECT pg_advisory_unlock(?)", (_PG_LOCK,))
            return
        if self.path == ":memory:":
            yield
            return
        with locked(f"{self.path}.ingest-lock"):
            yield

    def _rollback(self) -> None:
        self._db.rollback()

    def _open(self, path: Path) -> _File:
        """A spool file's complete size, its first bytes, and where to continue: the recorded offset,
        or 0 for a new file or one that changed (shorter, other first bytes, other bytes before the
        recorded offset, or recorded without that fingerprint).

        Raises:
            StoreError: the file cannot be read.
        """
        name = str(path.absolute())
        found = self._db.execute('SELECT "offset", lines, head_len, head_sha1, tail_sha1 FROM spool_progress '
                                 "WHERE file = ?", (name,))
        row = found[0] if found else None
        try:
            size = complete_size(path)
            with open(path, "rb") as f:
                head = f.read(min(_HEAD, size))
                before = b""
                if row is not None and 0 < row[0] <= size:
                    f.seek(row[0] - min(_HEAD, row[0]))
                    before = f.read(min(_HEAD, row[0]))
        except OSError as e:
            raise StoreError(f"cannot read spool file: {e.strerror or e}", source=str(path)) from None
        if row is None:
            return _File(path, name, size, head, 0, 0, None)
        offset, lines, head_len, head_sha1, tail_sha1 = row
        if (offset > size or len(head) < head_len or hashlib.sha1(head[:head_len]).hexdigest() != head_sha1
                or hashlib.sha1(before).hexdigest() != tail_sha1):
            return _File(path, name, size, head, 0, 0, offset, reread=True)
        return _File(path, name, size, head, offset, lines, offset, before)

    def _run(self, files: list[_File], progress: IngestProgress, on_skip, on_commit, batch_bytes: int,
             pool: ProcessPoolExecutor | None, depth: int) -> None:
        """Stream every file's unread lines in batches of chunks (a chunk: whole lines of one file; a
        batch: about ``batch_bytes`` of chunks of consecutive files), parse each batch (in ``pool``, up
        to ``depth`` batches ahead, or here) and commit each in one transaction, in order."""
        in_flight: deque[tuple[list[_Chunk], Future | None]] = deque()
        batches = _batches(_chunks(files, batch_bytes), batch_bytes)
        try:
            while True:
                while len(in_flight) < depth:
                    batch = next(batches, None)
                    if batch is None:
                        break
                    bodies = [c.body for c in batch]
                    in_flight.append((batch, pool.submit(_parse_marshalled, bodies) if pool else None))
                if not in_flight:
                    return
                batch, future = in_flight.popleft()
                parsed, pre = _unmarshal(future.result()) if future else (_parse([c.body for c in batch]), None)
                self._commit([(c, rows, errors) for c, (rows, errors) in zip(batch, parsed, strict=True)],
                             progress, pre)
                for s in progress.new_skipped:
                    if on_skip:
                        on_skip(s)
                if on_commit:
                    on_commit(progress)
        finally:
            for _, future in in_flight:
                if future:
                    future.cancel()

    def _commit(self, group: list[tuple[_Chunk, list[tuple], list[tuple[int, str]]]],
                progress: IngestProgress, pre: tuple | None = None) -> None:
        """Chunks in one transaction: their rows, their skipped lines, each file's new position (``pre``: the
        rollup's sums of the rows from the parse worker)."""
        skipped: list[Skipped] = []
        incomplete: list[Skipped] = []
        positions: dict[str, tuple] = {}
        expected: dict[str, int | None] = {}
        lines: dict[str, int] = {}
        for chunk, _rows, errors in group:
            f = chunk.file
            expected.setdefault(f.name, f.recorded)
            before = lines.get(f.name, f.lines)
            skipped += [Skipped(f.name, before + 1 + i, reason) for i, reason in errors]
            if chunk.tail:
                # not consumed: a copied or NFS spool may not have the rest yet; a local writer that
                # died is closed by the next one's newline, and the fragment is then skipped as corrupt
                incomplete.append(Skipped(f.name, before + chunk.newlines + 1,
                                          f"incomplete last line ({chunk.tail} bytes, no newline yet): "
                                          "not ingested until it ends"))
            lines[f.name] = before + chunk.newlines
            head_len = min(_HEAD, chunk.end)
            positions[f.name] = (f.name, chunk.end, lines[f.name], head_len,
                                 hashlib.sha1(f.head[:head_len]).hexdigest(), chunk.before_sha1)
        rows = [row for _, chunk_rows, _ in group for row in chunk_rows]
        db = self._db
        db.begin()
        try:
            for name, recorded in expected.items():
                found = db.execute('SELECT "offset" FROM spool_progress WHERE file = ?', (name,))
                row = found[0] if found else None
                if (row[0] if row else None) != recorded:
                    raise StoreError(f"{name} was ingested by another writer meanwhile (offset "
                                     f"{row and row[0]}, expected {recorded})", source=self.where,
                                     hint="run ingest again")
            for name in {c.file.name for c, _, _ in group if c.file.reread}:
                db.execute("DELETE FROM skipped WHERE file = ?", (name,))  # its line numbers are new
            inserted = self._upsert(rows, pre)
            if skipped:
                db.executemany("INSERT INTO skipped VALUES (?, ?, ?) ON CONFLICT DO NOTHING",
                               [(s.file, s.line, s.reason) for s in skipped])
            db.executemany("INSERT INTO spool_progress VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (file) DO UPDATE SET "
                           '"offset" = excluded."offset", lines = excluded.lines, head_len = excluded.head_len, '
                           "head_sha1 = excluded.head_sha1, tail_sha1 = excluded.tail_sha1", list(positions.values()))
            db.commit()
        except BaseException:
            self._rollback()
            raise
        for chunk, _, _ in group:
            chunk.file.recorded = chunk.file.offset = chunk.end
            chunk.file.lines = lines[chunk.file.name]
            chunk.file.reread = False
        last = group[-1][0]
        progress.file, progress.offset = last.file.name, last.end
        progress.ingested += inserted
        progress.duplicates += len(rows) - inserted
        progress.skipped.extend(skipped)
        progress.new_skipped = skipped
        progress.incomplete.extend(incomplete)

    # --- reading ---------------------------------------------------------------------------------

    def query(self, sql: str, params: dict | tuple = ()) -> list[tuple]:
        """Run a read-only SQL query (reports); rows as tuples. SQL in the common dialect
        (:mod:`~slurm_gpushare.accounting.backend`: ``?`` or ``:name`` parameters).

        Raises:
            StoreError: the database refused it.
        """
        try:
            return self._db.execute(sql, params)
        except self._db.errors as e:
            self._rollback()
            raise StoreError(f"query failed: {_one_line(e)}", source=self.where) from None

    def iterate(self, sql: str, params: dict | tuple = ()) -> Iterator[tuple]:
        """:meth:`query`, its rows yielded as the database produces them (a report over millions of rows holds
        a few thousand at a time).

        Raises:
            StoreError: the database refused it.
        """
        try:
            yield from self._db.iterate(sql, params)
        except self._db.errors as e:
            self._rollback()
            raise StoreError(f"query failed: {_one_line(e)}", source=self.where) from None

    def count(self) -> int:
        """Number of stored records."""
        return self.query("SELECT COUNT(*) FROM usage")[0][0]

    def records(self, *, job_id: str | None = None, user: str | None = None) -> list[UsageRecord]:
        """Stored records, optionally of one job or user, ordered by job, node, GPU."""
        where, params = [], []
        if job_id is not None:
            where.append('"job_id" = ?')
            params.append(job_id)
        if user is not None:
            where.append('"user" = ?')
            params.append(user)
        sql = f"SELECT {_COLUMNS} FROM usage" + (f" WHERE {' AND '.join(where)}" if where else "")
        d = self.dialect
        sql += (f' ORDER BY {d.numeric_order(chr(34) + "job_id" + chr(34))}, '
                + ", ".join(d.text_order(f'"{c}"') for c in ("job_id", "step", "node"))
                + f', "gpu_index", {d.text_order(chr(34) + "gpu_uuid" + chr(34))}')
        out = []
        for row in self.query(sql, tuple(params)):
            data = dict(zip(FIELDS, row, strict=True))
            data["mem_series_mib"] = series_from_text(data["mem_series_mib"])
            out.append(UsageRecord(**data))
        return out

    def skipped(self) -> list[Skipped]:
        """Every line ever skipped by ingest, by file and line."""
        return [Skipped(*row) for row in self.query("SELECT file, line, reason FROM skipped ORDER BY file, line")]


@dataclass
class _File:
    """A spool file being ingested: where it is, its complete size and first bytes, and how far it has
    been committed (``offset``, ``lines`` before it; ``recorded``: the offset in the database;
    ``before``: up to 4 KiB before ``offset``; ``reread``: read again from the start, its old skipped
    lines to be forgotten)."""

    path: Path
    name: str
    size: int
    head: bytes
    offset: int
    lines: int
    recorded: int | None
    before: bytes = b""
    reread: bool = False


@dataclass(frozen=True)
class _Chunk:
    """Whole lines of one file: ``body`` ends at byte ``end`` and holds ``newlines`` lines; ``tail``: bytes
    of an unterminated last line after it (not consumed); ``before_sha1``: SHA-1 of the 4 KiB before
    ``end``."""

    file: _File
    body: bytes
    end: int
    newlines: int
    tail: int
    before_sha1: str


def _chunks(files: list[_File], batch_bytes: int) -> Iterator[_Chunk]:
    """Every file's unread text, in chunks of whole lines of about ``batch_bytes``.

    Raises:
        StoreError: a file cannot be read (named).
    """
    for spool in files:
        offset = spool.offset
        before = spool.before
        try:
            with open(spool.path, "rb") as f:
                while offset < spool.size:
                    f.seek(offset)
                    data = f.read(min(batch_bytes, spool.size - offset))
                    cut = data.rfind(b"\n")
                    while cut < 0 and offset + len(data) < spool.size:  # a line longer than a batch
                        data += f.read(min(batch_bytes, spool.size - offset - len(data)))
                        cut = data.rfind(b"\n")
                    body = data[: cut + 1]
                    tail = len(data) - len(body) if offset + len(data) == spool.size else 0
                    offset += len(body)
                    before = (before + body[-_HEAD:])[-_HEAD:]
                    if body or tail:
                        yield _Chunk(spool, body, offset, body.count(b"\n"), tail,
                                     hashlib.sha1(before).hexdigest())
                    if tail:
                        break
        except OSError as e:
            raise StoreError(f"cannot read spool file: {e.strerror or e}", source=str(spool.path)) from None


def _batches(chunks: Iterator[_Chunk], batch_bytes: int) -> Iterator[list[_Chunk]]:
    """Consecutive chunks grouped up to ``batch_bytes`` (one chunk when it alone is that big)."""
    batch: list[_Chunk] = []
    size = 0
    for chunk in chunks:
        if batch and size + len(chunk.body) > batch_bytes:
            yield batch
            batch, size = [], 0
        batch.append(chunk)
        size += len(chunk.body)
    if batch:
        yield batch


def _parse(bodies: list[bytes]) -> list[tuple[list[tuple], list[tuple[int, str]]]]:
    """Rows and errors of each chunk of whole lines (in place)."""
    with _gc_paused():
        return [rows_from_lines(body.split(b"\n")[:-1]) for body in bodies]


def _parse_marshalled(bodies: list[bytes]) -> bytes:
    """:func:`_parse` in a parse worker, with the rollup's sums of the batch
    (:func:`~slurm_gpushare.accounting.rollup.batch_delta`); the answer is ``marshal``-ed (rows are plain str,
    int, float and None; marshal packs them several times faster than pickle, and both ends run the same
    Python)."""
    parsed = _parse(bodies)
    with _gc_paused():
        pre = rollup.batch_delta([row for rows, _ in parsed for row in rows], FIELDS)
    return marshal.dumps((parsed, pre))


def _unmarshal(data: bytes) -> tuple[list[tuple[list[tuple], list[tuple[int, str]]]], tuple]:
    with _gc_paused():
        return marshal.loads(data)


def _parse_pool(workers: int) -> ProcessPoolExecutor:
    """Parse workers: forked where the platform can (cheap, nothing to import), else spawned. Each dies
    with this process (:func:`_die_with_parent`)."""
    methods = multiprocessing.get_all_start_methods()
    context = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
    return ProcessPoolExecutor(max_workers=workers, mp_context=context, initializer=_die_with_parent,
                               initargs=(os.getpid(),))


_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _die_with_parent(parent: int) -> None:
    """In a parse worker: be killed (SIGKILL) when the ingest process dies, even by ``kill -9``.

    Linux ``prctl(PR_SET_PDEATHSIG)`` where there is one; the signal comes when the thread that forked
    the worker ends, which for the pool's workers is the ingest's own. Everywhere, a thread also checks
    once a second that the parent is still the one that started the worker (a parent that died before
    the prctl, or a platform without it).
    """
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:
        os._exit(1)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


@contextmanager
def _gc_paused() -> Iterator[None]:
    """No cyclic garbage collection while a chunk is parsed: tens of thousands of new dicts and tuples
    (none of them cyclic) would trigger it over and over (about 10% of parse time)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _redact(url: str) -> str:
    """A URL without the password it may hold (``postgresql://user:secret@host/db`` -> ``user:***@``)."""
    return re.sub(r"(?<=://)([^/@:]*):[^/@]*@", r"\1:***@", url)


def _one_line(e: BaseException) -> str:
    """An exception's message on one line (PostgreSQL's carry DETAIL and HINT lines)."""
    return " ".join(str(e).split()) or type(e).__name__


def default_db() -> str:
    """The database: ``$GPUSHARE_ACCOUNTING_DB`` when set (an SQLite path or a ``postgresql://`` URL), else
    :data:`DEFAULT_DB`."""
    return os.environ.get("GPUSHARE_ACCOUNTING_DB") or DEFAULT_DB
