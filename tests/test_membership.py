"""Job membership of local processes (slurm_gpushare.node.membership): Slurm's cgroup layouts as recorded
(cgroup v1 on this host and on 22.05 nodes; cgroup v2 path strings as Slurm's cgroup/v2 plugin writes them),
mountinfo texts, and the real /proc of this test's own process."""

from __future__ import annotations

import os

from slurm_gpushare.node.membership import (
    CgroupFs,
    CgroupJob,
    cgroup_jobs,
    job_of_cgroup,
    parse_mountinfo,
    read_cgroup,
    read_proc,
)

# task/cgroup on 22.05, cgroup v1, several slurmd on one host (the dev cluster's layout)
V1 = ("12:pids:/\n9:freezer:/\n5:devices:/slurm_cgnode/uid_1000/job_42/step_batch/task_0\n"
      "4:memory:/process_api/x\n1:name=systemd:/user.slice\n0::/\n")
# cgroup/v2 (24.11, 26.05): systemd's slurmstepd scope, and the multiple-slurmd form
V2 = "0::/system.slice/slurmstepd.scope/job_77/step_0/user/task_0\n"
V2_MULTI = "0::/system.slice/node3_slurmstepd.scope/job_78/step_batch/user/task_1\n"
# a v2 host (systemd, unified): the cgroup2 mount; and a container whose mount root is a subtree
MOUNTINFO_V2 = ("24 1 0:22 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 "
                "rw,nsdelegate,memory_recursiveprot\n")
MOUNTINFO_V1 = ("31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
                "34 31 0:31 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct\n"
                "36 31 0:33 / /sys/fs/cgroup/devices rw,relatime - cgroup cgroup rw,devices\n"
                "40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,xattr,name=systemd\n"
                "41 31 0:38 /slurm_a /mnt/slurm\\040a rw - cgroup cgroup rw,freezer\n")


def test_slurm_layouts_name_the_job():
    assert cgroup_jobs(V1) == [CgroupJob("devices", "/slurm_cgnode/uid_1000/job_42", "42")]
    assert cgroup_jobs(V2) == [CgroupJob("", "/system.slice/slurmstepd.scope/job_77", "77")]
    assert job_of_cgroup(V2_MULTI) == "78"
    assert job_of_cgroup("4:devices:/slurm/uid_0/job_5\n") == "5"  # the job's own directory (extern, no step)


def test_what_a_user_can_name_does_not_move_a_process_to_another_job():
    # 22.05: the step directory is the user's; a child named job_99 below it is still job 42's
    assert job_of_cgroup("5:devices:/slurm/uid_1000/job_42/step_0/job_99/task_0\n") == "42"
    # not Slurm's layout: a job_ directory elsewhere
    assert job_of_cgroup("0::/user.slice/user-1000.slice/user@1000.service/job_42/x\n") is None
    assert job_of_cgroup("4:memory:/job_scheduler/x\n") is None
    assert job_of_cgroup("5:devices:/job_42/step_0\n") is None  # v1 wants /slurm*/uid_N/job_N
    # hierarchies that disagree (moved in one of them): no answer
    assert job_of_cgroup("9:freezer:/slurm/uid_1/job_1/step_0\n5:devices:/slurm/uid_1/job_2/step_0\n") is None
    # a v2 path a user could make in a delegated subtree parses, and only the owner check refuses it
    forged = "0::/user.slice/user-1000.slice/user@1000.service/slurmstepd.scope/job_42/x\n"
    assert cgroup_jobs(forged)[0].path == "/user.slice/user-1000.slice/user@1000.service/slurmstepd.scope/job_42"


def test_mountinfo_maps_each_hierarchy_to_its_directory():
    mounts = parse_mountinfo(MOUNTINFO_V1 + MOUNTINFO_V2)
    assert len(mounts) == 5 and sum(m.v2 for m in mounts) == 1
    v1 = CgroupFs(MOUNTINFO_V1)
    assert v1.directory(CgroupJob("devices", "/slurm/uid_1/job_2", "2")) == "/sys/fs/cgroup/devices/slurm/uid_1/job_2"
    assert v1.directory(CgroupJob("cpu,cpuacct", "/slurm/uid_1/job_2", "2")) == \
        "/sys/fs/cgroup/cpu,cpuacct/slurm/uid_1/job_2"
    # a mount of a subtree (field 4), and an octal escape in the mount point
    assert v1.directory(CgroupJob("freezer", "/slurm_a/uid_1/job_2", "2")) == "/mnt/slurm a/uid_1/job_2"
    assert v1.directory(CgroupJob("freezer", "/slurm_b/uid_1/job_2", "2")) is None
    assert v1.directory(CgroupJob("", "/system.slice/slurmstepd.scope/job_2", "2")) is None  # no cgroup2 here
    v2 = CgroupFs(MOUNTINFO_V2)
    assert v2.directory(CgroupJob("", "/system.slice/slurmstepd.scope/job_2", "2")) == \
        "/sys/fs/cgroup/system.slice/slurmstepd.scope/job_2"
    assert v2.directory(CgroupJob("devices", "/slurm/uid_1/job_2", "2")) is None


def test_this_hosts_own_cgroups_and_proc():
    facts = read_proc(os.getpid())
    assert facts is not None and facts.uid == os.getuid() and facts.start > 0
    assert read_proc(os.getpid()) == facts  # the same process: the same start
    assert read_proc(2**22 + 17) is None  # beyond pid_max: gone
    text = read_cgroup(os.getpid())
    assert text.strip()
    fs = CgroupFs()
    # every hierarchy this process is in resolves to a directory that exists here
    for line in text.splitlines():
        hierarchy, _, path = line.partition(":")[2].partition(":")
        where = fs.directory(CgroupJob(hierarchy, path, "0"))
        if where is not None:
            assert os.path.isdir(where), (line, where)
            assert fs.owner(CgroupJob(hierarchy, path, "0")) == os.stat(where).st_uid
    assert fs.owner(CgroupJob("devices", "/slurm_nonexistent/uid_0/job_1", "1")) is None


def test_a_held_proc_directory_never_answers_for_another_process():
    import subprocess

    from slurm_gpushare.node.membership import ProcReader

    reader = ProcReader()
    child = subprocess.Popen(["sleep", "60"])
    try:
        facts = reader.facts(child.pid)
        assert facts == read_proc(child.pid) and reader.facts(child.pid) is facts  # kept, not read again
        assert reader.cgroup(child.pid) == read_cgroup(child.pid) != ""
    finally:
        child.kill()
        child.wait()
    # the process is gone: its held directory answers nothing (ESRCH), whoever has the pid now
    assert reader.cgroup(child.pid) == ""
    assert reader.facts(child.pid) is None
    me = reader.facts(os.getpid())
    reader.keep(set())
    assert reader.facts(os.getpid()) == me
