"""Issue #12 items 7-8 with real unprivileged users: no local user reads another user's job files,
usage or accounting (the Prolog/Epilog and ingest run as root, as slurmd and an admin run them)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from slurm_gpushare.accounting.live import save_usage
from slurm_gpushare.accounting.record import UsageTracker
from slurm_gpushare.accounting.spool import Spool
from slurm_gpushare.accounting.store import Store
from slurm_gpushare.node.epilog import epilog
from slurm_gpushare.node.prolog import prolog
from slurm_gpushare_dev.cluster import SITE
from tests.accounting.test_record import record
from tests.test_hooks import GPUSHARE_AC, SHOW, node  # noqa: F401  (the fixture)

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("useradd") or not shutil.which("runuser"),
                                reason="needs root, useradd and runuser (two real users)")



def as_user(user: str, *argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run ``argv`` as ``user`` (``runuser``), capturing its output."""
    return subprocess.run([shutil.which("runuser") or "runuser", "-u", user, "--", *argv], capture_output=True,
                          text=True,
                          env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", **(env or {})})


def test_a_jobs_files_are_its_users_alone(node, users):  # noqa: F811
    """Alice's job: her TaskProlog still prints her env files; Bob reads none of them, nor the job's
    state.json, nor the monitor's usage file (which names her), nor lists the job's directory."""
    os.chmod(node.root, 0o755)
    assert as_user("gpushare-bob", "ls", str(node.root)).returncode == 0
    uid = users["gpushare-alice"]
    node.jobs["701"] = SHOW.format(job="701", node="a100", gres="gpu:a100:2", detail="gpu:a100:2(IDX:0,2)",
                                   ac=GPUSHARE_AC).replace("UserId=root(0) GroupId=root(0)",
                                                  f"UserId=gpushare-alice({uid}) GroupId=gpushare-alice({uid})")
    node.used["a100"] = "GresUsed=gpu:a100:2(IDX:0,2),shard:a100:0(IDX:N/A)"
    env = {"SLURM_JOB_ID": "701", "SLURMD_NODENAME": "a100", "SLURM_JOB_GPUS": "0,2",
           "CUDA_VISIBLE_DEVICES": "0,2", "SLURM_JOB_UID": str(uid), "SLURM_JOB_USER": "gpushare-alice"}
    assert prolog(node.ctx, env) == 0
    jd = node.ctx.job_dir("701")
    tracker = UsageTracker()
    tracker.add("701", 0, used_mib=100, sm_percent=5.0)
    usage = save_usage(node.ctx.run_dir, "701", "a100", tracker)
    script = node.root / "taskprolog.sh"
    script.write_text((SITE / "taskprolog.sh").read_text()
                      .replace('RUN_DIR="/run/slurm-gpushare"', f'RUN_DIR="{node.root}/run/{{node}}"'))
    # Slurm gave the task both GPUs (ConstrainDevices numbers them 0,1): the TaskProlog prints the ring
    task_env = {"SLURM_JOB_ID": "701", "SLURMD_NODENAME": "a100", "SLURM_LOCALID": "0", "SLURM_GTIDS": "0,1",
                "SLURM_STEP_ID": "0", "CUDA_VISIBLE_DEVICES": "0,1"}
    out = as_user("gpushare-alice", "sh", str(script), env=task_env)
    assert out.returncode == 0, out.stderr
    ring = (jd / "ring.2").read_text()
    assert out.stdout.startswith(ring) and "CUDA_VISIBLE_DEVICES=GPU-" in ring
    files = sorted(p for p in jd.iterdir() if p.is_file())
    assert {jd / "ring.2", jd / "task.2.0", jd / "state.json"} <= set(files)
    for path in (*files, usage):
        got = as_user("gpushare-bob", "cat", str(path))
        assert got.returncode != 0 and "Permission denied" in got.stderr, path
    assert as_user("gpushare-bob", "ls", str(jd)).returncode != 0
    assert as_user("gpushare-bob", "sh", str(script), env=task_env).stdout == ""
    assert epilog(node.ctx, env) == 0


@pytest.fixture
def public_dir():
    """A directory every user can pass through (pytest's tmp_path lies under a 0700 directory)."""
    d = Path(tempfile.mkdtemp(prefix="gps-sec-", dir="/tmp"))
    os.chmod(d, 0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_the_spool_and_the_accounting_database_are_roots_alone(public_dir, users):
    """What ingest and the Epilog create under umask 022: Bob opens neither the spool file nor the
    database (nor its -wal), and cannot list their directories."""
    tmp_path = public_dir
    assert as_user("gpushare-bob", "ls", str(tmp_path)).returncode == 0
    old = os.umask(0o022)
    try:
        spool_file = Spool(tmp_path / "spool", node="n1").append([record(user="gpushare-alice")])
        db = tmp_path / "lib" / "acct.db"
        with Store(db) as st:
            st.ingest(tmp_path / "spool")
            wal = db.with_name(db.name + "-wal")
            assert wal.exists()
            for path in (spool_file, db, wal):
                got = as_user("gpushare-bob", "cat", str(path))
                assert got.returncode != 0 and "Permission denied" in got.stderr, path
            for d in (spool_file.parent, db.parent):
                assert as_user("gpushare-bob", "ls", str(d)).returncode != 0
            read = as_user("gpushare-bob", "/usr/bin/python3", "-c",
                           f"import sqlite3; print(sqlite3.connect('file:{db}?mode=ro', uri=True)"
                           ".execute('select user from usage').fetchall())")
            assert read.returncode != 0 and "gpushare-alice" not in read.stdout
    finally:
        os.umask(old)
