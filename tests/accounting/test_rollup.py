"""The daily rollup (slurm_gpushare/accounting/rollup.py) against the records it sums: every usage report it
serves must equal the same report read from the records, whatever was stored, replaced or stored twice."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurm_gpushare.accounting import rollup
from slurm_gpushare.accounting.report import Filters, usage_report
from slurm_gpushare.accounting.store import Store
from tests.accounting.test_record import record

DAY = 86400
T0 = 1_764_547_200  # 2025-12-01T00:00:00Z, a UTC midnight
PERIODS = [(None, None), (T0, T0 + 2 * DAY), (T0 + DAY, None), (None, T0 + DAY), (T0 - DAY, T0 + 4 * DAY),
           (T0 + 2 * DAY, T0 + 3 * DAY)]


def _record(rnd: random.Random, **kw):
    """A record from small sets of values, so that jobs share ids, keys collide and groups overlap."""
    start = T0 + rnd.choice((-1, 0, 0, 1, 2)) * DAY + rnd.choice((0, 1, 3600, DAY - 1, rnd.randrange(DAY)))
    length = rnd.choice((0, 1, 600, DAY - 1, DAY, DAY + 7, 2 * DAY + 5, rnd.randrange(3 * DAY)))
    sampled = rnd.random() < 0.8
    sm = round(rnd.uniform(0, 100), 1) if sampled and rnd.random() < 0.8 else None
    mode = rnd.choice(("gpu", "mps", "mig"))
    base = dict(job_id=str(rnd.randrange(1, 7)), restart=rnd.choice((0, 0, 1)), user=rnd.choice(("alice", "bob")),
                submit=rnd.choice((0, T0 - DAY, T0 + DAY)),
                account=rnd.choice(("physics", "chem")), partition=rnd.choice(("gpu", "long")),
                node=rnd.choice(("n1", "n2")), gpu_index=rnd.randrange(3), gpu_model=rnd.choice(("a100", "h100")),
                gpu_memory_mib=81920, mode=mode, share="" if mode == "gpu" else "shard:10",
                mem_granted_mib=81920 if mode == "gpu" else rnd.choice((10240, 20480)), start=start,
                end=start + length, mem_peak_mib=rnd.randrange(20480) if sampled else None, sm_mean_percent=sm,
                sm_peak_percent=None if sm is None else min(100.0, sm + rnd.choice((0, 10))),
                samples=rnd.randrange(1, 200) if sampled else 0)
    base["gpu_uuid"] = f"GPU-{base['node']}-{base['gpu_index']}"
    base.update(kw)
    return record(**base)


def _as_dict(report) -> dict:
    names = [c.name for c in report.columns]
    rows = {row[0]: dict(zip(names, row, strict=True)) for row in report.rows}
    total = dict(zip(names, report.total, strict=True)) if report.total else None
    return {"rows": rows, "total": total}


def _approx(value):
    if isinstance(value, float):
        return pytest.approx(value, rel=1e-9, abs=1e-9)
    if isinstance(value, dict):
        return {k: _approx(v) for k, v in value.items()}
    return value


def assert_rollup_equals_scan(store: Store) -> int:
    """Every report the rollup serves equals the records' own; returns how many were compared."""
    compared = 0
    for by in rollup.GROUP_COLUMNS:
        for since, until in PERIODS:
            filters = [Filters()]
            if by == "user":
                filters.append(Filters(users=("alice",)))
            if by == "account":
                filters.append(Filters(accounts=("chem", "physics")))
            for f in filters:
                assert rollup.serves(store.query, by, since, until, f.users, f.accounts, f.jobs)
                fast = usage_report(store, by=by, since=since, until=until, filters=f)
                slow = usage_report(store, by=by, since=since, until=until, filters=f, use_rollup=False)
                got, want = _as_dict(fast), _as_dict(slow)
                assert got["rows"].keys() == want["rows"].keys(), (by, since, until, f)
                assert got == {"rows": {k: _approx(v) for k, v in want["rows"].items()},
                               "total": _approx(want["total"])}, (by, since, until, f)
                compared += 1
    return compared


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), batches=st.integers(1, 4), n=st.integers(0, 40))
def test_the_rollup_gives_the_records_reports_whatever_was_stored(seed, batches, n):
    """Records added in several batches (keys collide: a later record that saw more replaces the stored one),
    some added twice, crossing midnights, of zero length, without SM data or a peak; job ids shared by users."""
    rnd = random.Random(seed)
    with Store(":memory:") as store:
        added = []
        for _ in range(batches):
            batch = [_record(rnd) for _ in range(n)]
            batch += rnd.sample(added, min(len(added), 3))  # stored again: nothing changes
            store.add(batch)
            added += batch
        assert_rollup_equals_scan(store)


def test_the_rollup_on_both_databases_and_after_a_replacement_that_lowers_the_peak(new_store):
    rnd = random.Random(7)
    store = new_store()
    store.add([_record(rnd) for _ in range(150)])
    store.add([_record(rnd) for _ in range(150)])
    assert assert_rollup_equals_scan(store) == 5 * len(PERIODS) + 2 * len(PERIODS)
    # a record holding the day's SM peak, then the same run's record that saw more, with a lower peak
    first = record(job_id="900", user="carol", start=T0 + 100, end=T0 + 200, samples=2, sm_mean_percent=50.0,
                   sm_peak_percent=99.0)
    store.add([first])
    assert usage_report(store, by="user", filters=Filters(users=("carol",))).rows[0][7] == 99.0
    store.add([record(job_id="900", user="carol", start=T0 + 100, end=T0 + 2 * DAY, samples=50,
                      sm_mean_percent=40.0, sm_peak_percent=70.0)])
    assert usage_report(store, by="user", filters=Filters(users=("carol",))).rows[0][7] == 70.0
    assert_rollup_equals_scan(store)


def test_a_span_of_more_than_ten_years_is_not_rolled_up_and_the_reports_scan(new_store):
    store = new_store()
    store.add([record(job_id="1", start=T0, end=T0 + 3600)])
    assert rollup.serves(store.query, "user", None, None, (), (), ())
    store.add([record(job_id="2", start=0, end=1 << 40)])  # a corrupt end time: no million-day rollup
    assert not rollup.serves(store.query, "user", None, None, (), (), ())
    report = usage_report(store, by="user")
    assert report.rows[0][1] == 2 and report.rows[0][2] == 2


@pytest.mark.parametrize("by, since, until, filters, served", [
    ("user", None, None, Filters(), True),
    ("user", T0, T0 + DAY, Filters(), True),
    ("user", T0 + 3600, None, Filters(), False),  # not a UTC midnight: the records are read
    ("node", None, None, Filters(), False),
    ("day", None, None, Filters(), False),
    ("account", None, None, Filters(users=("alice",)), False),  # another column's filter
    ("user", None, None, Filters(jobs=("1",)), False),
])
def test_what_the_rollup_serves(by, since, until, filters, served):
    with Store(":memory:") as store:
        assert rollup.serves(store.query, by, since, until, filters.users, filters.accounts, filters.jobs) is served


def test_a_requeued_job_counts_in_a_period_between_its_runs_on_both_paths():
    """JOBS counts a job whose first start to last end overlaps the period, though no record of it does."""
    with Store(":memory:") as store:
        store.add([record(job_id="5", restart=0, start=T0, end=T0 + 3600),
                   record(job_id="5", restart=1, start=T0 + 2 * DAY, end=T0 + 2 * DAY + 3600),
                   record(job_id="6", start=T0 + DAY, end=T0 + DAY + 60)])
        for since, until in ((T0 + DAY, T0 + 2 * DAY), (T0 + DAY + 30, T0 + DAY + 7200)):
            for use in (True, False):
                report = usage_report(store, by="user", since=since, until=until, use_rollup=use)
                assert [(row[0], row[1], row[2]) for row in report.rows] == [("alice", 2, 1)]


@pytest.mark.parametrize("workers", [1, 2])
def test_ingest_keeps_the_rollup_with_and_without_parse_workers(new_store, tmp_path, workers):
    """Spool files ingested in small batches: a job's records in several files and batches (two nodes), lines
    written twice within a batch and across batches, a later line that saw more of a stored run. With parse
    workers the batch's sums come from the worker, less the jobs it could not judge."""
    from slurm_gpushare.accounting.spool import Spool
    rnd = random.Random(11)
    records = [_record(rnd) for _ in range(400)]
    for k, node in enumerate(("n1", "n2", "n3")):
        part = records[k::3]
        part += rnd.sample(records, 20)  # lines of other files' records again, and of its own
        part += [_record(rnd, job_id=r.job_id, restart=r.restart, user=r.user, step=r.step, node=r.node,
                         gpu_index=r.gpu_index, gpu_uuid=r.gpu_uuid, samples=r.samples + 1, start=r.start,
                         end=r.end + 10) for r in rnd.sample(part, 10)]  # saw more: replaces the stored one
        Spool(tmp_path / "spool", node=node, clock=lambda: T0).append(part)
    store = new_store()
    result = store.ingest(tmp_path / "spool", workers=workers, parallel_bytes=0, batch_bytes=8192)
    assert result.ingested > 0 and result.duplicates > 0
    assert_rollup_equals_scan(store)


def test_a_layout_5_database_gets_its_rollup_made_from_the_records(target):
    """A database of the previous layout has no rollup: opening it makes one from every record (jobs in pages
    of whole jobs), after which the reports read it and equal the records' own."""
    rnd = random.Random(3)
    with Store(target) as store:
        store.add([_record(rnd) for _ in range(300)])
        store.add([_record(rnd, job_id="77", gpu_index=k, gpu_uuid=f"GPU-77-{k}") for k in range(5)])
        store._db.begin()
        store._db.execute("DROP TABLE usage_day")
        store._db.execute("DROP TABLE usage_day_jobs")
        store._db.execute("DELETE FROM meta WHERE key <> 'schema'")
        store._db.execute("UPDATE meta SET value = '5' WHERE key = 'schema'")
        store._db.commit()
    original = rollup._PAGE
    rollup._PAGE = 4  # pages smaller than job 77: a page of one job is read whole
    try:
        with Store(target, create=False) as store:
            assert store.query("SELECT value FROM meta WHERE key = 'schema'") == [("6",)]
            assert store.query("SELECT COUNT(*) FROM usage_day")[0][0] > 0
            assert_rollup_equals_scan(store)
    finally:
        rollup._PAGE = original


def test_a_replacement_longer_than_any_record_before_keeps_the_days_peak(new_store):
    """Found in review: the day's peak was looked for among records no longer than the longest before, so the
    replacing record itself (longer) was missed and the peak lost."""
    store = new_store()
    day5 = T0 + 5 * DAY
    store.add([record(job_id="1", start=day5 + 10 * 3600, end=day5 + 11 * 3600, samples=5, sm_peak_percent=80.0)])
    store.add([record(job_id="1", start=T0 + 3 * DAY, end=day5 + 11 * 3600, samples=50, sm_peak_percent=90.0)])
    report = usage_report(store, by="user", since=day5, until=day5 + DAY)
    assert report.rows[0][7] == 90.0
    assert_rollup_equals_scan(store)


def test_a_record_of_zero_length_at_the_periods_start_counts_its_job(new_store):
    """Found in review: a job whose last record has zero length at the period's start had 1 record but 0 jobs."""
    store = new_store()
    store.add([record(job_id="1", gpu_index=0, gpu_uuid="GPU-0", start=T0, end=T0 + DAY),
               record(job_id="1", gpu_index=1, gpu_uuid="GPU-1", start=T0 + DAY, end=T0 + DAY)])
    for until in (None, T0 + 2 * DAY):
        for use in (True, False):
            report = usage_report(store, by="user", since=T0 + DAY, until=until, use_rollup=use)
            assert [(row[0], row[1], row[2]) for row in report.rows] == [("alice", 1, 1)], (until, use)


def test_a_job_id_given_again_to_another_user_is_another_job(new_store):
    store = new_store()
    store.add([record(job_id="8", user="alice", start=T0, end=T0 + 60),
               record(job_id="8", user="bob", start=T0 + 3600, end=T0 + 7200)])
    for use in (True, False):
        for since, until in ((None, None), (T0, T0 + DAY), (T0 - DAY, None)):
            report = usage_report(store, by="mode", since=since, until=until, use_rollup=use)
            assert report.total[1] == 2 and report.rows[0][1] == 2, (use, since, until)


def test_the_sqlite_upgrade_waits_for_a_running_ingest(tmp_path):
    """Found in review: an ingest of the release before, running while the upgrade makes the rollup, would go on
    adding records the rollup never sees. The upgrade takes the ingest lock first."""
    import threading

    from slurm_gpushare.atomicfile import locked
    db = tmp_path / "acct.db"
    with Store(db) as store:
        store.add([record(job_id="1", start=T0, end=T0 + 60)])
        store._db.script("BEGIN; DROP TABLE usage_day; DROP TABLE usage_day_jobs; "
                         "UPDATE meta SET value = '5' WHERE key = 'schema'; COMMIT;")
    seen = []

    def open_it() -> None:
        with Store(db, create=False) as store:
            seen.append((store.query("SELECT value FROM meta WHERE key = 'schema'"),
                         usage_report(store, by="user").rows[0][1]))

    with locked(f"{db}.ingest-lock"):
        worker = threading.Thread(target=open_it)
        worker.start()
        worker.join(1.0)
        assert worker.is_alive() and not seen  # waits for the ingest's lock
    worker.join(30)
    assert seen == [([("6",)], 1)]


def test_a_job_id_given_again_to_the_same_user_is_another_job_and_a_requeued_job_one(new_store):
    """Found in review: jobs were their id and user, so an id Slurm gave the same user again (MaxJobId wrapped)
    made one span from the first job to the second, counted in every period between. A run with restart 0 begins
    a job (its submit time); a requeued run (Slurm gives it a new submit time) belongs to the latest before it."""
    store = new_store()
    store.add([record(job_id="1", submit=T0 - 10, start=T0, end=T0 + 60),
               record(job_id="1", submit=T0 + 5 * DAY - 10, start=T0 + 5 * DAY, end=T0 + 5 * DAY + 60),
               record(job_id="2", submit=T0 + 2 * DAY - 10, start=T0 + 2 * DAY, end=T0 + 2 * DAY + 60),
               # job 3 requeued: its second run has restart 1 and a later submit time
               record(job_id="3", submit=T0 - 10, start=T0, end=T0 + 60),
               record(job_id="3", restart=1, submit=T0 + 60, start=T0 + 4 * DAY, end=T0 + 4 * DAY + 60)])
    for use in (True, False):
        between = usage_report(store, by="user", since=T0 + 2 * DAY, until=T0 + 3 * DAY, use_rollup=use)
        assert [(row[0], row[1], row[2]) for row in between.rows] == [("alice", 2, 1)], use  # job 2 and job 3
        later = usage_report(store, by="user", since=T0 + 4 * DAY, until=T0 + 5 * DAY, use_rollup=use)
        assert [(row[0], row[1], row[2]) for row in later.rows] == [("alice", 1, 1)], use  # job 3's second run
        everything = usage_report(store, by="mode", use_rollup=use)
        assert everything.total[1] == 4 and everything.total[2] == 5, use  # 1, 1 again, 2 and 3
        assert usage_report(store, by="user", since=T0, until=T0 + 6 * DAY, use_rollup=use).rows[0][1] == 4, use


def test_the_worker_sums_keep_a_new_records_peak_beside_a_job_that_goes_the_long_way():
    """Found in review (a mutation the ingest test missed): in one batch a new job's record and a stored job's
    record with a higher peak share a day and group; the new record's peak must stay in the worker's sums."""
    from slurm_gpushare.accounting.record import FIELDS
    with Store(":memory:") as store:
        store.add([record(job_id="7", start=T0, end=T0 + 60, sm_peak_percent=20.0)])
        stored_again = record(job_id="7", start=T0, end=T0 + 60, sm_peak_percent=20.0)
        higher = record(job_id="7", gpu_index=1, gpu_uuid="GPU-1", start=T0 + 10, end=T0 + 70, sm_peak_percent=95.0)
        new = record(job_id="8", start=T0 + 100, end=T0 + 200, sm_peak_percent=60.0)
        rows = [r.row() for r in (stored_again, higher, new)]
        store._db.begin()
        store._upsert(rows, rollup.batch_delta(rows, FIELDS))
        store._db.commit()
        assert usage_report(store, by="user").rows[0][7] == 95.0
        assert_rollup_equals_scan(store)
        delta = rollup.take_out(rollup.batch_delta(rows, FIELDS)[0], rows, {"7"}, FIELDS)
        assert set(delta.peaks.values()) == {60.0}  # job 8's peak stays; job 7's go the long way


def test_an_upgrade_that_cannot_take_the_ingest_lock_says_so(tmp_path):
    from slurm_gpushare.accounting.store import StoreError
    db = tmp_path / "acct.db"
    with Store(db) as store:
        store._db.script("BEGIN; DROP TABLE usage_day; DROP TABLE usage_day_jobs; "
                         "UPDATE meta SET value = '5' WHERE key = 'schema'; COMMIT;")
    (tmp_path / "acct.db.ingest-lock").mkdir()  # no lock file can be opened there
    with pytest.raises(StoreError, match="cannot take the ingest lock to upgrade") as raised:
        Store(db, create=False)
    assert "accounting ingest" in (raised.value.hint or "")
