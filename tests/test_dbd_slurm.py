"""The usage summary in Slurm's own accounting: a dev cluster with slurmdbd (``--dbd``: a private MariaDB
and slurmdbd) shows, through ``sacct``, what the node monitor wrote into a running job's AdminComment.

Measured on Slurm 22.05.8: slurmctld sends a job's AdminComment to slurmdbd only when the job ends
(while the job runs, ``sacct`` shows it empty, even the request audit written at submit), and what it
sends then is the value the job holds at that moment: the audit plus the monitor's last summary.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import sys
import time
from pathlib import Path

import pytest

from slurm_gpushare_dev.cluster import DEFAULT_NODES, DevCluster, packaged_machine
from tests.conftest import (
    FINAL_STATES,
    TEST_DIR,
    TEST_PORT,
    SlurmSession,
    _skip_or_fail,
    _slurm_unavailable,
    push_usage_summary,
    wait_until,
)

pytestmark = pytest.mark.slurm

CLI = [sys.executable, "-m", "slurm_gpushare"]
NODE = "rtx4090-pcie"
DBD_DIR = os.environ.get("GPUSHARE_TEST_DBD_DIR", f"{TEST_DIR}-dbd")
#: beside the session's cluster (TEST_PORT) and the hardware cluster of test_gres_slurm (+300)
DBD_PORT = TEST_PORT + 600
DBD_PROGRAMS = ("slurmdbd", "mariadbd", "mariadb-install-db", "mariadb", "sacct")


def _dbd_unavailable() -> str | None:
    reason = _slurm_unavailable()
    if reason:
        return reason
    missing = [p for p in DBD_PROGRAMS if shutil.which(p) is None]
    if missing:
        return (f"slurmdbd/MariaDB are not installed ({', '.join(missing)} missing): "
                "apt-get install slurmdbd mariadb-server (scripts/install-deps does)")
    return None


@pytest.fixture(scope="module")
def dbd() -> SlurmSession:
    """A one-node dev cluster with slurmdbd and MariaDB, in its own directory and on its own ports."""
    reason = _dbd_unavailable()
    if reason:
        _skip_or_fail(reason)
    c = DevCluster(Path(DBD_DIR), DBD_PORT, {NODE: packaged_machine(DEFAULT_NODES[NODE])}, dbd=True)
    started = not c.alive("slurmctld")
    c.up(out=open(os.devnull, "w"))
    session = SlurmSession(c, c.root / "test-output")
    yield session
    session.cancel_all()
    if started and os.environ.get("GPUSHARE_TEST_KEEP") != "1":
        c.down(out=open(os.devnull, "w"))
        shutil.rmtree(c.root, ignore_errors=True)  # its MariaDB too: the next session starts from job 1


def _sacct(slurm: SlurmSession, job_id: str) -> tuple[str, str]:
    """``(State, AdminComment)`` of the job's allocation (``-X``: a step row has no AdminComment of its own
    and sacct 22.05 sometimes prints unrelated text in that column for the ``.batch`` row)."""
    out = slurm.run(["sacct", "-j", job_id, "-X", "-n", "-P", "-o", "State,AdminComment"]).stdout.strip()
    state, _, admin_comment = out.partition("|") if out else ("", "", "")
    return state, admin_comment


def _sacct_until_recorded(slurm: SlurmSession, job_id: str) -> tuple[str, str]:
    """Poll sacct until slurmdbd has the job's end record (a final state and an AdminComment)."""
    row = ("", "")

    def recorded() -> bool:
        nonlocal row
        row = _sacct(slurm, job_id)
        return row[0].split(" ")[0] in FINAL_STATES and bool(row[1])

    wait_until(recorded, f"sacct's end record with an AdminComment for job {job_id}",
               describe=lambda: f"State={row[0]!r} AdminComment={row[1]!r}")
    return row


def test_sacct_shows_the_usage_summary_the_monitor_wrote_while_the_job_ran(dbd, tmp_path):
    c = dbd.cluster
    app = shlex.quote(str(c.fake_gpu_app))
    # the app runs until the test has checked the running job (the file ``go`` appears), then the job ends
    go = c.root / "test-output" / f"go-{time.monotonic_ns()}"
    job = dbd.sbatch("--gres=gpushare:mem=10G", wrap=f"{app} --mem 3G --sm 30 --seconds 600 & "
                                                     f"until [ -e {go} ]; do sleep 0.2; done; kill $!; wait")
    dbd.wait(job, states={"RUNNING"})
    # the SM mean depends on when the samples fell (one taken as the app starts lowers it); the peaks do not
    want = re.compile(rf"\[gpushare-usage:v1 node={NODE} mode=mps gpus=1 peak=3072/10240MiB sm=[0-9.]+/30\.0\]$")
    fields = push_usage_summary(c, dbd, job.id, NODE, tmp_path, want)
    assert fields["JobState"] == "RUNNING" and want.search(fields.get("AdminComment", "")), fields
    # slurmdbd has only the job's start record (which reaches it a moment after slurmctld starts the job):
    # no AdminComment yet, not even the audit from submit
    def started_in_sacct() -> bool:
        row = _sacct(dbd, job.id)
        assert row[1] == "", f"sacct shows an AdminComment before the job ends: {row}"
        return row[0] == "RUNNING"

    wait_until(started_in_sacct, f"sacct showing job {job.id} RUNNING")
    assert _sacct(dbd, job.id) == ("RUNNING", ""), "sacct while the job runs"

    go.touch()
    done = dbd.wait(job)  # ends by itself (COMPLETED), as a real job would
    assert done.state == "COMPLETED", done.fields
    state, ac = _sacct_until_recorded(dbd, job.id)
    assert state == "COMPLETED"
    # exactly what slurmctld held when the job ended: the request audit written at submit, then the summary
    assert ac == done.fields["AdminComment"].strip(), (ac, done.fields["AdminComment"])
    assert re.match(r"\[gpushare:v1 req=mem=10G grant=gres[:/]shard:10 kind=mps ", ac) and want.search(ac), ac


def test_mariadb_root_needs_the_random_password_kept_in_the_cluster_dir(dbd):
    """mariadb-install-db leaves MariaDB's root without a password: any local user could rewrite Slurm's
    accounting. The dev cluster gives root (and slurmdbd's user) a random password, kept 0600."""
    import subprocess
    r = dbd.cluster.root
    sock = r / "db" / "mysqld.sock"
    no_password = subprocess.run(["mariadb", "--no-defaults", "-S", str(sock), "-uroot", "-e", "select 1"],
                                 capture_output=True, text=True)
    assert no_password.returncode != 0 and "Access denied" in no_password.stderr
    tcp = subprocess.run(["mariadb", "--no-defaults", "-h127.0.0.1", f"-P{DBD_PORT + 3}", "-uroot", "-e",
                          "select 1"], capture_output=True, text=True)
    assert tcp.returncode != 0
    for name in ("root", "slurm"):
        assert (r / "db" / f"{name}.password").stat().st_mode & 0o077 == 0
    assert (r / "db").stat().st_mode & 0o077 == 0
    password = (r / "db" / "root.password").read_text().strip()
    ok = subprocess.run(["mariadb", "--no-defaults", "-S", str(sock), "-uroot", f"-p{password}", "-e", "select 1"],
                        capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    conf = (r / "etc" / "slurmdbd.conf").read_text()
    assert "StoragePass=gpushare-dev" not in conf
    assert f"StoragePass={(r / 'db' / 'slurm.password').read_text().strip()}" in conf
