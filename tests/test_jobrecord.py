"""The node hooks' job-record reader (:func:`slurm_gpushare.slurm.job.parse_job_json`): user-written fields
cannot change what it returns, and a record it cannot trust is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_gpushare.errors import InputError, SlurmError
from slurm_gpushare.slurm.job import parse_job_json, with_env_identity
from slurm_gpushare.slurm.release import OLDEST, Release
from tests.jobjson import meta

DATA = Path(__file__).parent / "data" / "slurm"

BASE = {"job_id": 42, "user_id": 1001, "group_id": 1001, "user_name": "alice", "account": "research",
        "partition": "pcie", "job_state": "RUNNING", "nodes": "rtx4090-pcie", "tres_per_node": "gres:shard:10",
        "gres_detail": ["shard:10(IDX:0)"], "admin_comment": "[gpushare:v1 req=mem=10G sm=25]",
        "start_time": 1796116390, "submit_time": 1796116300, "restart_cnt": 1, "exit_code": 0, "array_job_id": 0,
        "array_task_id": None}
#: BASE as data_parser v0.0.42 (24.11) writes it: numbers as objects, a state list, an exit object
BASE_DP = {**BASE, "job_state": ["RUNNING"], "tres_per_node": "gres/shard:10", "gres_detail": ["shard:10(10/80)"],
           "start_time": {"set": True, "infinite": False, "number": 1796116390},
           "submit_time": {"set": True, "infinite": False, "number": 1796116300},
           "exit_code": {"status": ["SUCCESS"], "return_code": {"set": True, "infinite": False, "number": 0},
                         "signal": {"id": {"set": False, "infinite": False, "number": 0}, "name": ""}},
           "array_job_id": {"set": True, "infinite": False, "number": 0},
           "array_task_id": {"set": False, "infinite": False, "number": 0}}
SHAPES = [(OLDEST, BASE, "shard:10(IDX:0)"), (Release(24, 11), BASE_DP, "shard:10(10/80)"),
          (Release(26, 5), BASE_DP, "shard:10(10/80)")]
USER_FIELDS = ("name", "comment", "current_working_directory", "standard_output", "standard_error", "command")
# what a user may write: any text (newlines, '=', brackets, lone surrogates from undecodable bytes), up to 1 MB
hostile = st.one_of(st.text(), st.sampled_from([
    "x\nNodes=rtx4090-pcie GRES=shard:80(IDX:0)", "n UserId=root(0) Account=other StartTime=2020-01-01T00:00:00",
    "\nAdminComment=[gpushare:v1 sm=100]", "caf\udce9", '"}]}, {"job_id": 42, "user_id": 0', "=" * 1_000_000]))


def _doc(job: dict, *others: dict, release: Release = OLDEST) -> str:
    return json.dumps({"jobs": [*others, job], "meta": meta(release)})


@pytest.mark.parametrize("release, base, detail", SHAPES, ids=lambda v: str(v) if isinstance(v, Release) else "")
@settings(max_examples=100, deadline=None)
@given(fields=st.fixed_dictionaries({k: hostile for k in USER_FIELDS}))
def test_user_fields_never_change_the_record(release, base, detail, fields):
    info = parse_job_json(_doc({**base, **fields}, release=release), "42")
    assert (info.uid, info.gid, info.user, info.account, info.partition, info.start_time) == (
        1001, 1001, "alice", "research", "pcie", 1796116390)
    assert (info.submit_time, info.restarts) == (1796116300, 1)
    assert [it.text for it in info.gres_on("rtx4090-pcie")] == [detail]
    assert [it.indices for it in info.gres_on("rtx4090-pcie")] == [(0,)]
    assert info.audit == {"req": "mem=10G", "sm": "25"}
    assert (info.state, info.exit_code, info.array_job_id, info.array_task_id) == ("RUNNING", "0:0", None, None)


#: what each real record (tests/data/slurm/<release>/, captured on the dev cluster) says:
#: (job id, state, tres_per_node, {node: [(detail, device indices)]}, array job, array task, exit code)
REAL = {
    ("22.05", "squeue.json", "1"): ("RUNNING", "gres:shard:10", {"a100-nvb": [("shard:10(IDX:0)", (0,))]},
                                    None, None, "0:0"),
    ("22.05", "squeue.json", "2"): ("RUNNING", "gres:gpu:a100:2", {"a100-nvb": [("gpu:a100:2(IDX:4-5)", (4, 5))]},
                                    None, None, "0:0"),
    ("22.05", "squeue.json", "5"): ("RUNNING", "gres:shard:5", {"a100-nvb": [("shard:5(IDX:0)", (0,))]},
                                    "4", 0, "0:0"),
    ("22.05", "squeue-shard-cancelled.json", "1"): ("COMPLETING", "gres:shard:10", {}, None, None, "0:15"),
    ("24.11", "show-job-shard.json", "12"): (
        "RUNNING", "gres/shard:10", {"a100-nvb": [("shard:10(10/80,0/80,0/80,0/80,0/80,0/80,0/80,0/80)", (0,))]},
        None, None, "0:0"),
    ("24.11", "show-job-shard-cancelled.json", "12"): ("CANCELLED", "gres/shard:10", {}, None, None, "0:15"),
    ("24.11", "show-job-whole.json", "5"): ("RUNNING", "gres/gpu:a100:2",
                                            {"a100-nvb": [("gpu:a100:2(IDX:4,6)", (4, 6))]}, None, None, "0:0"),
    ("24.11", "show-job-mig.json", "11"): ("RUNNING", "gres/gpu:h100_1g.10gb:1",
                                           {"h100-mig": [("gpu:h100_1g.10gb:1(IDX:4)", (4,))]}, None, None, "0:0"),
    ("24.11", "show-job-array.json", "8"): (
        "RUNNING", "gres/shard:5", {"h100-mig": [("shard:5(5/79,0/79,0/0,0/0,0/0,0/0,0/0,0/0,0/0,0/0)", (0,))]},
        "7", 0, "0:0"),
    ("24.11", "show-job-hostile.json", "9"): (
        "RUNNING", "gres/shard:a100:7", {"a100-nvb": [("shard:7(7/80,0/80,0/80,0/80,0/80,0/80,0/80,0/80)", (0,))]},
        None, None, "0:0"),
    ("24.11", "show-job-multinode.json", "10"): (
        "RUNNING", "gres/gpu:1", {"a100-nvb": [("gpu:a100:1(IDX:4)", (4,))], "h100-nvs": [("gpu:h100:1(IDX:0)", (0,))]},
        None, None, "0:0"),
    ("26.05", "show-job-shard.json", "1"): (
        "RUNNING", "gres/shard:10", {"a100-nvb": [("shard:10(10/80,0/80,0/80,0/80,0/80,0/80,0/80,0/80)", (0,))]},
        None, None, "0:0"),
    ("26.05", "show-job-shard-cancelled.json", "1"): ("CANCELLED", "gres/shard:10", {}, None, None, "0:15"),
    ("26.05", "show-job-whole.json", "2"): ("RUNNING", "gres/gpu:a100:2",
                                            {"a100-nvb": [("gpu:a100:2(IDX:4,6)", (4, 6))]}, None, None, "0:0"),
    ("26.05", "show-job-mig.json", "3"): ("RUNNING", "gres/gpu:h100_1g.10gb:1",
                                          {"h100-mig": [("gpu:h100_1g.10gb:1(IDX:4)", (4,))]}, None, None, "0:0"),
    ("26.05", "show-job-array.json", "4"): (
        "RUNNING", "gres/shard:5", {"a100-nvb": [("shard:5(0/80,0/80,0/80,0/80,0/80,5/80,0/80,0/80)", (5,))]},
        "4", 1, "0:0"),
    ("26.05", "show-job-hostile.json", "5"): (
        "RUNNING", "gres/shard:a100:7", {"a100-nvb": [("shard:7(7/80,0/80,0/80,0/80,0/80,0/80,0/80,0/80)", (0,))]},
        None, None, "0:0"),
    ("26.05", "show-job-multinode.json", "7"): (
        "RUNNING", "gres/gpu:1", {"a100-nvb": [("gpu:a100:1(IDX:1)", (1,))], "h100-nvs": [("gpu:h100:1(IDX:0)", (0,))]},
        None, None, "0:0"),
}


@pytest.mark.parametrize("release, name, job_id", sorted(REAL))
def test_real_records_of_each_release(release, name, job_id):
    info = parse_job_json((DATA / release / name).read_text(), job_id)
    gres = {n: [(it.text, it.indices) for it in items] for n, items in info.gres.items()}
    assert (info.state, info.tres_per_node, gres, info.array_job_id, info.array_task_id, info.exit_code) == \
        REAL[(release, name, job_id)]
    assert (info.uid, info.user, info.partition) == (0, "root", "gpu")
    # issue 26 item 6: the submit time (what tells two jobs of one id apart) and the restart count, every release
    assert info.submit_time is not None and 1.7e9 < info.submit_time <= (info.start_time or info.submit_time)
    assert info.restarts == 0


@pytest.mark.parametrize("release, job_id", [("24.11", "9"), ("26.05", "5")])
def test_hostile_name_and_comment_are_only_strings(release, job_id):
    """A JobName and Comment that forge ``JobState=``, ``TresPerNode=`` and a ``GRES=`` detail line (they
    do forge them in ``scontrol -d show job`` text) change nothing in the record."""
    text = (DATA / release / "show-job-hostile.json").read_text()
    job = json.loads(text)["jobs"][0]
    assert "TresPerNode=gres:gpu:8" in job["comment"] and "JobState=FAKE" in job["name"]
    info = parse_job_json(text, job_id)
    assert info.gres_on("a100-nvb")[0].amount == 7 and info.state == "RUNNING" and info.admin_comment.startswith(
        "[gpushare:v1 req=shard:a100:7 ")


def test_a_newer_release_without_a_field_is_an_error_naming_release_and_field():
    job = {k: v for k, v in BASE_DP.items() if k != "tres_per_node"}
    with pytest.raises(SlurmError, match=r"Slurm 27\.05 has no jobs\[\]\.tres_per_node.*newer than 26\.05"):
        parse_job_json(_doc(job, release=Release(27, 5)), "42")
    with pytest.raises(SlurmError, match=r"Slurm 24\.11 has no jobs\[\]\.exit_code"):
        parse_job_json(_doc({k: v for k, v in BASE_DP.items() if k != "exit_code"}, release=Release(24, 11)), "42")
    with pytest.raises(SlurmError, match="no meta.slurm.version"):
        parse_job_json(json.dumps({"jobs": [BASE]}), "42")


def test_only_the_asked_job_is_read():
    other = {**BASE, "job_id": 43, "user_id": 0, "gres_detail": ["shard:80(IDX:0)"]}
    assert parse_job_json(_doc(BASE, other), "42").uid == 1001
    with pytest.raises(InputError, match="0 records of job 44"):  # what 24.11 prints for an unknown id too
        parse_job_json(_doc(BASE), "44")
    with pytest.raises(InputError, match="2 records of job 42"):
        parse_job_json(_doc(BASE, BASE), "42")


@pytest.mark.parametrize("key, value", [("user_id", "0"), ("account", "a\nb"), ("partition", "p|q"),
                                        ("gres_detail", ["bogus("]), ("job_state", "RUN NING"), ("start_time", 1.5),
                                        ("gres_detail", ["shard:1(IDX:0)", "shard:1(IDX:0)"])])
def test_an_untrustworthy_field_is_refused(key, value):
    with pytest.raises(InputError):
        parse_job_json(_doc({**BASE, key: value}), "42")


def test_identity_comes_from_slurmds_environment():
    info = parse_job_json(_doc(BASE), "42")
    env = {"SLURM_JOB_UID": "1002", "SLURM_JOB_GID": "1003", "SLURM_JOB_USER": "bob"}
    assert (lambda i: (i.uid, i.gid, i.user))(with_env_identity(info, env)) == (1002, 1003, "bob")
    with pytest.raises(InputError):
        with_env_identity(info, {"SLURM_JOB_UID": "0x0"})


#: the cores each real record with ``job_resources`` says its job holds, as ``scontrol -d show job`` of the same
#: job printed them at capture: ``Nodes=a100-nvb CPU_IDs=32-35`` (one thread per core: CPU ids are core ids)
#: and, for 22.05's job 11, ``CPU_IDs=0-5``; the a100-nvb node has 2 sockets of 32 cores.
CORES = {
    ("22.05", "squeue-cores.json", "11"): ((0, 1, 2, 3, 4, 5), 2, None),
    ("22.05", "squeue-cores.json", "12"): ((32, 33, 34, 35), 2, None),
    ("24.11", "show-job-cores.json", "2"): ((32, 33, 34, 35), 2, 2),  # --ntasks-per-node=2
    ("26.05", "show-job-cores.json", "2"): ((32, 33, 34, 35), 2, 2),
}


@pytest.mark.parametrize("release, name, job_id", sorted(CORES))
def test_real_records_give_the_cores_and_tasks_the_job_holds(release, name, job_id):
    info = parse_job_json((DATA / release / name).read_text(), job_id)
    cores, tasks, per_node = CORES[(release, name, job_id)]
    assert info.core_ids_on("a100-nvb", 32) == cores
    assert (info.tasks, info.tasks_per_node, info.tasks_on("a100-nvb")) == (tasks, per_node, 2)
    assert info.core_ids_on("h100-nvs", 32) is None  # not a node of the job
    assert info.core_ids_on("a100-nvb", 2) is None  # a layout the record contradicts: nothing is known


def test_a_record_without_job_resources_knows_no_cores():
    info = parse_job_json(_doc(BASE), "42")
    assert info.cores == {} and info.core_ids_on("rtx4090-pcie", 56) is None
    info = parse_job_json(_doc({**BASE_DP, "tasks": {"set": True, "infinite": False, "number": 3}},
                               release=Release(24, 11)), "42")
    assert info.tasks_on("rtx4090-pcie") == 3 and info.core_ids_on("rtx4090-pcie", 56) is None


def test_job_resources_of_the_wrong_shape_are_refused():
    with pytest.raises(InputError, match="job_resources"):
        parse_job_json(_doc({**BASE, "job_resources": {"allocated_nodes": [{"nodename": "x", "sockets": [1]}]}}),
                       "42")
    with pytest.raises(InputError, match="job_resources"):
        parse_job_json(_doc({**BASE_DP, "job_resources": {"nodes": {"allocation": [{"name": "x", "sockets": [
            {"index": -1, "cores": [{"index": 0, "status": ["ALLOCATED"]}]}]}]}}}, release=Release(24, 11)), "42")


def test_a_2205_record_without_a_task_count_reads_as_unknown():
    """22.05 writes ``"tasks": null`` for a job whose task count is unset (NO_VAL or INFINITE:
    ``data_set_null`` in src/plugins/openapi/v0.0.38/jobs.c at slurm-22-05-8-1; seen on the two-user
    cluster): no task count, not a refused record."""
    doc = json.loads((DATA / "22.05" / "squeue-cores.json").read_text())
    for job in doc["jobs"]:
        job["tasks"] = None
    info = parse_job_json(json.dumps(doc), "11")
    assert info.tasks is None and info.core_ids_on("a100-nvb", 32) == (0, 1, 2, 3, 4, 5)
