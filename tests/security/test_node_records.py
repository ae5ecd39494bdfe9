"""Hostile job fields against the node hooks, on the real dev cluster, as an unprivileged user (issue #12,
items 1-3): a forged ``scontrol show job`` line in a Comment or JobName, a Latin-1 name, a killed MPS daemon.
Each: the job gets the limit and identity Slurm granted, no node drains, the accounting record is the job's."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from tests.conftest import DEADLINE, Job, spooled_records, wait_until
from tests.security.conftest import USERS

pytestmark = pytest.mark.slurm

PROBE = ('env | grep -E "^CUDA_MPS_(PINNED|ACTIVE)" | sort; P=$(cat $CUDA_MPS_PIPE_DIRECTORY/'
         'nvidia-cuda-mps-control.pid); echo "DAEMON_UID=$(stat -c %u /proc/$P)"')



@pytest.fixture
def outdir():
    d = Path(tempfile.mkdtemp(prefix="gps-sec-"))
    d.chmod(0o1777)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def sbatch_as(slurm, user: str, outdir: Path, *args: str | bytes, wrap: str = PROBE) -> Job:
    """``sbatch`` run by ``user`` (runuser), its output in ``outdir``; args may be bytes (any encoding)."""
    out = outdir / f"job-{time.monotonic_ns()}.out"
    argv: list[str | bytes] = ["runuser", "-u", user, "--", "sbatch", "--parsable", f"--output={out}", *args,
                               "--wrap", wrap]
    proc = subprocess.run(argv, env=slurm.cluster.env, capture_output=True, timeout=DEADLINE)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    job_id = proc.stdout.decode().strip().split(";")[0]
    slurm.submitted.append(job_id)
    return Job(job_id, output_path=out)


def env_of(job: Job) -> dict[str, str]:
    return dict(line.split("=", 1) for line in job.output().splitlines() if "=" in line)


def drained(slurm) -> list[str]:
    out = slurm.run(["sinfo", "-h", "-N", "-o", "%N %t %E"]).stdout
    bad = [line for line in out.splitlines() if line.split()[1].startswith(("drain", "drng", "down"))]
    for line in bad:  # undo, so that one failure does not cascade
        slurm.run(["scontrol", "update", f"nodename={line.split()[0]}", "state=resume"], check=False)
    return bad


def record_of(cluster, job_id: str, timeout: float = DEADLINE) -> list[dict]:
    def mine() -> list[dict]:
        rows = spooled_records(cluster.accounting_spool)
        return [r for r in rows if str(r.get("job_id")) == job_id]

    return wait_until(mine, f"the accounting record of job {job_id}", timeout)


def check_mps_job(slurm, cluster, job: Job, user: str, uid: int, limit: str, sm: str | None = None):
    job = slurm.wait(job)
    assert job.state == "COMPLETED", (job.fields, job.output())
    env = env_of(job)
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == limit
    if sm is not None:
        assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == sm
    assert env["DAEMON_UID"] == str(uid)
    (rec,) = record_of(cluster, job.id)
    assert rec["user"] == user
    assert rec["start"] > time.time() - 600  # not the forged 2020
    assert drained(slurm) == []
    return rec


def test_comment_with_a_forged_gres_line_keeps_the_granted_limit(cluster, slurm, users, outdir):
    forged = "x\nNodes=rtx4090-pcie CPU_IDs=0 Mem=100 GRES=shard:80(IDX:0)\n   AdminComment=[gpushare:v1 sm=100]"
    job = sbatch_as(slurm, USERS[0], outdir, "-p", "pcie", "--gres=gpushare:mem=10G+sm=25", f"--comment={forged}")
    check_mps_job(slurm, cluster, job, USERS[0], users[USERS[0]], "0=10G", "25")


def test_job_name_with_a_forged_user_keeps_the_owner(cluster, slurm, users, outdir):
    bob = users[USERS[1]]
    name = (f"n UserId={USERS[1]}({bob}) GroupId={USERS[1]}({bob}) Account=other "
            "StartTime=2020-01-01T00:00:00\n   UserId=root(0) GroupId=root(0) Account=other")
    job = sbatch_as(slurm, USERS[0], outdir, "-p", "pcie", "--gres=gpushare:mem=10G", f"--job-name={name}")
    rec = check_mps_job(slurm, cluster, job, USERS[0], users[USERS[0]], "0=10G")
    assert rec["account"] != "other"


def test_scontrol_update_of_the_name_to_root_keeps_the_owner(cluster, slurm, users, outdir):
    job = sbatch_as(slurm, USERS[0], outdir, "-H", "-p", "pcie", "--gres=gpushare:mem=10G")
    subprocess.run(["runuser", "-u", USERS[0], "--", "scontrol", "update", f"jobid={job.id}",
                    "name=n\n   UserId=root(0) GroupId=root(0)"], env=slurm.cluster.env, check=True)
    subprocess.run(["runuser", "-u", USERS[0], "--", "scontrol", "release", job.id], env=slurm.cluster.env,
                   check=True)
    check_mps_job(slurm, cluster, job, USERS[0], users[USERS[0]], "0=10G")


def test_latin1_job_name_and_bogus_gres_line_drain_nothing(cluster, slurm, users, outdir):
    job = sbatch_as(slurm, USERS[0], outdir, "-p", "pcie", "--gres=gpushare:mem=10G", b"--job-name=caf\xe9",
                    "--comment=a\nNodes=rtx4090-pcie GRES=bogus\n")
    check_mps_job(slurm, cluster, job, USERS[0], users[USERS[0]], "0=10G")


def test_killing_ones_own_mps_daemon_fails_nothing_but_the_job(cluster, slurm, users, outdir):
    kill = PROBE + '; kill -9 $P; sleep 1; echo killed'
    job = slurm.wait(sbatch_as(slurm, USERS[0], outdir, "-p", "pcie", "--gres=gpushare:mem=10G", wrap=kill))
    assert "killed" in job.output(), job.output()
    assert drained(slurm) == []
    (rec,) = record_of(cluster, job.id)
    assert rec["user"] == USERS[0]
    # the node still serves the next job of the same user
    again = sbatch_as(slurm, USERS[0], outdir, "-p", "pcie", "--gres=gpushare:mem=10G")
    check_mps_job(slurm, cluster, again, USERS[0], users[USERS[0]], "0=10G")
