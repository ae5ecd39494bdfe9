"""The node path on the real dev cluster: slurmd runs the Prolog/TaskProlog/Epilog hooks, which start
and stop each job's MPS control daemon (the test stand-in) with the job's limits."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slurm_gpushare_dev.cluster import pid_alive
from tests.conftest import Job, wait_until

pytestmark = pytest.mark.slurm

PROBE = ('env | grep -E "^(CUDA_|SLURM_SHARDS)" | sort; echo "PID=$(cat $CUDA_MPS_PIPE_DIRECTORY/'
         'nvidia-cuda-mps-control.pid)"; cat "$CUDA_MPS_LOG_DIRECTORY/commands.jsonl"')


def _jobs_dir(cluster, node):
    return cluster.root / "run" / "gpushare" / node / "jobs"


def _wait_cleaned(jobdir: Path, pids: list[int]) -> None:
    """Wait until the Epilog removed the job's directory and every one of ``pids`` is gone."""
    wait_until(lambda: not jobdir.exists() and not any(pid_alive(p) for p in pids),
               f"the Epilog to remove {jobdir} and stop pids {pids}",
               describe=lambda: f"directory there: {jobdir.exists()}, alive: {[p for p in pids if pid_alive(p)]}")


def _prolog_state(cluster, slurm, job, node: str) -> dict:
    """The job's state.json once its Prolog has finished (slurmctld says so: :meth:`SlurmSession.wait_started`)."""
    slurm.wait_started(job)
    state = _jobs_dir(cluster, node) / job.id / "state.json"
    assert state.exists(), f"the Prolog of job {job.id} finished without writing {state}"
    return json.loads(state.read_text())


def _env_and_commands(output: str):
    env = dict(line.split("=", 1) for line in output.splitlines() if "=" in line and not line.startswith("{"))
    commands = [json.loads(line) for line in output.splitlines() if line.startswith("{")]
    return env, commands


def test_mps_job_gets_its_limits_and_leaves_nothing_behind(cluster, slurm):
    job = slurm.wait(slurm.sbatch("-p", "pcie", "--gres=gpushare:mem=10G+sm=25", wrap=PROBE))
    assert job.state == "COMPLETED", (job.fields, job.output())
    env, commands = _env_and_commands(job.output())
    jobdir = _jobs_dir(cluster, "rtx4090-pcie") / job.id
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == str(jobdir / "mps" / "pipe")
    assert env["CUDA_MPS_LOG_DIRECTORY"] == str(jobdir / "mps" / "log")
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=10G"
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    assert re.fullmatch(r"GPU-[0-9a-f-]{36}", env["CUDA_VISIBLE_DEVICES"])
    assert env["SLURM_SHARDS_ON_NODE"] == "10"
    received = [(c["command"], c["args"]) for c in commands]
    assert ("set_default_device_pinned_mem_limit", ["0", "10G"]) in received
    assert ("set_default_active_thread_percentage", ["25"]) in received
    assert all(c["cuda_visible_devices"] == env["CUDA_VISIBLE_DEVICES"] for c in commands)
    # after the job: the daemon is gone and its directories removed (the Epilog ran)
    pid = int(env["PID"])
    _wait_cleaned(jobdir, [pid])


def test_mig_job_sees_its_mig_device_and_no_mps(cluster, slurm):
    job = slurm.wait(slurm.sbatch("--gres=gpushare:mem=10G", wrap='env | grep -E "^CUDA_" | sort'))
    assert job.fields["NodeList"] == "h100-mig"
    env, _ = _env_and_commands(job.output())
    assert re.fullmatch(r"MIG-[0-9a-f-]{36}", env["CUDA_VISIBLE_DEVICES"]), job.output()
    assert not any(k.startswith("CUDA_MPS_") for k in env)


def test_twenty_concurrent_10g_jobs_on_one_node(cluster, slurm):
    jobs = [slurm.sbatch("-w", "a100-nvb", "-p", "nomig", "--gres=gpushare:mem=10G",
                         wrap='echo "PID=$(cat $CUDA_MPS_PIPE_DIRECTORY/nvidia-cuda-mps-control.pid)"; sleep 2')
            for _ in range(20)]
    pids = []
    slurm.wait_all(jobs, timeout=300)
    for job in jobs:
        assert job.state == "COMPLETED", (job.id, job.fields.get("Reason"), job.output())
        pids.append(int(job.output().split("PID=")[1].split()[0]))
    assert len(set(pids)) == 20  # one daemon per job
    jobs_dir = _jobs_dir(cluster, "a100-nvb")
    wait_until(lambda: not any(jobs_dir.iterdir()) and not any(pid_alive(p) for p in pids),
               "every Epilog of the 20 jobs done", describe=lambda: (list(jobs_dir.iterdir()),
                                                                     [p for p in pids if pid_alive(p)]))
    assert [p for p in pids if pid_alive(p)] == []  # no daemon leaked
    assert list(jobs_dir.iterdir()) == []  # every Epilog ran: no job directory, no lock file left
    state = slurm.run(["sinfo", "-h", "-n", "a100-nvb", "-o", "%T"]).stdout.strip()
    assert state in ("idle", "mixed"), state


def test_daemon_killed_mid_job_is_restarted_by_doctor_and_cleaned_by_the_epilog(cluster, slurm):
    job = slurm.sbatch("-p", "pcie", "--gres=gpushare:mem=5G", wrap="sleep 300")
    assert _prolog_state(cluster, slurm, job, "rtx4090-pcie")["phase"] == "ready"
    jobdir = _jobs_dir(cluster, "rtx4090-pcie") / job.id
    pidfile = jobdir / "mps" / "pipe" / "nvidia-cuda-mps-control.pid"
    first = int(pidfile.read_text())
    os.kill(first, signal.SIGKILL)
    doctor = [sys.executable, "-m", "slurm_gpushare", "doctor", "--node", "rtx4090-pcie",
              "--config", str(cluster.node_config)]
    env = {**cluster.env, "GPUSHARE_NVML": f"fake:{cluster.root}/machines/rtx4090-pcie.json"}
    report = subprocess.run(doctor, env=env, capture_output=True, text=True)
    assert report.returncode == 1 and f"MPS daemon of running job {job.id} is not running" in report.stdout
    fixed = subprocess.run([*doctor, "--repair"], env=env, capture_output=True, text=True)
    assert fixed.returncode == 0 and "restarted it with the job's limits" in fixed.stdout, fixed.stdout + fixed.stderr
    second = int(pidfile.read_text())
    assert second != first and pid_alive(second)
    slurm.run(["scancel", job.id])
    slurm.wait(job)
    _wait_cleaned(jobdir, [second])


def test_daemon_ignoring_quit_is_killed_and_the_node_stays_up(cluster, slurm):
    cluster.fake_mps_mode_file.write_text("ignore-quit")
    try:
        job = slurm.wait(slurm.sbatch("-p", "pcie", "--gres=gpushare:mem=5G",
                                      wrap='echo "PID=$(cat $CUDA_MPS_PIPE_DIRECTORY/nvidia-cuda-mps-control.pid)"'))
    finally:
        cluster.fake_mps_mode_file.unlink()
    pid = int(job.output().split("PID=")[1].split()[0])
    jobdir = _jobs_dir(cluster, "rtx4090-pcie") / job.id
    _wait_cleaned(jobdir, [pid])
    state = slurm.run(["sinfo", "-h", "-n", "rtx4090-pcie", "-o", "%T"]).stdout.strip()
    assert state in ("idle", "mixed"), state


def test_daemon_that_cannot_start_fails_the_job_not_the_node(cluster, slurm):
    # the job's MPS daemon runs as its user, who can kill it: its failure cancels the job, nothing drains
    cluster.fake_mps_mode_file.write_text("crash-on-start")
    try:
        job = slurm.wait(slurm.sbatch("-p", "pcie", "--gres=gpushare:mem=5G", wrap="true"))
        assert job.state == "CANCELLED", job.fields
        # the user reads why (issue 26 N11): the Prolog's reason after the audit in AdminComment
        shown = slurm.run(["scontrol", "show", "job", job.id]).stdout
        assert "gpushare: cancelled by the Prolog on rtx4090-pcie: MPS control daemon" in shown, shown
        node = slurm.run(["scontrol", "show", "node", "rtx4090-pcie"]).stdout
        assert "DRAIN" not in node, node
    finally:
        cluster.fake_mps_mode_file.unlink(missing_ok=True)
        slurm.run(["scancel", job.id], check=False)
        _resume_until_in_service(slurm, "rtx4090-pcie")


def _resume_until_in_service(slurm, node: str) -> None:
    """Resume ``node`` until it stays in service (2 s in a row): slurmd's own report of a hook failure can reach
    slurmctld after a resume and drain the node again."""
    since: list[float] = []

    def in_service() -> bool:
        st = slurm.run(["sinfo", "-h", "-n", node, "-o", "%T"]).stdout.strip()
        if st not in ("idle", "mixed"):
            since.clear()
            if st.startswith("drain"):
                slurm.run(["scontrol", "update", f"nodename={node}", "state=resume"], check=False)
            return False
        since[:] = since or [time.monotonic()]
        return time.monotonic() - since[0] >= 2.0

    wait_until(in_service, f"{node} in service again")


def _reason(slurm, node: str) -> str:
    return slurm.run(["sinfo", "-h", "-n", node, "-o", "%E"]).stdout.strip()


@pytest.mark.parametrize("hook", ["prolog", "epilog"])
def test_a_node_config_typo_drains_with_a_gpushare_reason(cluster, slurm, hook):
    """An administrator's typo in node.toml: the node drained with Slurm's generic "Prolog error" / "Epilog error",
    the reason only in slurmd's log (issue 26 D14). The drain reason now names the product and the fault."""
    conf = cluster.node_config
    good = conf.read_text()
    job = None
    try:
        if hook == "prolog":
            conf.write_text('mps_controll = "typo"\n' + good)
            job = slurm.sbatch("-w", "rtx4090-pcie", "-p", "pcie", "--gres=gpu:1", wrap="true")
        else:
            job = slurm.sbatch("-w", "rtx4090-pcie", "-p", "pcie", "--gres=gpu:1", wrap="sleep 3")
            slurm.wait_started(job)
            conf.write_text('mps_controll = "typo"\n' + good)
        wait_until(lambda: _reason(slurm, "rtx4090-pcie") not in ("", "none"), "rtx4090-pcie drained")
        reason = _reason(slurm, "rtx4090-pcie")
        # after a failed Prolog slurmd runs the Epilog, which fails on the same file and names it too
        assert reason.startswith(("gpushare prolog: node config", "gpushare epilog: node config")), reason
        assert "mps_controll" in reason, reason
    finally:
        conf.write_text(good)
        if job is not None:
            slurm.run(["scancel", job.id], check=False)
        _resume_until_in_service(slurm, "rtx4090-pcie")


def test_epilogs_spool_records_that_ingest_and_report_show(cluster, slurm, tmp_path):
    mps = slurm.wait(slurm.sbatch("-p", "pcie", "--gres=gpushare:mem=10G", wrap="true"))
    whole = slurm.wait(slurm.sbatch("-p", "pcie", "--gres=gpu:2", wrap="true"))
    assert mps.state == whole.state == "COMPLETED"
    db = tmp_path / "acct.db"
    cli = [sys.executable, "-m", "slurm_gpushare"]
    rows = {}

    def ingested() -> bool:
        nonlocal rows
        ingest = subprocess.run([*cli, "accounting", "ingest", "--spool", str(cluster.accounting_spool),
                                 "--db", str(db)], capture_output=True, text=True)
        assert ingest.returncode == 0, ingest.stdout + ingest.stderr
        out = subprocess.run([*cli, "report", "--db", str(db), "--by", "job", "--format", "json"],
                             capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        data = json.loads(out.stdout)
        rows = {str(r["job"]): r for r in data["rows"]}
        return {mps.id, whole.id} <= set(rows)

    wait_until(ingested, f"the records of jobs {mps.id} and {whole.id} in the report", describe=lambda: rows.keys())
    assert mps.id in rows and whole.id in rows, rows.keys()
    assert rows[mps.id]["mode"] == "mps" and rows[whole.id]["mode"] == "gpu"
    assert rows[mps.id]["mem_asked_mib"] == 10240 and rows[mps.id]["mem_granted_mib"] == 10240
    assert rows[whole.id]["gpus"] == 2
    # re-ingesting adds nothing
    again = subprocess.run([*cli, "accounting", "ingest", "--spool", str(cluster.accounting_spool),
                            "--db", str(db)], capture_output=True, text=True)
    assert again.returncode == 0 and re.search(r"ingested 0 record", again.stdout + again.stderr), again.stdout


def test_array_tasks_on_one_node_get_their_own_mig_slices(cluster, slurm):
    # found in a trial: the Prolog of the task whose id is the array's id read another task's GRES
    # (scontrol -d show job <array id> prints every task), and two tasks ran on one MIG slice
    out = Path(cluster.root) / "test-output"
    out.mkdir(parents=True, exist_ok=True)
    # every task runs until the test has seen all three run together (the file ``go`` appears)
    go = out / f"array-go-{time.monotonic_ns()}"
    proc = slurm.run(["sbatch", "--parsable", "--hold", "--array=0-2", "-w", "h100-mig", "--gres=gpushare:mem=10G",
                      f"--output={out}/array-%A_%a.out", "--wrap",
                      f"echo CVD=$CUDA_VISIBLE_DEVICES; until [ -e {go} ]; do sleep 0.2; done"])
    array_id = proc.stdout.strip().split(";")[0]
    slurm.submitted.append(array_id)
    # the task that keeps the array's own id (the last one) starts while the others run, so that
    # `scontrol -d show job <array id>` lists their GRES too
    slurm.run(["scontrol", "release", f"{array_id}_0", f"{array_id}_1"])
    for task in (0, 1):
        slurm.wait(Job(f"{array_id}_{task}"), states={"RUNNING"})
    slurm.run(["scontrol", "release", f"{array_id}_2"])
    slurm.wait_started(Job(f"{array_id}_2"))
    go.touch()
    seen = {}
    for task in range(3):
        job = slurm.wait(Job(f"{array_id}_{task}"))
        assert job.state == "COMPLETED", job.fields
        seen[task] = (out / f"array-{array_id}_{task}.out").read_text().strip()
    assert all(v.startswith("CVD=MIG-") for v in seen.values()), seen
    assert len(set(seen.values())) == 3, seen  # three tasks, three slices


def _gres_idx_and_cpus(slurm, job_id):
    """(GPU indices, CPU ids) of a running job on one node, from ``scontrol -d show job``."""
    text = slurm.run(["scontrol", "-d", "show", "job", job_id]).stdout
    m = re.search(r"CPU_IDs=(\S+).*?GRES=\S*?\(IDX:([0-9,-]*)\)", text)
    cpus_text = m.group(1) if m else re.search(r"CPU_IDs=(\S+)", text).group(1)

    def ids(spec):
        out = []
        for part in filter(None, spec.split(",")):
            lo, _, hi = part.partition("-")
            out.extend(range(int(lo), int(hi or lo) + 1))
        return out
    return (ids(m.group(2)) if m else []), ids(cpus_text)


def test_a_worse_gpu_set_than_was_free_is_written_to_the_node_log(cluster, slurm):
    # slurmd keeps a successful Prolog's output only at SlurmdDebug=debug2 (prep_script_slurmd.c,
    # _run_subpath_command, 22.05.8 / 24.11.5 / 26.05.3): the warning must reach the product's node log.
    # Steer Slurm into a non-NVLink pair on a100-nvb (NVLink pairs 0-2, 1-3, 4-5, 6-7; GPUs 0-3 near
    # cores 0-31): one job per GPU, free GPUs 0, 2 and 4, socket 0's cores taken by a CPU-only job, so the
    # 2-GPU job's core is on socket 1 and Slurm gives 4 and one of 0/2 while the pair 0-2 is free.
    holders = [slurm.sbatch("-w", "a100-nvb", "-p", "nomig", "--gres=gpu:1", wrap="sleep 120") for _ in range(8)]
    for job in holders:
        slurm.wait(job, {"RUNNING"})
    held_cores = []
    for job in holders:
        gpus, cpus = _gres_idx_and_cpus(slurm, job.id)
        if set(gpus) & {0, 2, 4}:
            slurm.run(["scancel", job.id])
            slurm.wait(job)
        else:
            held_cores += cpus
    filler = slurm.sbatch("-w", "a100-nvb", "-p", "nomig", "-c", str(32 - sum(c < 32 for c in held_cores)),
                          wrap="sleep 120")
    slurm.wait(filler, {"RUNNING"})
    job = slurm.sbatch("-w", "a100-nvb", "-p", "nomig", "--gres=gpu:2", wrap="sleep 120")
    run_dir = _jobs_dir(cluster, "a100-nvb").parent
    # wait for the Prolog's end, as slurmctld reports it (state.json is written last)
    placement = _prolog_state(cluster, slurm, job, "a100-nvb")["placement"]
    assert placement["excess"] > 0, placement  # the setup: Slurm's pair is worse than 0-2
    log = (run_dir / "node.log").read_text(errors="replace")
    line = next(line for line in log.splitlines() if f"job {job.id} " in line)
    assert f"a100-nvb prolog: job {job.id} got GPUs {placement['given']} (cost {placement['cost_given']}) " \
           f"while {placement['best']} (cost {placement['cost_best']}) were free" in line, line
    slurm.run(["scancel", job.id, filler.id, *(h.id for h in holders)])
