"""Shared fixtures: one real dev cluster per test session, job submission and polling.

Markers (pyproject.toml): ``slurm`` tests use the :func:`cluster` fixture (real slurmctld/slurmd from
Debian's slurm-wlm, started by the project's own dev cluster); ``gpu`` tests need real NVML.

Environment:
    GPUSHARE_TEST_DIR: state directory of the test cluster (default /tmp/slurm-gpushare-test, with
        ``-<release>`` added in a release's root, so that sessions of several releases can run at once).
    GPUSHARE_TEST_PORT: its port base (default 17817, so a developer's dev cluster can run beside it;
        +1000 for 24.11 and +2000 for 26.05 in their roots). Tests use ports up to the base + 700.
    GPUSHARE_SLURM_RELEASE: set by ``scripts/test --slurm R`` inside release R's root (read only).
    GPUSHARE_TEST_KEEP=1: leave the cluster running after the session (it is reused next time).
    GPUSHARE_REQUIRE_SLURM=1: fail instead of skipping when Slurm cannot be run (set by .ci/run).
    GPUSHARE_TEST_DEADLINE: seconds a test waits for an event of the daemons (default 120, see :data:`DEADLINE`).
    GPUSHARE_DEV_FILTER_TIMEOUT: the dev clusters' shim timeout for filterd's answer (set to 10 s here).
    GPUSHARE_DEV_INSTALLED: an installed ``slurm-gpushare`` whose ``install`` writes the clusters' site files
        (.ci/run: the wheel's, in a clean venv); unset: this interpreter's (tests/test_install_slurm.py).
    GPUSHARE_TEST_LOADED=1: the machine is loaded on purpose (set by ``scripts/test --stress``): ``timing`` tests,
        whose claim is a latency bound, are skipped.

Every wait in the tests is :func:`wait_until` (or :meth:`SlurmSession.wait`, built on it): it polls for the
event and returns as soon as it happened, with a deadline generous enough for a loaded machine
(``scripts/test --stress``); never a fixed sleep standing for an event.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from slurm_gpushare_dev.cluster import FILTER_TIMEOUT_ENV, DevCluster

#: The release whose root this session runs in (scripts/test --slurm), or None on the host's Slurm.
IN_RELEASE = os.environ.get("GPUSHARE_SLURM_RELEASE") or None
_RELEASE_PORT_OFFSET = {"24.11": 1000, "26.05": 2000}
TEST_DIR = os.environ.get("GPUSHARE_TEST_DIR", "/tmp/slurm-gpushare-test" + (f"-{IN_RELEASE}" if IN_RELEASE else ""))
TEST_PORT = int(os.environ.get("GPUSHARE_TEST_PORT", str(17817 + _RELEASE_PORT_OFFSET.get(IN_RELEASE or "", 0))))
#: Seconds a test waits for an event that depends on the daemons (Slurm, the hooks, the MPS stand-in, the
#: monitor): generous, for a machine loaded by other work; a wait ends as soon as its event happened.
DEADLINE = float(os.environ.get("GPUSHARE_TEST_DEADLINE", "120"))
#: the dev clusters' shim waits this long for filterd's answer (the shipped 20 ms is a real controller's bound,
#: which a loaded test machine misses; then the shim refuses gpushare jobs for 5 s): slurm_gpushare_dev.cluster
os.environ.setdefault(FILTER_TIMEOUT_ENV, "10")
FINAL_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL",
                "DEADLINE", "PREEMPTED"}


def wait_until(cond, what: str, timeout: float = DEADLINE, *, describe=None):
    """Poll ``cond()`` (backoff from 0.05 s to 1 s) until it returns something true; return that value.

    ``cond`` is tried once more after the deadline has passed, so a slow last poll still counts.

    Raises:
        AssertionError: ``cond()`` was still false after ``timeout`` seconds; the message names ``what``
            and, when ``describe`` is given, what ``describe()`` says about the state last seen.
    """
    deadline = time.monotonic() + timeout
    delay = 0.05
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() >= deadline:
            seen = f": {describe()}" if describe is not None else ""
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}{seen}")
        time.sleep(delay)
        delay = min(delay * 1.5, 1.0)


def slurm_epoch(text: str) -> int:
    """A time as ``scontrol show job`` prints it (``2026-11-29T12:00:00``, slurmctld's local time), in epoch
    seconds."""
    from datetime import datetime

    return int(datetime.strptime(text, "%Y-%m-%dT%H:%M:%S").timestamp())


def job_trail(cluster: DevCluster, job_id: str, lines: int = 12) -> str:
    """What the daemons said about one job, for a failed wait's message: ``scontrol show job -o`` (state and
    Reason), then the last ``lines`` lines naming the job in slurmctld's log, each slurmd's log and each node's
    hook log (``node.log``). Reads only; never raises (a log may be missing or being rotated)."""
    parts = []
    try:
        proc = subprocess.run(["scontrol", "show", "job", "-o", job_id], env=cluster.env, capture_output=True,
                              text=True, errors="replace", timeout=30)
        parts.append("scontrol: " + (proc.stdout.strip() or proc.stderr.strip()))
    except (OSError, subprocess.SubprocessError) as e:
        parts.append(f"scontrol: {e}")
    pattern = re.compile(rf"(?<![0-9]){re.escape(job_id)}(?![0-9])")
    logs = [*sorted((cluster.root / "log").glob("slurm*.log")),
            *sorted((cluster.root / "run" / "gpushare").glob("*/node.log"))]
    for log in logs:
        try:
            hits = [line for line in log.read_text(errors="replace").splitlines() if pattern.search(line)]
        except OSError:
            continue
        if hits:
            parts.append(f"{log.relative_to(cluster.root)}:\n  " + "\n  ".join(hits[-lines:]))
    return "\n".join(parts)


def _slurm_unavailable() -> str | None:
    if os.geteuid() != 0:
        return "the dev cluster needs root"
    missing = [p for p in ("munged", "slurmctld", "slurmd", "sbatch") if shutil.which(p) is None]
    if missing:
        return f"Slurm is not installed ({', '.join(missing)} missing): apt-get install slurm-wlm munge"
    return None


def _skip_or_fail(reason: str):
    if os.environ.get("GPUSHARE_REQUIRE_SLURM") == "1":
        pytest.fail(f"GPUSHARE_REQUIRE_SLURM=1 but {reason}")
    pytest.skip(reason)


@dataclass
class Job:
    """A submitted job: its id and final ``scontrol show job`` fields once polled."""

    id: str
    fields: dict[str, str] = field(default_factory=dict)
    output_path: Path | None = None

    @property
    def state(self) -> str:
        return self.fields.get("JobState", "")

    def output(self) -> str:
        return self.output_path.read_text() if self.output_path and self.output_path.exists() else ""


class SlurmSession:
    """Submit jobs to the test cluster and poll them; cancels what it submitted at teardown."""

    def __init__(self, cluster: DevCluster, out_dir: Path):
        self.cluster = cluster
        self.out_dir = out_dir
        self.submitted: list[str] = []

    def run(self, argv: list[str], *, check: bool = True, timeout: float = DEADLINE) -> subprocess.CompletedProcess:
        """Run a Slurm client command against the cluster."""
        proc = subprocess.run(argv, env=self.cluster.env, capture_output=True, text=True,
                              errors="replace", timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr.strip()}")
        return proc

    def sbatch(self, *args: str, wrap: str = "env", check: bool = True) -> Job | subprocess.CompletedProcess:
        """``sbatch --parsable ARGS --wrap WRAP``; returns the Job, or the failed process when check=False."""
        self.out_dir.mkdir(parents=True, exist_ok=True)
        out = self.out_dir / f"job-{time.monotonic_ns()}.out"
        proc = self.run(["sbatch", "--parsable", f"--output={out}", *args, "--wrap", wrap], check=False)
        if proc.returncode != 0:
            if check:
                raise AssertionError(f"sbatch {' '.join(args)} failed: {proc.stderr.strip()}")
            return proc
        job_id = proc.stdout.strip().split(";")[0]
        self.submitted.append(job_id)
        return Job(job_id, output_path=out)

    def show_job(self, job_id: str) -> dict[str, str]:
        """``scontrol show job ID`` as a dict (empty when the job is gone)."""
        proc = self.run(["scontrol", "show", "job", job_id], check=False)
        return parse_scontrol_record(proc.stdout) if proc.returncode == 0 else {}

    def wait(self, job: Job, states: set[str] = FINAL_STATES, timeout: float = DEADLINE) -> Job:
        """Poll until the job reaches one of ``states``; fail with its fields on timeout.

        A final job's output file is complete: slurmstepd opens it before the batch script starts and
        reports the job's end after the script exited (a job cancelled while pending has none)."""
        def reached() -> bool:
            job.fields = self.show_job(job.id)
            return job.state in states

        wait_until(reached, f"job {job.id} in {sorted(states)}", timeout, describe=lambda: job.fields)
        return job

    def wait_all(self, jobs: list[Job], states: set[str] = FINAL_STATES, timeout: float = DEADLINE) -> list[Job]:
        """Poll every job at once (one ``scontrol show job`` per round) until each has reached one of
        ``states``; a job's fields are kept from the round that saw it there, so a job that ended early is
        not lost when slurmctld forgets it (``MinJobAge``, 30 s on the dev cluster) before the last ends.

        Raises:
            AssertionError: not every job reached ``states`` within ``timeout`` (naming those that did not).
        """
        pending = {job.id: job for job in jobs}

        def reached() -> bool:
            out = self.run(["scontrol", "show", "job"], check=False).stdout
            for text in out.split("\n\n"):
                fields = parse_scontrol_record(text)
                job = pending.get(fields.get("JobId", ""))
                if job is not None:
                    job.fields = fields
                    if job.state in states:
                        del pending[job.id]
            return not pending

        wait_until(reached, f"{len(jobs)} jobs in {sorted(states)}", timeout,
                   describe=lambda: {j: job.fields.get("JobState") for j, job in pending.items()})
        return jobs

    def wait_started(self, job: Job, timeout: float = DEADLINE) -> Job:
        """Wait until the job runs and its Prolog has finished on every node of the job.

        With ``PrologFlags=Alloc`` (the dev cluster's slurm.conf) slurmctld makes the job RUNNING when it
        sends the Prolog to the nodes, with ``Reason=Prolog`` (WAIT_PROLOG, ``launch_prolog`` in
        src/slurmctld/node_scheduler.c) until each node reported its Prolog complete (``prolog_complete``
        in src/slurmctld/job_mgr.c), 22.05.8 to 26.05.3: a test that reads what the Prolog wrote
        waits for that, not for RUNNING.

        Raises:
            AssertionError: the job ended first (its fields), or not within ``timeout``.
        """
        def started() -> bool:
            job.fields = self.show_job(job.id)
            if job.state in FINAL_STATES:
                raise AssertionError(f"job {job.id} ended ({job.state}) before it ran with its Prolog done: "
                                     f"{job.fields}")
            return job.state == "RUNNING" and job.fields.get("Reason") != "Prolog"

        wait_until(started, f"job {job.id} running with its Prolog done", timeout, describe=lambda: job.fields)
        return job

    def cancel_all(self) -> None:
        if self.submitted:
            self.run(["scancel", *self.submitted], check=False)


#: Fields whose values are free text (spaces, '='): ``scontrol show`` prints each on a line of its own.
FREE_TEXT = ("AdminComment=", "Comment=", "Command=", "Reason=", "Features=")


_USED_UIDS: set[int] = set()


def add_user(name: str) -> int:
    """``useradd`` an unprivileged user with a uid no user of this test session had (returned): useradd would give
    a just-deleted user's uid to the next one, and slurmctld and slurmdbd keep uid -> name maps of their own, so a
    job of the new user could be shown under the old one's name."""
    import pwd
    import random

    while True:
        uid = random.randint(20000, 59999)
        try:
            pwd.getpwuid(uid)
        except KeyError:
            if uid not in _USED_UIDS:
                break
    _USED_UIDS.add(uid)
    subprocess.run(["useradd", "--no-create-home", "--shell", "/bin/sh", "-u", str(uid), name], check=True,
                   capture_output=True)
    return uid


def throwaway_users(root: Path, count: int = 2):
    """A fixture's body: ``count`` unprivileged users created for the test (``gpsa<tag>``, ``gpsb<tag>``...) and a
    world-writable output dir under ``root``/test-output, yielded as ``(names, out)``; the users are removed
    after. Skips where users cannot be created (not root)."""
    import uuid

    if os.geteuid() != 0:
        pytest.skip("creating users needs root")
    tag = uuid.uuid4().hex[:6]
    names = [f"gps{chr(ord('a') + i)}{tag}" for i in range(count)]
    for n in names:
        add_user(n)
    out = Path(root) / "test-output" / f"users-{tag}"
    out.mkdir(parents=True, exist_ok=True)
    os.chmod(out, 0o1777)
    try:
        yield names, out
    finally:
        for n in names:
            subprocess.run(["userdel", n], capture_output=True)


def parse_scontrol_record(text: str) -> dict[str, str]:
    """Parse one multi-line ``scontrol show job|node`` record; free-text fields keep their whole line."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith(FREE_TEXT):
            key, _, value = stripped.partition("=")
            out[key] = value
        elif stripped:
            out.update(parse_scontrol_line(stripped))
    return out


def parse_scontrol_line(text: str) -> dict[str, str]:
    """Parse one ``scontrol -o show`` record (``Key=Value`` pairs; values may contain ``=``)."""
    out: dict[str, str] = {}
    key = None
    for token in text.strip().split(" "):
        if "=" in token and not token.startswith("="):
            key, _, value = token.partition("=")
            out[key] = value
        elif key is not None:  # a value with spaces (e.g. Command, Reason)
            out[key] += " " + token
    return out


def bare(tres: str) -> str:
    """A TRES string without the release's prefixes: ``gres:shard:10`` (22.05) and ``gres/shard:10`` (23.11+)
    both give ``shard:10`` (through the product's grammar, slurm_gpushare.slurm.gres)."""
    from slurm_gpushare.slurm.gres import parse

    return ",".join(it.body for it in parse(tres))


def private_cluster(prefix: str, port_base: int, machines: dict[str, str], **options):
    """A module fixture's body: a dev cluster of its own (``machines``: node name -> packaged description) in a
    fresh ``/tmp/<prefix>*`` directory, up for the module, down and removed afterwards. Yields the cluster
    and the directory it lies in (for the test's own files)."""
    import tempfile

    from slurm_gpushare_dev.cluster import packaged_machine

    reason = _slurm_unavailable()
    if reason:
        _skip_or_fail(reason)
    root = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    os.chmod(root, 0o755)
    c = DevCluster(root / "c", port_base, {n: packaged_machine(f) for n, f in machines.items()}, **options)
    try:
        c.up(out=open(os.devnull, "w"))
        yield c, root
    finally:
        c.down(out=open(os.devnull, "w"))
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def cluster(tmp_path_factory) -> DevCluster:
    """The default dev cluster, up for the whole session (reused when already running)."""
    reason = _slurm_unavailable()
    if reason:
        _skip_or_fail(reason)
    c = DevCluster.default(TEST_DIR, TEST_PORT)
    started = not c.alive("slurmctld")
    c.up(out=open(os.devnull, "w"))
    yield c
    if started and os.environ.get("GPUSHARE_TEST_KEEP") != "1":
        c.down(out=open(os.devnull, "w"))


#: ``squeue --states`` of a job that still holds (or may yet hold) a node: the Epilog of a COMPLETING one runs.
ACTIVE_STATES = "PENDING,RUNNING,SUSPENDED,COMPLETING,CONFIGURING"


def active_jobs(cluster: DevCluster) -> dict[str, str]:
    """``{job id: compact state}`` of the cluster's jobs that hold or may yet hold a node (:data:`ACTIVE_STATES`);
    empty when slurmctld does not answer."""
    proc = subprocess.run(["squeue", "-h", "-t", ACTIVE_STATES, "-o", "%A %t"], env=cluster.env,
                          capture_output=True, text=True, timeout=DEADLINE)
    return dict(line.split() for line in proc.stdout.splitlines() if len(line.split()) == 2)


@pytest.fixture(autouse=True)
def _leaves_no_job(request):
    """Each test on the session's cluster leaves it as it found it: after the test (and the ``slurm`` fixture's
    ``scancel`` of the jobs it submitted), every job that was not active before has ended, its Epilog included,
    so the next test finds the nodes idle. A job still PENDING or RUNNING then was left by the test (a job
    submitted outside :class:`SlurmSession` and never cancelled): it is cancelled, and a warning names the test
    and the job (pytest's warnings summary), instead of a later test failing on a busy node."""
    if "cluster" not in request.fixturenames:
        yield
        return
    cluster = request.getfixturevalue("cluster")
    before = set(active_jobs(cluster))
    yield
    left = {j: st for j, st in active_jobs(cluster).items() if j not in before}
    leaked = sorted(j for j, st in left.items() if st in ("PD", "R", "S", "CF"))
    if leaked:
        subprocess.run(["scancel", *leaked], env=cluster.env, capture_output=True, timeout=DEADLINE)
    if left:
        wait_until(lambda: not set(left) & set(active_jobs(cluster)), f"jobs {', '.join(sorted(left))} ending",
                   describe=lambda: active_jobs(cluster))
    if leaked:
        warnings.warn(f"{request.node.nodeid} left job(s) {', '.join(leaked)} running or pending (cancelled after it)",
                      stacklevel=1)


@pytest.fixture
def slurm(cluster, tmp_path_factory) -> SlurmSession:
    """Submit and poll jobs on the session's cluster; cancels this test's jobs afterwards."""
    out_dir = Path(cluster.root) / "test-output"
    session = SlurmSession(cluster, out_dir)
    yield session
    session.cancel_all()


def _terminated(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def pytest_configure(config):
    """SIGTERM (``scripts/test --stress`` stopped, a CI job's timeout) ends the session as Ctrl-C does: the
    fixtures' teardown still stops the dev clusters the session started."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _terminated)


def pytest_collection_modifyitems(config, items):
    """Mark every test that uses the cluster as ``slurm``; skip ``gpu`` tests without real NVML, and ``timing``
    tests on a machine loaded on purpose (``GPUSHARE_TEST_LOADED=1``: ``scripts/test --stress``)."""
    nvml_reason = None
    loaded = os.environ.get("GPUSHARE_TEST_LOADED") == "1"
    for item in items:
        if loaded and "timing" in item.keywords:
            item.add_marker(pytest.mark.skip(reason="a latency bound, not measured beside CPU burners "
                                                    "(GPUSHARE_TEST_LOADED=1)"))
        if "cluster" in getattr(item, "fixturenames", ()) and "slurm" not in item.keywords:
            item.add_marker(pytest.mark.slurm)
        if "gpu" in item.keywords:
            if nvml_reason is None:
                nvml_reason = _nvml_unavailable() or ""
            if nvml_reason:
                item.add_marker(pytest.mark.skip(reason=nvml_reason))


def _nvml_unavailable() -> str | None:
    """Why real NVML cannot be used here, or None when it can (probed through the product's port)."""
    from slurm_gpushare.hardware.nvml import RealNvml

    try:
        with RealNvml() as port:
            port.device_count()
    except Exception as e:  # noqa: BLE001 - any NVML failure means "no GPU here"
        return f"no usable NVML on this host: {e}"
    return None


def push_usage_summary(cluster: DevCluster, session: SlurmSession, job_id: str, node: str, tmp_path: Path,
                       want, timeout: float = DEADLINE) -> dict[str, str]:
    """Run the product's AdminComment writer (``slurm-gpushare monitor --once`` with
    ``admin_comment_summary = true``, its own run_dir beside the node's monitor daemon, which leaves
    AdminComment alone) until the job's AdminComment matches the regex ``want`` (the fake app may not
    have registered at first); returns the job's ``scontrol show job`` fields."""
    config = tmp_path / "node.toml"
    config.write_text(cluster.node_config.read_text().replace(
        "monitor_interval = 0.5", f'monitor_interval = 0.5\nadmin_comment_summary = true\n'
        f'run_dir = "{tmp_path}/run"').replace(f'run_dir = "{cluster.node_run_dir}"\n', ""))
    env = {**cluster.env, "GPUSHARE_NVML": f"fake:{cluster.root}/machines/{node}.json",
           "GPUSHARE_FAKE_GPU_PROCESSES": str(cluster.fake_gpu_table(node))}
    fields: dict[str, str] = {}

    def summarised() -> bool:
        nonlocal fields
        once = subprocess.run([sys.executable, "-m", "slurm_gpushare", "monitor", "--once", "--config", str(config),
                               "--node", node], env=env, capture_output=True, text=True, timeout=DEADLINE)
        assert once.returncode == 0, once.stderr
        fields = session.show_job(job_id)
        return bool(want.search(fields.get("AdminComment", "")))

    wait_until(summarised, f"job {job_id}'s AdminComment matching {want.pattern!r}", timeout,
               describe=lambda: fields.get("AdminComment"))
    return fields


def spooled_lines(spool_dir) -> list[str]:
    """The record lines of the nodes' accounting spool (``<spool>/*.jsonl``) that their writers finished, read as
    the product's readers read them (:func:`slurm_gpushare.accounting.spool.complete_size`: the size while no
    Epilog holds the file's lock, whole lines only). A test reading the files without it once read an Epilog's
    line half-written."""
    from slurm_gpushare.accounting.spool import complete_size

    out: list[str] = []
    for f in sorted(Path(spool_dir).glob("*.jsonl")):
        text = f.read_bytes()[:complete_size(f)].decode(errors="replace")
        out += [ln for ln in text.split("\n")[:-1] if ln.strip()]
    return out


def spooled_records(spool_dir) -> list[dict]:
    """:func:`spooled_lines`, decoded."""
    return [json.loads(ln) for ln in spooled_lines(spool_dir)]


def scrape_metrics(url: str) -> dict[str, list]:
    """A Prometheus endpoint's samples by name (prometheus_client's parser)."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url, timeout=DEADLINE) as r:
        text = r.read().decode()
    out: dict[str, list] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append(s)
    return out
