"""The two databases the accounting store runs on: SQLite (stdlib ``sqlite3``, one file, the default) and
PostgreSQL (``psycopg`` 3, the optional extra ``slurm-gpushare[postgresql]``), chosen by the store's target: a
``postgresql://`` (or ``postgres://``) URL is a server, anything else an SQLite file.

Both run the same SQL, written once in the common dialect (``?`` and ``:name`` parameters, double-quoted
identifiers, ``CAST(x AS DOUBLE PRECISION)``, ``ON CONFLICT``); :class:`Dialect` holds what differs (scalar
``MIN``/``MAX`` of two values, dates, string aggregation, the numeric order of job ids, column types), and
:class:`PostgresDb` rewrites the parameters into psycopg's ``%s`` / ``%(name)s``.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

#: URL schemes that name a PostgreSQL server.
POSTGRES_SCHEMES = ("postgresql://", "postgres://")


def is_url(target: str) -> bool:
    """Whether a store target names a PostgreSQL server (else it is an SQLite file)."""
    return target.startswith(POSTGRES_SCHEMES)


@dataclass(frozen=True)
class Dialect:
    """What differs between the SQL of the two databases. ``name``: ``sqlite`` or ``postgresql``."""

    name: str

    @property
    def postgres(self) -> bool:
        """Whether this is PostgreSQL."""
        return self.name == "postgresql"

    def greatest(self, a: str, b: str) -> str:
        """The larger of two values (SQLite's two-argument ``MAX``)."""
        return f"GREATEST({a}, {b})" if self.postgres else f"MAX({a}, {b})"

    def least(self, a: str, b: str) -> str:
        """The smaller of two values."""
        return f"LEAST({a}, {b})" if self.postgres else f"MIN({a}, {b})"

    def utc_date(self, column: str, length: int) -> str:
        """The first ``length`` characters of ``YYYY-MM-DD`` of an epoch-seconds column, UTC (10: day, 7: month)."""
        if self.postgres:
            fmt = "YYYY-MM-DD"[:length]
            return f"to_char(to_timestamp({column}) AT TIME ZONE 'UTC', '{fmt}')"
        fmt = "%Y-%m-%d" if length == 10 else "%Y-%m"
        return f"strftime('{fmt}', {column}, 'unixepoch')"

    def concat_distinct(self, column: str) -> str:
        """The distinct values of a text column joined by ``,``."""
        return f"STRING_AGG(DISTINCT {column}, ',')" if self.postgres else f"GROUP_CONCAT(DISTINCT {column})"

    def numeric_order(self, column: str) -> str:
        """A text column's leading digits as a number (job ids sort 9 before 10), 0 without any: SQLite's
        ``CAST(x AS INTEGER)``."""
        if self.postgres:
            return f"COALESCE(CAST(NULLIF(substring({column} from '^[0-9]{{1,18}}'), '') AS BIGINT), 0)"
        return f"CAST({column} AS INTEGER)"

    def text_order(self, column: str) -> str:
        """A text column in byte order (SQLite's BINARY collation; PostgreSQL's database collation may be a
        locale's)."""
        return f'{column} COLLATE "C"' if self.postgres else column

    def sql_type(self, sqlite_type: str) -> str:
        """A column type of the SQLite layout in this database: PostgreSQL's ``INTEGER`` is 32 bits (epoch
        seconds times MiB overflow it) and its ``REAL`` single precision, so they are ``BIGINT`` and
        ``DOUBLE PRECISION`` there."""
        if not self.postgres:
            return sqlite_type
        return sqlite_type.replace("INTEGER", "BIGINT").replace("REAL", "DOUBLE PRECISION")


SQLITE = Dialect("sqlite")
POSTGRESQL = Dialect("postgresql")

_TOKENS = re.compile(r"""('(?:[^']|'')*')|("(?:[^"]|"")*")|(\?)|(?<![:\w]):([A-Za-z_]\w*)|(%)""")


def pg_params(sql: str) -> str:
    """SQL with ``?`` and ``:name`` parameters as psycopg's ``%s`` and ``%(name)s`` (``%`` doubled), leaving
    string literals and quoted identifiers alone.

    >>> pg_params("SELECT '%Y:x', t.a FROM t WHERE b = ? AND c = :c")
    "SELECT '%%Y:x', t.a FROM t WHERE b = %s AND c = %(c)s"
    """
    def sub(m: re.Match) -> str:
        literal, ident, qmark, name, percent = m.groups()
        if literal is not None:
            return literal.replace("%", "%%")
        if ident is not None:
            return ident
        if qmark is not None:
            return "%s"
        if name is not None:
            return f"%({name})s"
        return "%%"

    return _TOKENS.sub(sub, sql)


class SqliteDb:
    """An SQLite connection in autocommit mode (transactions are explicit ``BEGIN IMMEDIATE``/``COMMIT``)."""

    dialect = SQLITE
    errors: tuple[type[BaseException], ...] = (sqlite3.Error,)

    def __init__(self, path: str):
        self.conn = sqlite3.connect(path, isolation_level=None)

    def execute(self, sql: str, params: Sequence | dict = ()) -> list[tuple]:
        """Run one statement; its rows."""
        return self.conn.execute(sql, params).fetchall()

    def iterate(self, sql: str, params: Sequence | dict = (), size: int = 4096) -> Iterator[tuple]:
        """Run one query and yield its rows as SQLite steps through them (nothing is held but ``size`` rows)."""
        cur = self.conn.execute(sql, params)
        try:
            while rows := cur.fetchmany(size):
                yield from rows
        finally:
            cur.close()

    def executemany(self, sql: str, rows: Iterable[Sequence]) -> int:
        """Run one statement per row; the rows changed (inserted, or updated by an upsert)."""
        before = self.conn.total_changes
        self.conn.executemany(sql, rows)
        return self.conn.total_changes - before

    def script(self, sql: str) -> None:
        """Run several statements."""
        self.conn.executescript(sql)

    def begin(self) -> None:
        """Start a write transaction (it takes the write lock now, not at the first write)."""
        self.conn.execute("BEGIN IMMEDIATE")

    def commit(self) -> None:
        """Commit the transaction."""
        self.conn.execute("COMMIT")

    def rollback(self) -> None:
        """Roll back the transaction, if one is open."""
        if self.conn.in_transaction:
            self.conn.execute("ROLLBACK")

    def close(self) -> None:
        """Close the connection."""
        self.conn.close()


class PostgresDb:
    """A PostgreSQL connection (psycopg 3) in autocommit mode, transactions explicit as with SQLite; ``numeric``
    results (``SUM`` of ``BIGINT``) come back as ``float``, as SQLite's would be used.

    Raises:
        ImportError: psycopg is not installed (the caller says how to install it).
        psycopg.Error: the server cannot be reached or refuses the connection.
    """

    dialect = POSTGRESQL

    def __init__(self, url: str):
        import psycopg
        from psycopg.types.numeric import FloatLoader

        self.errors: tuple[type[BaseException], ...] = (psycopg.Error,)
        self.conn = psycopg.connect(url, autocommit=True, connect_timeout=30)
        self.conn.adapters.register_loader("numeric", FloatLoader)
        self._in_transaction = False

    def execute(self, sql: str, params: Sequence | dict = ()) -> list[tuple]:
        """Run one statement; its rows (none for a statement without a result)."""
        cur = self.conn.execute(pg_params(sql), params, prepare=False) if params else self.conn.execute(sql.encode())
        return cur.fetchall() if cur.description is not None else []

    def iterate(self, sql: str, params: Sequence | dict = (), size: int = 4096) -> Iterator[tuple]:
        """Run one query through a server-side cursor, yielding its rows ``size`` at a time (bounded memory)."""
        with self.conn.transaction(), self.conn.cursor(name="gpushare_report") as cur:
            cur.itersize = size
            if params:
                cur.execute(pg_params(sql), params)
            else:
                cur.execute(sql.encode())
            yield from cur

    def executemany(self, sql: str, rows: Iterable[Sequence]) -> int:
        """Run one statement per row (pipelined); the rows changed."""
        with self.conn.cursor() as cur:
            cur.executemany(pg_params(sql), list(rows))
            return max(cur.rowcount, 0)

    def copy_rows(self, table: str, columns: str, rows: Iterable[Sequence]) -> None:
        """Load rows into a table with ``COPY ... FROM STDIN`` (much faster than one INSERT per row)."""
        with self.conn.cursor() as cur, cur.copy(f"COPY {table} ({columns}) FROM STDIN") as copy:
            for row in rows:
                copy.write_row(row)

    def script(self, sql: str) -> None:
        """Run several statements (``;``-separated, no parameters)."""
        self.conn.execute(sql.encode(), prepare=False)  # bytes: no parameter parsing

    def begin(self) -> None:
        """Start a transaction."""
        self.conn.execute("BEGIN")
        self._in_transaction = True

    def commit(self) -> None:
        """Commit the transaction."""
        self.conn.execute("COMMIT")
        self._in_transaction = False

    def rollback(self) -> None:
        """Roll back the transaction, if one is open (also one that failed)."""
        if self._in_transaction or self.conn.info.transaction_status != 0:
            self._in_transaction = False
            try:
                self.conn.execute("ROLLBACK")
            except self.errors:
                pass

    def close(self) -> None:
        """Close the connection."""
        self.conn.close()

