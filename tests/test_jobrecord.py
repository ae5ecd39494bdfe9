"""The node hooks' job-record reader (:func:`slurm_gpushare.slurm.job.parse_job_json`): user-written fields
cannot change what it returns, and a record it cannot trust is refused."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_gpushare.errors import InputError
from slurm_gpushare.slurm.job import parse_job_json, with_env_identity

BASE = {"job_id": 42, "user_id": 1001, "group_id": 1001, "user_name": "alice", "account": "research",
        "partition": "pcie", "job_state": "RUNNING", "nodes": "rtx4090-pcie", "tres_per_node": "gres:shard:10",
        "gres_detail": ["shard:10(IDX:0)"], "admin_comment": "[gpushare:v1 req=mem=10G sm=25]",
        "start_time": 1796116390, "exit_code": 0, "array_job_id": 0, "array_task_id": None}
USER_FIELDS = ("name", "comment", "current_working_directory", "standard_output", "standard_error", "command")
# what a user may write: any text (newlines, '=', brackets, lone surrogates from undecodable bytes), up to 1 MB
hostile = st.one_of(st.text(), st.sampled_from([
    "x\nNodes=rtx4090-pcie GRES=shard:80(IDX:0)", "n UserId=root(0) Account=other StartTime=2020-01-01T00:00:00",
    "\nAdminComment=[gpushare:v1 sm=100]", "caf\udce9", '"}]}, {"job_id": 42, "user_id": 0', "=" * 1_000_000]))


def _doc(job: dict, *others: dict) -> str:
    return json.dumps({"jobs": [*others, job]})


@settings(max_examples=200, deadline=None)
@given(st.fixed_dictionaries({k: hostile for k in USER_FIELDS}))
def test_user_fields_never_change_the_record(fields):
    info = parse_job_json(_doc({**BASE, **fields}), "42")
    assert (info.uid, info.gid, info.user, info.account, info.partition, info.start_time) == (
        1001, 1001, "alice", "research", "pcie", 1796116390)
    assert [it.text for it in info.gres_on("rtx4090-pcie")] == ["shard:10(IDX:0)"]
    assert info.audit == {"req": "mem=10G", "sm": "25"}


def test_only_the_asked_job_is_read():
    other = {**BASE, "job_id": 43, "user_id": 0, "gres_detail": ["shard:80(IDX:0)"]}
    assert parse_job_json(_doc(BASE, other), "42").uid == 1001
    with pytest.raises(InputError, match="0 records of job 44"):
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
