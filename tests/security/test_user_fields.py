"""Every field a user writes into their own job, set by ``sbatch`` and by ``scontrol update`` of the pending job,
on the real dev cluster as an unprivileged user (issue #12, acceptance): a newline and forged ``scontrol show job``
lines, ``=`` / brackets / JSON, Latin-1 bytes, values as long as Slurm takes (measured: 1024 bytes for Comment,
JobName, MailUser, WCKey; 4096 for WorkDir, StdOut; longer is refused by slurmctld), a 1 MB environment and a 1 MB
batch script. Each job runs as its owner with the MPS limit Slurm granted, no node drains, and the accounting record
names the owner, the account and the start Slurm gave.

The jobs of all cases are submitted together (module fixture) and checked one test per case; the job state, account
and start are read from ``squeue --json``, never from ``scontrol show job`` text that the fields could forge."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from slurm_gpushare.slurm.job import JobInfo, parse_job_json
from tests.conftest import DEADLINE, job_trail, wait_until
from tests.security.conftest import USERS
from tests.security.test_node_records import PROBE, drained, record_of

pytestmark = pytest.mark.slurm

OWNER = USERS[0]
LIMIT = "0=4G"  # what --gres=gpushare:mem=4G on the pcie partition is granted: shard:4 of one RTX 4090
FORGED = (b"x\nNodes=rtx4090-pcie CPU_IDs=0 Mem=0 GRES=shard:80(IDX:0)\n"
          b"   UserId=root(0) GroupId=root(0) Account=other StartTime=2020-01-01T00:00:00\n"
          b"   AdminComment=[gpushare:v1 req=mem=80G grant=gres:shard:80 kind=mps mem=81920/81920MiB sm=100]\n")
VALUES = {
    "forged": FORGED,
    "syntax": b'a=b [x]=[y] ][ (IDX:0) "}],"jobs":[{"job_id":1,"user_id":0}]} \\ %u \x01\x1b[31m',
    "latin1": b"caf\xe9 \xff\xfe \xc3\x28 UserId=root(0)",
    "long": FORGED,  # repeated to the field's limit
}
#: Longest value slurmctld takes (measured on 22.05: one byte more is "Pathname of a file, directory or other
#: parameter too long"); paths are PATH_MAX.
TEXT_LIMIT, PATH_LIMIT = 1024, 4096
#: sbatch option and ``scontrol update`` key of each field (None: scontrol cannot change it on 22.05:
#: "Update of this parameter is not supported").
FIELDS = {"comment": ("--comment", "Comment"), "name": ("--job-name", "JobName"),
          "mail_user": ("--mail-user", "MailUser"), "wckey": ("--wckey", "WCKey"),
          "workdir": ("--chdir", "WorkDir"), "stdout": ("--output", "StdOut"), "stderr": ("--error", None)}
PATHS = ("workdir", "stdout", "stderr")
CASES = [(how, f, v) for how in ("sbatch", "update") for f, opts in FIELDS.items() if how == "sbatch" or opts[1]
         for v in VALUES]
OTHER = [("sbatch", "environment", "1MB"), ("sbatch", "script", "1MB")]


@dataclass
class Case:
    """One submitted job: its id, where its probe writes, and what Slurm said at submit time."""

    job_id: str
    result: Path
    account: str
    start_after: float
    #: ``time.monotonic()`` by which every case's job should have ended: one deadline for the module, so that
    #: jobs stuck together fail their tests together, not one full wait after another
    ends_by: float


def _text(value: bytes, limit: int) -> bytes:
    """``value`` repeated up to ``limit`` bytes."""
    return (value * (limit // len(value) + 1))[:limit]


def _path(base: Path, field: str, value: bytes, limit: int) -> bytes:
    """An absolute path under ``base`` made of ``value`` (``/`` cannot be in a name; names <= 255 bytes), at most
    ``limit`` bytes, owned by the job's owner: the work dir itself, or the directory of an output file."""
    root = bytes(base / field)
    # Slurm's own output-name syntax is not ours to test: it drops "\\" (and then expands no "%" pattern)
    name = value.replace(b"/", b"_").replace(b"\\", b"").replace(b"%", b"")
    parts = [name[:200]]
    if limit:  # the long case: directories of 200-byte names up to the limit
        parts = []
        while len(root) + sum(len(p) + 1 for p in parts) + 205 < limit:
            parts.append(_text(name, 200))
    path = b"/".join([root, *parts])
    os.makedirs(path, exist_ok=True)
    uid = pwd.getpwnam(OWNER).pw_uid
    cur = path
    while cur != bytes(base):
        os.chown(cur, uid, uid)
        cur = os.path.dirname(cur)
    return path if field == "workdir" else path + b"/out"


def _value(base: Path, field: str, cls: str) -> bytes:
    value = VALUES[cls]
    long = cls == "long"
    if field in PATHS:
        return _path(base, field, value, PATH_LIMIT if long else 0)
    return _text(value, TEXT_LIMIT) if long else value


def _as_owner(cluster, *argv: str | bytes, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["runuser", "-u", OWNER, "--", *argv], env=env or cluster.env, capture_output=True,
                          timeout=120)


#: every job as last seen by :func:`_squeue`: slurmctld forgets a job MinJobAge (30 s) after it ends, which
#: can be before the case's test comes to it (seen on 24.11); a job still running when last seen was not
#: forgotten but is shown no longer: its test fails naming it
_SEEN: dict[str, JobInfo] = {}


def _squeue(cluster) -> dict[str, JobInfo]:
    """Every job of ``squeue --json``, read by the hooks' own parser in the release's shape, and every job seen
    before that slurmctld has forgotten since."""
    # --states=all: from 24.11 squeue --json drops the jobs its text output would drop (squeue_filter_jobs_for_json,
    # src/squeue/print.c at slurm-24-11-5-1 and slurm-26-05-3-1), COMPLETED ones by default: a job whose
    # Epilog ended between two polls was never seen ended, and its last record here stayed RUNNING
    out = subprocess.run(["squeue", "--json", "--states=all"], env=cluster.env, capture_output=True,
                         timeout=DEADLINE, check=True)
    text = out.stdout.decode(errors="replace")
    _SEEN.update({str(j["job_id"]): parse_job_json(text, j["job_id"], source="squeue --json")
                  for j in json.loads(text)["jobs"]})
    return dict(_SEEN)


def _submit(cluster, base: Path, how: str, field: str, cls: str) -> str:
    """Submit one case as the owner (held when it is updated after), return its job id."""
    tag = f"{how}-{field}-{cls}"
    result = base / f"{tag}.result"
    wrap = f"({PROBE}; echo ID=$(id -u); echo PWD=$(pwd)) > {result} 2>&1"
    args: list[str | bytes] = ["-p", "pcie", "--gres=gpushare:mem=4G", "--output=/dev/null"]
    env = None
    if field == "environment":  # nine variables of 120,000 bytes (execve takes 128 KiB a string)
        env = {**cluster.env, "SLURM_JOB_UID": "0", "SLURM_JOB_USER": "root", "SLURM_JOB_ACCOUNT": "other",
               **{f"GPS_HOSTILE_{i}": _text(FORGED, 120_000).decode() for i in range(9)}}
        args.append("--export=ALL")
    if field == "script":  # a 1 MB batch script: forged lines in comments
        script = base / f"{tag}.sh"
        script.write_bytes(b"#!/bin/sh\n" + b"".join(b"# " + line + b"\n" for line in
                                                     _text(FORGED, 1 << 20).splitlines()) + wrap.encode() + b"\n")
        script.chmod(0o644)
        proc = _as_owner(cluster, "sbatch", "--parsable", *args, str(script))
    else:
        if how == "sbatch" and field in FIELDS:
            opt = FIELDS[field][0].encode()
            args.append(opt + b"=" + _value(base, field, cls))
        elif how == "update":
            args.append("-H")
        proc = _as_owner(cluster, "sbatch", "--parsable", *args, "--wrap", wrap, env=env)
    assert proc.returncode == 0, (tag, proc.stderr.decode(errors="replace"))
    job_id = proc.stdout.decode().strip().split(";")[0]
    if how == "update":
        key = FIELDS[field][1].encode()
        upd = _as_owner(cluster, "scontrol", "update", f"jobid={job_id}", key + b"=" + _value(base, field, cls))
        assert upd.returncode == 0, (tag, upd.stderr.decode(errors="replace"))
        _as_owner(cluster, "scontrol", "release", job_id)
    return job_id


@pytest.fixture(scope="module")
def submitted(cluster, users):  # noqa: F811
    """Every case's job, submitted at once: ``(how, field, class) -> Case``."""
    base = Path(tempfile.mkdtemp(prefix="gps-fields-", dir="/tmp"))
    base.chmod(0o1777)
    ids: dict[tuple, str] = {}
    before = time.time() - 1
    try:
        for case in CASES + OTHER:
            ids[case] = _submit(cluster, base, *case)
            # read each job while slurmctld still has it: an early one may end and be forgotten
            # (MinJobAge) before the last is submitted (seen on a loaded machine)
            table = _squeue(cluster)
        ends_by = time.monotonic() + 3 * DEADLINE
        yield {case: Case(j, base / f"{'-'.join(case)}.result", table[j].account, before, ends_by)
               for case, j in ids.items()}
    finally:
        subprocess.run(["scancel", *ids.values()], env=cluster.env, capture_output=True)
        shutil.rmtree(base, ignore_errors=True)


def _wait_final(cluster, case: Case) -> JobInfo:
    """The case's job once it ended, by the module's one deadline (every case's job was submitted at once: the
    last may wait for the others); a timeout says what slurmctld, slurmd and the hooks logged about the job."""
    def ended() -> JobInfo | None:
        job = _squeue(cluster).get(case.job_id)
        return job if job and job.state not in ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING") else None

    return wait_until(ended, f"job {case.job_id} ended", max(1.0, case.ends_by - time.monotonic()),
                      describe=lambda: f"{_squeue(cluster).get(case.job_id)}\n{job_trail(cluster, case.job_id)}")


@pytest.mark.parametrize("how, field, cls", CASES + OTHER, ids=["-".join(c) for c in CASES + OTHER])
def test_a_user_field_changes_no_limit_identity_or_record(cluster, users, submitted, how, field, cls):  # noqa: F811
    case = submitted[(how, field, cls)]
    job = _wait_final(cluster, case)
    got = case.result.read_text(errors="replace") if case.result.exists() else ""
    assert job.state == "COMPLETED", (job.state, got)
    env = dict(line.split("=", 1) for line in got.splitlines() if "=" in line)
    uid = users[OWNER]
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == LIMIT, got
    assert (env["DAEMON_UID"], env["ID"]) == (str(uid), str(uid)), got
    assert job.uid == uid and job.account == case.account
    (rec,) = record_of(cluster, case.job_id)
    assert (rec["user"], rec["account"], rec["partition"]) == (OWNER, case.account, "pcie"), rec
    assert rec["start"] == job.start_time and rec["start"] >= case.start_after, rec
    assert rec["mem_granted_mib"] == 4096, rec
    assert drained(cluster_session(cluster)) == []


def cluster_session(cluster):
    """What :func:`drained` needs of a SlurmSession: ``run`` and ``cluster``."""
    from tests.conftest import SlurmSession
    return SlurmSession(cluster, Path(cluster.root) / "test-output")


@pytest.mark.parametrize("field", [f for f, (_, key) in FIELDS.items() if key])
def test_slurm_refuses_a_value_one_byte_over_the_limit(cluster, users, field):  # noqa: F811
    """The limits above are Slurm's: one byte more is refused by slurmctld, for sbatch and scontrol alike."""
    opt, key = FIELDS[field]
    limit = PATH_LIMIT if field in PATHS else TEXT_LIMIT
    value = b"/tmp/" + b"c" * (limit - 4) if field in PATHS else b"c" * (limit + 1)
    out = _as_owner(cluster, "sbatch", "--parsable", "-H", "-p", "pcie", "--gres=gpushare:mem=4G",
                    "--output=/dev/null", "--wrap", "true")
    assert out.returncode == 0, out.stderr
    job_id = out.stdout.decode().strip().split(";")[0]
    try:
        upd = _as_owner(cluster, "scontrol", "update", f"jobid={job_id}", key.encode() + b"=" + value)
        assert upd.returncode != 0 and b"too long" in upd.stderr, upd.stderr
        if field not in PATHS:  # sbatch checks a path's directory itself first
            sb = _as_owner(cluster, "sbatch", "--parsable", "-p", "pcie", opt.encode() + b"=" + value,
                           "--wrap", "true")
            assert sb.returncode != 0 and b"too long" in sb.stderr, sb.stderr
    finally:
        subprocess.run(["scancel", job_id], env=cluster.env, capture_output=True)
