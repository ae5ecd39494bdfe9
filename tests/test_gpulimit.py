"""The driver's per-cgroup memory limit of a share job (slurm_gpushare/node/gpulimit.py, issue 27 item 3)."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

from slurm_gpushare.hardware.fake import FakeNvml
from slurm_gpushare.hardware.port import NVML_ERROR_UNKNOWN, MemoryLimits
from slurm_gpushare.node.gpulimit import apply_limit, job_cgroup_dir, wants_limit
from slurm_gpushare.node.membership import CgroupFs
from slurm_gpushare.node.plan import JobPlan
from slurm_gpushare_dev.cluster import packaged_machine

SHARE = JobPlan(kind="mps", job_id="42", uid=1000, gid=1000, gpu_indices=(0, 1), mem_limit_mib=10240)


def _mounts(tmp_path: Path, *hierarchies: str) -> tuple[CgroupFs, Path]:
    """Hierarchies mounted under ``tmp_path/cgroup`` as the kernel's mountinfo lists them (``unified``: cgroup2)."""
    lines = []
    for i, h in enumerate(hierarchies):
        point = tmp_path / "cgroup" / h
        point.mkdir(parents=True)
        lines.append(f"{35 + i} 25 0:{30 + i} / {point} rw,nosuid - cgroup2 cgroup2 rw" if h == "unified" else
                     f"{35 + i} 25 0:{30 + i} / {point} rw,nosuid - cgroup cgroup rw,{h}")
    return CgroupFs("\n".join(lines) + "\n"), tmp_path / "cgroup"


def _made(where: Path, uid: int = 0) -> str:
    where.mkdir(parents=True)
    os.chown(where, uid, uid)
    return str(where)


def test_the_job_cgroup_of_a_v2_process_is_its_one_directory_made_by_root(tmp_path):
    fs, root = _mounts(tmp_path, "unified")
    made = _made(root / "unified" / "system.slice" / "node1_slurmstepd.scope" / "job_42")
    text = "0::/system.slice/node1_slurmstepd.scope/job_42/step_0/user/task_0\n"
    assert job_cgroup_dir(text, "42", fs) == made
    assert job_cgroup_dir(text, "43", fs) is None  # another job's process
    assert job_cgroup_dir("0::/user.slice/user-1000.slice\n", "42", fs) is None
    # a directory of the same layout that the job's user made, in a subtree delegated to them, is not the job's
    _made(root / "unified" / "user.slice" / "u" / "x_slurmstepd.scope" / "job_42", uid=1000)
    assert job_cgroup_dir("0::/user.slice/u/x_slurmstepd.scope/job_42\n", "42", fs) is None


def test_on_cgroup_v1_the_memory_hierarchy_comes_first_then_devices(tmp_path):
    fs, root = _mounts(tmp_path, "cpuset", "devices", "memory")
    memory = _made(root / "memory" / "slurm" / "uid_1000" / "job_42")
    devices = _made(root / "devices" / "slurm" / "uid_1000" / "job_42")
    both = "9:memory:/slurm/uid_1000/job_42/step_0\n5:devices:/slurm/uid_1000/job_42/step_0/task_0\n"
    assert job_cgroup_dir(both, "42", fs) == memory
    only = "9:memory:/\n5:devices:/slurm/uid_1000/job_42/step_0/task_0\n4:cpuset:/slurm/uid_1000/job_42\n"
    assert job_cgroup_dir(only, "42", fs) == devices
    # a hierarchy that is not mounted here, or a job directory that is not there, gives nothing
    assert job_cgroup_dir("3:freezer:/slurm/uid_1000/job_42\n", "42", fs) is None
    assert job_cgroup_dir("4:cpuset:/slurm/uid_1000/job_42\n", "42", fs) is None


def test_on_a_hybrid_node_the_v1_directory_wins_over_a_unified_one_the_user_made(tmp_path):
    """Found by a review: on a node with v1 hierarchies and a unified one (Ubuntu 20.04), the job's user may make
    ``.../x_slurmstepd.scope/job_<id>`` in the unified subtree her systemd manager holds and move her process
    there; its v1 lines still name the job's real, root-made directory, which is the one limited."""
    fs, root = _mounts(tmp_path, "devices", "unified")
    devices = _made(root / "devices" / "slurm" / "uid_1000" / "job_42")
    _made(root / "unified" / "user.slice" / "user@1000.service" / "x_slurmstepd.scope" / "job_42")  # even root's
    text = ("5:devices:/slurm/uid_1000/job_42/step_0/task_0\n"
            "0::/user.slice/user@1000.service/x_slurmstepd.scope/job_42\n")
    assert job_cgroup_dir(text, "42", fs) == devices


def test_only_shares_want_the_driver_s_limit():
    assert wants_limit(SHARE, "auto")
    assert not wants_limit(SHARE, "off")
    assert not wants_limit(replace(SHARE, kind="gpu", mem_limit_mib=None), "auto")
    assert not wants_limit(replace(SHARE, kind="mig", mem_limit_mib=None), "auto")


def test_a_share_on_two_gpus_gets_its_share_as_the_most_on_each_and_no_guarantee(tmp_path):
    """Slurm does not say how many of a share's shards lie on each of its GPUs: each gets the whole share as the
    hard limit, as the MPS limit does, and no soft limit (NVIDIA: guaranteed), which would promise the share twice;
    a share on one GPU gets it as both (found by a review)."""
    with FakeNvml(packaged_machine("8x-a100-nv12-bridge.json")) as nvml:
        result = apply_limit(nvml, SHARE, str(tmp_path))
        assert (result.outcome, result.gpus, result.mib) == ("set", (0, 1), 10240)
        assert [nvml.memory_limits(g, str(tmp_path)).hard_mib for g in (0, 1, 2)] == [10240, 10240, None]
        assert [nvml.memory_limits(g, str(tmp_path)).soft_mib for g in (0, 1)] == [0, 0]
        apply_limit(nvml, replace(SHARE, gpu_indices=(3,)), str(tmp_path))
        assert nvml.memory_limits(3, str(tmp_path)) == MemoryLimits(10240, 10240, 0)


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
