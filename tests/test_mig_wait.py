"""mig plan's expected queue wait: the FIFO replay with backfill on small cases worked out by hand, today
against a plan with more fitting slices, the traces (store, Poisson), and the properties that no slot
runs two jobs at once, no job starts before it arrives or on a slot outside its class, and no job
queues while a slot of its class is free.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_gpushare.accounting.store import Store
from slurm_gpushare.cli import main
from slurm_gpushare.errors import InputError
from slurm_gpushare.hardware.machine import Machine
from slurm_gpushare.mig.demand import Request
from slurm_gpushare.mig.output import summary
from slurm_gpushare.mig.plan import Slot, plan_layout
from slurm_gpushare.mig.wait import (
    Job,
    Trace,
    expected_waits,
    overloaded,
    poisson_trace,
    replay,
    slot_class,
    trace_from_store,
    wait_of,
)
from tests.test_mig_plan import record

G = 1024
PACKAGED = Path(__file__).resolve().parent.parent / "slurm_gpushare" / "data" / "machines"
#: an H100's slots as the nominal fit counts them
S1 = Slot(10 * G, 1, 7)           # 1g.10gb
S3 = Slot(40 * G, 3, 7)           # 3g.40gb
WHOLE = Slot(80 * G, 7, 7, whole=True)


def trace(*jobs: Job) -> Trace:
    return Trace(jobs=jobs, source="test", lower_bound=False, note="test")


# --- by hand --------------------------------------------------------------------------------------


def test_three_jobs_on_two_slices():
    # all arrive at 0: 0 -> slot 0 (0-10), 1 -> slot 1 (0-20), 2 waits for slot 0 (10-15)
    jobs = (Job(0, 10, 5 * G), Job(0, 20, 5 * G), Job(0, 5, 5 * G))
    r = replay([S1, S1], jobs)
    assert sorted((s.job, s.slot, s.start_s, s.end_s) for s in r.started) == [(0, 0, 0, 10), (1, 1, 0, 20),
                                                                            (2, 0, 10, 15)]
    w = wait_of([S1, S1], trace(*jobs))
    assert (w.jobs, w.never, w.mean_s, w.p95_s) == (3, 0, pytest.approx(10 / 3), 10)


def test_a_later_job_backfills_a_slot_the_queued_one_cannot_use():
    # slot 0 1g.10gb, slot 1 3g.40gb. 30G at 0 runs on slot 1 until 10; 30G at 1 queues for slot 1 (starts
    # 10); 5G at 2 takes slot 0 at once although an earlier job queues; 5G at 3 waits for slot 0 until 5
    jobs = (Job(0, 10, 30 * G), Job(1, 5, 30 * G), Job(2, 3, 5 * G), Job(3, 1, 5 * G))
    r = replay([S1, S3], jobs)
    assert {s.job: (s.slot, s.start_s) for s in r.started} == {0: (1, 0), 1: (1, 10), 2: (0, 2), 3: (0, 5)}
    w = wait_of([S1, S3], trace(*jobs))
    # waits 0, 9, 0, 2: mean 11/4, p95 the ceil(0.95 * 4) = 4th smallest
    assert (w.mean_s, w.p95_s) == (2.75, 9)


def test_a_request_is_bound_to_the_smallest_slice_type_that_holds_it():
    # as the submit filter binds mem=5G to the 1g.10gb GRES type: the second job waits for the 1g slice
    # while the 3g.40gb is free
    r = replay([S1, S3], (Job(0, 10, 5 * G), Job(0, 10, 5 * G)))
    assert sorted((s.slot, s.start_s) for s in r.started) == [(0, 0), (0, 10)]


def test_whole_gpus_serve_whole_requests_and_what_no_slice_holds_in_fifo_order():
    # slot 0 1g.10gb, slot 1 MIG off. A whole-GPU job at 0 (until 10), 50G at 1 (no slice holds it: the
    # MIG-off GPU, 10-14), a whole-GPU job at 2 (14-15); a 90G job no slot holds never starts. Then with a
    # 40G MIG-off GPU too (slot 2, busy until 20 from 0): the 50G job at 1 still goes first on slot 1
    jobs = (Job(0, 10, whole=True), Job(1, 4, 50 * G), Job(2, 1, whole=True), Job(3, 1, 90 * G))
    r = replay([S1, WHOLE], jobs)
    assert {s.job: (s.slot, s.start_s) for s in r.started} == {0: (1, 0), 1: (1, 10), 2: (1, 14)}
    assert r.never == (3,)
    w = wait_of([S1, WHOLE], trace(*jobs))
    assert (w.jobs, w.never, w.mean_s, w.p95_s) == (3, 1, pytest.approx(21 / 3), 12)
    w40 = Slot(40 * G, 7, 7, whole=True)
    r = replay([S1, WHOLE, w40], (Job(0, 20, whole=True), *jobs))
    assert {s.job: (s.slot, s.start_s) for s in r.started} == {0: (2, 0), 1: (1, 0), 2: (1, 10), 3: (1, 14)}


def test_a_slot_freed_at_an_arrival_serves_it_and_sm_needs_its_slices():
    # sm=30 on 7 slices needs ceil(2.1) = 3 slices: the 3g.40gb, not the 1g.10gb
    assert slot_class([S1, S3, WHOLE], 5 * G, 30, False) == (S3,)
    assert slot_class([S1, S3, WHOLE], 5 * G, None, False) == (S1,)
    assert slot_class([S1, S3], 0, None, True) == ()
    r = replay([S1], (Job(0, 5, G), Job(5, 1, G)))
    assert [s.start_s for s in r.started] == [0, 5]


def test_no_job_and_empty_layouts():
    assert wait_of([S1], trace()).mean_s == 0
    w = wait_of([], trace(Job(0, 1, G)))
    assert (w.jobs, w.never) == (0, 1)


# --- today against a plan -------------------------------------------------------------------------


def test_a_plan_with_more_fitting_slices_waits_less_than_today():
    # the packaged H100 node holds six 1g.10gb slices today; 5.5 requests of 10G at once load them to 92 %,
    # the plan makes 1g.10gb slices of more GPUs
    m = Machine.load(PACKAGED / "4x-h100-mig-mixed.json")
    plan = plan_layout([m], [Request(10 * G, 5.5)], keep_mig_mode=True)
    assert sum(s == S1 for p in plan.gpus for s in p.choice.slots) > 6
    waits = expected_waits(plan, poisson_trace(plan.demand, jobs=4000))
    assert waits.today.jobs == waits.planned.jobs == 4000
    assert waits.today.mean_s > 10 * 60 and waits.planned.mean_s < waits.today.mean_s / 10
    assert waits.today.p95_s > waits.planned.p95_s
    assert waits.today.overloaded == waits.planned.overloaded == ()
    text = summary(plan, waits)
    assert "queue wait: FIFO replay with backfill of 4000 Poisson arrivals" in text
    assert text.count("  queue wait        mean ") == 2 and ", mean queue wait -" in text


def test_overloaded_kinds_are_named():
    # 7 at once of 10G on six 1g.10gb slices; 1 whole GPU asked, one MIG-off GPU: both grow without end
    assert overloaded([S1] * 6 + [WHOLE], [Request(10 * G, 7), Request(0, 1, whole=True), Request(30 * G, 0.5)]) \
        == ("10G", "gpu", "30G")
    assert overloaded([S1] * 6 + [WHOLE, WHOLE], [Request(10 * G, 5.9), Request(0, 1, whole=True)]) == ()


# --- traces ---------------------------------------------------------------------------------------


def test_the_poisson_trace_is_deterministic_and_at_the_counts_load():
    demand = [Request(10 * G, 6), Request(20 * G, 2)]
    a, b = poisson_trace(demand), poisson_trace(demand)
    assert a == b and len(a.jobs) == 10_000 and not a.lower_bound
    assert poisson_trace(demand, seed=2) != a
    span = a.jobs[-1].arrival_s
    busy = sum(j.run_s for j in a.jobs if j.mem_mib == 10 * G) / span
    assert busy == pytest.approx(6, rel=0.05)  # Little's law: 6 at once
    assert sum(j.mem_mib == 20 * G for j in a.jobs) / len(a.jobs) == pytest.approx(0.25, abs=0.02)
    with pytest.raises(InputError, match="a Poisson trace needs"):
        poisson_trace([])


def test_the_store_trace_arrives_at_starts(tmp_path):
    with Store(tmp_path / "a.db") as store:
        store.add([record(job_id="1", start=100, end=400, sm_asked_percent=20),
                   record(job_id="2", mode="gpu", share="", mem_asked_mib=None, start=50, end=60),
                   record(job_id="3", mode="mps", share="shard:1", mem_asked_mib=None, start=70, end=80),
                   record(job_id="4", start=0, end=5000),   # started before the period
                   record(job_id="5", partition="other", start=200, end=300)])
        t = trace_from_store(store, partitions=("gpu",), since=10, until=1000)
    assert t.lower_bound and t.source == "store" and "lower bounds" in t.note
    assert t.jobs == (Job(50, 10, 0, None, True), Job(100, 300, 10 * G, 20, False))


def test_cli_prints_both_waits_from_the_store(tmp_path):
    # five jobs of 6G that each ran the whole hour on the A100 with MIG off today: one at a time there,
    # waits 0, 1, 2, 3, 4 hours (mean 2 h, p95 4 h); the plan's slices run all five at once
    db = tmp_path / "a.db"
    with Store(db) as store:
        store.add([record(job_id=str(i), mem_asked_mib=6 * G, start=0, end=3600) for i in range(5)])
    r = CliRunner().invoke(main, ["mig", "plan", "--model", "a100-80gb", "--store", str(db), "--since", "@0",
                                  "--until", "@3600"])
    assert r.exit_code == 0, r.output
    assert "queue wait: FIFO replay with backfill of 5 jobs of the store" in r.output and "lower bounds" in r.output
    today, plan = (line.split("queue wait", 1)[1].strip() for line in r.output.splitlines()
                   if line.startswith("  queue wait"))
    assert today == "mean 2.00 h, p95 4.00 h over 5 jobs" and plan == "mean 0 s, p95 0 s over 5 jobs"
    assert "mean queue wait -2.00 h" in r.output


def test_cli_from_a_demand_file_replays_poisson_arrivals(tmp_path):
    demand = tmp_path / "d.csv"
    demand.write_text("10G,3\ngpu,1\n")
    r = CliRunner().invoke(main, ["mig", "plan", "--model", "a100-80gb", "--gpus", "2", "--demand", str(demand)])
    assert r.exit_code == 0, r.output
    assert "10000 Poisson arrivals" in r.output and "seed 1" in r.output
    # one MIG-off GPU for one whole-GPU request at once: that queue grows without end, and says so
    assert "overloaded (gpu asked at least as often at once as slots hold them" in r.output


# --- properties -----------------------------------------------------------------------------------


SLOTS = [S1, Slot(20 * G, 1, 7), Slot(20 * G, 2, 7), S3, Slot(40 * G, 4, 7), WHOLE, Slot(40 * G, 7, 7, whole=True)]
jobs_st = st.lists(st.builds(Job, arrival_s=st.integers(0, 30), run_s=st.integers(0, 20),
                             mem_mib=st.sampled_from([G, 10 * G, 15 * G, 30 * G, 50 * G, 90 * G]),
                             sm_percent=st.one_of(st.none(), st.integers(1, 100)), whole=st.booleans()),
                   min_size=1, max_size=40)
layouts = st.lists(st.sampled_from(SLOTS), max_size=6)
# with MIG-off GPUs of two sizes, whole-GPU jobs and the large requests queue in two classes that share a slot
layouts = st.one_of(layouts, layouts.map(lambda s: [*s, WHOLE, SLOTS[-1]]))


@settings(max_examples=150, deadline=None)
@given(slots=layouts, jobs=jobs_st)
def test_the_replay_never_runs_two_jobs_on_one_slot_nor_one_before_it_arrives(slots, jobs):
    r = replay(slots, jobs)
    types = sorted(set(slots), key=lambda s: (s.mem_mib, s.slices, s.whole))
    assert sorted([s.job for s in r.started] + list(r.never)) == list(range(len(jobs)))
    for i in r.never:
        assert slot_class(types, jobs[i].mem_mib, jobs[i].sm_percent, jobs[i].whole) == ()
    by_slot: dict[int, list] = {}
    for s in r.started:
        j = jobs[s.job]
        assert s.start_s >= j.arrival_s and s.end_s == s.start_s + j.run_s
        assert slots[s.slot] in slot_class(types, j.mem_mib, j.sm_percent, j.whole)
        by_slot.setdefault(s.slot, []).append(s)
    for runs in by_slot.values():
        runs.sort(key=lambda s: (s.start_s, s.end_s))
        for a, b in zip(runs, runs[1:], strict=False):
            assert b.start_s >= a.end_s, (a, b)
    # no job queues while a slot of its class is free: at its arrival every such slot is busy past it
    for s in r.started:
        j = jobs[s.job]
        if s.start_s > j.arrival_s:
            cls = slot_class(types, j.mem_mib, j.sm_percent, j.whole)
            for k, slot in enumerate(slots):
                if slot in cls:
                    assert any(o.start_s <= j.arrival_s < o.end_s for o in by_slot.get(k, [])), (s, k)
    # FIFO with backfill: a job never takes a slot that an earlier job, queued at that moment, could use
    runs = {s.job: s for s in r.started}
    for b, rb in runs.items():
        for a, ra in runs.items():
            if (jobs[a].arrival_s, a) < (jobs[b].arrival_s, b) and jobs[a].arrival_s <= rb.start_s < ra.start_s:
                assert slots[rb.slot] not in slot_class(types, jobs[a].mem_mib, jobs[a].sm_percent, jobs[a].whole)
