"""The SQL both stores run: parameters rewritten for psycopg, passwords kept out of messages."""

from __future__ import annotations

import pytest

from slurm_gpushare.accounting.backend import is_url, pg_params
from slurm_gpushare.accounting.store import Store, StoreError, _redact


def test_parameters_are_rewritten_outside_literals_and_identifiers():
    assert pg_params("SELECT '%Y ? :x', \"a?\" FROM t WHERE b = ? AND c = :c AND d::int > 0") == \
        "SELECT '%%Y ? :x', \"a?\" FROM t WHERE b = %s AND c = %(c)s AND d::int > 0"


def test_urls_name_a_server_and_their_password_is_not_shown():
    assert is_url("postgresql://u@h/db") and is_url("postgres://h/db") and not is_url("/var/lib/a.db")
    assert _redact("postgresql://acct:s3cret@db.example/gpushare") == "postgresql://acct:***@db.example/gpushare"


def test_a_server_that_is_not_there_is_one_line_naming_it_without_the_password(tmp_path):
    with pytest.raises(StoreError) as e:
        Store(f"postgresql://acct:s3cret@/gpushare?host={tmp_path}&port=1&connect_timeout=2", create=False)
    text = str(e.value)
    assert "cannot connect to the accounting database" in text and "s3cret" not in text and "\n" not in text
