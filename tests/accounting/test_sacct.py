"""The usage segment in AdminComment ([gpushare:u1 ...]): records -> segment -> records, the merge with other
tools' text (Princeton jobstats' JS1:, the request audit) and the report built from sacct rows."""

from __future__ import annotations

import base64
import binascii
import gzip
import json
import sys
from dataclasses import replace

import pytest
from click.testing import CliRunner

from slurm_gpushare.accounting import report as rep
from slurm_gpushare.accounting.sacct import (
    FinalJob,
    SacctJob,
    SegmentError,
    final_segment,
    latest_jobs,
    merge_final,
    parse_sacct,
    records_from_sacct,
    records_from_segment,
    spooled_records,
    write_final_summary,
)
from slurm_gpushare.accounting.spool import Spool
from slurm_gpushare.accounting.store import Store
from slurm_gpushare.cli import main
from slurm_gpushare.errors import InputError, SlurmError
from slurm_gpushare.slurm import commands
from slurm_gpushare.slurm.release import Release
from tests.accounting.test_record import record

AUDIT = "[gpushare:v1 req=mem=10G grant=gres:shard:10 kind=mps mem=10240/10240MiB]"


def _js1(info: dict) -> str:
    """jobstats' segment as its slurmctld epilog writes it: JS1: + base64(gzip(json)) (jobstats.py reads it back
    with json.loads(gzip.decompress(base64.b64decode(data[4:]))))."""
    return "JS1:" + base64.b64encode(gzip.compress(json.dumps(info, sort_keys=True, indent=4).encode())).decode()


def _jobstats_reads(admin_comment: str) -> dict:
    """What jobstats.py does with the field: startswith('JS1:'), then decode everything after the tag."""
    assert admin_comment.startswith("JS1:")
    return json.loads(gzip.decompress(base64.b64decode(admin_comment[4:])))


#: Python's lenient base64 decoding stops at a complete padding up to 3.11 (measured) and reads on from
#: 3.13 (measured): there jobstats' reader fails on any text after its segment.
STOPS_AT_PADDING = sys.version_info < (3, 13)


def _jobstats_outcome(admin_comment: str, info: dict) -> None:
    """jobstats' segment itself is intact; jobstats' whole-field reader gets it where Python stops at padding."""
    token = admin_comment.split(" ", 1)[0]
    assert _jobstats_reads(token) == info
    if STOPS_AT_PADDING:
        assert _jobstats_reads(admin_comment) == info, admin_comment
    else:
        with pytest.raises(binascii.Error):
            _jobstats_reads(admin_comment)


def _two_node_job():
    common = dict(job_id="77", restart=1, start=1000, end=4600)
    return [
        record(node="n1", gpu_index=0, gpu_uuid="GPU-a", sm_mean_percent=28.333333333333332, **common),
        record(node="n1", gpu_index=3, gpu_uuid="GPU-b", mem_peak_mib=None, sm_mean_percent=None, sm_peak_percent=None,
               samples=0, **common),
        record(node="n2", gpu_index=1, gpu_uuid="MIG-1", mode="mig", share="1g.10gb", mem_asked_mib=None,
               mem_granted_mib=9984, sm_mean_percent=None, sm_peak_percent=None, **{**common, "end": 4601}),
        record(node="n2", gpu_index=1, gpu_uuid="MIG-2", mode="mig", share="1g.10gb", mem_asked_mib=None,
               mem_granted_mib=9984, sm_mean_percent=None, sm_peak_percent=None, **{**common, "end": 4601}),
    ]


def _sacct_job(records, admin_comment: str, **kw) -> SacctJob:
    r = records[0]
    base = dict(job_id=r.job_id, array_job_id=None, array_task_id=None, user=r.user, account=r.account,
                partition=r.partition, state="COMPLETED", admin_comment=admin_comment)
    base.update(kw)
    return SacctJob(**base)


def test_segment_reads_back_to_the_same_records_except_the_device_uuid():
    recs = _two_node_job()
    seg = final_segment(recs)
    assert seg.startswith("[gpushare:u1 run=1 node=n1 t=1000+3600 exit=COMPLETED/0:0 gpu=0/a100/81920/mps/shard:10/"
                          "10240/-/10240/4096/28.333333333333332/60.0/120 gpu=3/")
    assert " node=n2 t=1000+3601 " in seg and "gpu=1/a100/81920/mig/1g.10gb/-/-/9984/4096/-/-/120" in seg
    back = records_from_segment(_sacct_job(recs, f"JS1:abc {AUDIT} {seg}"))
    assert len(back) == 4
    for got, want in zip(back, recs, strict=True):
        assert {**got.to_dict(), "gpu_uuid": ""} == {**want.to_dict(), "gpu_uuid": ""}
    assert len({r.key for r in back}) == 4  # two MIG slices of one GPU stay two records


def test_segment_refuses_values_that_would_break_it_and_mixed_jobs():
    with pytest.raises(InputError, match="cannot be written"):
        final_segment([record(share="a/b")])
    with pytest.raises(InputError, match="one run of one job"):
        final_segment([record(), record(job_id="43")])
    with pytest.raises(InputError, match="no records"):
        final_segment([])


def test_a_newer_or_broken_segment_is_an_error_not_a_guess():
    with pytest.raises(SegmentError, match="version u2"):
        records_from_segment(_sacct_job([record()], "[gpushare:u2 run=0]"))
    with pytest.raises(SegmentError, match="has 3 fields"):
        records_from_segment(_sacct_job([record()], "[gpushare:u1 run=0 node=n t=1+2 exit=-/- gpu=1/2/3]"))
    assert records_from_segment(_sacct_job([record()], AUDIT)) == []  # no usage segment: no records


def test_merge_keeps_jobstats_first_and_readable_the_audit_and_replaces_our_older_segments():
    seg = final_segment([record()])
    for info in ({"nodes": {"n1": {"cpus": 1}}}, {"nodes": {"n1": {"cpus": 4, "gpu_utilization": {"0": 99.5}}}},
                 {"nodes": {"n2": {"total_memory": 1073741824}}, "gpus": 1}):
        js1 = _js1(info)
        # jobstats replaced the whole field (the audit is gone from slurmdbd, still in slurmctld)
        out = merge_final(js1, f"{AUDIT} [gpushare-usage:v1 node=a100 mode=mps gpus=1 peak=1/2MiB sm=-]", seg)
        _jobstats_outcome(out, info)
        assert out.endswith(f" {AUDIT} {seg}") and "gpushare-usage" not in out
        # run again (a second write): the same text
        assert merge_final(out, None, seg) == out


def test_merge_pads_an_unpadded_js1_so_jobstats_decoder_stops_before_our_text():
    info = None
    for n in range(60):  # find a payload whose gzip stream is 3k bytes long: base64 without '='
        candidate = {"nodes": {"n": {"x": "y" * n}}}
        if len(gzip.compress(json.dumps(candidate, sort_keys=True, indent=4).encode())) % 3 == 0:
            info = candidate
            break
    assert info is not None
    js1 = _js1(info)
    assert not js1.endswith("=")
    with pytest.raises((OSError, EOFError, ValueError)):  # appended as it is, jobstats' reader fails
        _jobstats_reads(f"{js1} {AUDIT}")
    out = merge_final(js1, AUDIT, final_segment([record()]))
    assert out.split(" ", 1)[0].endswith("==")
    _jobstats_outcome(out, info)


def test_merge_keeps_other_tools_text_and_refuses_quotes():
    seg = final_segment([record()])
    assert merge_final("site:tag=1 [gpushare:u1 run=0]", None, seg) == f"site:tag=1 {seg}"
    with pytest.raises(InputError, match="quote"):
        merge_final("it's", None, seg)


SACCT_TEXT = (
    "77|77|alice|physics|gpu|COMPLETED|0:0|1000|4600|01:00:00|billing=1,cpu=1,gres/shard=10,mem=100M,node=1|{ac}\n"
    "78|40_2|bob|chem|pcie|FAILED|1:0|1000|1100|00:01:40|cpu=1,gres/gpu=1|AC with | bar\n"
)


def test_parse_sacct_rows_keep_the_admin_comment_whole_and_read_array_tasks():
    rows = parse_sacct(SACCT_TEXT.format(ac="x") + "\n")
    assert [(r.job_id, r.array_job_id, r.array_task_id, r.user, r.account, r.partition) for r in rows] == [
        ("77", None, None, "alice", "physics", "gpu"), ("78", "40", 2, "bob", "chem", "pcie")]
    assert rows[1].admin_comment == "AC with | bar"


def test_report_from_sacct_rows_equals_the_report_from_the_store():
    recs = _two_node_job() + [record(job_id="78", user="bob", account="chem", partition="pcie", mode="gpu", share="",
                                     mem_asked_mib=None, mem_granted_mib=81920, array_job_id="40", array_task_id=2,
                                     exit_state="FAILED", exit_code="1:0")]
    by_job = {}
    for r in recs:
        by_job.setdefault(r.job_id, []).append(r)
    seg77 = final_segment(by_job["77"])
    text = (f"77|77|alice|physics|gpu|COMPLETED|0:0|1000|4600|01:00:00|cpu=1|JS1:x {AUDIT} {seg77}\n"
            f"78|40_2|bob|chem|pcie|FAILED|1:0|1000|4600|01:00:00|cpu=1|{final_segment(by_job['78'])}\n"
            "79|79|carol|physics|gpu|COMPLETED|0:0|1000|4600|01:00:00|cpu=1|\n")  # no segment: no GPU job of ours
    with Store() as store, Store() as from_sacct:
        store.add(recs)
        from_sacct.add(records_from_sacct(parse_sacct(text)))
        for make in (lambda s: rep.usage_report(s, by="user"), lambda s: rep.usage_report(s, by="node"),
                     lambda s: rep.usage_report(s, by="mode", since=2000, until=3000), rep.job_report,
                     rep.waste_report):
            a, b = make(store), make(from_sacct)
            assert a.rows and (a.rows, a.total) == (b.rows, b.total)
            for fmt in rep.FORMATS:
                assert rep.render(a, fmt) == rep.render(b, fmt)


def test_report_from_sacct_command_line_passes_sacct_options_and_the_period(monkeypatch):
    seen = []

    def fake_sacct(args, **kw):
        seen.append(list(args))
        return f"42|42|alice|physics|gpu|COMPLETED|0:0|1000|4600|01:00:00|cpu=1|{final_segment([record()])}\n"

    monkeypatch.setattr(commands, "sacct_jobs", fake_sacct)
    r = CliRunner().invoke(main, ["report", "--from-sacct", "--by", "job", "--format", "csv", "-u", "alice",
                                  "--since", "@1000"])
    assert r.exit_code == 0, r.output
    assert seen[0][:2] == ["-u", "alice"] and seen[0][2] == "-S"
    assert r.output.splitlines()[1].startswith("42,,alice,physics,gpu,a100,mps,shard:10,1,")
    r = CliRunner().invoke(main, ["report", "-u", "alice"])
    assert r.exit_code == 2 and "need --from-sacct" in r.output
    for shaping in (["-o", "JobID"], ["--json"], ["-p"], ["--delimiter=,"]):
        r = CliRunner().invoke(main, ["report", "--from-sacct", *shaping])
        assert r.exit_code == 2 and "changes sacct's output" in r.output, r.output
    assert len(seen) == 1
    # the filters select in sacct too (unless sacct options already do), and in the report
    r = CliRunner().invoke(main, ["report", "--from-sacct", "--by", "job", "--format", "csv", "--user", "alice",
                                  "--user", "bob", "--account", "physics", "--job", "42"])
    assert r.exit_code == 0, r.output
    assert seen[1] == ["-u", "alice,bob", "-A", "physics", "-j", "42"]
    assert r.output.splitlines()[1].startswith("42,")
    r = CliRunner().invoke(main, ["report", "--from-sacct", "--format", "csv", "--user", "bob", "-u", "alice"])
    assert r.exit_code == 0, r.output
    assert seen[2] == ["-u", "alice"] and r.output.splitlines()[1:] == []  # sacct's alice, then only bob's rows


def _run_row(job_id, user, state, start, run=None):
    seg = "" if run is None else final_segment([record(job_id=job_id, user=user, restart=run, start=start,
                                                        end=start + 60)])
    return f"{job_id}|{job_id}|{user}|acct|gpu|{state}|0:0|{start}|{start + 60}|00:01:00|cpu=1|{seg}\n"


def test_latest_jobs_keeps_the_most_recent_job_of_each_id_with_its_requeued_runs():
    """Job ids start again when slurmctld's state is lost and slurmdbd keeps the old jobs; sacct -D (which lists
    a requeued job's runs) then lists the old jobs of that id too. sacct -j without -D shows the most recent
    job of the id (sacct(1) --duplicates); a report or jobstats for that id shows that job, all its runs."""
    text = (_run_row("3", "root", "COMPLETED", 100, run=0)        # an old job 3 (root's)
            + _run_row("3", "alice", "COMPLETED", 900, run=1)     # alice's job 3, run 1 (rows in any order)
            + _run_row("3", "alice", "REQUEUED", 500, run=0)      # ... and its first run
            + _run_row("4", "bob", "REQUEUED", 200, run=0)        # bob's old job 4, requeued once
            + _run_row("4", "bob", "COMPLETED", 300, run=1)
            + _run_row("4", "bob", "COMPLETED", 700, run=0)       # bob's job 4 now: the same user, a new job
            + _run_row("5", "carol", "CANCELLED", 50)             # a job without a segment, alone
            + _run_row("6", "dave", "COMPLETED", 60)              # no segments: an old job 6 ...
            + _run_row("6", "erin", "COMPLETED", 80))             # ... and the most recent one
    got = [(r.job_id, r.user, r.start) for r in latest_jobs(parse_sacct(text))]
    assert sorted(got) == [("3", "alice", 500), ("3", "alice", 900), ("4", "bob", 700), ("5", "carol", 50),
                           ("6", "erin", 80)]
    assert sorted(r.restart for r in records_from_sacct(latest_jobs(parse_sacct(text))) if r.job_id == "3") == [0, 1]


def test_report_from_sacct_for_a_reused_job_id_shows_the_most_recent_job(monkeypatch):
    """Seen in CI on 22.05: ``report --from-sacct -j 3`` showed root's old job 3 beside the user's job 3."""
    text = _run_row("3", "root", "COMPLETED", 100, run=0) + _run_row("3", "alice", "COMPLETED", 500, run=0)
    monkeypatch.setattr(commands, "sacct_jobs", lambda args, **kw: text)
    for selection in (["-j", "3"], ["--job", "3"], ["--jobs=3"]):
        r = CliRunner().invoke(main, ["report", "--from-sacct", "--by", "user", "--format", "csv", *selection])
        assert r.exit_code == 0, r.output
        assert [ln.split(",")[0] for ln in r.output.splitlines()[1:]] == ["alice"], (selection, r.output)
    # a period is every job in it, both jobs 3 among them
    r = CliRunner().invoke(main, ["report", "--from-sacct", "--by", "user", "--format", "csv", "-S", "@0"])
    assert sorted(ln.split(",")[0] for ln in r.output.splitlines()[1:]) == ["alice", "root"], r.output


def test_the_owner_of_a_job_slurmctld_forgot_is_the_most_recent_jobs_of_that_id(monkeypatch):
    """sacct without -D gives the most recent job of each id (sacct(1) --duplicates); with -D, an old job of the
    same id named a second uid and jobstats refused the user's own job (seen in CI on 22.05)."""
    seen = []
    monkeypatch.setattr(commands, "run", lambda argv, **kw: seen.append(argv) or "3|1001\n")
    assert commands.sacct_uids("3") == "3|1001\n"
    assert seen[0][0] == "sacct" and "-D" not in seen[0] and "--duplicates" not in seen[0]


def test_final_job_from_epilog_slurmctld_environment():
    job = FinalJob.from_env({"SLURM_JOB_ID": "40", "SLURM_ARRAY_JOB_ID": "40", "SLURM_ARRAY_TASK_ID": "3",
                             "SLURM_JOB_RESTART_COUNT": "2", "SLURM_JOB_NODELIST": "n[1-2]"})
    assert job == FinalJob("40", 2, ("n1", "n2"), "40_3")
    assert FinalJob.from_env({"SLURM_JOB_ID": "41", "SLURM_ARRAY_JOB_ID": "40"}).sacctmgr_id == "41"
    with pytest.raises(InputError):
        FinalJob.from_env({})


def test_write_final_summary_waits_for_records_and_the_end_record_then_merges(tmp_path):
    recs = _two_node_job()
    job = FinalJob("77", 1, ("n1", "n2"), "77")
    spool = tmp_path / "spool"
    Spool(spool, node="n1", clock=lambda: 1000).append([r for r in recs if r.node == "n1"])
    Spool(spool, node="n9", clock=lambda: 1000).append([record(job_id="77", node="n9", restart=1)])  # not its node
    t = [0.0]
    stored = {"state": "RUNNING", "ac": ""}
    writes = []

    def sleep(s):
        t[0] += s
        if t[0] == 3:  # the second node's Epilog
            Spool(spool, node="n2", clock=lambda: 1000).append([r for r in recs if r.node == "n2"])
        if t[0] == 5:  # slurmdbd gets the end record, then jobstats replaces the whole field
            stored.update(state="COMPLETED", ac=_js1({"nodes": {}}))

    def sacct(args):
        assert args == ["-j", "77"]
        return f"77|77|alice|physics|gpu|{stored['state']}|0:0|1000|4600|01:00:00|cpu=1|{stored['ac']}\n"

    def sacctmgr(jid, text):
        writes.append((jid, text))
        stored["ac"] = text
        return ""

    out = write_final_summary(job, [spool], sacct=sacct, show_job=lambda j: AUDIT, sacctmgr=sacctmgr,
                              clock=lambda: t[0], sleep=sleep, release=Release(24, 11))
    assert t[0] == 5 and writes == [("77", out)]
    assert out.startswith("JS1:") and out.endswith(f"{AUDIT} {final_segment(recs)}")
    assert {r.node for r in spooled_records([spool], job)} == {"n1", "n2"}
    # slurmdbd never gets the end record: an error naming it, nothing written
    stored.update(state="RUNNING")
    with pytest.raises(SlurmError, match="no end record"):
        write_final_summary(job, [spool], wait=3, sacct=sacct, show_job=lambda j: AUDIT, sacctmgr=sacctmgr,
                            clock=lambda: t[0], sleep=sleep, release=Release(24, 11))
    assert len(writes) == 1
    # a job without records: nothing to write
    assert write_final_summary(FinalJob("5", 0, ("n1",), "5"), [spool], wait=0, sacct=sacct,
                               sacctmgr=sacctmgr) is None


def test_the_summary_reads_and_checks_the_run_that_just_ended_in_whatever_order_sacct_lists_an_id(tmp_path):
    """slurmdbd keeps an older job of the same id (slurmctld's state lost; the dev cluster's test sessions): sacct -D
    lists both, newest first here. The summary took the last row as "this run", merged the old job's field, then
    read the old row back, failed, and the array task's row was never written (seen on 22.05 in a real-daemon
    test). slurmdbd's modify job names the newest job of the id (as_mysql_modify_job: time_submit desc limit 1)."""
    recs = [record(job_id="3", node="n1", start=5000, end=5060)]
    job = FinalJob("3", 0, ("n1",), "3_1")
    spool = tmp_path / "spool"
    Spool(spool, node="n1", clock=lambda: 6000).append(recs)
    rows = {"new": "[gpushare:v1 req=mem=4G]", "old": "old job text [gpushare:u1 run=0]"}
    writes = []

    def sacct(args):
        return (f"3|3_1|alice|physics|gpu|COMPLETED|0:0|5000|5060|00:01:00|cpu=1|{rows['new']}\n"
                f"3|3|root|root|gpu|COMPLETED|0:0|100|160|00:01:00|cpu=1|{rows['old']}\n")

    def sacctmgr(jid, text):
        writes.append((jid, text))
        rows["new"] = text
        return ""

    out = write_final_summary(job, [spool], wait=0, sacct=sacct, show_job=lambda j: "", sacctmgr=sacctmgr,
                              release=Release(24, 11))
    assert writes == [("3_1", out)] and out == f"[gpushare:v1 req=mem=4G] {final_segment(recs)}"
    assert rows["old"] == "old job text [gpushare:u1 run=0]"


def test_a_write_slurmdbd_does_not_take_yet_is_tried_again_until_the_deadline(tmp_path):
    """Seen on 22.05 for the array task whose id is the array's own (``jobid=3_1``): right after the job ended,
    sacctmgr said "Request didn't affect anything" although sacct showed the row ended; the same command
    worked seconds later. The run was dropped at the first failure; it is tried again each round until its
    deadline, and only then reported."""
    recs = [record(job_id="3", node="n1", start=5000, end=5060)]
    job = FinalJob("3", 0, ("n1",), "3_1")
    spool = tmp_path / "spool"
    Spool(spool, node="n1", clock=lambda: 6000).append(recs)
    stored = {"ac": ""}
    t = [0.0]
    tries = []

    def sacct(args):
        return f"3|3_1|alice|physics|gpu|COMPLETED|0:0|5000|5060|00:01:00|cpu=1|{stored['ac']}\n"

    def sacctmgr(jid, text):
        tries.append(t[0])
        if len(tries) < 3:
            raise SlurmError("sacctmgr: Request didn't affect anything or your user doesn't have privilege")
        stored["ac"] = text
        return ""

    def sleep(s):
        t[0] += s

    out = write_final_summary(job, [spool], wait=30, sacct=sacct, show_job=lambda j: "", sacctmgr=sacctmgr,
                              clock=lambda: t[0], sleep=sleep, release=Release(24, 11))
    assert out == final_segment(recs) and tries == [0.0, 1.0, 2.0]
    # never taken: reported at the deadline, with sacctmgr's words
    with pytest.raises(SlurmError, match="didn't affect anything"):
        write_final_summary(job, [spool], wait=5, sacct=sacct, show_job=lambda j: "",
                            sacctmgr=lambda j, x: (_ for _ in ()).throw(SlurmError("Request didn't affect anything")),
                            clock=lambda: t[0], sleep=sleep, release=Release(24, 11))


def test_before_23_02_the_lowercased_field_still_reads_back():
    """sacctmgr before 23.02 lowercases AdminComment (src/sacctmgr/job_functions.c at slurm-22-05-8-1)."""
    recs = _two_node_job()
    job = _sacct_job(recs, f"{AUDIT} {final_segment(recs)}".lower())
    assert [r.exit_state for r in records_from_segment(job)] == ["COMPLETED"] * 4
    stored = {"ac": ""}

    def sacct(args):
        return f"77|77|alice|physics|gpu|COMPLETED|0:0|1000|4600|01:00:00|cpu=1|{stored['ac']}\n"

    def sacctmgr(jid, text):
        stored["ac"] = text.lower()  # what 22.05's sacctmgr stores
        return ""

    spool_recs = [r for r in recs if r.node == "n1"]
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        Spool(d, node="n1").append(spool_recs)
        out = write_final_summary(FinalJob("77", 1, ("n1",), "77"), [d], sacct=sacct, show_job=lambda j: AUDIT,
                                  sacctmgr=sacctmgr, release=Release(22, 5))
    assert out == f"{AUDIT} {final_segment(spool_recs)}".lower()


def test_of_two_records_of_one_device_the_one_that_saw_the_run_is_the_final_segments(tmp_path):
    # found in CI: an Epilog run again for a run wrote a second record (span 0, no samples) that the final
    # segment took because it was spooled first
    poor = record(job_id="78", node="n1", start=5000, end=5000, mem_peak_mib=None, sm_mean_percent=None,
                  sm_peak_percent=None, samples=0)
    good = record(job_id="78", node="n1", start=1000, end=4600)
    assert poor.key == good.key
    spool = tmp_path / "n1.gpushare.jsonl"
    spool.write_text(poor.to_json() + "\n" + good.to_json() + "\n")
    job = FinalJob("78", 0, ("n1",), "78")
    assert spooled_records([spool], job) == [good]
    spool.write_text(good.to_json() + "\n" + poor.to_json() + "\n")
    assert spooled_records([spool], job) == [good]


def test_the_final_segment_takes_only_this_jobs_run_of_a_reused_id(tmp_path):
    """Issue 26 N15: the spool still holds an earlier job of the same id (another user's, or the same user's
    long before): EpilogSlurmctld put the older usage into the new owner's sacct row. A record is this job's
    when its user is the job's (SLURM_JOB_USER) and, where Slurm says when the job started (SLURM_JOB_START_TIME,
    24.11 and later), it did not start before."""
    older = record(job_id="79", node="n1", user="alice", start=1_000, end=1_500)
    other = record(job_id="79", node="n1", user="bob", start=9_000, end=9_500, gpu_index=1, gpu_uuid="GPU-1")
    mine = record(job_id="79", node="n1", user="bob", start=20_000, end=20_600)
    spool = tmp_path / "n1.gpushare.jsonl"
    spool.write_text("".join(r.to_json() + "\n" for r in (older, other, mine)))
    env = {"SLURM_JOB_ID": "79", "SLURM_JOB_NODELIST": "n1", "SLURM_JOB_USER": "bob"}
    assert spooled_records([spool], FinalJob.from_env(env)) == [mine, other]
    assert spooled_records([spool], FinalJob.from_env({**env, "SLURM_JOB_START_TIME": "20000"})) == [mine]
    # no user known (an entry of an older queue): as before
    assert len(spooled_records([spool], FinalJob.from_env({"SLURM_JOB_ID": "79", "SLURM_JOB_NODELIST": "n1"}))) == 2
    # issue 26 item 6: records of version 4 carry the run's submit time; of one run's records only the newest
    # job's count, on 22.05 too (no SLURM_JOB_START_TIME), even where the older job held the same GPU
    other, mine = replace(other, submit=8_900, gpu_index=0, gpu_uuid="GPU-0"), replace(mine, submit=19_900)
    spool.write_text("".join(r.to_json() + "\n" for r in (older, mine, other)))
    assert spooled_records([spool], FinalJob.from_env(env)) == [mine]
    # a record whose submit time is not known (0: a node of an earlier release) is kept, not taken for older
    unknown = replace(mine, submit=0, node="n2")
    (tmp_path / "n2.gpushare.jsonl").write_text(unknown.to_json() + "\n")
    both = FinalJob.from_env({**env, "SLURM_JOB_NODELIST": "n[1-2]"})
    assert spooled_records([spool, tmp_path / "n2.gpushare.jsonl"], both) == [mine, unknown]
