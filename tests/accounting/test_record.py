"""The version-1 record: strict JSON round trip, the batch parser, and building records from what the
Epilog knows (recorded `scontrol -d show job` text, the plan, a packaged machine description)."""

from __future__ import annotations

import json

import pytest

from slurm_gpushare.accounting.record import (
    FIELDS,
    FIELDS_V1,
    FIELDS_V2,
    RECORD_VERSION,
    SERIES_LEN,
    RecordError,
    Usage,
    UsageRecord,
    UsageTracker,
    exit_from_env,
    rows_from_lines,
    series_from_text,
    series_text,
)
from slurm_gpushare.errors import InputError
from slurm_gpushare.node.plan import plan_job
from slurm_gpushare.node.records import records_for_job
from slurm_gpushare.slurm.job import parse_show_job
from slurm_gpushare.slurm.nodegres import GresOptions, node_gres
from slurm_gpushare_dev.cluster import packaged_machine


def record(**kw) -> UsageRecord:
    base = dict(job_id="42", user="alice", account="physics", partition="gpu", node="a100", gpu_index=0,
                gpu_uuid="GPU-0", gpu_model="a100", gpu_memory_mib=81920, mode="mps", share="shard:10",
                mem_asked_mib=10240, sm_asked_percent=None, mem_granted_mib=10240, start=1000, end=4600,
                mem_peak_mib=4096, sm_mean_percent=30.5, sm_peak_percent=60.0, samples=120,
                exit_state="COMPLETED", exit_code="0:0")
    base.update(kw)
    return UsageRecord(**base)


def test_json_round_trip_keeps_every_field_and_writes_v_first():
    r = record(array_job_id="40", array_task_id=2, step="batch", placement_cost=1.5)
    line = r.to_json()
    assert "\n" not in line and line.startswith('{"v":4,"job_id":"42","restart":0,"submit":0,')
    assert list(json.loads(line)) == list(FIELDS)
    assert UsageRecord.from_json(line) == r
    assert UsageRecord.from_json(line.encode()) == r


def test_no_data_stays_none_never_zero():
    r = record(mem_peak_mib=None, sm_mean_percent=None, sm_peak_percent=None, samples=0)
    back = UsageRecord.from_json(r.to_json())
    assert back.sm_mean_percent is None and back.mem_peak_mib is None


@pytest.mark.parametrize("change, message", [
    ({"v": 5}, "record version 5; this slurm-gpushare reads versions 1, 2, 3, 4"),
    ({"v": "1"}, "record version '1'"),
    ({"extra": 1}, "unknown key(s) extra"),
    ({"gpu_index": True}, "gpu_index is True, not an integer"),
    ({"gpu_index": 1.0}, "gpu_index is 1.0, not an integer"),
    ({"job_id": 42}, "job_id is 42, not a string"),
    ({"mem_peak_mib": "4G"}, "mem_peak_mib is '4G', not an integer or null"),
    ({"mode": "shared"}, "mode is 'shared'"),
    ({"end": 10}, "end 10 is before start 1000"),
    ({"sm_mean_percent": 101}, "sm_mean_percent is 101, not a percentage"),
    ({"sm_peak_percent": float("nan")}, "not a percentage"),
    ({"mem_asked_mib": -1}, "mem_asked_mib is negative"),
    ({"job_id": ""}, "job_id is empty"),
    ({"mem_series_mib": [1, "2"], "mem_series_width": 1}, "mem_series_mib is [1, '2'], not a list of integers"),
    ({"mem_series_mib": [1, True], "mem_series_width": 1}, "not a list of integers"),
    ({"mem_series_mib": "1,2", "mem_series_width": 1}, "not a list of integers or null"),
    ({"mem_series_mib": [1, 2]}, "both are null (no series) or neither is"),
    ({"mem_series_width": 2}, "both are null (no series) or neither is"),
    ({"mem_series_mib": [1], "mem_series_width": 0}, "mem_series_width is 0, not at least 1"),
    ({"mem_series_mib": list(range(33)), "mem_series_width": 1}, "has 33 values, more than 32"),
    ({"mem_series_mib": [-1], "mem_series_width": 1}, "mem_series_mib has a negative value"),
])
def test_reading_is_strict(change, message):
    data = {**record().to_dict(), **change}
    with pytest.raises(RecordError) as e:
        UsageRecord.from_json(json.dumps(data), source="spool.jsonl:7")
    assert message in str(e.value) and "spool.jsonl:7" in str(e.value)


def test_missing_keys_and_no_version_are_named():
    data = record().to_dict()
    del data["user"]
    with pytest.raises(RecordError, match="missing key"):
        UsageRecord.from_dict(data)
    del data["v"]
    with pytest.raises(RecordError, match='no "v" key'):
        UsageRecord.from_dict(data)
    with pytest.raises(RecordError, match="not a JSON record"):
        UsageRecord.from_json('{"v":1,')
    with pytest.raises(RecordError, match="JSON object, not list"):
        UsageRecord.from_json("[1]")


def test_invalid_records_cannot_be_built_either():
    with pytest.raises(RecordError, match="mode"):
        record(mode="whole")


def test_batch_parser_agrees_with_the_strict_reader_line_by_line():
    good = [record(job_id=str(i)).to_json().encode() for i in range(5)]
    bad_version = json.dumps({**record().to_dict(), "v": 5}).encode()
    bool_index = json.dumps({**record().to_dict(), "gpu_index": True}).encode()
    reordered = json.dumps(dict(reversed(list(record(job_id="9").to_dict().items())))).encode()
    lines = [good[0], b"", good[1], b"{garbage", good[2], bad_version, good[3], bool_index, reordered, b"  ",
             good[4], b'{"v":1},{"v":1}']
    rows, errors = rows_from_lines(lines)
    assert [r[FIELDS.index("job_id")] for r in rows] == ["0", "1", "2", "3", "9", "4"]
    assert [i for i, _ in errors] == [3, 5, 7, 11]
    assert "version 5" in errors[1][1] and "gpu_index is True" in errors[2][1]
    # the all-good batch takes the column-wise path and gives the same rows
    fast, none = rows_from_lines(good)
    assert none == [] and fast == [tuple(UsageRecord.from_json(g).to_dict().values()) for g in good]
    # one bad value in an otherwise good batch is still found
    nan = json.dumps({**record().to_dict(), "sm_mean_percent": float("nan")}).encode()
    rows, errors = rows_from_lines([*good, nan])
    assert len(rows) == 5 and errors[0][0] == 5
    # with series: the rows hold them as text, on both paths; a bad series in a batch is found
    series = [record(job_id=str(i), mem_series_mib=(0, 512, 4096), mem_series_width=2).to_json().encode()
              for i in range(3)]
    fast, none = rows_from_lines(series)
    slow, _ = rows_from_lines([*series, b"{garbage"])
    assert none == [] and fast == slow and fast[0][FIELDS.index("mem_series_mib")] == "0,512,4096"
    wrong = json.dumps({**record().to_dict(), "mem_series_mib": [1, True], "mem_series_width": 1}).encode()
    rows, errors = rows_from_lines([*series, wrong])
    assert len(rows) == 3 and errors[0][0] == 3 and "not a list of integers" in errors[0][1]


def test_version_3_carries_the_memory_series_and_versions_2_and_1_read_without_one():
    r = record(mem_series_mib=(0, 512, 4096), mem_series_width=4)
    data = json.loads(r.to_json())
    assert data["mem_series_mib"] == [0, 512, 4096] and data["mem_series_width"] == 4
    assert UsageRecord.from_json(r.to_json()) == r and r.row()[FIELDS.index("mem_series_mib")] == "0,512,4096"
    plain = record()
    v2 = {k: v for k, v in plain.to_dict().items() if k in FIELDS_V2} | {"v": 2}
    v1 = {k: v for k, v in v2.items() if k != "restart"} | {"v": 1}
    for old in (v1, v2):
        back = UsageRecord.from_dict(old)
        assert back == plain and back.v == 4 and back.mem_series_mib is None and back.mem_series_width is None
        assert rows_from_lines([json.dumps(old).encode()]) == ([plain.row()], [])
    with pytest.raises(RecordError, match="version-2 record with unknown key.*mem_series_mib"):
        UsageRecord.from_dict({**v2, "mem_series_mib": [1], "mem_series_width": 1})
    with pytest.raises(RecordError, match="version-4 record with missing key.*mem_series_width"):
        UsageRecord.from_dict({k: v for k, v in plain.to_dict().items() if k != "mem_series_width"})
    assert series_from_text(series_text(())) == () and series_from_text(None) is None


def test_version_4_carries_the_submit_time_and_version_3_reads_with_0():
    """Issue 26 item 6: the run's submit time is in the record and its key; a version-3 line (no ``submit``)
    is the version-4 record with submit 0, on the slow and the fast path; a negative one is refused."""
    r = record(submit=1_700_000_000, mem_series_mib=(1, 2), mem_series_width=1)
    assert json.loads(r.to_json())["submit"] == 1_700_000_000 and UsageRecord.from_json(r.to_json()) == r
    assert r.key != record(mem_series_mib=(1, 2), mem_series_width=1).key
    v3 = {k: v for k, v in r.to_dict().items() if k != "submit"} | {"v": 3}
    back = UsageRecord.from_dict(v3)
    assert back.submit == 0 and back.v == 4 and back == record(mem_series_mib=(1, 2), mem_series_width=1)
    assert rows_from_lines([json.dumps(v3).encode()] * 3) == ([back.row()] * 3, [])
    with pytest.raises(RecordError, match="version-3 record with unknown key.*submit"):
        UsageRecord.from_dict({**v3, "submit": 5})
    with pytest.raises(RecordError, match="submit is negative"):
        UsageRecord.from_dict({**r.to_dict(), "submit": -1})


def test_tracker_buckets_memory_into_a_series_of_constant_size():
    t = UsageTracker()
    for mib in [5, 1, 7, 3]:
        t.add("7", 0, used_mib=mib, sm_percent=None)
    u = t.usage("7")[0]
    assert u.series_mib == (5, 1, 7, 3) and u.series_width == 1
    for i in range(28):  # 32 samples: every bucket full, width 1
        t.add("7", 0, used_mib=i, sm_percent=None)
    assert len(t.usage("7")[0].series_mib) == SERIES_LEN and t.usage("7")[0].series_width == 1
    t.add("7", 0, used_mib=None, sm_percent=None)  # the 33rd: pairs merge, width 2; no reading counts 0
    u = t.usage("7")[0]
    assert u.series_width == 2 and u.series_mib[:3] == (5, 7, 1) and u.series_mib[-2:] == (27, 0)
    assert len(u.series_mib) == 17
    big = UsageTracker()
    for i in range(10_000):
        big.add("8", 0, used_mib=i % 1000, sm_percent=None)
        s = big.usage("8")[0]
        assert len(s.series_mib) <= SERIES_LEN and len(s.series_mib) == -(-(i + 1) // s.series_width)
    assert s.series_width == 512 and s.samples == 10_000 and max(s.series_mib) == 999


def test_tracker_state_round_trip_keeps_the_series_and_old_rows_restore_without_one():
    t = UsageTracker()
    for mib in range(40):
        t.add("7", 0, used_mib=mib, sm_percent=10.0)
    again = UsageTracker()
    again.restore("7", json.loads(json.dumps(t.state("7"))))
    assert again.usage("7") == t.usage("7")
    for tracker in (t, again):
        tracker.add("7", 0, used_mib=100, sm_percent=None)
    assert again.usage("7") == t.usage("7") and t.usage("7")[0].series_mib[-1] == 100
    old = [{k: v for k, v in row.items() if not k.startswith("series")} for row in t.state("7")]
    prior = UsageTracker()
    prior.restore("7", old)
    assert prior.usage("7")[0].series_mib == () and prior.usage("7")[0].samples == 41
    prior.add("7", 0, used_mib=9, sm_percent=None)
    assert prior.usage("7")[0].series_mib == (9,)
    with pytest.raises(InputError, match="series_mib"):
        prior.restore("7", [{**t.state("7")[0], "series_mib": ["x"]}])
    with pytest.raises(InputError, match="do not fit the series"):
        prior.restore("7", [{**t.state("7")[0], "series_width": 0}])


def test_tracker_keeps_peaks_and_means_and_no_data():
    t = UsageTracker()
    t.add("7", 0, used_mib=1000, sm_percent=40.0)
    t.add("7", 0, used_mib=3000, sm_percent=80.0)
    t.add("7", 0, used_mib=2000, sm_percent=None)
    t.add("7", "MIG-x", used_mib=500, sm_percent=None)
    u = t.pop("7")
    assert u[0] == Usage(peak_mib=3000, sm_mean=60.0, sm_peak=80.0, samples=3, series_mib=(1000, 3000, 2000))
    assert u["MIG-x"] == Usage(peak_mib=500, sm_mean=None, sm_peak=None, samples=1, series_mib=(500,))
    assert t.usage("7") == {} and t.jobs() == ()


@pytest.mark.parametrize("env, expected", [
    ({"SLURM_JOB_EXIT_CODE2": "0:0"}, ("COMPLETED", "0:0")),
    ({"SLURM_JOB_EXIT_CODE2": "3:0"}, ("FAILED", "3:0")),
    ({"SLURM_JOB_EXIT_CODE2": "0:9"}, ("SIGNALED", "0:9")),
    ({"SLURM_JOB_EXIT_CODE": "256"}, ("FAILED", "1:0")),
    ({"SLURM_JOB_EXIT_CODE": "15"}, ("SIGNALED", "0:15")),
    ({}, ("", "")),
])
def test_exit_state_from_the_epilog_environment(env, expected):
    assert exit_from_env(env) == expected


# --- records from what the Epilog has ------------------------------------------------------------

SHOW = """\
JobId={job} JobName=train
   UserId=alice(1000) GroupId=alice(1000) MCS_label=N/A
   Account=physics QOS=normal
   JobState=COMPLETING Reason=None Dependency=(null)
   Partition=gpu AllocNode:Sid=login:1
   NodeList=h100-mig
   {tres}
     Nodes=h100-mig CPU_IDs=0 Mem=100 GRES={detail}
   AdminComment={ac}
"""
MACHINE = packaged_machine("4x-h100-mig-mixed.json")  # hostname h100-mig: GPUs 0-1 whole, 2-3 MIG


def _records(detail: str, ac: str = "", tres: str = "TresPerNode=gres:gpu:1", **kw):
    info = parse_show_job(SHOW.format(job="77", tres=tres, detail=detail, ac=ac))
    gres = node_gres(MACHINE, "h100-mig", GresOptions(shard_unit_mib=1024))
    gpu_uuids = {g.index: g.uuid for g in MACHINE.gpus}
    mig_uuids = {(g.index, i.gi_id): i.uuid for g in MACHINE.gpus for i in g.mig_instances}
    plan = plan_job(info, "h100-mig", gres, gpu_uuids=gpu_uuids, mig_uuids=mig_uuids, shard_unit_mib=1024)
    return records_for_job(info, plan, MACHINE, node="h100-mig", start=1000, end=4600, gpu_uuids=gpu_uuids,
                           exit_state="COMPLETED", exit_code="0:0", **kw)


def test_mps_share_record():
    usage = {0: Usage(peak_mib=6000, sm_mean=22.5, sm_peak=40.0, samples=60, series_mib=(1000, 6000, 2000),
                      series_width=32)}
    (r,) = _records("shard:10(IDX:0)", "[gpushare:v1 req=mem=10G+sm=25 grant=gres:shard:10 kind=mps "
                    "mem=10240/10240MiB sm=25]", tres="TresPerNode=gres:shard:10", usage=usage, account="physics")
    assert (r.mode, r.share, r.gpu_index, r.gpu_model, r.gpu_memory_mib) == ("mps", "shard:10", 0, "h100", 81559)
    assert (r.mem_asked_mib, r.mem_granted_mib, r.sm_asked_percent) == (10240, 10240, 25)
    assert (r.mem_peak_mib, r.sm_mean_percent, r.sm_peak_percent, r.samples) == (6000, 22.5, 40.0, 60)
    assert (r.user, r.account, r.partition, r.job_id, r.v) == ("alice", "physics", "gpu", "77", RECORD_VERSION)
    assert r.gpu_uuid == MACHINE.gpus[0].uuid and r.duration_s == 3600
    assert (r.mem_series_mib, r.mem_series_width) == ((1000, 6000, 2000), 32)


def test_mig_record_has_its_profile_memory_and_no_sm_data():
    mig_uuid = MACHINE.gpus[2].mig_instances[1].uuid  # GPU 2, GI 7, 1g.10gb
    usage = {mig_uuid: Usage(peak_mib=8000, sm_mean=None, sm_peak=None, samples=10)}
    (r,) = _records("gpu:h100_1g.10gb:1(IDX:4)", "[gpushare:v1 req=mem=10G grant=gres:gpu:h100_1g.10gb:1 "
                    "kind=mig model=h100 mem=10240/9984MiB]", usage=usage)
    assert (r.mode, r.share, r.gpu_index, r.gpu_uuid) == ("mig", "1g.10gb", 2, mig_uuid)
    assert (r.mem_asked_mib, r.mem_granted_mib, r.mem_peak_mib) == (10240, 9984, 8000)
    assert r.sm_mean_percent is None and r.sm_peak_percent is None
    assert r.mem_series_mib is None and r.mem_series_width is None  # a Usage without a series: none


def test_two_mig_slices_of_one_gpu_are_two_records_keyed_by_uuid():
    recs = _records("gpu:h100_1g.10gb:2(IDX:4-5)", usage={2: Usage(peak_mib=1)})
    assert [(r.gpu_index, r.share) for r in recs] == [(2, "1g.10gb"), (2, "1g.10gb")]
    assert len({r.key for r in recs}) == 2
    assert all(r.mem_peak_mib is None for r in recs)  # an index key is ambiguous here: no data


@pytest.mark.parametrize("tres", ["TresPerNode=gres:gpu:2",            # --gres=gpu:2
                                  "TresPerJob=gres:gpu:2",             # --gpus=2
                                  "TresPerNode=gres:gpu:2 TresPerTask=gres:gpu:1"])  # --gpus-per-node=2
def test_whole_gpus_are_records_however_they_were_requested(tres):
    usage = {0: Usage(peak_mib=20480, sm_mean=80.0, sm_peak=90.0, samples=5)}
    recs = _records("gpu:h100:2(IDX:0-1)", tres=tres, usage=usage)
    assert [(r.mode, r.gpu_index, r.mem_granted_mib, r.mem_asked_mib) for r in recs] == \
        [("gpu", 0, 81559, None), ("gpu", 1, 81559, None)]
    assert recs[0].sm_mean_percent == 80.0 and recs[1].sm_mean_percent is None  # never sampled: no data


def test_a_job_without_gpus_here_has_no_records():
    info = parse_show_job(SHOW.format(job="5", tres="", detail="", ac="").replace(" GRES=", " X="))
    gres = node_gres(MACHINE, "h100-mig", GresOptions(shard_unit_mib=1024))
    plan = plan_job(info, "h100-mig", gres, gpu_uuids={}, mig_uuids={}, shard_unit_mib=1024)
    assert records_for_job(info, plan, MACHINE, node="h100-mig", start=0, end=1) == ()


def test_summary_segment_for_admin_comment():
    from slurm_gpushare.accounting.record import merge_summary, summary_segment
    from slurm_gpushare.slurm.admincomment import extract, format_segment, merge

    recs = [record(job_id="2", mode="gpu", gpu_index=0, gpu_uuid="a", mem_granted_mib=81920, mem_peak_mib=20480,
                   sm_mean_percent=80.0, sm_peak_percent=90.0),
            record(job_id="2", mode="gpu", gpu_index=1, gpu_uuid="b", mem_granted_mib=81920, mem_peak_mib=10240,
                   sm_mean_percent=20.0, sm_peak_percent=50.0)]
    seg = summary_segment(recs)
    assert seg == "[gpushare-usage:v1 node=a100 mode=gpu gpus=2 peak=20480/81920MiB sm=50.0/90.0]"
    mig = summary_segment([record(mode="mig", mem_peak_mib=None, sm_mean_percent=None, sm_peak_percent=None)])
    assert mig.endswith("peak=- sm=-]")
    audit = format_segment({"req": "mode=gpu:2", "kind": "gpu"})
    ac = merge_summary(f"ticket-17 {audit}", seg)
    assert ac == f"ticket-17 {audit} {seg}" and extract(ac) == {"req": "mode=gpu:2", "kind": "gpu"}
    other = seg.replace("node=a100", "node=b200")
    again = merge_summary(merge_summary(ac, other), seg.replace("sm=50.0/90.0", "sm=51.0/90.0"))
    assert again.count("node=a100") == 1 and "sm=51.0/90.0" in again and "node=b200" in again
    assert seg in merge(ac, format_segment({"req": "x"}))  # re-deciding the audit keeps the summary
    with pytest.raises(InputError, match="one job on one node"):
        summary_segment([recs[0], record(job_id="3")])


def test_the_restart_count_is_part_of_the_key_and_version_1_reads_as_the_first_run():
    first, again = record(job_id="77"), record(job_id="77", restart=1)
    assert first.key != again.key and first.restart == 0
    assert UsageRecord.from_json(again.to_json()) == again
    v1 = {k: v for k, v in first.to_dict().items() if k in FIELDS_V1}
    v1["v"] = 1
    assert UsageRecord.from_dict(v1) == first
    assert rows_from_lines([json.dumps(v1).encode()]) == ([first.row()], [])
    with pytest.raises(RecordError, match="version-1 record with unknown key"):
        UsageRecord.from_dict({**v1, "restart": 1})
    with pytest.raises(RecordError, match="restart is negative"):
        record(restart=-1)


def test_the_epilog_takes_the_restart_count_from_slurmd():
    from slurm_gpushare.node.records import restart_from_env
    assert restart_from_env({"SLURM_JOB_RESTART_COUNT": "2"}) == 2
    assert restart_from_env({}) == 0 and restart_from_env({"SLURM_JOB_RESTART_COUNT": "²"}) == 0
