"""The usage summary in Slurm's own accounting: a dev cluster with slurmdbd (``--dbd``: a private MariaDB
and slurmdbd) shows, through ``sacct``, what the node monitor wrote into a running job's AdminComment.

Measured on Slurm 22.05.8: slurmctld sends a job's AdminComment to slurmdbd only when the job ends
(while the job runs, ``sacct`` shows it empty, even the request audit written at submit), and what it
sends then is the value the job holds at that moment: the audit plus the monitor's last summary.
"""

from __future__ import annotations

import base64
import gzip
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from datetime import datetime
from pathlib import Path

import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from slurm_gpushare.slurm.release import SACCTMGR_KEEPS_CASE, Release
from slurm_gpushare_dev.cluster import DEFAULT_NODES, DevCluster, packaged_machine
from tests.conftest import (
    DEADLINE,
    FINAL_STATES,
    TEST_DIR,
    TEST_PORT,
    Job,
    SlurmSession,
    _skip_or_fail,
    _slurm_unavailable,
    add_user,
    push_usage_summary,
    spooled_lines,
    throwaway_users,
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


def dbd_session(root: Path, port: int, nodes: list[str], **settings):
    """A module fixture's body: a dev cluster of ``nodes`` with slurmdbd and MariaDB in ``root`` on ``port``
    (``settings``: more :class:`DevCluster` fields), up for the module and its session yielded; brought down
    and removed after, MariaDB included (the next session starts from job 1), when this call started it."""
    reason = _dbd_unavailable()
    if reason:
        _skip_or_fail(reason)
    c = DevCluster(root, port, {n: packaged_machine(DEFAULT_NODES[n]) for n in nodes}, dbd=True, **settings)
    started = not c.alive("slurmctld")
    c.up(out=open(os.devnull, "w"))
    session = SlurmSession(c, c.root / "test-output")
    yield session
    session.cancel_all()
    if started and os.environ.get("GPUSHARE_TEST_KEEP") != "1":
        c.down(out=open(os.devnull, "w"))
        shutil.rmtree(c.root, ignore_errors=True)


#: The module cluster's partitions whose MPS share jobs over their share get another action than "kill"
#: (node.toml ``[enforce_partitions]``); the other tests use the default partition.
ENFORCE_PARTITIONS = {"warnp": "warn", "requeuep": "requeue"}
#: A QOS whose jobs' MPS clients run below normal priority (node.toml ``low_priority_qos``).
LOW_QOS = "preemptible"


@pytest.fixture(scope="module")
def dbd() -> SlurmSession:
    """A one-node dev cluster with slurmdbd and MariaDB, in its own directory and on its own ports; its node in two
    more partitions of their own enforcement (:data:`ENFORCE_PARTITIONS`)."""
    yield from dbd_session(Path(DBD_DIR), DBD_PORT, [NODE],
                           extra_conf=tuple(f"PartitionName={p} Nodes={NODE}" for p in ENFORCE_PARTITIONS),
                           node_conf=(f"low_priority_qos = [{LOW_QOS!r}]", "[enforce_partitions]",
                                      *(f'{p} = "{a}"' for p, a in ENFORCE_PARTITIONS.items())))


def _sacct(slurm: SlurmSession, job_id: str) -> tuple[str, str]:
    """``(State, AdminComment)`` of the job's allocation (``-X``: a step row has no AdminComment of its own
    and sacct 22.05 sometimes prints unrelated text in that column for the ``.batch`` row). Of several jobs of
    that id (``-D``: slurmctld restarted without its state within the module while slurmdbd kept the older
    job), the one submitted last: the test's own."""
    out = slurm.run(["sacct", "-j", job_id, "-X", "-D", "-n", "-P", "-o", "Submit,State,AdminComment"]).stdout
    rows = [line.split("|", 2) for line in out.splitlines() if line.count("|") >= 2]
    if not rows:
        return "", ""
    _, state, admin_comment = max(rows, key=lambda r: r[0])
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


def _sacct_until_segment(slurm: SlurmSession, job_id: str) -> str:
    """Poll sacct until the job's AdminComment holds the final usage segment (EpilogSlurmctld wrote it)."""
    row = ("", "")

    def written() -> bool:
        nonlocal row
        row = _sacct(slurm, job_id)
        return "[gpushare:u1 " in row[1]

    wait_until(written, f"the [gpushare:u1 ...] segment in sacct's AdminComment of job {job_id}",
               describe=lambda: f"State={row[0]!r} AdminComment={row[1]!r}")
    return row[1]


def _case(c: DevCluster, admin_comment: str) -> int:
    """``re`` flags for matching what sacctmgr stored: before Slurm 23.02 it lowercases the whole field
    (SACCTMGR_KEEPS_CASE), which the test then checks."""
    if Release.parse(c.slurm_release or "") >= SACCTMGR_KEEPS_CASE:
        return 0
    assert admin_comment == admin_comment.lower(), admin_comment
    return re.IGNORECASE


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
    # the node's own monitor (not the --once writer above) must have sampled the app before the job ends: the
    # final segment is built from its usage file (a job that ends first, under a second here, records 0 MiB)
    _wait_measured(c, job.id, 3 << 30, 0.3)

    go.touch()
    done = dbd.wait(job)  # ends by itself (COMPLETED), as a real job would
    assert done.state == "COMPLETED", done.fields
    state, ac = _sacct_until_recorded(dbd, job.id)
    assert state == "COMPLETED"
    # slurmctld's end record holds what the job held (the audit, then the monitor's summary); then the
    # EpilogSlurmctld step replaces the running summary with the final usage segment
    ac = _sacct_until_segment(dbd, job.id)
    flags = _case(dbd.cluster, ac)
    assert re.match(r"\[gpushare:v1 req=mem=10G grant=gres[:/]shard:10 kind=mps ", ac, flags), ac
    audit = done.fields["AdminComment"].strip().split(" [gpushare-usage:")[0]
    assert ac.startswith(audit if not flags else audit.lower()), ac
    assert "gpushare-usage" not in ac and re.search(r" \[gpushare:u1 run=0 node=rtx4090-pcie t=\d+\+\d+ "
                                                   r"exit=COMPLETED/0:0 gpu=\d+/rtx4090/\d+/mps/shard:10/10240/-/10240/"
                                                   r"3072/[0-9.]+/30\.0/\d+\]$", ac, flags), ac


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


#: What the jobstats-like step stores: the JSON that jobstats' JS1: segment holds for a GPU job (jobstats.py
#: reads ``t["nodes"]``).
JOBSTATS_INFO = {"gpus": 1, "nodes": {NODE: {"cpus": 1, "gpu_total_memory": {"0": 25757220864},
                                             "gpu_used_memory": {"0": 3221225472}, "gpu_utilization": {"0": 30.0},
                                             "total_memory": 104857600, "total_time": 2.5, "used_memory": 1048576}},
                 "total_time": 3}


def _jobstats_like_step(c: DevCluster) -> str:
    """A slurmctld epilog step that writes AdminComment the way Princeton jobstats' slurm/slurmctldepilog.sh does:
    once slurmdbd has the job (jobstats sleeps 5 s; this polls sacct), ``sacctmgr -i update job where
    jobid=ID set AdminComment=JS1:<base64 of gzipped JSON>``, replacing the whole field."""
    encode = ("import base64, gzip, json, sys; print(base64.b64encode(gzip.compress(json.dumps("
              "json.loads(sys.argv[1]), sort_keys=True, indent=4).encode())).decode())")
    return (
        "#!/bin/sh\n"
        f"SLURM_CONF={c.slurm_conf}\nexport SLURM_CONF\n"
        f"STATS=$({shlex.quote(sys.executable)} -c {shlex.quote(encode)} {shlex.quote(json.dumps(JOBSTATS_INFO))})\n"
        "i=0\n"
        "while [ $i -lt 1200 ]; do\n"
        '  case "$(sacct -X -n -P -j "$SLURM_JOB_ID" -o State | tail -n 1)" in\n'
        "    COMPLETED*|FAILED*|CANCELLED*|TIMEOUT*|OUT_OF_MEMORY*) break ;;\n"
        "  esac\n"
        "  sleep 0.1; i=$((i + 1))\n"
        "done\n"
        'sacctmgr -i update job where jobid="$SLURM_JOB_ID" set AdminComment="JS1:$STATS"\n')


def _wait_measured(c: DevCluster, job_id: str, mem_bytes: int, sm_ratio: float) -> None:
    """Wait until the node's monitor has measured the job's app (its peak memory and its SM utilization now),
    so that the record holds them when the job ends."""
    seen: dict[str, float] = {}

    def measured() -> bool:
        with urllib.request.urlopen(c.monitor_url(NODE), timeout=DEADLINE) as r:
            text = r.read().decode()
        seen.clear()
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                if s.labels.get("hpc_job") == job_id:
                    seen[s.name] = s.value
        return (seen.get("gpushare_job_gpu_memory_peak_bytes") == mem_bytes
                and seen.get("gpushare_job_gpu_sm_utilization_ratio") == sm_ratio)

    wait_until(measured, f"the monitor measuring job {job_id}'s app", describe=lambda: seen)


def _jobstats_reads(admin_comment: str) -> dict:
    """What jobstats.py does with the field: ``startswith('JS1:')``, then
    ``json.loads(gzip.decompress(base64.b64decode(data[4:])))``."""
    assert admin_comment.startswith("JS1:"), admin_comment
    return json.loads(gzip.decompress(base64.b64decode(admin_comment[4:])))


@pytest.fixture
def user(dbd):
    """A throwaway unprivileged user (created for the test, removed after) and a world-writable output dir."""
    if os.geteuid() != 0:
        pytest.skip("creating users needs root")
    name = f"gpsd{uuid.uuid4().hex[:6]}"
    add_user(name)
    out = dbd.cluster.root / "test-output" / name
    out.mkdir(parents=True, exist_ok=True)
    os.chmod(out, 0o1777)
    yield name, out
    subprocess.run(["userdel", name], capture_output=True)


def _as(c: DevCluster, user: str, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(["runuser", "-u", user, "--", "env", f"SLURM_CONF={c.slurm_conf}", *argv],
                          capture_output=True, text=True, timeout=DEADLINE)


def _report(*args: str, env: dict[str, str]) -> str:
    out = subprocess.run([*CLI, "report", *args], capture_output=True, text=True, env=env, timeout=DEADLINE)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def test_final_segment_sits_beside_jobstats_and_report_from_sacct_equals_the_store(dbd, user, tmp_path):
    c = dbd.cluster
    name, out = user
    step = c.epilog_slurmctld_dir / "10-jobstats-like"
    step.write_text(_jobstats_like_step(c))
    step.chmod(0o755)
    try:
        # the user's own job, with a forged usage segment in the Comment (which the user may write)
        forged = ("[gpushare:u1 run=0 node=rtx4090-pcie t=1+1 exit=COMPLETED/0:0 "
                  "gpu=0/rtx4090/1/gpu/-/-/-/1/1/1.0/1.0/1]")
        go = out / "go"
        app = shlex.quote(str(c.fake_gpu_app))
        sub = _as(c, name, "sbatch", "--parsable", f"--output={out}/job-%j.out", "--gres=gpushare:mem=10G",
                  f"--comment={forged}", "--wrap",
                  f"{app} --mem 3G --sm 30 --seconds 600 & until [ -e {go} ]; do sleep 0.2; done; kill $!; wait")
        assert sub.returncode == 0, sub.stderr
        job = Job(sub.stdout.strip().split(";")[0])
        dbd.submitted.append(job.id)
        dbd.wait(job, states={"RUNNING"})
        # AdminComment is not the user's to write: slurmctld refuses (job_mgr.c: validate_super_user)
        tried = _as(c, name, "scontrol", "update", f"jobid={job.id}", f"AdminComment={forged}")
        assert tried.returncode != 0 and "denied" in (tried.stdout + tried.stderr).lower(), tried
        _wait_measured(c, job.id, 3 << 30, 0.3)
        go.touch()
        done = dbd.wait(job)
        assert done.state == "COMPLETED", done.fields
        ac = _sacct_until_segment(dbd, job.id)
        flags = _case(c, ac)
        # jobstats' segment first and still readable by jobstats, the audit kept, our segment last (before
        # 23.02 the jobstats-like step's own sacctmgr write lowercased its base64: nothing reads it then)
        if flags:
            assert ac.startswith("js1:"), ac
        else:
            assert _jobstats_reads(ac.split(" ", 1)[0]) == JOBSTATS_INFO, ac
            if sys.version_info < (3, 13):  # Python's lenient base64 stops at the padding (3.11; 3.13 reads on)
                assert _jobstats_reads(ac) == JOBSTATS_INFO, ac
        assert re.search(r" \[gpushare:v1 req=mem=10G grant=gres[:/]shard:10 kind=mps [^\]]*\] \[gpushare:u1 run=0 "
                         r"node=rtx4090-pcie t=\d+\+\d+ exit=COMPLETED/0:0 gpu=\d+/rtx4090/\d+/mps/shard:10/10240/-/"
                         r"10240/3072/[0-9.]+/30\.0/\d+\]$", ac, flags), ac
        # nor is slurmdbd's copy the user's to write (as_mysql_modify_job: Operator or more)
        tried = _as(c, name, "sacctmgr", "-i", "modify", "job", "where", f"jobid={job.id}", "set",
                    f"AdminComment={forged}")
        assert tried.returncode != 0 or "denied" in (tried.stdout + tried.stderr).lower(), tried
        assert _sacct(dbd, job.id)[1] == ac
    finally:
        step.unlink()

    # Slurm 22.05 was seen (twice in CI, cause not found) recording uid 0 for a throwaway user's job in slurmdbd
    # while slurmctld held it as the user's: the report from sacct then names root, as sacct does
    uids = dbd.run(["sacct", "-j", job.id, "-X", "-n", "-P", "-o", "UID"], check=False).stdout.split()
    if uids == ["0"]:
        pytest.xfail(f"slurmdbd recorded uid 0 for {name}'s job {job.id} (Slurm's data; see docs/accounting.md)")
    # the store: this job's records from the nodes' spool, ingested
    spool = tmp_path / "spool"
    spool.mkdir()
    lines = [ln for ln in spooled_lines(c.accounting_spool) if json.loads(ln)["job_id"] == job.id]
    assert len(lines) == 1, lines
    (spool / f"{NODE}.jsonl").write_text("\n".join(lines) + "\n")
    db = tmp_path / "acct.db"
    ingest = subprocess.run([*CLI, "accounting", "ingest", "--spool", str(spool), "--db", str(db)],
                            capture_output=True, text=True, timeout=DEADLINE)
    assert ingest.returncode == 0, ingest.stderr
    env = c.env
    for view in (["--by", "user"], ["--by", "job"], ["--by", "node"], ["--by", "mode"], ["--waste"]):
        for fmt in ("json", "csv", "table"):
            from_store = _report("--db", str(db), *view, "--format", fmt, env=env)
            from_sacct = _report("--from-sacct", *view, "--format", fmt, "-j", job.id, env=env)
            assert from_sacct == from_store, (view, fmt)
    rows = json.loads(_report("--from-sacct", "--by", "job", "--format", "json", "-j", job.id, env=env))["rows"]
    assert [(r["job"], r["user"], r["mode"], r["share"], r["mem_asked_mib"], r["mem_peak_mib"], r["sm_peak_pct"])
            for r in rows] == [(job.id, name, "mps", "shard:10", 10240, 3072, 30.0)]


@pytest.fixture
def two_users(dbd):
    """Two throwaway unprivileged users (created for the test, removed after) and a world-writable output dir."""
    yield from throwaway_users(dbd.cluster.root)


def _jobstats_as(c: DevCluster, user: str, job_id: str, *args: str) -> subprocess.CompletedProcess:
    """``slurm-gpushare jobstats`` as ``user``, from the cluster's world-readable copy of the package (a user
    cannot reach the project's venv), with the cluster's policy and machine descriptions as a site's
    /etc/slurm/gpushare would hold them."""
    from slurm_gpushare_dev.cluster import job_python

    return _as(c, user, f"PYTHONPATH={c.lib_dir}", job_python(), "-s", "-m", "slurm_gpushare", "jobstats", job_id,
               "--policy", str(c.policy_file), "--machines", str(c.root / "machines"), *args)


def _run_as(dbd: SlurmSession, user: str, out: Path, gres: str, wrap: str) -> Job:
    c = dbd.cluster
    sub = _as(c, user, "sbatch", "--parsable", f"--output={out}/job-%j.out", f"--gres={gres}", "--wrap", wrap)
    assert sub.returncode == 0, sub.stderr
    job = Job(sub.stdout.strip().split(";")[0])
    dbd.submitted.append(job.id)
    return job


def test_jobstats_shows_a_users_own_job_refuses_anothers_and_its_suggestion_runs(dbd, two_users, tmp_path):
    c = dbd.cluster
    (alice, bob), out = two_users
    app = shlex.quote(str(c.fake_gpu_app))
    go = out / "go"
    job = _run_as(dbd, alice, out, "gpushare:mem=10G",
                  f"{app} --mem 3G --sm 30 --seconds 600 & until [ -e {go} ]; do sleep 0.2; done; kill $!; wait")
    dbd.wait(job, states={"RUNNING"})
    _wait_measured(c, job.id, 3 << 30, 0.3)
    go.touch()
    assert dbd.wait(job).state == "COMPLETED"
    _sacct_until_segment(dbd, job.id)
    # a store the user may not read (root's, 0600): jobstats reads Slurm's accounting instead
    db = tmp_path / "acct.db"
    subprocess.run([*CLI, "accounting", "ingest", "--spool", str(c.accounting_spool), "--db", str(db)],
                   check=True, capture_output=True, timeout=DEADLINE)

    own = _jobstats_as(c, alice, job.id, "--db", str(db))
    # what slurmdbd recorded of the job, and who alice is, to read a failure by (seen once on 22.05 in CI: "job 3 is
    # another user's" for alice's own job; not reproduced in 5 runs since)
    recorded = dbd.run(["sacct", "-X", "-D", "-n", "-P", "-o", "JobIDRaw,UID,User,Submit,State", "-j", job.id],
                       check=False).stdout
    print("sacct JobIDRaw|UID|User|Submit|State of the job:", recorded, sep="\n")  # shown whole on a failure
    assert own.returncode == 0, (own.stdout + own.stderr, recorded, subprocess.run(
        ["id", alice], capture_output=True, text=True).stdout, dbd.show_job(job.id).get("UserId"))
    text = own.stdout
    assert text.startswith(f"job {job.id}  user {alice}  account ") and "(from the job AdminComment in sacct)" in text
    # the header Princeton's jobstats prints, from sacct: name, state, what was allocated, start, run time, limit;
    # where slurmdbd holds the job as a row without its start record (seen on 22.05 in CI: uid 0, name
    # "allocation", QOS Unknown), the header says so and shows none of that row's name, QOS or limit
    started = r"^  started \d{4}-\d\d-\d\d \d\d:\d\d:\d\d  ran \d+ s"
    if recorded.split("|")[1:2] == ["0"]:
        assert re.search(r"^  name -  state COMPLETED  nodes 1  cores [1-9]\d*  CPU memory \S+  GPUs \d+  QOS -$",
                         text, re.M), text
        assert re.search(started + "$", text, re.M) and "names another user than slurmctld" in text, text
    else:
        assert re.search(r"^  name wrap  state COMPLETED  nodes 1  cores [1-9]\d*  CPU memory \S+  GPUs \d+  "
                         r"QOS \S+$", text, re.M), text
        assert re.search(started + r" (of a .+ limit \(\d+% of it\)|no time limit)$", text, re.M), text
    assert re.search(r"^rtx4090-pcie GPU \d+  rtx4090 \(24G\)  mps shard:10  .* COMPLETED 0:0", text, re.M), text
    bar = "[█▉▊▋▌▍▎▏]+"
    assert re.search(rf"^  asked    {bar}  10G$", text, re.M) and re.search(rf"^  granted  {bar}  10G$", text, re.M)
    assert re.search(rf"^  peak     {bar} +3G \(30% of what it asked\)$", text, re.M), text
    # the mean is over the monitor's samples, one of which may precede the app's first step
    assert re.search(rf"^  SM mean  {bar} +(30|[12]?[0-9])%, peak 30%$", text, re.M), text
    # 3 GiB x 1.2 (the policy's headroom) = 3687 MiB -> 4 GiB (1 GiB shard units on a 24 GiB GPU)
    assert "next time: --gres=gpushare:mem=4G   (" in text, text
    data = json.loads(_jobstats_as(c, alice, job.id, "--format", "json").stdout)
    assert (data["source"], data["suggestion"]["request"]) == ("sacct", "gpushare:mem=4G")
    assert (data["slurm"]["name"], data["slurm"]["state"], data["slurm"]["nodes"]) == ("wrap", "COMPLETED", 1)
    # sacct's own figures (the job may take less than a second: on 24.11 it did, ElapsedRaw 0)
    raw = subprocess.run(["sacct", "-X", "-n", "-P", "-j", job.id, "-o", "Start,ElapsedRaw"],
                         env={**c.env, "SLURM_TIME_FORMAT": "%s"}, capture_output=True, text=True).stdout.split()
    assert [f"{data['slurm']['start']}|{data['slurm']['elapsed_s']}"] == raw, (data["slurm"], raw)

    # another user's job: refused before anything of it is read, also with the store named
    other = _jobstats_as(c, bob, job.id, "--db", str(db))
    assert other.returncode == 2, other
    assert f"job {job.id} is another user's: jobstats shows your own jobs only" in other.stderr, other.stderr
    assert "peak" not in other.stdout and alice not in other.stdout + other.stderr
    # root (an administrator) sees it, from the store it may read
    admin = subprocess.run([*CLI, "jobstats", job.id, "--db", str(db), "--policy", str(c.policy_file),
                            "--machines", str(c.root / "machines")], capture_output=True, text=True, env=c.env,
                           timeout=DEADLINE)
    assert admin.returncode == 0 and "(from the accounting database)" in admin.stdout, admin.stdout + admin.stderr
    assert "next time: --gres=gpushare:mem=4G" in admin.stdout

    # the suggestion, resubmitted, runs under its MPS limit; less than the peak would not
    again = _run_as(dbd, alice, out, data["suggestion"]["request"], f"{app} --mem 3G --sm 30 --seconds 3")
    short = _run_as(dbd, alice, out, "gpushare:mem=2G", f"{app} --mem 3G --sm 30 --seconds 3")
    done, failed = dbd.wait(again), dbd.wait(short)
    log = (out / f"job-{again.id}.out").read_text()
    assert done.state == "COMPLETED" and "out of memory" not in log, (done.fields, log)
    assert failed.state == "FAILED", failed.fields
    assert "out of memory (MPS pinned device memory limit 2G)" in (out / f"job-{short.id}.out").read_text()
    _sacct_until_segment(dbd, again.id)
    rerun = _jobstats_as(c, alice, again.id)
    assert rerun.returncode == 0 and "mps shard:4" in rerun.stdout, rerun.stdout + rerun.stderr


def _summaries_running(root: Path) -> list[str]:
    """Command lines of the ``accounting sacct-summary`` processes of the cluster in ``root`` (its spool on their
    command line: another session's cluster on the same host is not counted) now on this host
    (EpilogSlurmctld's Python)."""
    found = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if "sacct-summary" in cmd and "python" in cmd.lower() and str(root) in cmd:
            found.append(cmd)
    return found


def test_a_job_of_a_low_priority_qos_gets_the_mps_client_priority_and_one_of_normal_does_not(dbd):
    """node.toml low_priority_qos (issue 30 item 5): the QOS as slurmctld holds it (sacctmgr's, so only with
    slurmdbd) gives a share job's tasks CUDA_MPS_CLIENT_PRIORITY=1; a job of the default QOS gets none."""
    dbd.run(["sacctmgr", "-i", "add", "qos", LOW_QOS], check=False)  # already there on a rerun: fine
    submitted: list = []

    def accepted() -> bool:  # slurmctld learns of the new QOS from slurmdbd a moment later
        job = dbd.sbatch(f"--qos={LOW_QOS}", "--gres=gpushare:mem=4G", wrap="env", check=False)
        if isinstance(job, Job):
            submitted.append(job)
        return bool(submitted)

    wait_until(accepted, f"sbatch --qos={LOW_QOS} accepted")
    plain = dbd.sbatch("--gres=gpushare:mem=4G", wrap="env")
    low = submitted[0]
    assert dbd.show_job(low.id).get("QOS") == LOW_QOS
    for job, wanted in ((low, True), (plain, False)):
        done = dbd.wait(job)
        assert done.state == "COMPLETED", done.fields
        out = done.output()
        assert ("CUDA_MPS_CLIENT_PRIORITY=1" in out) is wanted, (job.id, out)
        assert "CUDA_MPS_PIPE_DIRECTORY=" in out, out  # both are MPS shares


def test_a_plain_job_costs_the_controller_no_python_and_its_successor_starts_at_once(dbd):
    """A job that holds no GPU: its EpilogSlurmctld ends in the shell (no run marked in the spool's runs/), so
    the job leaves COMPLETING as in plain Slurm and a '-d afterok' successor starts within seconds (it waited
    the whole 120 s deadline of the summary for records such a job never writes)."""
    first = dbd.sbatch(wrap="true")
    second = dbd.sbatch(f"--dependency=afterok:{first.id}", wrap="true")
    seen: list[str] = []

    def ended() -> bool:
        seen.extend(_summaries_running(dbd.cluster.root))
        return dbd.show_job(second.id).get("JobState") in FINAL_STATES

    wait_until(ended, f"job {second.id} (after {first.id}) ending", timeout=60)
    assert seen == [], seen
    end = dbd.show_job(first.id)["EndTime"]
    start = dbd.show_job(second.id)["StartTime"]
    delay = (datetime.fromisoformat(start) - datetime.fromisoformat(end)).total_seconds()
    assert delay <= 5, (end, start)


def _summary_processes(queue: Path) -> list[str]:
    """Command lines of the Python processes of this cluster's controller summary (``accounting sacct-summary``
    or ``accounting sacct-worker`` naming its ``queue``; another cluster's on the same host, a second test
    session's, is not counted) now on this host. A worker starting with ``--detach`` forks and its parent
    exits: for that moment the two are one worker (the child is not counted beside its parent; seen on 24.11)."""
    found = {}
    for p in psutil.process_iter(["cmdline", "ppid"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if ("sacct-summary" in cmd or "sacct-worker" in cmd) and "python" in cmd.lower() and str(queue) in cmd:
            found[p.pid] = (p.info["ppid"], cmd)
    return [cmd for ppid, cmd in found.values() if ppid not in found]


def test_an_array_of_gpu_jobs_costs_the_controller_one_worker_and_every_task_gets_its_segment(dbd):
    """30 GPU tasks ending together: their EpilogSlurmctld only queues each run (plain sh); one long-lived
    worker (``accounting sacct-worker``, single by its lock) writes every task's segment, so at most one
    summary process is ever on the controller host (there was one per ended job, each waiting for records)."""
    job = dbd.sbatch("--array=0-29", "--gres=gpu:1", wrap="true")
    most: list[str] = []

    def all_written() -> bool:
        now = _summary_processes(dbd.cluster.sacct_queue)
        if len(now) > len(most):
            most[:] = now
        out = dbd.run(["sacct", "-j", job.id, "-X", "-n", "-P", "-o", "JobID,State,AdminComment"]).stdout
        rows = [line.split("|", 2) for line in out.splitlines() if line.count("|") >= 2]
        return len(rows) == 30 and all("[gpushare:u1 " in r[2] for r in rows)

    log = dbd.cluster.sacct_queue / "worker.log"
    wait_until(all_written, f"the [gpushare:u1 ...] segment of all 30 tasks of array {job.id}", timeout=240,
               describe=lambda: log.read_text()[-2000:] if log.exists() else "no worker log")
    assert len(most) <= 1, most


def test_product_off_runs_no_epilog_slurmctld_and_on_again_writes_the_segment(dbd):
    """The plain-Slurm side of benchmarks/plain_jobs is plain: with the product's lines off no EpilogSlurmctld
    runs at a job's end. Slurm 22.05's scontrol reconfigure does not take an added or removed EpilogSlurmctld
    (prep/script decides at its init whether one is configured: have_epilog_slurmctld in
    src/plugins/prep/script/prep_script.c at slurm-22-05-8-1), so with the line removed slurmctld still ran one
    (exit 127, logged), and with it added to a slurmctld started without it, none; from 23.11 reconfigure
    restarts slurmctld. Back on, a GPU job's usage segment is written again."""
    c = dbd.cluster
    log = c.root / "log" / "slurmctld.log"
    try:
        c.set_product(False)
        plain = dbd.sbatch("--gres=gpu:1", wrap="true")
        assert dbd.wait(plain).state == "COMPLETED"
        time.sleep(1)  # slurmscriptd logs a script's exit after the job's end
        ran = [ln for ln in log.read_text(errors="replace").splitlines()
               if f"JobId={plain.id} EpilogSlurmctld" in ln]
        assert ran == [], ran
    finally:
        c.set_product(True)
    job = dbd.sbatch("--gres=gpu:1", wrap="true")
    assert dbd.wait(job).state == "COMPLETED"
    assert "[gpushare:u1 " in _sacct_until_segment(dbd, job.id)


def test_jobstats_names_a_running_job_a_cpu_job_and_an_array_task_as_slurm_does(dbd, two_users):
    """jobstats for any job a user can name (issue 31 item 1): a running job is told its records come when it
    ends (it said "no GPU usage records (a job without GPUs has none ...)"), a job without GPUs that it held none,
    and an array task is read by the name squeue and sacct give it (``10_2``; it was refused as no job id)."""
    c = dbd.cluster
    (alice, _bob), out = two_users
    running = _run_as(dbd, alice, out, "gpushare:mem=10G", "sleep 600")
    dbd.wait(running, states={"RUNNING"})
    r = _jobstats_as(c, alice, running.id)
    assert r.returncode == 2 and f"job {running.id} is RUNNING: its GPU usage records are written when it ends" \
        in r.stdout + r.stderr, r.stdout + r.stderr
    dbd.run(["scancel", running.id])
    sub = _as(c, alice, "sbatch", "--parsable", f"--output={out}/cpu-%j.out", "--wrap", "true")
    cpu = Job(sub.stdout.strip().split(";")[0])
    dbd.submitted.append(cpu.id)
    assert dbd.wait(cpu).state == "COMPLETED"
    r = _jobstats_as(c, alice, cpu.id)
    assert r.returncode == 2 and f"job {cpu.id} held no GPU" in r.stdout + r.stderr, r.stdout + r.stderr
    sub = _as(c, alice, "sbatch", "--parsable", f"--output={out}/arr-%A_%a.out", "--array=0-1",
              "--gres=gpushare:mem=4G", "--wrap", "true")
    array = sub.stdout.strip().split(";")[0]
    dbd.submitted.append(array)
    rows: list[list[str]] = []

    def ended() -> bool:  # both tasks ended with their usage segments (sacct -j ARRAY lists both)
        text = dbd.run(["sacct", "-j", array, "-X", "-n", "-P", "-o", "JobID,JobIDRaw,State,AdminComment"]).stdout
        rows[:] = [ln.split("|", 3) for ln in text.splitlines() if ln.count("|") >= 3]
        return len(rows) == 2 and all(r[2] == "COMPLETED" and "[gpushare:u1 " in r[3] for r in rows)

    wait_until(ended, f"both tasks of array {array} completed with their segments", timeout=180,
               describe=lambda: str(rows))
    raw = {jid: raw for jid, raw, _state, _ac in rows}[f"{array}_1"]
    r = _jobstats_as(c, alice, f"{array}_1")
    assert r.returncode == 0 and r.stdout.startswith(f"job {raw}  user {alice}  "), r.stdout + r.stderr
    assert "mps shard:4" in r.stdout, r.stdout


def test_a_job_name_forging_a_sacct_row_changes_nothing_in_jobstats_header(dbd, two_users):
    """alice names her job ``x<newline><a sacct row of her job: a later run, TIMEOUT, 64 GPUs>`` and an escape
    sequence (``scontrol update`` of her held job; sacct -P prints the name as written). jobstats, hers and root's,
    shows the run Slurm recorded (COMPLETED, 1 GPU) and no escape byte: the header's fields come from a sacct call
    without the name."""
    c = dbd.cluster
    (alice, _bob), out = two_users
    sub = _as(c, alice, "sbatch", "--parsable", "-H", f"--output={out}/named-%j.out", "--gres=gpu:1", "--wrap", "true")
    assert sub.returncode == 0, sub.stderr
    job = Job(sub.stdout.strip().split(";")[0])
    dbd.submitted.append(job.id)
    forged = f"{job.id}|9999999999|TIMEOUT|64|512|cpu=512,gres/gpu=64,mem=4T,node=64|high|gpu|99999|UNLIMITED|y"
    name = f"x\n{forged}\x1b]0;owned\x07"
    for argv in (["scontrol", "update", f"jobid={job.id}", f"name={name}"], ["scontrol", "release", job.id]):
        r = _as(c, alice, *argv)
        assert r.returncode == 0, r.stderr
    assert dbd.wait(job).state == "COMPLETED"
    _sacct_until_segment(dbd, job.id)
    # once slurmctld has forgotten the job (MinJobAge), jobstats cannot tell its run by slurmctld's start time
    wait_until(lambda: not dbd.show_job(job.id), f"slurmctld forgetting job {job.id} (MinJobAge)")
    for who in (alice, "root"):
        r = _jobstats_as(c, who, job.id)
        assert r.returncode == 0, r.stdout + r.stderr
        assert re.search(r"^  name x\S*  state COMPLETED  nodes 1  cores \d+  CPU memory \S+  GPUs 1  QOS \S+$",
                         r.stdout, re.M), r.stdout
        assert "\x1b" not in r.stdout and "TIMEOUT" not in r.stdout and "99999" not in r.stdout, r.stdout

# --- issue 27: the enforce actions other than kill, on real daemons ----------------------------------------


def _over_its_share(dbd: SlurmSession, partition: str, first_run_only: bool = False) -> Job:
    """A 4G share whose two processes hold 3 GiB each (each under its per-client MPS limit, 6 GiB together)."""
    app = shlex.quote(str(dbd.cluster.fake_gpu_app))
    rerun = '[ "${SLURM_RESTART_COUNT:-0}" -ge 1 ] && exit 0; ' if first_run_only else ""
    return dbd.sbatch("-p", partition, "--gres=gpushare:mem=4G",
                      wrap=f"{rerun}{app} --mem 3G --seconds 90 & p=$!; {app} --mem 3G --seconds 90; wait $p")


def _note(dbd: SlurmSession, job: Job, said: str) -> str:
    def told() -> str | None:
        note = dbd.show_job(job.id).get("AdminComment") or ""
        return note if said in note else None

    return wait_until(told, f"job {job.id}'s AdminComment to say {said!r}")


def test_a_share_over_its_memory_in_a_warn_partition_is_told_and_runs_on(dbd):
    """Issue 27 (b) under enforce = "warn" (node.toml [enforce_partitions]): the job's user reads why in its
    AdminComment, and its processes run on."""
    job = _over_its_share(dbd, "warnp")
    note = _note(dbd, job, "the monitor warned")
    assert ("its 2 process(es) there held 6144 MiB together, its share is 4096 MiB; the monitor warned (node.toml "
            'enforce = "warn").') in note, note
    assert dbd.show_job(job.id)["JobState"] == "RUNNING"
    dbd.run(["scancel", job.id])
    dbd.wait(job)


def test_a_share_over_its_memory_in_a_requeue_partition_is_requeued(dbd):
    """Issue 27 (b) under enforce = "requeue": slurmctld requeues the job (its processes end with the run), the
    note says so, and the next run (which stays within its share) completes."""
    job = _over_its_share(dbd, "requeuep", first_run_only=True)
    note = _note(dbd, job, "the monitor requeued the job")
    assert "its share is 4096 MiB; the monitor requeued the job." in note, note
    done = dbd.wait(job)
    assert done.state == "COMPLETED" and int(done.fields.get("Restarts", "0")) >= 1, done.fields


# --- issue 28 item 2: the lines gres-conf prints start slurmctld, with slurmdbd and without ------------------
#
# Each case merges the generated slurm.conf.gres (and gres.conf) into a minimal site slurm.conf of its own (its
# own ports, state and log; this module's munge, and its slurmdbd where the site has one) and runs
# ``slurmctld -D`` until it says it runs as the primary controller (it started: it is then stopped by its pid)
# or exits (a fatal error: its log's last lines are the message). ``gres-conf --check`` must agree. The
# generated node lines themselves start slurmd in tests/test_gres_slurm.py.

MACHINES = Path(__file__).resolve().parent.parent / "slurm_gpushare" / "data" / "machines"
#: How long slurmctld may take to say it runs (it reads its state, loads plugins; a few seconds at most here).
START_S = 30.0
GEN_PORT = TEST_PORT + 850


def _release() -> str:
    out = subprocess.run(["slurmctld", "-V"], capture_output=True, text=True).stdout.split()
    return str(Release.parse(out[-1])) if out else "22.05"


def _site_conf(root: Path, cluster: DevCluster, *, dbd: bool) -> str:
    """A minimal slurm.conf of a site, before the generated lines are merged in."""
    lines = [
        "ClusterName=gencheck", "SlurmctldHost=localhost", f"SlurmctldPort={GEN_PORT}", f"SlurmdPort={GEN_PORT + 1}",
        "SlurmUser=root", "AuthType=auth/munge", f"AuthInfo=socket={cluster.root / 'munge' / 'munge.sock'}",
        f"StateSaveLocation={root / 'state'}", f"SlurmdSpoolDir={root / 'spool'}",
        f"SlurmctldPidFile={root / 'slurmctld.pid'}", f"SlurmctldLogFile={root / 'slurmctld.log'}",
        "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core", "MpiDefault=none", "ReturnToService=2", "SlurmctldDebug=info",
    ]
    if dbd:  # the module's slurmdbd (slurmctld stops at its first start without one: it has no TRES)
        lines += ["AccountingStorageType=accounting_storage/slurmdbd", "AccountingStorageHost=localhost",
                  f"AccountingStoragePort={cluster.port_base + 2}",
                  f"AccountingStoragePass={cluster.root / 'munge' / 'munge.sock'}"]
    return "\n".join(lines) + "\n"


def _start(conf_dir: Path) -> tuple[bool, str]:
    """Run ``slurmctld -D -f conf_dir/slurm.conf`` until it runs or exits; (started, the end of its log)."""
    (conf_dir / "state").mkdir(exist_ok=True)
    log = conf_dir / "slurmctld.log"
    log.unlink(missing_ok=True)
    env = {**os.environ, "SLURM_CONF": str(conf_dir / "slurm.conf")}
    proc = subprocess.Popen(["slurmctld", "-D", "-i", "-f", str(conf_dir / "slurm.conf")], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    started = False
    deadline = time.monotonic() + START_S
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            text = log.read_text(errors="replace") if log.exists() else ""
            if "Running as primary controller" in text:
                started = True
                break
            time.sleep(0.1)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)  # ours, by its pid
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait()
    err = proc.stderr.read() if proc.stderr else ""
    text = (log.read_text(errors="replace") if log.exists() else "") + err
    return started, "\n".join(text.splitlines()[-8:])


@pytest.fixture
def work(dbd, tmp_path):
    return tmp_path, dbd.cluster


ALL_MACHINES = sorted(p.name for p in MACHINES.glob("*.json"))


def _generate(root: Path, machines: list[str], *flags: str) -> Path:
    out = root / f"gen{'-'.join(flags)}"
    proc = subprocess.run([*CLI, "gres-conf", *(str(MACHINES / m) for m in machines), "--slurm-version", _release(),
                           "--output-dir", str(out), *flags], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return out


def _check(site: Path, machines: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, "gres-conf", *(str(MACHINES / m) for m in machines), "--slurm-version", _release(),
                           "--check", "--gres-conf", str(site / "gres.conf"), "--slurm-conf", str(site / "slurm.conf")],
                          capture_output=True, text=True)


def _site(root: Path, cluster: DevCluster, machines: list[str], *, dbd: bool, extra: str = "") -> Path:
    """The site's directory: its slurm.conf with the generated lines of ``machines`` merged in, and gres.conf."""
    gen = _generate(root, machines, "--slurmdbd" if dbd else "--no-slurmdbd")
    site = root / f"site-{'dbd' if dbd else 'nodbd'}{'-x' if extra else ''}"
    site.mkdir()
    # the site's partition, with the TRESBillingWeights= the generator prints for it merged in, as its text says
    lines = (gen / "slurm.conf.gres").read_text().splitlines()
    weights = [w for ln in lines if ln.startswith("PartitionName=") for w in ln.split()
               if w.startswith("TRESBillingWeights=")]
    partition = " ".join(["PartitionName=gpu Nodes=ALL Default=YES", *weights])
    # each node line with the site's own address for it (here the node names resolve nowhere: a lookup waits)
    merged = "\n".join(ln + " NodeAddr=127.0.0.1" if ln.startswith("NodeName=") else ln for ln in lines
                       if not ln.startswith("PartitionName=")) + "\n" + partition + "\n"
    (site / "slurm.conf").write_text(_site_conf(site, cluster, dbd=dbd) + merged + extra)
    shutil.copy(gen / "gres.conf", site / "gres.conf")
    return site


@pytest.mark.parametrize("with_dbd", [True, False], ids=["slurmdbd", "no-slurmdbd"])
def test_the_generated_lines_start_slurmctld_and_check_agrees(work, with_dbd):
    """The four packaged machines' lines (MIG, NVSwitch, NVLink bridges, PCIe) in one site's files."""
    root, cluster = work
    site = _site(root, cluster, ALL_MACHINES, dbd=with_dbd)
    started, tail = _start(site)
    assert started, f"slurmctld did not start from the generated lines (slurmdbd={with_dbd}):\n{tail}"
    checked = _check(site, ALL_MACHINES)
    assert checked.returncode == 0, checked.stdout + checked.stderr


@pytest.mark.parametrize("extra, said", [
    # without slurmdbd: the GRES TRES, and GRES billing weights (slurmctld's own words); --check calls each an error
    ("AccountingStorageTRES=gres/gpu,gres/shard\n", "slurmdbd is required"),
    ("PartitionName=bill Nodes=ALL TRESBillingWeights=GRES/gpu=1\n", "tres weights"),
], ids=["tres", "billing"])
def test_what_check_calls_fatal_stops_slurmctld(work, extra, said):
    root, cluster = work
    site = _site(root, cluster, ["8x-rtx4090-pcie.json"], dbd=False, extra=extra)
    started, tail = _start(site)
    assert not started and said in tail, tail
    checked = _check(site, ["8x-rtx4090-pcie.json"])
    assert checked.returncode != 0 and "slurmdbd" in checked.stdout + checked.stderr, checked.stdout
