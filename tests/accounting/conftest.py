"""The stores the accounting tests run on: every test that takes ``target`` (or ``new_store``) runs once on
SQLite and once on PostgreSQL, a real server from Debian's ``postgresql`` package started for the session by
:class:`slurm_gpushare_dev.postgres.PostgresServer` (its own directory beside ``GPUSHARE_TEST_DIR``, a unix
socket there, stopped by its PID at the end). Without PostgreSQL or psycopg the PostgreSQL half is skipped,
and fails instead under ``GPUSHARE_REQUIRE_SLURM=1`` on the host (CI installs both; a release's root has
neither)."""

from __future__ import annotations

import itertools
import os

import pytest

from slurm_gpushare.accounting.store import Store
from slurm_gpushare_dev.postgres import PostgresError, PostgresServer, bin_dir
from tests.conftest import IN_RELEASE, TEST_DIR, TEST_PORT

STORES = ("sqlite", "postgresql")
_names = itertools.count()


def _unavailable(reason: str):
    if IN_RELEASE is None and os.environ.get("GPUSHARE_REQUIRE_SLURM") == "1":
        pytest.fail(f"GPUSHARE_REQUIRE_SLURM=1 but {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def postgres_server():
    """One private PostgreSQL server for the session (fsync off: the tests' databases are throwaway)."""
    try:
        import psycopg  # noqa: F401
    except ImportError:
        _unavailable("psycopg is not installed (pip install -e '.[test]' brings psycopg[binary])")
    if bin_dir() is None:
        _unavailable("Debian's postgresql is not installed (scripts/install-deps installs it)")
    server = PostgresServer(f"{TEST_DIR}-postgres", port=TEST_PORT + 750, durable=False)
    try:
        server.start()
    except PostgresError as e:
        _unavailable(str(e))
    yield server
    server.stop()


@pytest.fixture(params=STORES)
def target(request, tmp_path) -> str:
    """A new, empty store's target: an SQLite file, or a fresh database of the session's PostgreSQL server."""
    if request.param == "sqlite":
        return str(tmp_path / "acct.db")
    server = request.getfixturevalue("postgres_server")
    return server.create_database(f"test_{os.getpid()}_{next(_names)}", fresh=True)


@pytest.fixture
def new_store(target):
    """Open a store on ``target`` (each call another connection to the same database); all closed after."""
    opened: list[Store] = []

    def make(**kw) -> Store:
        opened.append(Store(target, **kw))
        return opened[-1]

    yield make
    for st in opened:
        try:
            st.close()
        except Exception:
            pass
