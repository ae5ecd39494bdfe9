"""The driver's per-cgroup memory limit of a share job (slurm_gpushare/node/gpulimit.py, issue 27 item 3)."""

from __future__ import annotations

from dataclasses import replace

from slurm_gpushare.hardware.fake import FakeNvml
from slurm_gpushare.hardware.port import NVML_ERROR_UNKNOWN
from slurm_gpushare.node.gpulimit import apply_limit, job_cgroup_dir, wants_limit
from slurm_gpushare.node.membership import CgroupFs
from slurm_gpushare.node.plan import JobPlan
from slurm_gpushare_dev.cluster import packaged_machine

V2_MOUNTINFO = "30 23 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw\n"
V1_MOUNTINFO = ("35 25 0:30 / /sys/fs/cgroup/cpuset rw,nosuid - cgroup cgroup rw,cpuset\n"
                "36 25 0:31 / /sys/fs/cgroup/devices rw,nosuid - cgroup cgroup rw,devices\n"
                "37 25 0:32 / /sys/fs/cgroup/memory rw,nosuid - cgroup cgroup rw,memory\n")
SHARE = JobPlan(kind="mps", job_id="42", uid=1000, gid=1000, gpu_indices=(0, 1), mem_limit_mib=10240)


def test_the_job_cgroup_of_a_v2_process_is_its_one_directory():
    text = "0::/system.slice/node1_slurmstepd.scope/job_42/step_0/user/task_0\n"
    assert job_cgroup_dir(text, "42", CgroupFs(V2_MOUNTINFO)) == \
        "/sys/fs/cgroup/system.slice/node1_slurmstepd.scope/job_42"
    assert job_cgroup_dir(text, "43", CgroupFs(V2_MOUNTINFO)) is None  # another job's process
    assert job_cgroup_dir("0::/user.slice/user-1000.slice\n", "42", CgroupFs(V2_MOUNTINFO)) is None


def test_on_cgroup_v1_the_memory_hierarchy_comes_first_then_devices():
    both = "9:memory:/slurm/uid_1000/job_42/step_0\n5:devices:/slurm/uid_1000/job_42/step_0/task_0\n"
    assert job_cgroup_dir(both, "42", CgroupFs(V1_MOUNTINFO)) == "/sys/fs/cgroup/memory/slurm/uid_1000/job_42"
    devices = "9:memory:/\n5:devices:/slurm/uid_1000/job_42/step_0/task_0\n4:cpuset:/slurm/uid_1000/job_42\n"
    assert job_cgroup_dir(devices, "42", CgroupFs(V1_MOUNTINFO)) == "/sys/fs/cgroup/devices/slurm/uid_1000/job_42"
    # a hierarchy that is not mounted here gives nothing
    assert job_cgroup_dir("3:freezer:/slurm/uid_1000/job_42\n", "42", CgroupFs(V1_MOUNTINFO)) is None


def test_only_shares_want_the_driver_s_limit():
    assert wants_limit(SHARE, "auto")
    assert not wants_limit(SHARE, "off")
    assert not wants_limit(replace(SHARE, kind="gpu", mem_limit_mib=None), "auto")
    assert not wants_limit(replace(SHARE, kind="mig", mem_limit_mib=None), "auto")


def test_a_share_on_two_gpus_gets_its_share_on_each(tmp_path):
    with FakeNvml(packaged_machine("8x-a100-nv12-bridge.json")) as nvml:
        result = apply_limit(nvml, SHARE, str(tmp_path))
        assert (result.outcome, result.gpus, result.mib) == ("set", (0, 1), 10240)
        assert [nvml.memory_limits(g, str(tmp_path)).hard_mib for g in (0, 1, 2)] == [10240, 10240, None]
        assert [nvml.memory_limits(g, str(tmp_path)).soft_mib for g in (0, 1)] == [10240, 10240]


def test_a_driver_that_refuses_is_a_result_not_an_error(tmp_path):
    old = replace(packaged_machine("8x-a100-nv12-bridge.json"), driver_version="580.95.05")
    with FakeNvml(old) as nvml:
        result = apply_limit(nvml, SHARE, str(tmp_path))
    assert (result.outcome, result.gpus) == ("unsupported", ())
    assert "no driver memory limit" in result.line("42") and "R615" in result.detail
    with FakeNvml(packaged_machine("8x-a100-nv12-bridge.json")) as nvml:
        nvml.fail_next("nvmlDeviceSetMemoryLimits_v1", NVML_ERROR_UNKNOWN, gpu=1)
        result = apply_limit(nvml, SHARE, str(tmp_path))
        assert (result.outcome, result.gpus) == ("failed", (0,))  # GPU 0 keeps the limit it got
        assert nvml.memory_limits(0, str(tmp_path)).hard_mib == 10240
