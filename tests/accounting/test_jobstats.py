"""``slurm-gpushare jobstats``: the suggestion's rounding (headroom, shard units, MIG profiles, whole GPUs), the
terminal chart, who may see a job, and the command over a store and over sacct's AdminComment segment."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from slurm_gpushare.accounting import jobstats as js
from slurm_gpushare.accounting.jobstats import (
    NotYours,
    Offer,
    SuggestRule,
    bar,
    chart,
    job_stats,
    may_see,
    suggest,
)
from slurm_gpushare.accounting.sacct import final_segment
from slurm_gpushare.accounting.store import Store
from slurm_gpushare.cli import main
from slurm_gpushare.errors import InputError
from slurm_gpushare_dev.cluster import DEFAULT_NODES, packaged_machine
from tests.accounting.test_record import record
from tests.accounting.test_report import A100, H100, T0, fixture

H100_MIG = (10240, 20480, 40960, 81920)  # 1g.10gb, 2g.20gb / 1g.20gb, 3g.40gb / 4g.40gb, 7g.80gb


# --- the suggestion --------------------------------------------------------------------------------------

@pytest.mark.parametrize(("peak", "offer", "kw", "want"), [
    # peak x 1.2 rounded up to whole GiB (MPS shares come in shard units)
    (6000, Offer(24564), {}, "gpushare:mem=8G"),          # 7200 MiB -> 8 GiB
    (4096, Offer(A100), {}, "gpushare:mem=5G"),           # 4915.2 -> 5 GiB
    (1, Offer(A100), {}, "gpushare:mem=1G"),              # never less than one unit
    (0, Offer(A100), {}, "gpushare:mem=1G"),
    (6000, Offer(24564), {"headroom": 0.0}, "gpushare:mem=6G"),
    (6000, Offer(24564), {"headroom": 0.5}, "gpushare:mem=9G"),
    # another shard unit: 512 MiB steps
    (6000, Offer(24564), {"unit_mib": 512}, "gpushare:mem=7680M"),
    # a MIG job: the smallest profile that holds peak x 1.2, by its nominal size
    (7000, Offer(H100, H100_MIG), {"on_mig": True}, "gpushare:mem=10G"),    # 8400 -> 1g.10gb
    (8600, Offer(H100, H100_MIG), {"on_mig": True}, "gpushare:mem=20G"),    # 10320 -> 2g.20gb
    (30000, Offer(H100, H100_MIG), {"on_mig": True}, "gpushare:mem=40G"),   # 36000 -> 3g.40gb
    # the same peak of an MPS job: shard units, MIG sizes do not apply
    (8600, Offer(H100, H100_MIG), {}, "gpushare:mem=11G"),
    # a MIG job that no slice smaller than the GPU holds: shard units (an MPS share holds it)
    (50000, Offer(H100, H100_MIG), {"on_mig": True}, "gpushare:mem=59G"),
    # a whole GPU's size (its nominal memory: 81559 MiB reads 80G), also beyond it
    (70000, Offer(H100), {}, "gpushare:mem=80G"),
    (90000, Offer(H100), {}, "gpushare:mem=80G"),
    # the policy's whole_gpu.threshold: from 0.5 of the GPU on, a whole one
    (11000, Offer(24564), {"whole_threshold": 0.5}, "gpushare:mem=24G"),
    # several devices per node
    (6000, Offer(24564), {"count": 2}, "gpushare:mem=8G:2"),
    # a job that failed near its limit: at least what it had
    (9800, Offer(24564), {"at_least_mib": 10240, "headroom": 0.0}, "gpushare:mem=10G"),
])
def test_suggestion_rounds_to_what_the_site_offers(peak, offer, kw, want):
    assert suggest(peak, offer, **kw).request == want


def test_suggestion_says_why():
    s = suggest(7000, Offer(H100, H100_MIG), on_mig=True)
    assert (s.mib, s.why) == (10240, "peak 7000 MiB + 20% headroom = 8400 MiB, the smallest MIG slice that holds "
                                     "it (10G)")
    assert "more than one GPU holds" in suggest(90000, Offer(H100)).why
    assert "peaked near its limit" in suggest(9800, Offer(24564), at_least_mib=10240, headroom=0.0).why


def test_a_job_that_held_no_memory_is_asked_whether_it_needs_a_gpu():
    # found by a reviewer: "peak 0 MiB + 20% headroom = 1 MiB"
    got = suggest(0, Offer(81920, ()), headroom=0.2)
    assert got.mib == 1024 and "held no GPU memory" in got.why and "0 MiB" not in got.why


@pytest.mark.parametrize("kw", [{"headroom": -0.1}, {"unit_mib": 0}, {"count": 0}])
def test_suggestion_refuses_nonsense(kw):
    with pytest.raises(InputError, match="cannot suggest"):
        suggest(1000, Offer(A100), **kw)


def test_offers_from_the_site_machines():
    machines = [packaged_machine(DEFAULT_NODES[n]) for n in DEFAULT_NODES]
    offers = js.offers_from_machines(machines)
    mig_models = {m for m, o in offers.items() if o.mig_mib}
    assert mig_models, offers
    for model in mig_models:
        assert all(size % 1024 == 0 for size in offers[model].mig_mib), offers[model]
    assert not any(o.mig_mib for o in js.offers_from_machines(machines, mig_enabled=False).values())


# --- the job's stats ----------------------------------------------------------------------------------------

def test_job_stats_of_a_share_and_of_a_mig_slice_without_site_data():
    recs = fixture()
    mps = job_stats("1", [r for r in recs if r.job_id == "1"], source="store")
    assert mps.suggestion.request == "gpushare:mem=5G"  # peak 4 GiB x 1.2
    assert mps.devices[0].used_pct == 40.0
    # the MIG job's own record names its slice: the suggestion rounds to it
    mig = job_stats("3", [r for r in recs if r.job_id == "3"], source="sacct")
    assert mig.suggestion.request == "gpushare:mem=10G"  # 8000 x 1.2 = 9600 -> the 10G slice it had
    # two whole GPUs on one node: the higher peak, two devices
    two = job_stats("2", [r for r in recs if r.job_id == "2"], source="store")
    assert two.suggestion.request == "gpushare:mem=24G:2"  # 20480 x 1.2 = 24576
    # never sampled: no suggestion
    assert job_stats("4", [r for r in recs if r.job_id == "4"], source="store").suggestion is None
    with pytest.raises(InputError, match="no GPU usage records"):
        job_stats("5", [], source="store")


def test_a_failed_job_near_its_limit_is_not_told_to_ask_for_less():
    r = record(job_id="7", mode="mps", share="shard:10", mem_asked_mib=10240, mem_granted_mib=10240,
               mem_peak_mib=9900, exit_state="FAILED", exit_code="1:0")
    assert job_stats("7", [r], source="store", rule=SuggestRule(headroom=0.0)).suggestion.request == "gpushare:mem=10G"
    ok = record(job_id="7", mode="mps", share="shard:10", mem_asked_mib=10240, mem_granted_mib=10240,
                mem_peak_mib=3000, exit_state="FAILED", exit_code="1:0")
    assert job_stats("7", [ok], source="store").suggestion.request == "gpushare:mem=4G"


def test_a_requeued_job_suggests_from_its_last_run():
    runs = [record(job_id="8", restart=0, mem_peak_mib=20000, mem_granted_mib=24576, mode="mps", share="shard:24"),
            record(job_id="8", restart=1, mem_peak_mib=2000, mem_granted_mib=24576, mode="mps", share="shard:24")]
    stats = job_stats("8", runs, source="store")
    assert len(stats.devices) == 2 and stats.suggestion.request == "gpushare:mem=3G"
    assert "run 0" in js.to_text(stats) and "run 1" in js.to_text(stats)


def test_of_a_reused_job_id_only_the_current_jobs_runs_are_shown():
    """Issue 26 item 6: the store keeps two jobs of one user that Slurm gave one id (a lost StateSaveLocation):
    an old requeued job (runs 0 and 1) and the current one (run 0, later submit). jobstats shows the current job's
    run only; of a requeued job it shows every run back to its first; slurmctld's submit time and restart count,
    where it still knows the job, choose the job even before its run has records."""
    old0 = record(job_id="8", restart=0, submit=100, start=110, end=120, exit_state="REQUEUED", node="n1")
    old1 = record(job_id="8", restart=1, submit=130, start=140, end=150, node="n1")
    new0 = record(job_id="8", restart=0, submit=900, start=910, end=990, exit_state="REQUEUED", node="n2")
    new1 = record(job_id="8", restart=1, submit=995, start=1000, end=1100, node="n2")
    assert js.current_job([old0, old1, new0]) == [new0]
    assert js.current_job([new1, old1, new0, old0]) == [new0, new1]
    assert js.current_job([old0, old1]) == [old0, old1]
    # slurmctld knows the job: its run (submit 995) or, before that run has records, its earlier runs only
    assert js.current_job([old0, old1, new0, new1], submit=995, restarts=1) == [new0, new1]
    assert js.current_job([old0, old1, new0], submit=995, restarts=1) == [new0]
    assert js.current_job([old0, old1], submit=900, restarts=0) == []
    # records of releases before version 4 (submit 0): by restart and state alone, as before
    legacy = [replace(r, submit=0) for r in (old0, old1)]
    assert js.current_job(legacy) == legacy and js.current_job([]) == []
    # a submit time not known (0: a node of an earlier release, slurmctld not reached by the Epilog) is never
    # read as older than a known one: runs are ordered by their start
    r0 = record(job_id="8", restart=0, submit=900, start=910, end=990, exit_state="REQUEUED")
    r1 = record(job_id="8", restart=1, submit=0, start=1000, end=1100)
    assert js.current_job([r0, r1]) == [r0, r1] and js.current_job([r0, r1], submit=995, restarts=1) == [r0, r1]
    old, new = record(job_id="8", submit=100, start=110, end=120), record(job_id="8", submit=0, start=5000, end=6000)
    assert js.current_job([old, new]) == [new] and js.current_job([old, new], submit=4990, restarts=0) == [new]


# --- the chart ----------------------------------------------------------------------------------------------

def test_bar_resolves_eighths_and_clips():
    assert bar(0, 10, 8) == " " * 8
    assert bar(10, 10, 8) == "█" * 8
    assert bar(20, 10, 8) == "█" * 8
    assert bar(1, 16, 2) == "▏ "
    assert bar(5, 10, 3) == "█▌ "
    assert len(bar(3.3, 10)) == js.BAR_WIDTH


def test_chart_draws_asked_granted_peak_on_one_scale():
    r = record(mem_asked_mib=10240, mem_granted_mib=10240, mem_peak_mib=5120, sm_mean_percent=25.0,
               sm_peak_percent=60.0, mode="mps", share="shard:10")
    lines = chart(js.DeviceStats(r), width=8)
    assert lines == ["  asked    ████████  10G",
                     "  granted  ████████  10G",
                     "  peak     ████      5G (50% of what it asked)",
                     "  SM mean  ██        25%, peak 60%"]
    mig = chart(js.DeviceStats(record(mode="mig", share="1g.10gb", mem_asked_mib=None, mem_granted_mib=9984,
                                      mem_peak_mib=None, sm_mean_percent=None, sm_peak_percent=None)), width=8)
    assert "no data" in mig[2] and "no data" in mig[3] and "no size" in mig[0]


def test_memory_over_time_is_a_sparkline_on_the_granted_memory_with_its_time_span():
    assert js.sparkline([0, 1024, 1025, 4096, 8192, 9000], 8192) == "▁▁▂▄█!"
    # 30 samples over an hour in 4 buckets of 8 (the last one of 6): 120 s a sample, 16 min a column
    r = record(mem_asked_mib=10240, mem_granted_mib=10240, mem_peak_mib=10240, sm_mean_percent=25.0,
               sm_peak_percent=60.0, mode="mps", share="shard:10", start=1000, end=4600, samples=30,
               mem_series_mib=(1280, 5120, 10240, 0), mem_series_width=8)
    lines = chart(js.DeviceStats(r), width=8)
    assert lines[:4] == chart(js.DeviceStats(record(**{**r.to_dict(), "mem_series_mib": None,
                                                        "mem_series_width": None})), width=8)
    assert lines[4] == "  used     ▕▁▄█▁▏    over 60.0 min, 16.0 min a column (8 samples), full height = granted 10G"
    one = record(samples=1, start=1000, end=1060, mem_series_mib=(4096,), mem_series_width=1)
    assert js.series_line(one).endswith("over 60 s, 60 s a column (1 sample), full height = granted 10G")
    assert js.series_line(record()) is None  # no series, no line (records before format 3, sacct)
    stats = job_stats("42", [r], source="store")
    assert "▕▁▄█▁▏" in js.to_text(stats) and "only in the accounting database" not in js.to_text(stats)
    data = json.loads(js.to_json(stats))["devices"][0]
    assert data["mem_series_mib"] == [1280, 5120, 10240, 0] and data["mem_series_width"] == 8


def test_text_and_json_views():
    recs = [r for r in fixture() if r.job_id == "1"]
    stats = job_stats("1", recs, source="sacct")
    text = js.to_text(stats)
    assert text.startswith("job 1  user alice  account physics")
    assert "next time: --gres=gpushare:mem=5G" in text and "sacct" in text
    assert "memory over time is kept only in the accounting database" in text
    data = json.loads(js.to_json(stats))
    assert data["suggestion"]["request"] == "gpushare:mem=5G" and data["devices"][0]["used_pct"] == 40.0


def test_the_header_is_the_runs_own_and_a_users_job_name_cannot_reach_a_terminal():
    # sacct -X -D -P: JobIDRaw|Start|State|NNodes|NCPUS|AllocTRES|QOS|Partition|ElapsedRaw|TimelimitRaw|UID, and the
    # names apart (JobIDRaw|Start|JobName): a name is the user's text, newlines included
    text = (f"7|{T0 - 900}|REQUEUED|1|4|billing=4,cpu=4,gres/gpu=1,mem=16G,node=1|normal|gpu|300|60|1001\n"
            f"7|{T0}|CANCELLED by 1001|2|8|cpu=8,gres:gpu=2,mem=32000M,node=2|long|gpu|720|60|1001\n"
            f"70|{T0}|COMPLETED|1|1|cpu=1,mem=1G|normal|cpu|5|UNLIMITED|1001\n")
    names = (f"7|{T0 - 900}|first run\n7|{T0}|train\x1b]0;owned\x07 | resnet\n70|{T0}|other job\n")
    h = js.parse_job_header(text, "7", names=names)  # no start given: the most recent run
    assert (h.state, h.nodes, h.cpus, h.mem_mib, h.gpus, h.qos, h.partition) == ("CANCELLED", 2, 8, 32000, 2, "long",
                                                                                  "gpu")
    assert (h.start, h.elapsed_s, h.limit_s, h.limit_used_pct) == (T0, 720, 3600, 20.0)
    assert h.name == "train]0;owned | resnet"  # the escape and bell are gone, the '|' of the name is kept
    first = js.parse_job_header(text, "7", T0 - 900, names=names)  # the run slurmctld's job started at
    assert (first.state, first.mem_mib, first.gpus, first.elapsed_s, first.name) == ("REQUEUED", 16384, 1, 300,
                                                                                     "first run")
    other = js.parse_job_header(text, "70", names=names)
    assert other.limit_s is None and other.limit_used_pct is None and other.gpus == 0
    assert js.parse_job_header(text, "8") is None and js.parse_job_header("", "7") is None
    assert js.parse_job_header(text, "70").name == ""  # names not read (sacct failed): no name
    assert js.parse_job_header(f"9|{T0}|COMPLETED|1|1|cpu=1|normal|gpu|5|0|1001\n", "9").limit_s is None  # --time=0
    assert js.header_lines(js.parse_job_header(f"9|{T0}|COMPLETED|1|1|cpu=1|normal|gpu|5|0|1001\n", "9"))[1].endswith(
        "no time limit")
    long_name = js.parse_job_header(f"9|{T0}|RUNNING|1|1|cpu=1|normal|gpu|5|10|1001\n", "9",
                                    names=f"9|{T0}|{'x' * 200}\n")
    assert long_name.name == "x" * js.NAME_CHARS + "..." and long_name.mem_mib is None

    stats = job_stats("7", [r for r in fixture() if r.job_id == "1"], source="sacct", header=h)
    text_view = js.to_text(stats)
    lines = text_view.splitlines()
    assert lines[1] == ("  name train]0;owned | resnet  state CANCELLED  nodes 2  cores 8  CPU memory 32000M  GPUs 2  "
                        "QOS long")
    assert lines[2].endswith("  ran 12.0 min of a 60.0 min limit (20% of it)") and lines[2].startswith("  started 20")
    assert "\x1b" not in text_view
    assert json.loads(js.to_json(stats))["slurm"] == {**h.to_dict(), "limit_used_pct": 20.0}
    assert json.loads(js.to_json(job_stats("1", fixture()[:1], source="sacct")))["slurm"] is None


def test_a_job_name_with_a_forged_sacct_row_changes_no_field_of_the_header():
    """sacct -P prints a job name as the user wrote it, newlines included: a name ``x\\n7|<later>|COMPLETED|...``
    made a row of its own, which was taken for the job's most recent run (state, GPUs, elapsed). The header's
    fields come from a sacct call without the name; the name's own call gives the name of the run's first line."""
    forged = f"7|{T0 + 9999}|COMPLETED|64|512|cpu=512,gres/gpu=64,mem=4T,node=64|high|gpu|1|UNLIMITED|1001"
    text = f"7|{T0}|FAILED|1|4|cpu=4,gres/gpu=1,mem=16G,node=1|normal|gpu|300|60|1001\n"
    names = f"7|{T0}|x\n{forged}|y\n"
    for start in (None, T0):
        h = js.parse_job_header(text, "7", start, names=names)
        assert (h.state, h.gpus, h.nodes, h.start, h.elapsed_s, h.limit_s, h.name) == (
            "FAILED", 1, 1, T0, 300, 3600, "x"), h
    assert js.parse_job_header(text, "7", T0 + 9999, names=names).start == T0  # no such run: the most recent


def test_a_run_row_of_another_uid_is_said_incomplete_and_another_users_job_of_the_id_is_not_taken():
    """Slurm 22.05 was seen keeping a user's job as a row without its start record: uid 0, name ``allocation``,
    no QOS (CI, job 3 of the accounting module). The header showed that row's name and QOS as the job's; with
    slurmctld's owner given, a row of another uid says it is incomplete instead."""
    text = f"3|{T0}|COMPLETED|1|2|billing=2,cpu=2,gres/shard=10,mem=200M,node=1|Unknown|gpu|1|0|0\n"
    names = f"3|{T0}|allocation\n"
    as_recorded = js.parse_job_header(text, "3", T0, names=names)  # no owner known: the row as sacct has it
    assert (as_recorded.name, as_recorded.qos, as_recorded.incomplete) == ("allocation", "Unknown", False)
    assert js.parse_job_header(text, "3", T0, names=names, owner_uid=0) == as_recorded  # root's own job
    h = js.parse_job_header(text, "3", T0, names=names, owner_uid=1001)
    assert (h.name, h.qos, h.partition, h.limit_s, h.incomplete) == ("", "", "", None, True)
    assert (h.state, h.cpus, h.mem_mib, h.start, h.elapsed_s) == ("COMPLETED", 2, 200, T0, 1)
    lines = js.header_lines(h)
    assert lines[0] == "  name -  state COMPLETED  nodes 1  cores 2  CPU memory 200M  GPUs 0  QOS -"
    assert lines[1].endswith("  ran 1 s") and "names another user than slurmctld" in lines[2], lines
    assert h.to_dict()["incomplete"] is True and as_recorded.to_dict()["incomplete"] is False
    # another user's older job of the id (slurmctld's state lost) is not this run, whatever its start: with the
    # owner known, only the owner's rows and the row that started when slurmctld's job did are taken
    other = f"3|{T0 - 86400}|COMPLETED|4|64|cpu=64,gres/gpu=8,node=4|normal|gpu|36000|0|1002\n"
    assert js.parse_job_header(other, "3", T0, owner_uid=1001) is None
    assert js.parse_job_header(other, "3", None, owner_uid=1001) is None
    assert js.parse_job_header(other + text, "3", T0, owner_uid=1001) == h
    assert js.parse_job_header(other, "3", T0, owner_uid=1002).gpus == 8  # the owner's own older run
    assert js.parse_job_header(f"3|{T0}|COMPLETED|1|2|cpu=2|n|gpu|1|0|\n", "3", T0, owner_uid=1001).incomplete


# --- who may see a job --------------------------------------------------------------------------------------

def _never():
    raise AssertionError("asked although not needed")


def test_owner_and_root_see_without_asking_slurm():
    may_see("1", 1001, 1001, slurm_user_uid=_never, admin_level=_never)
    may_see("1", 1001, 0, slurm_user_uid=_never, admin_level=_never)


@pytest.mark.parametrize("level", ["Administrator", "Operator", "operator\n"])
def test_slurm_admins_see_every_job(level):
    may_see("1", 1001, 1002, slurm_user_uid=lambda: 64030, admin_level=lambda: level)
    may_see("1", None, 1002, slurm_user_uid=lambda: 64030, admin_level=lambda: level)


def test_slurm_user_sees_every_job():
    may_see("1", 1001, 64030, slurm_user_uid=lambda: 64030, admin_level=_never)


def test_another_users_job_is_refused():
    with pytest.raises(NotYours, match="job 1 is another user's: jobstats shows your own jobs only"):
        may_see("1", 1001, 1002, slurm_user_uid=lambda: 64030, admin_level=lambda: "None")
    with pytest.raises(NotYours, match="not known to Slurm"):
        may_see("1", None, 1002, slurm_user_uid=lambda: None, admin_level=lambda: "")


# --- the command --------------------------------------------------------------------------------------------

@pytest.fixture
def fake_slurm(monkeypatch):
    """Slurm's answers: the job's uid per sacct, its AdminComment rows, SlurmUser, AdminLevel."""
    from slurm_gpushare.slurm import commands

    state = {"uid": 0, "sacct": "", "slurm_user": 64030, "level": "None", "calls": [], "names": {}}
    # the job owner's name, which keeps the records to the owner's (none given: the records' user is taken)
    monkeypatch.setattr("slurm_gpushare.cli.accounting._user_name", lambda uid: state["names"].get(uid))
    monkeypatch.setattr(commands, "sacct_uids", lambda job: f"{job}|{state['uid']}\n")
    monkeypatch.setattr(commands, "show_config", lambda: f"SlurmUserId             = slurm({state['slurm_user']})\n")
    monkeypatch.setattr(commands, "admin_level", lambda user: state["level"] + "\n")

    def sacct_jobs(args):
        state["calls"].append(args)
        return state["sacct"]

    monkeypatch.setattr(commands, "sacct_jobs", sacct_jobs)
    state["header"], state["job_names"] = "", ""
    monkeypatch.setattr(commands, "sacct_job_header", lambda job: state["header"])
    monkeypatch.setattr(commands, "sacct_job_names", lambda job: state["job_names"])
    return state


def _sacct_row(rec, job_id="1"):
    seg = final_segment([rec])
    return f"{job_id}|{job_id}|{rec.user}|{rec.account}|{rec.partition}|COMPLETED|0:0|{T0}|{T0 + 60}|00:01:00||{seg}\n"


def test_command_reads_the_store_where_readable(tmp_path, fake_slurm, monkeypatch):
    import os

    fake_slurm["uid"] = os.getuid()
    db = tmp_path / "acct.db"
    with Store(db) as st:
        # a per-step record beside the allocation's: not a device of its own (the segment has none either)
        step = record(job_id="1", step="batch", mode="mps", share="shard:10", mem_asked_mib=10240,
                      mem_granted_mib=10240, mem_peak_mib=9000)
        st.add([*fixture(), step])
    out = CliRunner().invoke(main, ["jobstats", "1", "--db", str(db), "--machines", str(tmp_path)])
    assert out.exit_code == 0, out.output
    assert "accounting database" in out.output and "--gres=gpushare:mem=5G" in out.output
    assert out.output.count("  granted  ") == 1
    assert fake_slurm["calls"] == []
    with Store(db) as st:
        st.add([record(job_id="11", samples=4, mem_series_mib=(1024, 2048, 10240, 4096), mem_series_width=1)])
    out = CliRunner().invoke(main, ["jobstats", "11", "--db", str(db), "--machines", str(tmp_path)])
    assert out.exit_code == 0, out.output
    assert "used     ▕▁▂█▄▏" in out.output
    out = CliRunner().invoke(main, ["jobstats", "11", "--db", str(db), "--machines", str(tmp_path), "--format", "json"])
    assert json.loads(out.output)["devices"][0]["mem_series_mib"] == [1024, 2048, 10240, 4096]
    assert json.loads(out.output)["slurm"] is None  # sacct said nothing of the job: no header
    fake_slurm["header"] = f"11|{T0}|COMPLETED|1|2|cpu=2,mem=4G,gres/gpu=1|normal|gpu|90|10|1001\n"
    fake_slurm["job_names"] = f"11|{T0}|resnet\n"
    out = CliRunner().invoke(main, ["jobstats", "11", "--db", str(db), "--machines", str(tmp_path)])
    assert "  name resnet  state COMPLETED  nodes 1  cores 2  CPU memory 4G  GPUs 1  QOS normal" in out.output
    assert "ran 90 s of a 10.0 min limit (15% of it)" in out.output


@pytest.mark.parametrize("given", ["3", "003"])  # Slurm reads 003 as job 3 (jobstats said job 003 was not known)
def test_command_reads_sacct_without_a_readable_store(tmp_path, fake_slurm, given):
    import os

    fake_slurm["uid"] = os.getuid()
    rec = [r for r in fixture() if r.job_id == "3"][0]
    fake_slurm["sacct"] = _sacct_row(rec, "3")
    out = CliRunner().invoke(main, ["jobstats", given, "--db", str(tmp_path / "none.db"), "--machines",
                                    str(tmp_path), "--format", "json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)
    assert data["source"] == "sacct" and data["suggestion"]["request"] == "gpushare:mem=10G" and data["job"] == "3"
    assert fake_slurm["calls"] == [["-j", "3"]]


def test_command_refuses_another_users_job(tmp_path, fake_slurm, monkeypatch):
    import os

    monkeypatch.setattr(os, "getuid", lambda: 4242)
    monkeypatch.setattr("pwd.getpwuid", lambda uid: SimpleNamespace(pw_name="carol"))
    fake_slurm["uid"] = 4343
    out = CliRunner().invoke(main, ["jobstats", "1", "--db", str(tmp_path / "none.db")])
    assert out.exit_code != 0
    assert "another user's" in out.output and fake_slurm["calls"] == []
    fake_slurm["level"] = "Operator"
    rec = [r for r in fixture() if r.job_id == "1"][0]
    fake_slurm["sacct"] = _sacct_row(rec)
    out = CliRunner().invoke(main, ["jobstats", "1", "--db", str(tmp_path / "none.db"), "--machines", str(tmp_path)])
    assert out.exit_code == 0, out.output


def test_command_refuses_a_job_id_that_is_not_one():
    out = CliRunner().invoke(main, ["jobstats", "12;rm"])
    assert out.exit_code == 2 and "not a job id" in out.output


def test_command_uses_the_policy_headroom(tmp_path, fake_slurm):
    import os

    fake_slurm["uid"] = os.getuid()
    fake_slurm["sacct"] = _sacct_row([r for r in fixture() if r.job_id == "1"][0])
    policy = tmp_path / "p.toml"
    policy.write_text("version = 1\nheadroom = 1.0\n")
    out = CliRunner().invoke(main, ["jobstats", "1", "--from-sacct", "--policy", str(policy), "--machines",
                                    str(tmp_path)])
    assert out.exit_code == 0, out.output
    assert "--gres=gpushare:mem=8G" in out.output  # 4 GiB x 2
    # the efficiency notes follow the policy's [jobstats] table: on with its footer, then off
    policy.write_text('version = 1\nheadroom = 1.0\n[jobstats]\nfooter = "see https://hpc.example.org/gpu"\n')
    out = CliRunner().invoke(main, ["jobstats", "1", "--from-sacct", "--policy", str(policy), "--machines",
                                    str(tmp_path)])
    assert out.output.endswith("notes:\n  - its GPU memory peaked at 4G of the 10G it asked for (40%, below the site's "
                               "50%): next time ask for --gres=gpushare:mem=8G\n  see https://hpc.example.org/gpu\n"), \
        out.output
    policy.write_text("version = 1\n[jobstats]\nnotes = false\n")
    out = CliRunner().invoke(main, ["jobstats", "1", "--from-sacct", "--policy", str(policy), "--machines",
                                    str(tmp_path)])
    assert out.exit_code == 0 and "notes:" not in out.output, out.output


def test_a_store_behind_a_directory_the_user_may_not_enter_is_not_readable_and_not_an_error(tmp_path, monkeypatch):

    from slurm_gpushare.cli.accounting import _readable

    def denied(path, *a, **kw):
        raise PermissionError(13, "Permission denied", str(path))

    db = tmp_path / "acct.db"
    db.write_text("")
    assert _readable(db) and _readable(tmp_path, directory=True) and not _readable(tmp_path / "none")
    # what a directory above it without x gives every user but root; os.stat, which Path.is_file reaches on
    # every Python (3.11 through Path.stat, which raises; 3.13 through os.path.isfile, which says False)
    monkeypatch.setattr(os, "stat", denied)
    assert not _readable(db) and not _readable(tmp_path, directory=True)


@pytest.mark.parametrize("job_id", ["²", "１２", "٣"])
def test_command_refuses_digits_that_slurm_does_not_read(fake_slurm, job_id):
    """str.isdigit() holds for superscripts and other scripts' digits, which no Slurm job id is made of: such an
    id was passed on to sacct and scontrol (and, for root, read as a job) instead of refused."""
    out = CliRunner().invoke(main, ["jobstats", job_id])
    assert out.exit_code == 2 and "not a job id" in out.output, out.output
    assert fake_slurm["calls"] == []
    out = CliRunner().invoke(main, ["report", "--job", job_id, "--db", "/nonexistent.db"])
    assert out.exit_code == 2 and "not a job id" in out.output, out.output



def test_a_reused_job_id_shows_only_the_callers_own_run(tmp_path, fake_slurm, monkeypatch):
    """Job ids start again after slurmctld's state is lost while slurmdbd keeps the old jobs: sacct -D then
    lists carol's finished job 1 beside the caller's running job 1. The caller's own job (slurmctld's uid,
    since sacct's two uids name no one owner) let jobstats show carol's records as the caller's."""
    import os

    from slurm_gpushare.slurm import commands

    me = os.getuid()
    monkeypatch.setattr(commands, "sacct_uids", lambda job: f"{job}|{me}\n{job}|4343\n")
    monkeypatch.setattr("slurm_gpushare.cli.accounting._job_uid", lambda job, ctld=None: me)  # slurmctld: job 1
    fake_slurm["names"] = {me: "me", 4343: "carol"}
    carols = [r for r in fixture() if r.job_id == "1"][0]
    assert carols.user != "me"
    fake_slurm["sacct"] = _sacct_row(carols)  # carol's run of job 1: the only one slurmdbd has ended
    out = CliRunner().invoke(main, ["jobstats", "1", "--db", str(tmp_path / "none.db"), "--machines", str(tmp_path)])
    assert out.exit_code != 0 and "no GPU usage records" in out.output, out.output
    assert carols.user not in out.output


def test_an_idle_jobs_peak_of_nothing_reads_0g():
    """An allocation that ran no GPU program peaks at 0 MiB: its bar read "0T" (0 is a multiple of a TiB)."""
    idle = record(job_id="9", mode="mps", share="shard:4", mem_asked_mib=4096, mem_granted_mib=4096, mem_peak_mib=0)
    text = js.to_text(js.job_stats("9", [idle], source="store"))
    (peak,) = [ln for ln in text.splitlines() if ln.startswith("  peak")]
    assert peak.endswith("  0G (0% of what it asked)"), peak


# --- any job a user can name (issue 31 item 1) -------------------------------------------------------------

def _slurmctld_holds(monkeypatch, *infos):
    """slurmctld's --json job list holding ``infos`` (JobInfo), in this session's release's shape."""
    from slurm_gpushare.slurm import commands
    from tests.jobjson import job_dict, meta, session_release

    text = json.dumps({"jobs": [job_dict(i) for i in infos], "meta": meta(session_release()), "errors": [],
                       "warnings": []})
    monkeypatch.setattr(commands, "job_record", lambda job_id, **kw: text)


def _share(node="n1"):
    from slurm_gpushare.slurm.gres import GresItem

    return {node: (GresItem("shard", "", 10, "IDX:0"),)}


def test_a_running_job_is_told_that_its_records_come_when_it_ends(tmp_path, fake_slurm, monkeypatch):
    from slurm_gpushare.slurm.job import JobInfo

    _slurmctld_holds(monkeypatch, JobInfo(job_id="7", uid=os.getuid(), state="RUNNING", nodes=("n1",),
                                          gres=_share(), tres_per_node="gres:shard:10"))
    out = CliRunner().invoke(main, ["jobstats", "7", "--db", str(tmp_path / "none.db")])
    assert out.exit_code == 2, out.output
    assert "job 7 is RUNNING: its GPU usage records are written when it ends" in out.output, out.output
    assert "node monitor" in out.output and "a job without GPUs" not in out.output


def test_a_job_without_gpus_is_told_so(tmp_path, fake_slurm, monkeypatch):
    from slurm_gpushare.slurm.job import JobInfo

    _slurmctld_holds(monkeypatch, JobInfo(job_id="8", uid=os.getuid(), state="COMPLETED", nodes=("n1",)))
    out = CliRunner().invoke(main, ["jobstats", "8", "--db", str(tmp_path / "none.db")])
    assert out.exit_code == 2 and "job 8 held no GPU" in out.output, out.output
    # a job slurmctld has forgotten: its sacct row (AllocTRES without GPU or shard) says the same
    monkeypatch.setattr("slurm_gpushare.slurm.commands.job_record", lambda job_id, **kw: '{"jobs": []}')
    fake_slurm["uid"] = os.getuid()
    fake_slurm["sacct"] = f"9|9|me|acct|cpu|COMPLETED|0:0|{T0}|{T0 + 60}|00:01:00|billing=1,cpu=1,mem=100M,node=1|\n"
    out = CliRunner().invoke(main, ["jobstats", "9", "--db", str(tmp_path / "none.db")])
    assert out.exit_code == 2 and "job 9 held no GPU" in out.output, out.output


def test_an_array_task_is_named_as_squeue_and_sacct_name_it(tmp_path, fake_slurm, monkeypatch):
    from slurm_gpushare.slurm.job import JobInfo

    me = os.getuid()
    _slurmctld_holds(monkeypatch,
                     JobInfo(job_id="10", uid=me, state="COMPLETED", array_job_id="10", array_task_id=1),
                     JobInfo(job_id="12", uid=me, state="COMPLETED", array_job_id="10", array_task_id=2))
    fake_slurm["uid"] = me
    rec = [r for r in fixture() if r.job_id == "3"][0]
    fake_slurm["sacct"] = _sacct_row(rec, "12")
    out = CliRunner().invoke(main, ["jobstats", "10_2", "--db", str(tmp_path / "none.db"), "--machines",
                                    str(tmp_path), "--format", "json"])
    assert out.exit_code == 0, out.output
    assert json.loads(out.output)["job"] == "12" and fake_slurm["calls"] == [["-j", "12"]]
    out = CliRunner().invoke(main, ["jobstats", "10_9", "--db", str(tmp_path / "none.db")])
    assert out.exit_code == 2 and "array task 10_9 is not known" in out.output, out.output
    for bad in ("10_", "_2", "10_2_3", "10_x"):
        out = CliRunner().invoke(main, ["jobstats", bad])
        assert out.exit_code == 2 and "not a job id" in out.output, (bad, out.output)


def test_the_job_slurmctld_holds_is_shown_although_slurmdbd_recorded_another_user(tmp_path, fake_slurm, monkeypatch):
    """Seen in CI on 22.05 (twice): slurmdbd recorded uid 0 (root) for a user's job that slurmctld holds as hers,
    and jobstats dropped the row as another user's old job of the id. A row that starts when slurmctld's job
    started is that job, whoever slurmdbd names; another start of the id stays hidden."""
    from slurm_gpushare.slurm.job import JobInfo

    me = os.getuid()
    _slurmctld_holds(monkeypatch, JobInfo(job_id="1", uid=me, state="COMPLETED", start_time=T0, nodes=("n1",),
                                          gres=_share(), account="physics", partition="gpu"))
    fake_slurm["names"] = {me: "me"}
    rec = replace(next(r for r in fixture() if r.job_id == "1"), user="root", account="", partition="")
    fake_slurm["sacct"] = _sacct_row(rec)  # Start T0: slurmctld's job
    out = CliRunner().invoke(main, ["jobstats", "1", "--db", str(tmp_path / "none.db"), "--machines", str(tmp_path)])
    assert out.exit_code == 0, out.output
    # whose job it is: slurmctld's owner, not the user slurmdbd's row names (CI on 22.05 printed "user root")
    assert out.output.startswith("job 1  user me  account physics  partition gpu  "), out.output
    fake_slurm["sacct"] = _sacct_row(rec).replace(f"|{T0}|", f"|{T0 - 5000}|", 1)  # an older job of the id
    out = CliRunner().invoke(main, ["jobstats", "1", "--db", str(tmp_path / "none.db"), "--machines", str(tmp_path)])
    assert out.exit_code != 0 and "no GPU usage records" in out.output, out.output


def test_efficiency_notes_follow_the_sites_thresholds_and_footer():
    """Issue 31 item 1: efficiency notes a site can configure (the policy's [jobstats] table), as Princeton's
    jobstats prints them: memory well below the request (with the request to make), SM utilization below the
    site's threshold, a GPU that was never used; the site's footer under them; none when notes are off."""
    from slurm_gpushare.accounting.jobstats import NotesRule

    rule = NotesRule(low_sm=15, low_memory=50, footer="GPU efficiency: https://hpc.example.org/gpu")
    low = record(job_id="9", mode="mps", share="shard:20", mem_asked_mib=20480, mem_granted_mib=20480,
                 mem_peak_mib=3000, sm_mean_percent=4.0, sm_peak_percent=9.0)
    stats = job_stats("9", [low], source="store", notes=rule)
    assert stats.notes == (
        "its GPU memory peaked at 3000M of the 20G it asked for (15%, below the site's 50%): next time ask for "
        "--gres=gpushare:mem=4G",
        "its mean SM utilization was 4% (below the site's 15%): it may run as well on a smaller share (sm=) or "
        "fewer GPUs")
    text = js.to_text(stats)
    assert text.endswith("notes:\n  - " + stats.notes[0] + "\n  - " + stats.notes[1]
                         + "\n  GPU efficiency: https://hpc.example.org/gpu\n"), text
    data = json.loads(js.to_json(stats))
    assert data["notes"] == list(stats.notes) and data["notes_footer"] == rule.footer
    # at the thresholds: no note; a stricter site sees one
    fine = record(job_id="9", mode="mps", share="shard:20", mem_asked_mib=20480, mem_granted_mib=20480,
                  mem_peak_mib=10240, sm_mean_percent=15.0)
    assert job_stats("9", [fine], source="store", notes=rule).notes == ()
    assert len(job_stats("9", [fine], source="store", notes=NotesRule(low_sm=50, low_memory=60)).notes) == 2
    # a GPU never used: that note alone
    idle = record(job_id="9", mode="gpu", share="", mem_asked_mib=None, mem_granted_mib=81920, mem_peak_mib=0,
                  sm_mean_percent=0.0)
    assert job_stats("9", [idle], source="store", notes=rule).notes == (
        "it used no GPU memory in 120 samples: a job that does not need a GPU starts sooner without one",)
    # four whole GPUs, three never used: that note, and the memory measured against what was granted (asked: none)
    four = [record(job_id="9", mode="gpu", share="", gpu_index=i, gpu_uuid=f"GPU-{i}", mem_asked_mib=None,
                   mem_granted_mib=81920, mem_peak_mib=30000 if i == 0 else 0, sm_mean_percent=80.0 if i == 0 else 0.0)
            for i in range(4)]
    assert job_stats("9", four, source="store", notes=rule).notes == (
        "3 of its 4 GPU devices held no memory when sampled (a100 GPU 1, a100 GPU 2, a100 GPU 3): it may need fewer "
        "GPUs", "its GPU memory peaked at 30000M of the 80G it was granted (37%, below the site's 50%): next time ask "
        "for --gres=gpushare:mem=36G:4")
    # notes off (the policy's notes = false): none, no footer
    off = job_stats("9", [low], source="store")
    assert off.notes == () and "notes:" not in js.to_text(off) and json.loads(js.to_json(off))["notes"] == []


def test_a_record_without_the_gpus_memory_is_judged_by_what_it_was_granted():
    """gpu_memory_mib 0 (not known when the record was written; the store's GPU share takes the grant then): the
    suggestion was "gpushare:mem=0G ... a whole GPU (0G)"; it is the peak's share of the grant, as report --waste
    has it."""
    r = record(job_id="1", gpu_memory_mib=0, mem_asked_mib=20480, mem_granted_mib=20480, mem_peak_mib=1000)
    assert job_stats("1", [r], source="store").suggestion.request == "gpushare:mem=2G"
