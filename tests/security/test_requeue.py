"""A user's ``scontrol requeue`` of their own running gpushare job on the real dev cluster (issue #12, item 8):
each run is recorded (its own restart count, start and end) and the job report bills them. The user then brings
the requeued job's start forward (``scontrol update StartTime=now``, allowed to a job's owner): slurmd runs that
rerun without the Prolog (the job id is still in its credential cache), so it would run with no MPS daemon and
no limit; it never starts, and the run after it has its Prolog and its daemon (issue 26 N12)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from tests.conftest import DEADLINE, Job, slurm_epoch, spooled_records, wait_until
from tests.security.conftest import USERS, public_tmp
from tests.security.test_leftovers import node_log
from tests.security.test_node_records import drained

pytestmark = pytest.mark.slurm

CLI = [sys.executable, "-m", "slurm_gpushare"]
#: the first run waits to be requeued; a later one ends after 2 s; each prints its restart count, start and MPS
#: pipe directory
SCRIPT = ('echo "run=${SLURM_RESTART_COUNT:-0} t=$(date +%s) pipe=${CUDA_MPS_PIPE_DIRECTORY:-none}"; '
          'if [ "${SLURM_RESTART_COUNT:-0}" = 0 ]; then sleep 600; else sleep 2; fi')


def _records(cluster, job_id: str) -> list[dict]:
    return [r for r in spooled_records(cluster.accounting_spool) if str(r.get("job_id")) == job_id]


@pytest.fixture
def out_dir():
    """A directory the job's user can write its output in (pytest's tmp_path lies under a 0700 directory)."""
    with public_tmp("gps-requeue-", 0o1777) as d:
        yield d


def test_a_requeued_jobs_two_runs_are_both_recorded_and_reported(cluster, slurm, users, out_dir, tmp_path):  # noqa: F811, E501
    out = out_dir / "job.out"
    proc = subprocess.run(["runuser", "-u", USERS[0], "--", "sbatch", "--parsable", "-p", "pcie",
                           "--gres=gpushare:mem=4G", f"--output={out}", "--open-mode=append", "--wrap", SCRIPT],
                          env=cluster.env, capture_output=True, text=True, timeout=DEADLINE)
    assert proc.returncode == 0, proc.stderr
    job = Job(proc.stdout.strip().split(";")[0], output_path=out)
    slurm.submitted.append(job.id)
    submit0 = slurm.wait(job, states={"RUNNING"}).fields["SubmitTime"]  # run 0's (Job.fields change as it goes)
    wait_until(lambda: "run=0" in job.output(), f"job {job.id}'s first run started", describe=job.output)
    time.sleep(2)  # not a wait for an event: the first run is to last at least 2 s
    requeue = subprocess.run(["runuser", "-u", USERS[0], "--", "scontrol", "requeue", job.id], env=cluster.env,
                             capture_output=True, text=True)
    assert requeue.returncode == 0, requeue.stderr
    requeued_at = time.time()
    # Slurm makes a requeued job eligible 120 s later (measured); the admin (root) makes it eligible now
    slurm.wait(job, states={"PENDING"})
    # release it only once the first run's Epilog is done (its record is spooled): slurmd refuses to
    # launch a job whose previous run it is still killing ("already killed, do not launch batch job")
    wait_until(lambda: _records(cluster, job.id), f"the record of job {job.id}'s first run")
    # and only in a later second than the one slurmd revoked the first run's credential in (before that
    # Epilog): slurmd refuses a credential whose whole-second ctime is <= the revoke time ("Job credential
    # revoked", cred_revoked() in src/slurmd/slurmd/cred_context.c at slurm-24-11-5-1; seen on 24.11)
    seen = int(time.time())
    wait_until(lambda: int(time.time()) > seen, "the next second")
    forward = subprocess.run(["runuser", "-u", USERS[0], "--", "scontrol", "update", f"jobid={job.id}",
                              "StartTime=now"], env=cluster.env, capture_output=True, text=True)
    assert forward.returncode == 0, forward.stderr
    done = slurm.wait(job)
    assert done.state == "COMPLETED", done.fields
    lines = [dict(f.split("=", 1) for f in line.split()) for line in job.output().splitlines()
             if line.startswith("run=")]
    runs = {int(x["run"]): int(x["t"]) for x in lines}
    # every run whose script started had its MPS daemon; the rerun slurmd started without the Prolog (run 1)
    # did not start its script: it was requeued and run 2 ran
    assert all(x["pipe"] != "none" for x in lines), job.output()
    assert sorted(runs) in ([0, 1], [0, 2]), job.output()
    if sorted(runs) == [0, 2]:
        assert "started without its Prolog" in node_log(cluster, done.fields["NodeList"]), job.output()
    assert drained(slurm) == []

    # one record per run: run 1 too when slurmd started it without the Prolog (its task refused, seen in CI)
    last = max(runs)
    def every_run() -> list[dict] | None:
        r = _records(cluster, job.id)
        return r if {x["restart"] for x in r} >= set(range(last + 1)) else None

    recs = wait_until(every_run, f"the records of every run of job {job.id}",
                      describe=lambda: _records(cluster, job.id))
    by_run = {r["restart"]: r for r in recs}
    assert sorted(by_run) == list(range(last + 1)) and len(recs) == last + 1, recs
    assert all(r["user"] == USERS[0] for r in recs)
    first, final = by_run[0], by_run[last]
    # the runs before the last were requeued, as sacct says of them (issue 26 N13); the last ran to its end
    assert [by_run[i]["exit_state"] for i in range(last + 1)] == ["REQUEUED"] * last + ["COMPLETED"], recs
    assert first["start"] <= runs[0] and first["end"] >= requeued_at - 1 and first["end"] - first["start"] >= 2, first
    # Slurm's start is whole seconds, the scheduler's clock at the start of its pass: the next run may start
    # within the second of the requeue (26.05.5: requeued at 11:36:36.725, started 11:36:36)
    assert final["start"] >= int(requeued_at) and final["end"] - final["start"] >= 2, final
    db = tmp_path / "acct.db"
    ingest = subprocess.run([*CLI, "accounting", "ingest", "--spool", str(cluster.accounting_spool), "--db", str(db)],
                            capture_output=True, text=True)
    assert ingest.returncode == 0, ingest.stdout + ingest.stderr
    report = subprocess.run([*CLI, "report", "--db", str(db), "--format", "json", "--by", "job"], capture_output=True,
                            text=True)
    assert report.returncode == 0, report.stderr
    (row,) = [r for r in json.loads(report.stdout)["rows"] if str(r["job"]) == job.id]
    want = sum(r["end"] - r["start"] for r in recs) / 3600
    assert row["hours"] == pytest.approx(want, abs=1e-4) and row["gpus"] == 1, row

    # issue 26 item 6: each run's record carries slurmctld's submit time of that run (SubmitTime, which Slurm sets
    # anew on requeue), and jobstats shows the job's runs, back from the current one
    assert first["submit"] == slurm_epoch(submit0) and final["submit"] == slurm_epoch(done.fields["SubmitTime"]), recs
    assert final["submit"] > first["submit"] and final["submit"] >= int(requeued_at) - 1, recs
    stats = subprocess.run([*CLI, "jobstats", job.id, "--db", str(db), "--format", "json", "--policy",
                            str(cluster.policy_file), "--machines", str(cluster.root / "machines")], env=cluster.env,
                           capture_output=True, text=True)
    assert stats.returncode == 0, stats.stdout + stats.stderr
    assert sorted(d["restart"] for d in json.loads(stats.stdout)["devices"]) == list(range(last + 1)), stats.stdout
