"""Ingest into the SQLite store: skipped lines named by file and line, idempotence, and exactness when
an ingest is killed half-way (a real process killed by its PID) or fails after some commits."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from slurm_gpushare.accounting.record import UsageRecord
from slurm_gpushare.accounting.spool import Spool
from slurm_gpushare.accounting.store import Store, StoreError
from tests.accounting.test_record import record
from tests.conftest import DEADLINE

ROOT = Path(__file__).resolve().parents[2]
DAY = 1_764_547_200


def _spool(directory: Path, jobs: range, node: str = "n1", per_call: int = 1000) -> Path:
    sp = Spool(directory, node=node, clock=lambda: DAY)
    recs = [record(job_id=str(j), node=node, user=f"user{j % 7}") for j in jobs]
    path = None
    for i in range(0, len(recs), per_call):
        path = sp.append(recs[i:i + per_call])
    return path


def test_ingest_then_reingest_adds_nothing(tmp_path, target):
    _spool(tmp_path / "spool", range(100), node="n1")
    _spool(tmp_path / "spool", range(100, 150), node="n2")
    with Store(target) as st:
        r = st.ingest(tmp_path / "spool")
        assert (r.ingested, r.duplicates, r.skipped, r.files) == (150, 0, (), 2)
        again = st.ingest(tmp_path / "spool")
        assert (again.ingested, again.duplicates) == (0, 0)
        assert st.count() == 150
        got = st.records(job_id="7")
        assert got == [record(job_id="7", node="n1", user="user0")]
    # a new process, the same database: still nothing new
    with Store(target, create=False) as st:
        assert st.ingest(tmp_path / "spool").ingested == 0 and st.count() == 150


def test_a_copy_of_a_spool_file_is_read_but_adds_no_duplicate(tmp_path, target):
    path = _spool(tmp_path / "spool", range(20))
    copy = tmp_path / "copy" / path.name
    copy.parent.mkdir()
    copy.write_bytes(path.read_bytes())
    with Store(target) as st:
        st.ingest(path)
        r = st.ingest(copy)
        assert (r.ingested, r.duplicates) == (0, 20) and st.count() == 20


def test_corrupt_lines_are_skipped_and_named_and_an_unended_last_line_waits(tmp_path, target):
    path = _spool(tmp_path / "spool", range(5))
    with open(path, "ab") as f:
        f.write(b'{"v":1,"job_id":"oops"\n')                                        # line 6: corrupt
        f.write(json.dumps({**record(job_id="5").to_dict(), "v": 5}).encode() + b"\n")  # line 7: newer
        f.write(record(job_id="6").to_json().encode() + b"\n")                      # line 8: good
        f.write(record(job_id="7").to_json().encode()[:80])                         # line 9: no newline yet
    warned = []
    with Store(target) as st:
        r = st.ingest(tmp_path / "spool", on_skip=warned.append)
        assert r.ingested == 6 and len(r.skipped) == 2
        assert [(s.file, s.line) for s in r.skipped] == [(str(path), 6), (str(path), 7)]
        assert "not a JSON record" in r.skipped[0].reason
        assert "version 5" in r.skipped[1].reason
        assert [(s.line, s.reason[:35]) for s in r.incomplete] == [(9, "incomplete last line (80 bytes, no ")]
        assert str(r.skipped[0]).startswith(f"{path}:6: ")
        assert warned == list(r.skipped) and st.skipped() == list(r.skipped)
        # the next Epilog closes the fragment (a writer that died) and appends whole records after it
        Spool(tmp_path / "spool", node="n1", clock=lambda: DAY).append([record(job_id="8")])
        with open(path, "ab") as f:
            f.write(b"garbage\n")                                                   # line 11
        r = st.ingest(tmp_path / "spool")
        assert r.ingested == 1 and [s.line for s in r.skipped] == [9, 11] and r.incomplete == ()
        assert "not a JSON record" in r.skipped[0].reason
        assert path.read_text().split("\n")[10] == "garbage"  # the line numbers are the file's
        assert st.count() == 7


def test_a_half_copied_last_line_is_ingested_once_the_copy_completes(tmp_path, target):
    """A spool copied (or read over NFS) while its last line is only half there: that record is not
    lost, it is read when the rest arrives."""
    path = _spool(tmp_path / "spool", range(3))
    line = record(job_id="3").to_json().encode() + b"\n"
    with open(path, "ab") as f:
        f.write(line[:100])
    with Store(target) as st:
        r = st.ingest(path)
        assert (r.ingested, r.skipped, len(r.incomplete)) == (3, (), 1)
        with open(path, "ab") as f:
            f.write(line[100:])
        r = st.ingest(path)
        assert (r.ingested, r.skipped, r.incomplete) == (1, (), ())
        assert [x.job_id for x in st.records()] == ["0", "1", "2", "3"]


@pytest.mark.parametrize("line_no", [2, 60])  # within the first 4 KiB (the head), and after it
def test_deleting_a_corrupt_line_does_not_lose_a_later_record(tmp_path, line_no, target):
    """An admin deletes a corrupt line that ingest had skipped; then a new record is appended: the
    recorded byte offset now points into the new record. Progress by content notices, the file is
    read again, and duplicates are dropped by key."""
    path = _spool(tmp_path / "spool", range(80))
    lines = path.read_bytes().split(b"\n")[:-1]
    lines[line_no - 1] = b'{"v":2,"job_id":"corrupt"'
    path.write_bytes(b"".join(x + b"\n" for x in lines))
    with Store(target) as st:
        r = st.ingest(path)
        assert (r.ingested, [s.line for s in r.skipped]) == (79, [line_no])
        del lines[line_no - 1]
        path.write_bytes(b"".join(x + b"\n" for x in lines))
        Spool(tmp_path / "spool", node="n1", clock=lambda: DAY).append([record(job_id="1000", node="n1")])
        r = st.ingest(path)
        assert (r.ingested, r.duplicates, r.skipped) == (1, 79, ())
        assert st.count() == 80 and st.records(job_id="1000")
        assert st.skipped() == []  # the deleted line's entry went with it


def test_each_run_of_a_requeued_job_is_its_own_record(tmp_path, target):
    first = record(job_id="77", restart=0, start=1000, end=1100)
    second = record(job_id="77", restart=1, start=2000, end=5600)
    sp = Spool(tmp_path / "spool", node="a100", clock=lambda: DAY)
    sp.append([first])
    sp.append([second])
    with Store(target) as st:
        r = st.ingest(tmp_path / "spool")
        assert (r.ingested, r.duplicates) == (2, 0)
        assert [(x.restart, x.duration_s) for x in st.records(job_id="77")] == [(0, 100), (1, 3600)]


def test_version_1_lines_and_a_version_1_database_are_still_read(tmp_path):
    """Spool lines written by the previous release (no ``restart``) and a database of layout 1."""
    from slurm_gpushare.accounting.record import FIELDS_V1
    v1 = {k: v for k, v in record(job_id="5").to_dict().items() if k in FIELDS_V1}
    v1["v"] = 1
    old_db = tmp_path / "old.db"
    import sqlite3
    db = sqlite3.connect(old_db)
    cols = [k for k in v1]
    db.executescript(
        "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);"
        "INSERT INTO meta VALUES ('schema', '1');"
        f"CREATE TABLE usage ({', '.join(repr(c).replace(chr(39), chr(34)) for c in cols)}, "
        'UNIQUE ("job_id", "step", "node", "gpu_index", "gpu_uuid", "v"));'
        "CREATE TABLE spool_progress (file TEXT PRIMARY KEY, offset INTEGER NOT NULL, lines INTEGER NOT NULL,"
        " head_len INTEGER NOT NULL, head_sha1 TEXT NOT NULL);"
        "CREATE TABLE skipped (file TEXT NOT NULL, line INTEGER NOT NULL, reason TEXT NOT NULL,"
        " PRIMARY KEY (file, line));")
    db.execute(f"INSERT INTO usage VALUES ({', '.join('?' * len(cols))})", list(v1.values()))
    db.commit()
    db.close()
    spool = tmp_path / "old.jsonl"
    spool.write_text(json.dumps(v1) + "\n" + json.dumps({**v1, "job_id": "6"}) + "\n")
    with Store(old_db) as st:
        assert st.records() == [record(job_id="5")]  # restart 0, v 3, no series
        r = st.ingest(spool)
        assert (r.ingested, r.duplicates, r.skipped) == (1, 1, ())
        assert [x.job_id for x in st.records()] == ["5", "6"]
    with Store(old_db, create=False) as st:
        assert st.count() == 2


def test_a_version_2_database_is_migrated_in_place_and_keeps_the_memory_series(tmp_path):
    """A database of layout 2 (records without series) gets the series columns by ALTER TABLE; its rows
    become v 3 without a series, so a version-2 line of a stored record is a duplicate, not a new row."""
    import sqlite3

    from slurm_gpushare.accounting.record import FIELDS_V2
    from slurm_gpushare.accounting.store import _SQL_TYPES
    old = record(job_id="5")
    v2 = {k: v for k, v in old.to_dict().items() if k in FIELDS_V2} | {"v": 2}
    old_db = tmp_path / "v2.db"
    db = sqlite3.connect(old_db)
    db.executescript(
        "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);"
        "INSERT INTO meta VALUES ('schema', '2');"
        f"CREATE TABLE usage ({', '.join(f'{chr(34)}{c}{chr(34)} {_SQL_TYPES[c]}' for c in FIELDS_V2)}, "
        'UNIQUE ("job_id", "restart", "step", "node", "gpu_index", "gpu_uuid", "v"));'
        "CREATE TABLE spool_progress (file TEXT PRIMARY KEY, offset INTEGER NOT NULL, lines INTEGER NOT NULL,"
        " head_len INTEGER NOT NULL, head_sha1 TEXT NOT NULL, tail_sha1 TEXT NOT NULL DEFAULT '');"
        "CREATE TABLE skipped (file TEXT NOT NULL, line INTEGER NOT NULL, reason TEXT NOT NULL,"
        " PRIMARY KEY (file, line));")
    db.execute(f"INSERT INTO usage VALUES ({', '.join('?' * len(v2))})", list(v2.values()))
    db.commit()
    db.close()
    with_series = record(job_id="6", mem_series_mib=(0, 1024, 4096, 2048), mem_series_width=8)
    spool = tmp_path / "mixed.jsonl"
    spool.write_text(json.dumps(v2) + "\n" + with_series.to_json() + "\n")
    with Store(old_db) as st:
        assert st.records() == [old] and st.records()[0].v == 4 and st.records()[0].mem_series_mib is None
        r = st.ingest(spool)
        assert (r.ingested, r.duplicates, r.skipped) == (1, 1, ())
        assert st.records(job_id="6") == [with_series]
        st.add([record(job_id="7", mem_series_mib=(), mem_series_width=1)])
        assert st.records(job_id="7")[0].mem_series_mib == ()
    with Store(old_db, create=False) as st:
        assert st.count() == 3 and st.query("SELECT value FROM meta WHERE key = 'schema'") == [("6",)]
        assert st.query('SELECT "mem_series_mib" FROM usage WHERE "job_id" = \'6\'') == [("0,1024,4096,2048",)]


def test_the_database_and_its_directory_are_private(tmp_path):
    """Records name users and accounts: no other local user reads them."""
    db = tmp_path / "lib" / "acct.db"
    old = os.umask(0o022)
    try:
        with Store(db) as st:
            _spool(tmp_path / "spool", range(3))
            st.ingest(tmp_path / "spool")
    finally:
        os.umask(old)
    for p in [db.parent, *db.parent.iterdir()]:
        assert p.stat().st_mode & 0o077 == 0, f"{p} is {oct(p.stat().st_mode)}"


def test_parse_workers_die_with_a_killed_ingest(tmp_path):
    """``kill -9`` of ingest: its parse workers go within seconds (they used to idle for minutes)."""
    import psutil
    _spool(tmp_path / "spool", range(4000), per_call=500)
    script = textwrap.dedent(f"""
        import sys, time
        from slurm_gpushare.accounting.store import Store
        def stall(progress):
            print("committed", flush=True)
            time.sleep(600)
        Store({str(tmp_path / "acct.db")!r}).ingest({str(tmp_path / "spool")!r}, workers=2, parallel_bytes=0,
                                                  batch_bytes=64 << 10, on_commit=stall)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, stdout=subprocess.PIPE)
    try:
        assert proc.stdout.readline() == b"committed\n"
        workers = psutil.Process(proc.pid).children()
        assert len(workers) >= 2
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        _gone, alive = psutil.wait_procs(workers, timeout=30)  # seconds, not the minutes they used to idle
        assert alive == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
def test_a_failure_after_some_commits_loses_and_doubles_nothing(tmp_path, target):
    _spool(tmp_path / "spool", range(2000))
    commits = []

    def crash(progress):
        commits.append(progress.ingested)
        if len(commits) == 3:
            raise RuntimeError("injected")

    with Store(target) as st:
        with pytest.raises(RuntimeError, match="injected"):
            st.ingest(tmp_path / "spool", batch_bytes=64 << 10, on_commit=crash, workers=0)
        assert 0 < st.count() == commits[-1] < 2000
        r = st.ingest(tmp_path / "spool", batch_bytes=64 << 10)
        assert (r.ingested, r.duplicates) == (2000 - commits[-1], 0)
        assert sorted(int(x.job_id) for x in st.records()) == list(range(2000))


KILLED = textwrap.dedent("""
    import sys, time
    from slurm_gpushare.accounting.store import Store
    def slow(progress):
        print(progress.ingested, flush=True)
        time.sleep(0.05)
    Store(sys.argv[1]).ingest(sys.argv[2], batch_bytes=32 << 10, on_commit=slow, workers=0)
    print("done", flush=True)
""")


def test_an_ingest_killed_half_way_then_rerun_is_exact(tmp_path, target):
    _spool(tmp_path / "spool", range(3000))
    db = target
    proc = subprocess.Popen([sys.executable, "-c", KILLED, str(db), str(tmp_path / "spool")], cwd=ROOT,
                            stdout=subprocess.PIPE, text=True)
    try:
        seen = [proc.stdout.readline() for _ in range(5)]
        assert all(line.strip().isdigit() for line in seen), seen
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(DEADLINE)
        proc.stdout.close()
    with Store(db, create=False) as st:
        before = st.count()
        assert 0 < before < 3000
        r = st.ingest(tmp_path / "spool")
        assert r.duplicates == 0 and before + r.ingested == 3000 == st.count()
        assert sorted(int(x.job_id) for x in st.records()) == list(range(3000))


def test_parse_workers_give_the_same_result(tmp_path, target):
    path = _spool(tmp_path / "spool", range(3000))
    with open(path, "ab") as f:
        f.write(b"{broken\n")
    _spool(tmp_path / "spool", range(3000, 3100))
    with Store(target) as st:
        r = st.ingest(tmp_path / "spool", batch_bytes=64 << 10, workers=2, parallel_bytes=0)
        assert (r.ingested, len(r.skipped), r.skipped[0].line) == (3100, 1, 3001)
        assert st.count() == 3100


def test_a_replaced_spool_file_is_read_again_from_the_start(tmp_path, target):
    path = _spool(tmp_path / "spool", range(10))
    with Store(target) as st:
        st.ingest(path)
        # rotated and rewritten under the same name, with other records first
        path.write_bytes(b"".join(record(job_id=str(j)).to_json().encode() + b"\n" for j in range(50, 60)))
        r = st.ingest(path)
        assert (r.ingested, r.duplicates) == (10, 0) and st.count() == 20


def test_add_and_records_round_trip(tmp_path, target):
    recs = [record(job_id="3", gpu_index=1, gpu_uuid="GPU-1"), record(job_id="3"), record(job_id="10")]
    with Store(target) as st:
        assert st.add(recs) == (3, 0)
        assert st.add(recs[:1]) == (0, 1)
        assert [(r.job_id, r.gpu_index) for r in st.records()] == [("3", 0), ("3", 1), ("10", 0)]
        assert st.records(user="nobody") == []
        assert all(isinstance(r, UsageRecord) for r in st.records())


def test_database_errors_name_the_file(tmp_path):
    with pytest.raises(StoreError, match="no accounting database at"):
        Store(tmp_path / "missing.db", create=False)
    with pytest.raises(StoreError, match="does not exist"):
        Store(tmp_path / "a" / "b" / "acct.db")
    bad = tmp_path / "bad.db"
    bad.write_text("this is not sqlite" * 100)
    with pytest.raises(StoreError) as e:
        Store(bad)
    assert str(bad) in str(e.value)
    with Store(tmp_path / "new" / "acct.db") as st:  # the last component is created
        assert st.count() == 0
    import sqlite3
    sqlite3.connect(tmp_path / "other.db").execute("CREATE TABLE t (x)")
    with pytest.raises(StoreError, match="not an accounting database"):
        Store(tmp_path / "other.db", create=False)


def test_of_two_records_of_one_key_the_store_keeps_the_one_that_saw_more_whichever_came_first(tmp_path, target):
    """An Epilog run again for a run spools a second record of the same key with fewer samples (or none):
    the store keeps the one that saw more, as the sacct segment does (UsageRecord.saw_more), in either order."""
    full = record(samples=120, mem_peak_mib=3072, start=1000, end=4600)
    empty = record(samples=0, mem_peak_mib=None, sm_mean_percent=None, sm_peak_percent=None, start=4600, end=4600)
    shorter = record(samples=120, mem_peak_mib=1024, start=1000, end=2000)
    for order in ((full, empty), (empty, full), (shorter, full), (full, shorter)):
        st = Store(target)
        st.query("DELETE FROM usage")  # each order from an empty store
        st.add([order[0]])
        st.add([order[1]])
        kept = st.records()
        best = order[1] if order[1].saw_more(order[0]) else order[0]
        assert kept == [best] and best == full, (order, kept)
        assert st.add([full]) == (0, 1)  # the same record again: nothing changes
        st.close()
    # and through ingest of one spool holding both, the emptier one spooled first
    sp = Spool(tmp_path / "spool", node="a100", clock=lambda: DAY)
    sp.append([empty])
    sp.append([full])
    st = Store(target)
    st.query("DELETE FROM usage")
    st.ingest(tmp_path / "spool")
    assert st.records() == [full]
    st.close()


def test_a_job_id_given_to_another_user_again_is_another_record(new_store):
    """Issue 26 N15: a job id Slurm gives again (a lost StateSaveLocation, MaxJobId wrapping) to another user,
    restart 0, same node and GPU: the older user's record was replaced by the newer job's (same key). Both are
    kept now, each with its own owner; the same run spooled again is still one record."""
    old = record(job_id="3", user="alice", start=1_000, end=1_500)
    new = record(job_id="3", user="bob", start=9_000, end=9_100)
    with new_store() as st:
        st.add([old])
        st.add([new])
        assert sorted((r.user, r.start) for r in st.records(job_id="3")) == [("alice", 1_000), ("bob", 9_000)]
        st.add([new])
        assert st.count() == 2


def test_the_same_users_job_id_given_again_is_another_record_by_its_submit_time(new_store):
    """Issue 26 item 6: the same user's job id given again (a lost StateSaveLocation), restart 0, same node and GPU:
    one key before record version 4, so the newer job replaced the older one's record. The submit time (slurmdbd
    keys its job rows by id and submit time too) keeps both; the same run spooled again is still one record."""
    old = record(job_id="3", user="alice", submit=900, start=1_000, end=1_500)
    new = record(job_id="3", user="alice", submit=8_900, start=9_000, end=9_100)
    with new_store() as st:
        assert st.add([old]) == (1, 0)
        assert st.add([new]) == (1, 0)
        assert sorted((r.submit, r.start) for r in st.records(job_id="3")) == [(900, 1_000), (8_900, 9_000)]
        assert st.add([new, old]) == (0, 2)
        assert st.count() == 2


def _make_old_layout(st: Store, layout: int) -> None:
    """Turn a new store back into layout 3 or 4: no ``submit`` column, records ``v`` 3, the key of that layout."""
    key = ('"job_id", "restart", "step", "node", "gpu_index", "gpu_uuid", "v"' if layout == 3 else
           '"job_id", "restart", "user", "step", "node", "gpu_index", "gpu_uuid", "v"')
    db = st._db
    if st.url:
        db.begin()
        for (name,) in db.execute("SELECT conname FROM pg_constraint WHERE conrelid = 'usage'::regclass "
                                  "AND contype = 'u'"):
            db.execute(f'ALTER TABLE usage DROP CONSTRAINT "{name}"')
        db.execute('ALTER TABLE usage DROP COLUMN "submit"')
        db.execute('UPDATE usage SET "v" = 3')
        db.execute(f"ALTER TABLE usage ADD UNIQUE ({key})")
        db.execute(f"UPDATE meta SET value = '{layout}' WHERE key = 'schema'")
        db.commit()
    else:
        cols = ", ".join(f'"{c}"' for (c,) in st.query("SELECT name FROM pragma_table_info('usage')")
                         if c not in ("gpu_share", "submit"))
        db.script("BEGIN; CREATE TABLE old AS SELECT * FROM usage; DROP TABLE usage;"
                  f"CREATE TABLE usage ({cols}, UNIQUE ({key})); INSERT INTO usage SELECT {cols} FROM old;"
                  "UPDATE usage SET v = 3; DROP TABLE old;"
                  f"UPDATE meta SET value = '{layout}' WHERE key = 'schema'; COMMIT;")


@pytest.mark.parametrize("layout", [3, 4])
def test_a_layout_3_or_4_database_gets_the_submit_time_in_its_key(target, tmp_path, layout):
    """Layout 3 keyed a record without its user, layout 4 without its submit time: opening either upgrades it in
    place (records kept, submit 0 and v 4 as reading their version-3 lines gives), after which another user's and
    the same user's job of a reused id are records of their own, and a version-3 line of a stored record ingested
    again is a duplicate."""
    stored = record(job_id="3", user="alice", start=1_000, end=1_500)
    line = json.dumps({k: v for k, v in {**stored.to_dict(), "v": 3}.items() if k != "submit"})
    with Store(target) as st:
        st.add([stored])
        _make_old_layout(st, layout)
    with Store(target) as st:
        assert st.query("SELECT value FROM meta WHERE key = 'schema'") == [("6",)]
        assert st.records(job_id="3") == [stored]
        st.add([record(job_id="3", user="bob", start=9_000, end=9_100)])
        st.add([record(job_id="3", user="alice", submit=8_000, start=8_000, end=8_100)])
        assert st.count() == 3
        (tmp_path / "spool").mkdir()
        (tmp_path / "spool" / "a100.jsonl").write_text(line + "\n")
        result = st.ingest(tmp_path / "spool")
        assert (result.ingested, result.duplicates, st.count()) == (0, 1, 3)


