"""Which job the node monitor charges a GPU process to, on a real dev cluster under task/cgroup (cgroup v1) with
two unprivileged users (issue 18, item 4).

The monitor reads the job from the process's cgroup every sample (no Slurm call) and charges the process only
to a job of its owner. On 22.05 a job's step cgroup is its user's: alice can make a child cgroup there and open
it to everyone, and bob can then move his own GPU process into it. The process then sits in alice's job cgroup,
and must still not be charged to her job: it is bob's, and the stepd's pid list places it in bob's job. From
23.02 the step cgroup is root's and the kernel refuses the move; the test checks that refusal instead."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from slurm_gpushare.slurm.release import Release
from slurm_gpushare_dev.cluster import DevCluster
from tests.conftest import DEADLINE, scrape_metrics, wait_until
from tests.security.conftest import USERS

pytestmark = pytest.mark.slurm

NODE = "cgnode"


def _job_series(fams: dict[str, list], name: str, job: str) -> dict[str, float]:
    """gpu index -> value of the job's series ``name``."""
    return {s.labels["gpu"]: s.value for s in fams.get(name, []) if s.labels["hpc_job"] == job}


def _one(fams: dict[str, list], name: str, **labels: str) -> float:
    (value,) = [s.value for s in fams.get(name, []) if all(s.labels.get(k) == v for k, v in labels.items())]
    return value


def _devices_cgroup(pid: int) -> str:
    """The process's cgroup in the devices hierarchy (task/cgroup, ConstrainDevices=yes)."""
    m = re.search(r"^\d+:devices:(.*)$", Path(f"/proc/{pid}/cgroup").read_text(), re.M)
    assert m, Path(f"/proc/{pid}/cgroup").read_text()
    return m.group(1)


@pytest.fixture
def cg_cluster(cluster, users):
    root = Path(tempfile.mkdtemp(prefix="gpushare-cg-mon-", dir="/tmp"))
    os.chmod(root, 0o755)
    c = DevCluster(root / "c", cluster.port_base + 800, {NODE: cluster.nodes["rtx4090-pcie"]}, cgroup=True)
    c.up(out=open(os.devnull, "w"))
    out = root / "out"
    out.mkdir(mode=0o1777)
    out.chmod(0o1777)
    jobs: list[str] = []
    try:
        yield c, out, jobs
    finally:
        if jobs:
            subprocess.run(["scancel", *jobs], env=c.env, capture_output=True)
        c.down(out=open(os.devnull, "w"))
        shutil.rmtree(root, ignore_errors=True)


def test_a_gpu_process_is_charged_by_its_cgroup_and_never_to_another_users_job(cg_cluster, users):
    c, out, jobs = cg_cluster
    alice, bob = USERS
    app = shlex.quote(str(c.fake_gpu_app))
    url = c.monitor_url(NODE)

    def submit(user: str, name: str, mem: str) -> str:
        script = f"{app} --mem {mem} --seconds 300 & echo $! > {out}/{name}.pid; wait"
        proc = subprocess.run(["runuser", "-u", user, "--", "sbatch", "--parsable", "-w", NODE, "--gres=gpu:1",
                               f"--output={out}/{name}.out", "--wrap", script],
                              env=c.env, capture_output=True, text=True, timeout=DEADLINE)
        assert proc.returncode == 0, proc.stderr
        jobs.append(proc.stdout.strip())
        return jobs[-1]

    def registered(name: str) -> int:
        f = out / f"{name}.pid"
        pid = int(f.read_text()) if f.exists() and f.read_text().strip() else 0
        return pid if pid and (c.fake_gpu_table(NODE) / f"{pid}.json").exists() else 0

    a = submit(alice, "a", "2G")
    a_pid = wait_until(lambda: registered("a"), "alice's fake GPU process registered")
    assert f"/job_{a}/" in _devices_cgroup(a_pid) + "/"

    # 1. charged through its cgroup: the monitor runs no Slurm command for it
    def a_measured():
        fams = scrape_metrics(url)
        return fams if sum(_job_series(fams, "gpushare_job_gpu_memory_used_bytes", a).values()) == 2 << 30 else None

    fams = wait_until(a_measured, f"job {a}'s 2 GiB at {url}")
    assert _one(fams, "gpushare_monitor_attributed_processes", by="cgroup") == 1
    assert _one(fams, "gpushare_monitor_attributed_processes", by="slurm") == 0
    assert sum(_job_series(fams, "gpushare_job_gpu_processes", a).values()) == 1

    # 2. bob's GPU process, in his own job, then moved by bob into a cgroup of alice's job
    b = submit(bob, "b", "3G")
    b_pid = wait_until(lambda: registered("b"), "bob's fake GPU process registered")
    wait_until(lambda: sum(_job_series(scrape_metrics(url), "gpushare_job_gpu_memory_used_bytes", b).values())
               == 3 << 30,
               f"job {b}'s 3 GiB at {url}")
    step = Path("/sys/fs/cgroup/devices") / _devices_cgroup(a_pid).lstrip("/")
    opened = step / "open"
    release = Release.parse(c.slurm_release or "22.05")
    made = subprocess.run(["runuser", "-u", alice, "--", "sh", "-c",
                           f"mkdir {opened} && chmod 0666 {opened}/cgroup.procs {opened}/tasks"],
                          capture_output=True, text=True)
    if release >= Release.parse("23.02"):
        # the step cgroup is root's: alice cannot open one of hers to bob, nor can bob write into hers
        assert made.returncode != 0 and "Permission denied" in made.stderr, made
        moved = subprocess.run(["runuser", "-u", bob, "--", "sh", "-c", f"echo {b_pid} > {step}/cgroup.procs"],
                               capture_output=True, text=True)
        assert moved.returncode != 0 and f"/job_{b}/" in _devices_cgroup(b_pid) + "/", moved
        return
    assert made.returncode == 0, made.stderr  # 22.05: the step cgroup is alice's (docs/compatibility.md)
    moved = subprocess.run(["runuser", "-u", bob, "--", "sh", "-c", f"echo {b_pid} > {opened}/cgroup.procs"],
                           capture_output=True, text=True)
    assert moved.returncode == 0, moved.stderr
    assert _devices_cgroup(b_pid).startswith(_devices_cgroup(a_pid) + "/open")  # now in alice's job's cgroup

    def refused():
        fams = scrape_metrics(url)
        return fams if _one(fams, "gpushare_monitor_refused_attributions_total") >= 1 else None

    fams = wait_until(refused, "the monitor to refuse charging bob's process to alice's job")
    # alice's job: her own process only, on her own GPU
    assert sum(_job_series(fams, "gpushare_job_gpu_memory_used_bytes", a).values()) == 2 << 30
    assert sum(_job_series(fams, "gpushare_job_gpu_processes", a).values()) == 1
    assert set(_job_series(fams, "gpushare_job_gpu_memory_used_bytes", a)) == \
        set(_job_series(fams, "gpushare_job_gpu_memory_reserved_bytes", a))  # no series on bob's GPU
    assert _one(fams, "gpushare_job_gpu_over_limit", hpc_job=a) == 0
    # bob's process is still his job's: slurmstepd's pid list (proctrack/linuxproc) places it, once
    wait_until(lambda: sum(_job_series(scrape_metrics(url), "gpushare_job_gpu_memory_used_bytes", b).values())
               == 3 << 30,
               f"job {b} charged its 3 GiB through the pid list")
    fams = scrape_metrics(url)
    assert _one(fams, "gpushare_monitor_attributed_processes", by="slurm") == 1
    assert _one(fams, "gpushare_monitor_attributed_processes", by="cgroup") == 1
    log = (c.root / "log" / f"monitor-{NODE}.log").read_text()
    assert f"not charged: pid {b_pid} (uid {users[bob]}) is in the cgroup of job {a}, whose user is {alice}" in log
