"""GPU processes left behind by a job, on the real dev cluster with two unprivileged users (issue #14, item 5).

slurmd signals the processes a step's proctrack plugin tracks, then runs the Epilog. A fake GPU process that
escapes (``setsid -f``: out of ``proctrack/linuxproc``'s process tree) is still on the GPU when the Epilog
runs: the Epilog kills it when it provably belongs to the ended job (its cgroup under task/cgroup; else its
uid, its start during the job, and no other job of that user on the node) and the node stays up. Another
user's process on the job's GPU, or one of the same user that may be their running job's, drains the node
with a reason naming pid, user and GPU; ``doctor`` reports what is left."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from slurm_gpushare_dev.cluster import DevCluster, pid_alive
from tests.security.conftest import USERS
from tests.security.test_node_records import drained, outdir, sbatch_as  # noqa: F401 - outdir is a fixture

pytestmark = pytest.mark.slurm

NODE = "rtx4090-pcie"


def escape(cluster: DevCluster, node: str, out: Path, *, delay: float = 0) -> str:
    """A job script whose fake GPU process escapes the job (``setsid -f``), writes its pid to ``out`` and
    registers on the job's GPU (after ``delay`` seconds); the script waits for that, then ends."""
    table = cluster.fake_gpu_table(node)
    return (f"setsid -f sh -c 'echo $$ > {out}; sleep {delay}; exec {cluster.fake_gpu_app} --mem 1G --seconds 300' "
            f"</dev/null >/dev/null 2>&1; while [ ! -s {out} ]; do sleep 0.1; done; "
            + ("" if delay else f"while [ ! -e {table}/$(cat {out}).json ]; do sleep 0.1; done; ")
            + "echo escaped")


def wait_for(what, timeout: float = 30, message: str = ""):
    deadline = time.monotonic() + timeout
    while True:
        value = what()
        if value or time.monotonic() > deadline:
            assert value, message
            return value
        time.sleep(0.1)


def node_log(cluster: DevCluster, node: str) -> str:
    f = cluster.root / "run" / "gpushare" / node / "node.log"
    return f.read_text(errors="replace") if f.exists() else ""


def drain_reason(slurm, node: str) -> str:
    text = slurm.run(["scontrol", "show", "node", node]).stdout
    m = re.search(r"Reason=(.*?)(?: \[[^\]]*\])?$", text, re.M)
    return m.group(1) if m else ""


def resume(slurm, node: str) -> None:
    slurm.run(["scontrol", "update", f"nodename={node}", "state=resume"], check=False)


def doctor(cluster: DevCluster, node: str, *args: str) -> subprocess.CompletedProcess:
    env = {**cluster.env, "GPUSHARE_NVML": f"fake:{cluster.root}/machines/{node}.json",
           "GPUSHARE_FAKE_GPU_PROCESSES": str(cluster.fake_gpu_table(node))}
    return subprocess.run([sys.executable, "-m", "slurm_gpushare", "doctor", "--node", node,
                           "--config", str(cluster.node_config), *args], env=env, capture_output=True, text=True)


def kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def test_a_process_that_escapes_the_jobs_kill_is_killed_by_the_epilog_and_the_node_stays_up(
        cluster, slurm, users, outdir):  # noqa: F811
    pidfile = outdir / "escaped.pid"
    job = slurm.wait(sbatch_as(slurm, USERS[0], outdir, "-p", "pcie", "--gres=gpu:1",
                               wrap=escape(cluster, NODE, pidfile)))
    assert job.state == "COMPLETED" and "escaped" in job.output(), (job.fields, job.output())
    pid = int(pidfile.read_text())
    try:
        wait_for(lambda: not pid_alive(pid), message=f"the escaped process {pid} outlived the Epilog")
        line = wait_for(lambda: [ln for ln in node_log(cluster, NODE).splitlines()
                                 if f"job {job.id}: killed pid {pid} of {USERS[0]}({users[USERS[0]]}) on GPU" in ln])
        # no cgroup here (task/none): the owner, the start during the job, no other job of that user
        assert "started while it ran" in line[0], line
        assert drained(slurm) == []
    finally:
        kill(pid)


def test_another_users_process_on_the_jobs_gpu_drains_the_node_naming_pid_user_and_gpu(
        cluster, slurm, users, outdir):  # noqa: F811
    bob = subprocess.Popen(["runuser", "-u", USERS[1], "--", str(cluster.fake_gpu_app), "--machine",
                            str(cluster.root / "machines" / f"{NODE}.json"), "--table",
                            str(cluster.fake_gpu_table(NODE)), "--devices", ",".join(map(str, range(8))),
                            "--mem", "1G", "--seconds", "300"], env=cluster.env)
    pid = 0
    try:
        table = cluster.fake_gpu_table(NODE)
        (entry,) = wait_for(lambda: [f for f in table.glob("*.json") if f.stat().st_uid == users[USERS[1]]])
        pid = int(entry.stem)
        job = slurm.wait(sbatch_as(slurm, USERS[0], outdir, "-p", "pcie", "--gres=gpu:1",
                                   wrap="echo GPUS=$SLURM_JOB_GPUS"))
        reason = wait_for(lambda: drain_reason(slurm, NODE))
        gpu = job.output().split("GPUS=")[1].split()[0]
        assert re.search(rf"gpushare epilog job {job.id}: pid {pid} of {USERS[1]}\({users[USERS[1]]}\) on GPU "
                         rf"{gpu} \(GPU-[0-9a-f-]{{36}}\) holds the GPU", reason), reason
        assert pid_alive(pid)  # not the ended job's: left to the administrator
        report = doctor(cluster, NODE, "--repair")
        assert report.returncode == 1, report.stdout + report.stderr
        assert f"pid {pid} of {USERS[1]}" in report.stdout and "left alone" in report.stdout, report.stdout
        assert pid_alive(pid)
    finally:
        if pid:
            kill(pid)
        bob.kill()
        bob.wait(timeout=30)
        resume(slurm, NODE)
    assert wait_for(lambda: drained(slurm) == [])


def test_a_process_of_the_same_user_with_another_job_running_drains_instead_of_killing(
        cluster, slurm, users, outdir):  # noqa: F811
    other = sbatch_as(slurm, USERS[0], outdir, "-p", "pcie", "--gres=gpu:1", wrap="sleep 120")
    slurm.wait(other, {"RUNNING"})
    pidfile = outdir / "maybe.pid"
    try:
        job = slurm.wait(sbatch_as(slurm, USERS[0], outdir, "-p", "pcie", "--gres=gpu:1",
                                   wrap=escape(cluster, NODE, pidfile)))
        pid = int(pidfile.read_text())
        reason = wait_for(lambda: drain_reason(slurm, NODE))
        assert f"job {job.id}: pid {pid} of {USERS[0]}" in reason and f"running job {other.id}" in reason, reason
        assert pid_alive(pid)  # it may be the running job's: never killed on a guess
    finally:
        slurm.run(["scancel", other.id], check=False)
        if pidfile.exists():
            kill(int(pidfile.read_text()))
        resume(slurm, NODE)
    assert wait_for(lambda: drained(slurm) == [])


def test_under_task_cgroup_the_jobs_cgroup_proves_the_owner_for_the_epilog_and_doctor(cluster, users):
    root = Path(tempfile.mkdtemp(prefix="gpushare-cg-left-", dir="/tmp"))
    os.chmod(root, 0o755)
    c = DevCluster(root / "c", cluster.port_base + 600, {"cgnode": cluster.nodes[NODE]}, cgroup=True)
    c.up(out=open(os.devnull, "w"))
    out = root / "out"
    out.mkdir(mode=0o1777)
    out.chmod(0o1777)
    pids: list[int] = []

    def submit(script: str) -> str:
        proc = subprocess.run(["runuser", "-u", USERS[0], "--", "sbatch", "--parsable", "-w", "cgnode",
                               "--gres=gpu:1", f"--output={out}/%j.out", "--wrap", script],
                              env=c.env, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.strip()

    def log() -> str:
        f = c.root / "run" / "gpushare" / "cgnode" / "node.log"
        return f.read_text(errors="replace") if f.exists() else ""

    try:
        # 1. the Epilog: the process escaped the kill but not its cgroup
        first = submit(escape(c, "cgnode", out / "first.pid"))
        pid = int(wait_for(lambda: (out / "first.pid").exists() and (out / "first.pid").read_text().strip()))
        pids.append(pid)
        wait_for(lambda: not pid_alive(pid), 60, f"the escaped process {pid} outlived the Epilog")
        assert wait_for(lambda: f"job {first}: killed pid {pid} of {USERS[0]}" in log()), log()
        assert f"in the cgroup of ended job {first}" in log()
        # 2. doctor: a process that came onto the GPU after the Epilog looked, still in the ended job's cgroup
        second = submit(escape(c, "cgnode", out / "second.pid", delay=8))
        pid = int(wait_for(lambda: (out / "second.pid").exists() and (out / "second.pid").read_text().strip()))
        pids.append(pid)
        wait_for(lambda: (c.fake_gpu_table("cgnode") / f"{pid}.json").exists(), 60, "no late registration")
        cgroup = Path(f"/proc/{pid}/cgroup").read_text()
        assert re.search(rf"devices:/slurm_cgnode/uid_{users[USERS[0]]}/job_{second}/step_batch", cgroup), cgroup
        report = doctor(c, "cgnode")
        assert report.returncode == 1 and f"job {second}: pid {pid} of {USERS[0]}" in report.stdout, report.stdout
        assert "would kill it" in report.stdout and pid_alive(pid)
        fixed = doctor(c, "cgnode", "--repair")
        assert "killed it" in fixed.stdout, fixed.stdout + fixed.stderr
        wait_for(lambda: not pid_alive(pid), 10, "doctor --repair did not kill it")
        state = subprocess.run(["sinfo", "-h", "-n", "cgnode", "-o", "%T"], env=c.env, capture_output=True,
                               text=True).stdout.strip()
        assert state in ("idle", "mixed"), state
    finally:
        for p in pids:
            kill(p)
        c.down(out=open(os.devnull, "w"))
        shutil.rmtree(root, ignore_errors=True)
