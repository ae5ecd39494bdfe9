"""Accounting end to end on the dev cluster: two users run gpushare and whole-GPU jobs whose fake GPU
processes use memory; the node monitors measure them, the Epilogs spool the records, ingest loads
them, and the reports show what was asked, granted and used, matching values computed here by hand.
Also: a node monitor's endpoint, scraped while a job's two processes together exceed its share."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from slurm_gpushare_dev.cluster import packaged_machine
from tests.conftest import (
    DEADLINE,
    Job,
    push_usage_summary,
    scrape_metrics,
    slurm_epoch,
    spooled_records,
    throwaway_users,
    wait_until,
)

pytestmark = pytest.mark.slurm

CLI = [sys.executable, "-m", "slurm_gpushare"]


@pytest.fixture
def users(cluster):
    """Two throwaway users (created for the test, removed after), a world-writable output dir, and the jobs
    submitted (cancelled after)."""
    for names, out in throwaway_users(cluster.root):
        submitted: list[str] = []
        yield names, out, submitted
        if submitted:
            subprocess.run(["scancel", *submitted], env=cluster.env, capture_output=True)


def _submit_as(cluster, user: str, out: Path, *args: str, wrap: str) -> str:
    cmd = ["runuser", "-u", user, "--", "env", f"SLURM_CONF={cluster.slurm_conf}", "sbatch", "--parsable",
           f"--output={out}/job-%j.out", *args, "--wrap", wrap]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=DEADLINE)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip().split(";")[0]


def _ingest_until(cluster, db: Path, job_ids: set[str], timeout: float = DEADLINE) -> dict[str, dict]:
    """Ingest the cluster's spool until every job has its records; the per-job report rows."""
    rows: dict[str, dict] = {}

    def ingested() -> bool:
        nonlocal rows
        ingest = subprocess.run([*CLI, "accounting", "ingest", "--spool", str(cluster.accounting_spool),
                                 "--db", str(db)], capture_output=True, text=True)
        assert ingest.returncode == 0, ingest.stdout + ingest.stderr
        rows = {str(r["job"]): r for r in _report(db, "--by", "job")["rows"]}
        return job_ids <= set(rows)

    wait_until(ingested, f"the records of jobs {sorted(job_ids)} in the spool", timeout,
               describe=lambda: f"missing {sorted(job_ids - set(rows))}")
    return rows


def _report(db: Path, *args: str) -> dict:
    out = subprocess.run([*CLI, "report", "--db", str(db), "--format", "json", *args], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def _spooled(cluster, job_ids: set[str]) -> list[dict]:
    return [r for r in spooled_records(cluster.accounting_spool) if r["job_id"] in job_ids]


def test_two_users_requested_vs_peak_and_per_user_totals(cluster, slurm, users, tmp_path):
    (alice, bob), out, submitted = users
    app = shlex.quote(str(cluster.fake_gpu_app))
    jobs = {
        # alice: 10 GiB anywhere (the gpu partition has MIG slices that fit), one process of 6 GiB
        _submit_as(cluster, alice, out, "--gres=gpushare:mem=10G",
                   wrap=f"{app} --mem 6G --sm 40 --seconds 4"): (alice, 6144),
        # alice: a 10 GiB MPS share, two processes of 4 GiB each (the job holds 8 GiB together)
        _submit_as(cluster, alice, out, "-p", "nomig", "--gres=gpushare:mem=10G",
                   wrap=f"{app} --mem 4G --sm 20 --seconds 4 & {app} --mem 4G --sm 20 --seconds 4; wait"):
            (alice, 8192),
        # bob: a 10 GiB MPS share whose use grows from 2 to 7 GiB
        _submit_as(cluster, bob, out, "-p", "nomig", "--gres=gpushare:mem=10G",
                   wrap=f"{app} --schedule 0:2G:20,1.5:7G:60 --seconds 4.5"): (bob, 7168),
        # bob: a whole RTX 4090 (24 GiB) of which he uses 20 GiB
        _submit_as(cluster, bob, out, "-p", "pcie", "--gres=gpu:1", wrap=f"{app} --mem 20G --sm 90 --seconds 4"):
            (bob, 20480),
    }
    submitted.extend(jobs)
    finals = {j: slurm.wait(Job(j)) for j in jobs}
    for j, job in finals.items():
        assert job.state == "COMPLETED", (j, job.fields, (out / f"job-{j}.out").read_text())

    db = tmp_path / "acct.db"
    rows = _ingest_until(cluster, db, set(jobs))
    whole_mib = packaged_machine("8x-rtx4090-pcie.json").gpus[0].memory_mib
    for j, (user, peak) in jobs.items():
        r = rows[j]
        assert r["user"] == user and r["gpus"] == 1, r
        assert r["mem_peak_mib"] == peak, (j, r)
        if r["mode"] == "gpu":
            assert r["mem_asked_mib"] is None and r["mem_granted_mib"] == whole_mib
        else:
            assert r["mem_asked_mib"] == 10240, r
    assert rows[next(iter(jobs))]["mode"] in ("mig", "mps")
    assert [rows[j]["mode"] for j in list(jobs)[1:]] == ["mps", "mps", "gpu"]

    # per-user totals, by hand from the records' durations and the peaks the jobs were told to use
    records = _spooled(cluster, set(jobs))
    assert len(records) == 4
    # memory over time, end to end (monitor -> usage file -> Epilog -> spool): each record's series
    # peaks where the record does
    for rec in records:
        series = rec["mem_series_mib"]
        assert rec["v"] == 4 and rec["submit"] > 0, rec  # the run's submit time, slurmctld's (issue 26 item 6)
        assert series and len(series) <= 32 and max(series) == rec["mem_peak_mib"], rec
        assert rec["mem_series_width"] >= 1 and len(series) == -(-rec["samples"] // rec["mem_series_width"]), rec
    per_user = {u: {"jobs": 0, "res": 0.0, "used": 0.0} for u in (alice, bob)}
    for rec in records:
        user, peak = jobs[rec["job_id"]]
        d = rec["end"] - rec["start"]
        per_user[user]["jobs"] += 1
        per_user[user]["res"] += d * rec["mem_granted_mib"] / 1024 / 3600
        per_user[user]["used"] += d * peak / 1024 / 3600
    got = {r["user"]: r for r in _report(db, "--by", "user")["rows"]}
    for user, want in per_user.items():
        assert got[user]["jobs"] == want["jobs"] and got[user]["gpus"] == want["jobs"]
        assert got[user]["mem_gib_hours"] == pytest.approx(want["res"], abs=1e-4)
        assert got[user]["mem_gib_hours_used"] == pytest.approx(want["used"], abs=1e-4)
        assert got[user]["no_mem_data"] == 0
    # the table a person reads names both users
    table = subprocess.run([*CLI, "report", "--db", str(db)], capture_output=True, text=True).stdout
    assert alice in table and bob in table and "TOTAL" in table
    # one user's jobs only
    assert {r["job"] for r in _report(db, "--by", "job", "--user", bob)["rows"]} == {
        j for j, (u, _) in jobs.items() if u == bob}
    # the picture of the same records (the spool may hold earlier sessions' users): one histogram series per user
    from slurm_gpushare.accounting import plot
    from slurm_gpushare.accounting.report import Filters
    from slurm_gpushare.accounting.store import Store

    with Store(db, create=False) as store:
        eff = plot.figure(store, filters=Filters(users=(alice, bob))).axes[1]
    assert [t.get_text() for t in eff.get_legend().get_texts()] == sorted([alice, bob])
    png = tmp_path / "usage.png"
    drawn = subprocess.run([*CLI, "report", "--db", str(db), "--plot", str(png)], capture_output=True, text=True)
    assert drawn.returncode == 0 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", drawn.stderr


def test_a_share_whose_processes_together_pass_it_is_killed_and_its_neighbour_runs_on(cluster, slurm):
    """Issue 27 (b): an MPS limit is per client process, so two processes of 6 GiB each stay under a 10 GiB
    share's limit and together hold 12 GiB. The monitor flags the job, and after node.toml's enforce_grace
    samples kills those processes (enforce = "kill", the default); a neighbour share on the node runs on."""
    app = shlex.quote(str(cluster.fake_gpu_app))
    url = cluster.monitor_url("rtx4090-pcie")
    # the second process starts 8 s after the first: the neighbour, another share on the node, starts meanwhile
    # (Slurm 22.05 puts it on another GPU of the node)
    job = slurm.sbatch("-p", "pcie", "--gres=gpushare:mem=10G",
                       wrap=f"{app} --mem 6G --seconds 600 & p=$!; sleep 8; {app} --mem 6G --seconds 600; wait $p")
    slurm.wait(job, states={"RUNNING"})
    neighbour = slurm.sbatch("-p", "pcie", "--gres=gpushare:mem=4G", wrap=f"{app} --mem 4G --seconds 25")
    slurm.wait(neighbour, states={"RUNNING"})

    def over() -> dict | None:
        fams = scrape_metrics(url)
        mine = [s for s in fams.get("gpushare_job_gpu_over_limit", []) if s.labels["hpc_job"] == job.id]
        return fams if mine and mine[0].value == 1 else None

    flagged = wait_until(over, f"job {job.id} flagged over its share at {url}")
    labels = {s.labels["hpc_job"]: s for s in flagged["gpushare_job_gpu_memory_used_bytes"]}[job.id].labels
    assert labels["mode"] == "mps" and labels["share"] == "shard:10" and labels["Hostname"] == "rtx4090-pcie"
    used = {s.labels["hpc_job"]: s.value for s in flagged["gpushare_job_gpu_memory_used_bytes"]}
    reserved = {s.labels["hpc_job"]: s.value for s in flagged["gpushare_job_gpu_memory_reserved_bytes"]}
    procs = {s.labels["hpc_job"]: s.value for s in flagged["gpushare_job_gpu_processes"]}
    assert (used[job.id], reserved[job.id], procs[job.id]) == (12 << 30, 10 << 30, 2)
    gpu = labels["gpu"]
    # its processes are killed (its script's wait returns: the job fails) long before their 600 s
    done = slurm.wait(job)
    assert done.state == "FAILED", done.fields
    note = done.fields["AdminComment"]
    assert f"gpushare: GPU {gpu} of rtx4090-pcie: its 2 process(es) there held 12288 MiB together, its share is " \
           "10240 MiB; the monitor killed 2 of its process(es) there" in note, note
    kills = [s.value for s in scrape_metrics(url)["gpushare_monitor_enforcements_total"]
             if s.labels["action"] == "kill"]
    assert kills and kills[0] >= 1
    # the neighbour was not touched
    assert slurm.show_job(neighbour.id)["JobState"] == "RUNNING"
    assert slurm.wait(neighbour).state == "COMPLETED"
    assert "gpushare: GPU" not in (slurm.show_job(neighbour.id).get("AdminComment") or "")
    # once the job is gone its series go too
    wait_until(lambda: not [s for s in scrape_metrics(url).get("gpushare_job_gpu_over_limit", [])
                            if s.labels["hpc_job"] == job.id], f"job {job.id}'s series gone after it ended")


def _alice_beside_bob(cluster, slurm, users, wrap: str) -> tuple[Job, str, str]:
    """alice's 10G share running ``wrap`` and bob's 4G share (an app of 2 GiB for 20 s) beside it on rtx4090-pcie;
    waits for alice's job. Returns her ended job, its output and bob's job id."""
    (alice, bob), out, submitted = users
    app = shlex.quote(str(cluster.fake_gpu_app))
    job = _submit_as(cluster, alice, out, "-p", "pcie", "--gres=gpushare:mem=10G", wrap=wrap)
    neighbour = _submit_as(cluster, bob, out, "-p", "pcie", "--gres=gpushare:mem=4G",
                           wrap=f"{app} --mem 2G --seconds 20")
    submitted.extend([job, neighbour])
    return slurm.wait(Job(job)), (out / f"job-{job}.out").read_text(), neighbour


def _untouched(slurm, neighbour: str) -> None:
    assert slurm.wait(Job(neighbour)).state == "COMPLETED"
    assert "gpushare: GPU" not in (slurm.show_job(neighbour).get("AdminComment") or "")


def test_a_share_that_raises_its_own_daemons_limit_is_killed_and_its_daemon_set_back(cluster, slurm, users):
    """Issue 27 (c), as two unprivileged users: alice's MPS control daemon runs as alice, who tells it
    ``set_device_pinned_mem_limit <server> 0 80G``. The monitor reads the daemon's settings back every
    mps_check_interval (2 s on the dev cluster); found changed twice in a row, alice's processes on her GPU are
    killed (enforce = "kill") and her daemon is set back to the share; bob's share on the node runs on."""
    app = shlex.quote(str(cluster.fake_gpu_app))
    ctl = shlex.quote(str(cluster.mps_control))
    done, text, neighbour = _alice_beside_bob(cluster, slurm, users, wrap=(
        f"echo start_server -uid $(id -u) | {ctl}; s=$(echo get_server_list | {ctl}); "
        f"echo set_device_pinned_mem_limit $s 0 80G | {ctl}; echo server $s; exec {app} --mem 3G --seconds 600"))
    assert done.state == "FAILED", (done.fields, text)  # its app was killed long before its 600 s
    server = re.search(r"server (\d+)", text).group(1)
    note = done.fields["AdminComment"]
    assert re.search(rf"gpushare: GPU \d of rtx4090-pcie: get_device_pinned_mem_limit {server} 0 shows '80G', set "
                     rf"'set_device_pinned_mem_limit {server} 0 10G'; the monitor killed 1 of its process\(es\) "
                     r"there \(pid \d+\); its MPS daemon's settings were set back\.", note), note
    _untouched(slurm, neighbour)


def test_a_share_s_process_that_leaves_mps_is_killed_and_the_rest_of_the_job_runs_on(cluster, slurm, users):
    """Issue 27 (a), as two unprivileged users: one of alice's processes unsets CUDA_MPS_PIPE_DIRECTORY, so it runs
    a CUDA context of its own on the shared GPU, with no MPS limit, though within her share. After enforce_grace
    samples the monitor kills that process, only it: her MPS client runs on and the job completes; bob's share on
    the GPU is untouched."""
    app = shlex.quote(str(cluster.fake_gpu_app))
    done, text, neighbour = _alice_beside_bob(cluster, slurm, users, wrap=(
        f"{app} --mem 1G --seconds 20 & env -u CUDA_MPS_PIPE_DIRECTORY {app} --mem 2G --seconds 600; "
        "echo outside=$?; wait $!; echo client=$?"))
    assert done.state == "COMPLETED" and "outside=137" in text and "client=0" in text, (done.fields, text)
    note = done.fields["AdminComment"]
    assert re.search(r"gpushare: GPU \d of rtx4090-pcie: its process\(es\) \d+ ran outside MPS there \(a CUDA "
                     r"context of their own: no MPS memory or SM limit\); the monitor killed 1 of its process\(es\) "
                     r"there \(pid \d+\)\.", note), note
    _untouched(slurm, neighbour)


def test_monitor_puts_the_usage_summary_into_a_running_jobs_admin_comment(cluster, slurm, tmp_path):
    app = shlex.quote(str(cluster.fake_gpu_app))
    job = slurm.sbatch("-p", "pcie", "--gres=gpushare:mem=10G", wrap=f"{app} --mem 3G --sm 30 --seconds 30")
    slurm.wait(job, states={"RUNNING"})
    node = "rtx4090-pcie"
    # the SM mean may include a sample taken before the app started (0 %, the share was idle); the peaks are exact
    want = re.compile(rf"\[gpushare-usage:v1 node={node} mode=mps gpus=1 peak=3072/10240MiB sm=[0-9.]+/30\.0\]$")
    push_usage_summary(cluster, slurm, job.id, node, tmp_path, want)
    ac = slurm.show_job(job.id)["AdminComment"]
    assert ac.startswith("[gpushare:v1 ") and want.search(ac), ac  # the request audit is kept
    slurm.run(["scancel", job.id])
    done = slurm.wait(job)
    assert want.search(done.fields["AdminComment"])  # slurmctld keeps it after the job ends


@pytest.mark.parametrize("request_args, gpus", [(("--gres=gpu:2",), 2), (("--gpus=2",), 2),
                                                (("--gpus-per-node=1",), 1)])
def test_gres_gpus_and_gpus_per_node_are_all_recorded_with_their_use(cluster, slurm, tmp_path, request_args, gpus):
    app = shlex.quote(str(cluster.fake_gpu_app))
    job = slurm.wait(slurm.sbatch("-p", "pcie", *request_args, wrap=f"{app} --mem 5G --sm 50 --seconds 3"))
    assert job.state == "COMPLETED", job.fields
    rows = _ingest_until(cluster, tmp_path / "acct.db", {job.id})
    r = rows[job.id]
    assert (r["mode"], r["gpus"], r["mem_peak_mib"], r["mem_asked_mib"]) == ("gpu", gpus, 5120, None), r
    assert r["sm_mean_pct"] is not None and 0 < r["sm_mean_pct"] <= 50  # measured, averaged over the GPUs
    records = _spooled(cluster, {job.id})
    assert len(records) == gpus and all(rec["gpu_uuid"].startswith("GPU-") for rec in records)
    assert {rec["submit"] for rec in records} == {slurm_epoch(job.fields["SubmitTime"])}, records  # issue 26 item 6
