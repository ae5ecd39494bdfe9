"""Parsing ``scontrol -d show job`` (recorded from the dev cluster's Slurm 22.05)."""

import pytest

from slurm_gpushare.errors import InputError
from slurm_gpushare.slurm.gres import GresItem
from slurm_gpushare.slurm.job import parse_gres_detail, parse_show_job

SHARD_JOB = """\
JobId=15 JobName=wrap
   UserId=alice(1000) GroupId=users(100) MCS_label=N/A
   Priority=1 Nice=0 Account=(null) QOS=(null)
   JobState=RUNNING Reason=None Dependency=(null)
   Requeue=1 Restarts=2 BatchFlag=1 Reboot=0 ExitCode=0:0
   SubmitTime=2026-11-29T12:00:00 EligibleTime=2026-11-29T12:00:00
   StartTime=2026-11-29T12:05:05 EndTime=Unknown Deadline=N/A
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
    assert j.gres_on("a100-nvb") == (GresItem("shard", "", 10, "IDX:0"),)
    assert j.gres_on("other") == ()
    # the run's submit time and restart count (issue 26 item 6), in slurmctld's local time as scontrol prints it
    from datetime import datetime
    assert (j.submit_time, j.start_time, j.restarts) == (
        int(datetime(2026, 11, 29, 12, 0, 0).timestamp()), int(datetime(2026, 11, 29, 12, 5, 5).timestamp()), 2)
    # the audit comes from AdminComment only, never from the user's Comment
    assert j.audit["sm"] == "25" and j.audit["grant"] == "gres:shard:10"


def test_multi_node_and_multi_item_detail():
    text = ("JobId=7 UserId=bob(1001) GroupId=bob(1001)\n NodeList=gpu[01-02]\n"
            "   Nodes=gpu[01-02] CPU_IDs=0-1 Mem=200 GRES=gpu:a100:2(IDX:0,2),nic:1(IDX:N/A)\n")
    j = parse_show_job(text)
    assert j.nodes == ("gpu01", "gpu02")
    assert j.gres_on("gpu02") == (GresItem("gpu", "a100", 2, "IDX:0,2"), GresItem("nic", "", 1, "IDX:N/A"))
    assert [a.indices for a in j.gres_on("gpu02")] == [(0, 2), ()]


def test_bad_input():
    with pytest.raises(InputError, match="no job"):
        parse_show_job("slurm_load_jobs error: Invalid job id specified\n")
    with pytest.raises(InputError, match="GRES detail"):
        parse_gres_detail("gpu:a100(IDX:0)")
    assert parse_gres_detail("gpu:h100_1g.10gb:1(IDX:4-6)")[0].indices == (4, 5, 6)


def test_plan_names_a_whole_gpu_next_to_mig_devices_by_uuid():
    from slurm_gpushare.node.plan import plan_job
    from slurm_gpushare.slurm.nodegres import node_gres
    from slurm_gpushare_dev.cluster import packaged_machine

    gres = node_gres(packaged_machine("4x-h100-mig-mixed.json"), "mig")
    text = ("JobId=9 UserId=a(1) GroupId=a(1)\n NodeList=mig\n"
            "   Nodes=mig CPU_IDs=0 Mem=1 GRES=gpu:h100:1(IDX:0),gpu:h100_1g.10gb:1(IDX:4)\n")
    plan = plan_job(parse_show_job(text), "mig", gres, gpu_uuids={0: "GPU-a"}, mig_uuids={(2, 7): "MIG-b"},
                    shard_unit_mib=1024)
    assert plan.kind == "mig" and plan.visible_devices == "GPU-a,MIG-b"


ARRAY_SHOW = """\
JobId=49 ArrayJobId=49 ArrayTaskId=1 JobName=wrap
   UserId=root(0) GroupId=root(0) MCS_label=N/A
   Priority=1 Nice=0 Account=(null) QOS=normal
   JobState=RUNNING Reason=None Dependency=(null)
   Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:0
   StartTime=2026-11-29T14:50:01 EndTime=Unknown Deadline=N/A
   Partition=gpu AllocNode:Sid=localhost:1
   NodeList=h100-mig
   JOB_GRES=gpu:h100_1g.10gb:1
     Nodes=h100-mig CPU_IDs=0 Mem=100 GRES=gpu:h100_1g.10gb:1(IDX:5)
   TresPerNode=gres:gpu:h100_1g.10gb:1

JobId=50 ArrayJobId=49 ArrayTaskId=0 JobName=wrap
   UserId=root(0) GroupId=root(0) MCS_label=N/A
   Priority=1 Nice=0 Account=(null) QOS=normal
   JobState=COMPLETING Reason=None Dependency=(null)
   Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:15
   StartTime=2026-11-29T14:50:00 EndTime=Unknown Deadline=N/A
   Partition=gpu AllocNode:Sid=localhost:1
   NodeList=h100-mig
   JOB_GRES=gpu:h100_1g.10gb:1
     Nodes=h100-mig CPU_IDs=1 Mem=100 GRES=gpu:h100_1g.10gb:1(IDX:4)
   TresPerNode=gres:gpu:h100_1g.10gb:1
"""


def test_the_array_jobs_own_id_prints_every_task_and_only_the_asked_one_counts():
    # found in a trial: `scontrol -d show job 49` (the array's id) prints all its tasks; the GRES of task 0
    # (JobId=50) replaced task 1's own, and two jobs got the same MIG slice
    info = parse_show_job(ARRAY_SHOW, "49")
    assert (info.job_id, info.array_task_id, info.gres_on("h100-mig")[0].indices) == ("49", 1, (5,))
    other = parse_show_job(ARRAY_SHOW, "50")
    assert (other.job_id, other.array_task_id, other.gres_on("h100-mig")[0].indices) == ("50", 0, (4,))
    assert (other.state, other.exit_code) == ("COMPLETING", "0:15")
    with pytest.raises(InputError, match="no record of job 51"):
        parse_show_job(ARRAY_SHOW, "51")


@pytest.mark.parametrize("text, used", [
    # 22.05.8 (measured): node-wide IDX lists for GPUs and shards
    ("gpu:a100:0(IDX:N/A),shard:a100:2(IDX:0,6),gpushare:0", {0, 6}),
    ("gpu:a100:3(IDX:0-1,3),shard:a100:0(IDX:N/A)", {0, 1, 3}),
    # 24.11.5 (measured): shards as per-device counts, one item per type, the types in device order
    ("gpu:a100:0(IDX:N/A),shard:a100:10(10/80,0/80,0/80,0/80,0/80,0/80,0/80,0/80)", {0}),
    ("gpu:h100:0(IDX:N/A),gpu:h100_4g.40gb:1(IDX:2),gpu:h100_1g.10gb:0(IDX:N/A),shard:h100:5(0/79,5/79),"
     "shard:h100_4g.40gb:0(0/0,0/0),shard:h100_1g.10gb:0(0/0,0/0,0/0,0/0,0/0,0/0)", {1, 2}),
    # 26.05.5 (measured): a device allocated whole is "-" in the shard item
    ("gpu:a100:2(IDX:0-1),shard:a100:5(-/80,-/80,0/80,0/80,5/80,0/80,0/80,0/80)", {0, 1, 4}),
    ("", set()),
])
def test_devices_in_use_on_a_node(text, used):
    from slurm_gpushare.slurm.job import used_devices

    assert used_devices(text) == used


def test_gres_detail_of_a_gpus_job_with_empty_index_lists_of_other_types():
    # 22.05.8, a --gpus=1 job on a node of gpu:h100 and two MIG types (measured on the dev cluster): the types it
    # got none of show an empty IDX: list
    items = parse_gres_detail("gpu:h100:1(IDX:0),gpu:h100_4g.40gb:0(IDX:),gpu:h100_1g.10gb:0(IDX:)")
    assert [(it.type, it.count, it.indices) for it in items] == \
        [("h100", 1, (0,)), ("h100_4g.40gb", 0, ()), ("h100_1g.10gb", 0, ())]
