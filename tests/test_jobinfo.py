"""Parsing ``scontrol -d show job`` (recorded from the dev cluster's Slurm 22.05)."""

import pytest

from slurm_gpushare.errors import InputError
from slurm_gpushare.jobinfo import GresAlloc, parse_gres_detail, parse_show_job

SHARD_JOB = """\
JobId=15 JobName=wrap
   UserId=alice(1000) GroupId=users(100) MCS_label=N/A
   Priority=1 Nice=0 Account=(null) QOS=(null)
   JobState=RUNNING Reason=None Dependency=(null)
   Partition=nomig AllocNode:Sid=localhost:1106
   ReqNodeList=(null) ExcNodeList=(null)
   NodeList=a100-nvb
   JOB_GRES=shard:10
     Nodes=a100-nvb CPU_IDs=0 Mem=100 GRES=shard:10(IDX:0)
   AdminComment=other text [gpushare:v1 req=mem=10G+sm=25 grant=gres:shard:10 kind=mps mem=10240/10240MiB sm=25]
   Comment=user text x=1 [gpushare:v1 req=mem=80G grant=gres:shard:80 kind=mps]
   TresPerNode=gres:shard:10
"""


def test_shard_job():
    j = parse_show_job(SHARD_JOB)
    assert (j.job_id, j.user, j.uid, j.gid, j.state, j.partition) == ("15", "alice", 1000, 100, "RUNNING", "nomig")
    assert j.nodes == ("a100-nvb",) and j.tres_per_node == "gres:shard:10"
    assert j.gres_on("a100-nvb") == (GresAlloc("shard", "", 10, (0,)),)
    assert j.gres_on("other") == ()
    # the audit comes from AdminComment only, never from the user's Comment
    assert j.audit["sm"] == "25" and j.audit["grant"] == "gres:shard:10"


def test_multi_node_and_multi_item_detail():
    text = ("JobId=7 UserId=bob(1001) GroupId=bob(1001)\n NodeList=gpu[01-02]\n"
            "   Nodes=gpu[01-02] CPU_IDs=0-1 Mem=200 GRES=gpu:a100:2(IDX:0,2),nic:1(IDX:N/A)\n")
    j = parse_show_job(text)
    assert j.nodes == ("gpu01", "gpu02")
    assert j.gres_on("gpu02") == (GresAlloc("gpu", "a100", 2, (0, 2)), GresAlloc("nic", "", 1, ()))


def test_bad_input():
    with pytest.raises(InputError, match="no job"):
        parse_show_job("slurm_load_jobs error: Invalid job id specified\n")
    with pytest.raises(InputError, match="GRES detail"):
        parse_gres_detail("gpu:a100(IDX:0)")
    assert parse_gres_detail("gpu:h100_1g.10gb:1(IDX:4-6)")[0].indices == (4, 5, 6)


def test_plan_names_a_whole_gpu_next_to_mig_devices_by_uuid():
    from slurm_gpushare.devcluster import packaged_machine
    from slurm_gpushare.gresconf import node_gres
    from slurm_gpushare.jobplan import plan_job

    gres = node_gres(packaged_machine("4x-h100-mig-mixed.json"), "mig")
    text = ("JobId=9 UserId=a(1) GroupId=a(1)\n NodeList=mig\n"
            "   Nodes=mig CPU_IDs=0 Mem=1 GRES=gpu:h100:1(IDX:0),gpu:h100_1g.10gb:1(IDX:4)\n")
    plan = plan_job(parse_show_job(text), "mig", gres, gpu_uuids={0: "GPU-a"}, mig_uuids={(2, 7): "MIG-b"},
                    shard_unit_mib=1024)
    assert plan.kind == "mig" and plan.visible_devices == "GPU-a,MIG-b"
