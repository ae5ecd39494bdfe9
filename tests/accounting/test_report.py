"""Reports over a small fixture whose numbers were worked out by hand:

alice  job 1: MPS share 10 GiB of an 80 GiB A100 (share 1/8), 2 h, peak 4 GiB, SM mean 30%, peak 60%
       job 2: two whole A100s, 1 h; GPU0 SM mean 80% (peak 90), mem peak 20 GiB; GPU1 20% (50), 10 GiB
bob    job 3: MIG 1g.10gb (9984 MiB of an 81559 MiB H100), 3 h, peak 8000 MiB, no SM data (MIG)
       job 4: one whole H100 (81559 MiB), 1 h, never sampled: no data at all
"""

from __future__ import annotations

import csv
import io
import json

import pytest

from slurm_gpushare.accounting.jobstats import Offer, SuggestRule, job_stats
from slurm_gpushare.accounting.report import (
    NO_DATA,
    job_report,
    parse_time,
    render,
    usage_report,
    waste_report,
)
from slurm_gpushare.accounting.store import Store
from slurm_gpushare.errors import InputError
from tests.accounting.test_record import record

T0 = 1_764_547_200  # 2025-12-01T00:00:00Z
H = 3600
A100, H100 = 81920, 81559


def fixture() -> list:
    a = dict(user="alice", account="physics", gpu_model="a100", gpu_memory_mib=A100, node="a100")
    b = dict(user="bob", account="chem", gpu_model="h100", gpu_memory_mib=H100, node="h100-mig")
    return [
        record(job_id="1", **a, mode="mps", share="shard:10", mem_asked_mib=10240, mem_granted_mib=10240,
               start=T0, end=T0 + 2 * H, mem_peak_mib=4096, sm_mean_percent=30.0, sm_peak_percent=60.0),
        record(job_id="2", **a, gpu_index=0, gpu_uuid="GPU-a0", mode="gpu", share="", mem_asked_mib=None,
               mem_granted_mib=A100, start=T0, end=T0 + H, mem_peak_mib=20480, sm_mean_percent=80.0,
               sm_peak_percent=90.0),
        record(job_id="2", **a, gpu_index=1, gpu_uuid="GPU-a1", mode="gpu", share="", mem_asked_mib=None,
               mem_granted_mib=A100, start=T0, end=T0 + H, mem_peak_mib=10240, sm_mean_percent=20.0,
               sm_peak_percent=50.0),
        record(job_id="3", **b, gpu_index=2, gpu_uuid="MIG-b", mode="mig", share="1g.10gb", mem_asked_mib=10240,
               mem_granted_mib=9984, start=T0 + H, end=T0 + 4 * H, mem_peak_mib=8000, sm_mean_percent=None,
               sm_peak_percent=None),
        record(job_id="4", **b, gpu_index=0, gpu_uuid="GPU-b0", mode="gpu", share="", mem_asked_mib=None,
               mem_granted_mib=H100, start=T0, end=T0 + H, mem_peak_mib=None, sm_mean_percent=None,
               sm_peak_percent=None, samples=0),
    ]


@pytest.fixture
def store(new_store):
    """The fixture's records in a new store, SQLite and PostgreSQL (tests/accounting/conftest.py)."""
    st = new_store()
    st.add(fixture())
    return st


def dicts(report):
    """The rows as ``{column name: value}``."""
    return [dict(zip([c.name for c in report.columns], row, strict=True)) for row in report.rows]


def by(report, key):
    return {row[report.columns[0].name]: row for row in dicts(report)}[key]


def test_per_user_totals_match_the_hand_computation(store):
    rep = usage_report(store, by="user")
    alice, bob = by(rep, "alice"), by(rep, "bob")
    assert (alice["jobs"], alice["gpus"]) == (2, 3)
    assert alice["gpu_hours"] == pytest.approx(2 * 0.125 + 2 * 1)                    # 2.25
    assert alice["gpu_hours_used"] == pytest.approx(2 * 0.30 + 0.80 + 0.20)           # 1.6
    assert alice["gpu_efficiency_pct"] == pytest.approx(100 * 1.6 / 2.25)             # 71.1
    assert alice["sm_mean_pct"] == pytest.approx((2 * 30 + 80 + 20) / 4)              # 40: averaged, not summed
    assert alice["sm_peak_pct"] == 90
    assert alice["mem_gib_hours"] == pytest.approx(2 * 10 + 80 + 80)                  # 180
    assert alice["mem_gib_hours_used"] == pytest.approx(2 * 4 + 20 + 10)              # 38
    assert alice["mem_efficiency_pct"] == pytest.approx(100 * 38 / 180)
    assert (alice["no_sm_data"], alice["no_mem_data"]) == (0, 0)
    assert (bob["jobs"], bob["gpus"]) == (2, 2)
    assert bob["gpu_hours"] == pytest.approx(3 * 9984 / H100 + 1)
    # MIG and the unsampled GPU: "no data", not 0%
    assert bob["gpu_hours_used"] is None and bob["gpu_efficiency_pct"] is None
    assert bob["sm_mean_pct"] is None and bob["sm_peak_pct"] is None
    assert bob["mem_gib_hours"] == pytest.approx(3 * 9984 / 1024 + H100 / 1024)
    assert bob["mem_gib_hours_used"] == pytest.approx(3 * 8000 / 1024)
    assert bob["mem_efficiency_pct"] == pytest.approx(100 * 8000 / 9984)              # only where a peak exists
    assert (bob["no_sm_data"], bob["no_mem_data"]) == (2, 1)
    total = dict(zip([c.name for c in rep.columns], rep.total, strict=True))
    assert (total["user"], total["jobs"], total["gpus"]) == ("TOTAL", 4, 5)
    assert total["gpu_hours"] == pytest.approx(2.25 + 3 * 9984 / H100 + 1)
    assert total["sm_mean_pct"] == pytest.approx(40) and total["sm_peak_pct"] == 90
    assert total["mem_efficiency_pct"] == pytest.approx(100 * (38 + 3 * 8000 / 1024) / (180 + 3 * 9984 / 1024))
    assert [row[0] for row in rep.rows] == ["alice", "bob"]  # most GPU-hours first


def test_a_two_gpu_job_is_averaged_over_its_gpus(store):
    rep = job_report(store)
    job2 = by(rep, "2")
    assert job2["gpus"] == 2 and job2["sm_mean_pct"] == pytest.approx(50) and job2["sm_peak_pct"] == 90
    assert job2["mem_peak_mib"] == 20480 and job2["mem_asked_mib"] is None and job2["mem_granted_mib"] == A100
    job1 = by(rep, "1")
    assert (job1["mem_asked_mib"], job1["mem_peak_mib"], job1["mem_used_pct"]) == (10240, 4096, 40.0)
    assert by(rep, "3")["sm_mean_pct"] is None and by(rep, "3")["share"] == "1g.10gb"
    assert [row[0] for row in rep.rows] == ["1", "2", "3", "4"]


@pytest.mark.parametrize("group, key, gpu_hours", [
    ("account", "physics", 2.25), ("partition", "gpu", 3.25 + 3 * 9984 / H100),
    ("model", "h100", 1 + 3 * 9984 / H100), ("mode", "mig", 3 * 9984 / H100), ("mode", "gpu", 3.0),
    ("node", "a100", 2.25), ("day", "2025-12-01", 3.25 + 3 * 9984 / H100), ("month", "2025-12", 3.25 + 0.367243),
])
def test_other_groupings(store, group, key, gpu_hours):
    assert by(usage_report(store, by=group), key)["gpu_hours"] == pytest.approx(gpu_hours, abs=1e-6)


def test_the_period_clips_durations(store):
    # [T0+1h, T0+2h): job 1 (MPS) 1 h of 2, job 3 (MIG) 1 h of 3; jobs 2 and 4 ended at T0+1h: outside
    rep = usage_report(store, by="user", since=T0 + H, until=T0 + 2 * H)
    alice, bob = by(rep, "alice"), by(rep, "bob")
    assert (alice["jobs"], alice["gpu_hours"], alice["gpu_hours_used"]) == (1, 0.125, pytest.approx(0.3))
    assert (bob["jobs"], bob["mem_gib_hours"]) == (1, pytest.approx(9984 / 1024))
    with pytest.raises(InputError, match="period is empty"):
        usage_report(store, since=T0 + H, until=T0)


def _wasteful(n: int) -> list:
    """``n`` one-GPU MPS jobs that asked 10 GiB and peaked at 1 GiB, job k running k minutes (job ids 1..n), and
    jobs n+1..n+3 of equal waste (an hour each) so that ties are decided by the job id."""
    a = dict(user="alice", account="physics", gpu_model="a100", gpu_memory_mib=A100, node="a100", mode="mps",
             share="shard:10", mem_asked_mib=10240, mem_granted_mib=10240, mem_peak_mib=1024)
    return ([record(job_id=str(k), **a, start=T0, end=T0 + 60 * k) for k in range(1, n + 1)]
            + [record(job_id=str(k), **a, start=T0, end=T0 + H) for k in range(n + 1, n + 4)])


def test_waste_keeps_the_limits_most_wasteful_in_the_unlimited_order(new_store):
    st = new_store()
    st.add(_wasteful(40))
    everything = waste_report(st, limit=0)
    assert len(everything.rows) == 43 and everything.left_out == 0
    # jobs 41-43 (an hour each: equal waste) before 40 (40 min), ties in job-id order as text
    order = [r[0] for r in everything.rows]
    assert order[:5] == ["41", "42", "43", "40", "39"]
    for limit in (1, 2, 3, 4, 7, 43, 50):
        rep = waste_report(st, limit=limit)
        assert [r[0] for r in rep.rows] == order[:limit]
        assert rep.left_out == max(0, 43 - limit)
    assert waste_report(st).left_out == 0  # the default (100) lists all 43
    with pytest.raises(InputError, match="not a number of jobs"):
        waste_report(st, limit=-1)


def test_waste_says_how_many_jobs_a_limit_left_out(new_store):
    st = new_store()
    st.add(_wasteful(3))
    table = render(waste_report(st, limit=2), "table")
    assert table.splitlines()[-1] == "(4 more jobs wasted less; --limit N shows N, --limit 0 all)"
    assert json.loads(render(waste_report(st, limit=5), "json"))["left_out"] == 1
    assert json.loads(render(waste_report(st, limit=0), "json"))["left_out"] == 0
    assert "more job wasted less" in render(waste_report(st, limit=5), "table")


def test_waste_lists_jobs_with_the_request_that_would_have_fit(store):
    rep = waste_report(store)
    rows = dicts(rep)
    assert [r["job"] for r in rows] == ["2", "1"]  # most wasted GiB-hours first
    assert rows[0]["would_fit"] == "gpushare:mem=24G:2"  # 20 GiB peak + 20%, two GPUs
    assert rows[0]["wasted_gib_hours"] == pytest.approx((80 - 20) + (80 - 10))
    assert rows[1]["would_fit"] == "gpushare:mem=5G"  # 4 GiB + 20% = 4.8 -> 5G
    assert rows[1]["wasted_gib_hours"] == pytest.approx(2 * 6)
    # job 3 used 78% of its request; job 4 has no peak: neither is judged


def test_waste_and_jobstats_suggest_by_the_sites_one_rule(new_store):
    """Issue 31 item 1: jobstats suggested mem=10G for a job that report --waste told to ask for mem=3G (whole GiB
    above the peak, whatever the site offers). Both now take the site's rule (jobstats.SuggestRule): the policy's
    headroom, shard unit and whole-GPU threshold, and the MIG slices of the model. A job whose suggestion is no
    smaller than its request is not listed."""
    rule = SuggestRule(unit_mib=2048, whole_threshold=0.5,
                       offers={"h100": Offer(H100, (10240, 20480, 40960)), "a100": Offer(A100)})
    common = dict(start=T0, end=T0 + H, sm_mean_percent=None, sm_peak_percent=None)
    recs = [
        # a 1g.10gb slice that peaked at 2.5 GiB: the smallest slice holds it, nothing smaller to ask for
        record(job_id="5", gpu_model="h100", gpu_memory_mib=H100, node="h100-mig", mode="mig", share="1g.10gb",
               mem_asked_mib=3072, mem_granted_mib=9984, mem_peak_mib=1200, **common),
        # a 20 GiB share that peaked at 4 GiB: 4.8 GiB in 2 GiB shard units is 6 GiB (whole GiB said 5G)
        record(job_id="6", mode="mps", share="shard:10", mem_asked_mib=20480, mem_granted_mib=20480,
               mem_peak_mib=4096, **common),
        # 40000 MiB of an 80 GiB share: + 20% is past the whole-GPU threshold (half a GPU here), a whole GPU, no
        # smaller than asked (whole GiB said 47G)
        record(job_id="7", mode="mps", share="shard:80", mem_asked_mib=81920, mem_granted_mib=81920,
               mem_peak_mib=40000, **common),
        # a 2-GPU job at 10 GiB on each of two 80 GiB GPUs: 12 GiB in 2 GiB units, on each
        *(record(job_id="8", gpu_index=i, gpu_uuid=f"GPU-{i}", mode="gpu", share="", mem_asked_mib=None,
                 mem_granted_mib=A100, mem_peak_mib=10240, **common) for i in (0, 1)),
    ]
    st = new_store()
    st.add(recs)
    rows = {r["job"]: r for r in dicts(waste_report(st, rule=rule))}
    assert {j: r["would_fit"] for j, r in rows.items()} == {"6": "gpushare:mem=6G", "8": "gpushare:mem=12G:2"}
    for job in "5678":
        suggestion = job_stats(job, [r for r in recs if r.job_id == job], source="store", rule=rule).suggestion
        asked = max(r.mem_asked_mib or r.mem_granted_mib for r in recs if r.job_id == job)
        if job in rows:
            assert rows[job]["would_fit"] == suggestion.request
        else:
            assert suggestion.mib >= asked, (job, suggestion)
    # the MIG job, by whole GiB above its peak, would have been told mem=2G
    assert job_stats("5", recs[:1], source="store", rule=rule).suggestion.request == "gpushare:mem=10G"


def test_table_says_no_data_and_has_a_total(store):
    text = render(usage_report(store, by="user"))
    lines = text.splitlines()
    assert lines[0] == "GPU usage by user"
    assert lines[1].split()[:4] == ["USER", "JOBS", "GPUS", "GPU-H"]
    # the efficiencies say what they divide (issue 31 item 6): "GPU EFF% 94.4" beside "SM MEAN% 52.2" read as a
    # contradiction; it is GPU-hours used over reserved, and a share's reservation is part of a GPU
    assert "GPU-H USED/RES%" in lines[1] and "MEM-H USED/RES%" in lines[1]
    assert "GPU EFF%" not in lines[1] and "MEM EFF%" not in lines[1]
    bob = next(ln for ln in lines if ln.startswith("bob"))
    assert NO_DATA in bob and " 0.0 " not in bob
    assert lines[-1].startswith("TOTAL")
    assert "(no records)" in render(usage_report(store, by="user", since=T0 + 100 * H))


def test_csv_and_json(store):
    rep = usage_report(store, by="user")
    rows = list(csv.DictReader(io.StringIO(render(rep, "csv"))))
    assert [r["user"] for r in rows] == ["alice", "bob"]
    assert rows[1]["sm_mean_pct"] == "" and float(rows[0]["sm_mean_pct"]) == 40.0
    assert float(rows[0]["gpu_hours"]) == 2.25 and rows[0]["jobs"] == "2"
    data = json.loads(render(rep, "json"))
    assert data["report"] == "usage" and data["by"] == "user" and data["since"] is None
    assert data["rows"][1]["sm_mean_pct"] is None and data["rows"][0]["sm_mean_pct"] == 40.0
    assert data["total"]["jobs"] == 4 and data["columns"][0] == "user"
    waste = json.loads(render(waste_report(store), "json"))
    assert waste["rows"][1]["would_fit"] == "gpushare:mem=5G"
    jobs = list(csv.DictReader(io.StringIO(render(job_report(store), "csv"))))
    assert jobs[1]["mem_asked_mib"] == "" and jobs[0]["mem_peak_mib"] == "4096"
    with pytest.raises(InputError, match="unknown report format"):
        render(rep, "xml")


@pytest.mark.parametrize("text, expected", [
    ("@1764547200", T0), ("now", 2_000_000_000), ("now-7days", 2_000_000_000 - 7 * 86400),
    ("now-12h", 2_000_000_000 - 12 * H), ("now-30min", 2_000_000_000 - 1800),
    ("2025-12-01T00:00:00+00:00", T0),
])
def test_parse_time(text, expected):
    assert parse_time(text, now=2_000_000_000) == expected


def test_parse_time_local_dates_and_errors():
    import time as _time
    assert parse_time("2025-12-01") == int(_time.mktime((2025, 12, 1, 0, 0, 0, 0, 0, -1)))
    with pytest.raises(InputError, match="--until 'yesterday' is not a time"):
        parse_time("yesterday", what="--until")


def test_waste_does_not_judge_jobs_that_failed(new_store):
    # a job that failed (e.g. out of memory under its MPS limit) must not be told to ask for less
    a = dict(user="alice", account="physics", gpu_model="a100", gpu_memory_mib=A100, node="a100", mode="mps",
             share="shard:10", mem_asked_mib=10240, mem_granted_mib=10240, start=T0, end=T0 + H, mem_peak_mib=2048)
    with new_store() as st:
        st.add([record(job_id="7", **a, exit_state="FAILED", exit_code="2:0"),
                record(job_id="8", **a, exit_state="SIGNALED", exit_code="0:9"),
                record(job_id="9", **a, exit_state="COMPLETED", exit_code="0:0")])
        assert [r["job"] for r in dicts(waste_report(st))] == ["9"]


def test_short_jobs_do_not_all_read_zero_hours_in_the_table():
    # found in a trial: jobs of seconds showed GPU-H 0.00 next to their efficiencies
    from slurm_gpushare.accounting.report import _cell
    assert [_cell(v, "hours") for v in (0, 0.5, 0.0028, 3.5e-5, 12.345)] == ["0.00", "0.50", "0.0028", "0.000035",
                                                                            "12.35"]


def test_array_tasks_are_named_as_sacct_names_them(new_store):
    # found in a trial: array tasks showed only their own job ids
    a = dict(user="alice", account="physics", gpu_model="a100", gpu_memory_mib=A100, node="a100", mode="gpu",
             share="", mem_asked_mib=None, mem_granted_mib=A100, start=T0, end=T0 + H, mem_peak_mib=2048)
    with new_store() as st:
        st.add([record(job_id="12", array_job_id="10", array_task_id=2, **a), record(job_id="13", **a)])
        rows = dicts(job_report(st))
        assert [(r["job"], r["array"]) for r in rows] == [("12", "10_2"), ("13", "")]
        assert "10_2" in render(job_report(st), "table")


def test_a_requeued_jobs_runs_add_up_without_the_time_between_them(new_store):
    # two runs on one GPU (restart 0 and 1), 1 h and 2 h, with 5 h pending between them: 3 h on 1 GPU
    with new_store() as st:
        st.add([record(job_id="7", restart=0, start=T0, end=T0 + H),
                record(job_id="7", restart=1, start=T0 + 6 * H, end=T0 + 8 * H)])
        row = by(job_report(st), "7")
    assert row["hours"] == pytest.approx(3.0) and row["gpus"] == 1


# --- filters: report --user/--account/--job ---------------------------------------------------------------

def test_filters_keep_to_users_accounts_and_jobs(store):
    from slurm_gpushare.accounting.report import Filters

    def jobs(rep):
        return [r[0] for r in rep.rows]

    assert jobs(job_report(store, filters=Filters(users=("bob",)))) == ["3", "4"]
    assert jobs(job_report(store, filters=Filters(users=("alice", "bob")))) == ["1", "2", "3", "4"]
    assert jobs(job_report(store, filters=Filters(accounts=("physics",)))) == ["1", "2"]
    assert jobs(job_report(store, filters=Filters(jobs=("2", "3")))) == ["2", "3"]
    # different options: all of them
    assert jobs(job_report(store, filters=Filters(users=("alice",), jobs=("3",)))) == []
    assert jobs(job_report(store, filters=Filters(users=("nobody",)))) == []
    by_user = usage_report(store, by="user", filters=Filters(accounts=("chem",)))
    assert [r[0] for r in by_user.rows] == ["bob"] and by_user.total[1] == 2
    # with a period: both apply
    assert jobs(job_report(store, since=T0 + 2 * H, filters=Filters(users=("bob",)))) == ["3"]
    assert jobs(waste_report(store, filters=Filters(users=("bob",)))) == []
    assert jobs(waste_report(store, filters=Filters(users=("alice",)))) == jobs(waste_report(store))


def test_a_job_filter_takes_an_arrays_id_for_all_its_tasks(new_store):
    from slurm_gpushare.accounting.report import Filters

    with new_store() as st:
        st.add([record(job_id="41", array_job_id="40", array_task_id=1),
                record(job_id="42", array_job_id="40", array_task_id=2), record(job_id="43")])
        assert [r[0] for r in job_report(st, filters=Filters(jobs=("40",))).rows] == ["41", "42"]
        assert [r[0] for r in job_report(st, filters=Filters(jobs=("42",))).rows] == ["42"]


def test_report_command_filters(target):
    """The command line on both stores: ``--db`` takes a file or a ``postgresql://`` URL."""
    from click.testing import CliRunner

    from slurm_gpushare.cli import main

    db = target
    with Store(db) as st:
        st.add(fixture())
    out = CliRunner().invoke(main, ["report", "--db", str(db), "--by", "job", "--format", "json", "--user", "alice",
                                    "--job", "2", "--job", "3"])
    assert out.exit_code == 0, out.output
    assert [r["job"] for r in json.loads(out.output)["rows"]] == ["2"]
    out = CliRunner().invoke(main, ["report", "--db", str(db), "--account", "chem", "--format", "csv"])
    assert out.exit_code == 0 and [r.split(",")[0] for r in out.output.splitlines()[1:]] == ["bob"], out.output
    out = CliRunner().invoke(main, ["report", "--db", str(db), "--job", "12x"])
    assert out.exit_code == 2 and "not a job id" in out.output
