"""Prolog/Epilog/doctor without Slurm: recorded `scontrol -d show job` text, the fake NVML, the MPS stand-in."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import pytest

from slurm_gpushare.errors import SlurmError
from slurm_gpushare.node.config import NodeConfig
from slurm_gpushare.node.context import HookContext, NodeFault
from slurm_gpushare.node.doctor import doctor
from slurm_gpushare.node.epilog import epilog
from slurm_gpushare.node.jobdir import read_state
from slurm_gpushare.node.mps import remove_tree, unmount_below
from slurm_gpushare.node.prolog import prolog
from slurm_gpushare.node.shared_mps import shared_dir
from slurm_gpushare_dev.cluster import MPS_STANDIN, SITE, packaged_machine, pid_alive
from tests.conftest import DEADLINE, slurm_epoch, wait_until
from tests.jobjson import as_job_json
from tests.security.conftest import USERS, users  # noqa: F401  (the fixture)

SHOW = """\
JobId={job} JobName=wrap
   UserId=root(0) GroupId=root(0) MCS_label=N/A
   JobState=RUNNING Reason=None Dependency=(null)
   Partition=nomig AllocNode:Sid=localhost:1
   NodeList={node}
   JOB_GRES={gres}
     Nodes={node} CPU_IDs=0 Mem=100 GRES={detail}
   AdminComment={ac}
   TresPerNode=gres:{gres}
"""


@pytest.fixture
def node(monkeypatch):
    """A simulated node: run dir and machine description under a short /tmp path, fake NVML."""
    root = Path(tempfile.mkdtemp(prefix="gps-h-", dir="/tmp"))
    (root / "machines").mkdir()
    for name, f in (("a100", "8x-a100-nv12-bridge.json"), ("mig", "4x-h100-mig-mixed.json")):
        (root / "machines" / f"{name}.json").write_text(packaged_machine(f).to_json())
    monkeypatch.setenv("GPUSHARE_NVML", f"fake:{root}/machines/a100.json")
    mode = root / "mps-mode"
    cfg = NodeConfig(run_dir=f"{root}/run/{{node}}", machine=f"{root}/machines/{{node}}.json",
                     mps_control=str(MPS_STANDIN), mps_start_timeout=DEADLINE, mps_quit_timeout=1.0,
                     mps_env=(("GPUSHARE_FAKE_MPS_MODE_FILE", str(mode)),))
    drained: list[tuple[str, str]] = []
    jobs: dict[str, str] = {}
    used: dict[str, str] = {"a100": "GresUsed=gpu:a100:0(IDX:N/A),shard:a100:0(IDX:N/A)"}
    cancelled: list[str] = []
    notes: list[tuple[str, str]] = []
    ctx = HookContext(cfg, "a100", job_record=lambda j: as_job_json(jobs[str(j)], str(j)),
                      drain=lambda n, r: drained.append((n, r)), cancel=cancelled.append,
                      set_admin_comment=lambda j, t: notes.append((j, t)),
                      show_node=lambda n: f"NodeName={n}\n   {used[n]}\n")
    ctx_obj = type("Node", (), {})()
    ctx_obj.root, ctx_obj.ctx, ctx_obj.jobs, ctx_obj.drained, ctx_obj.mode = root, ctx, jobs, drained, mode
    ctx_obj.used, ctx_obj.cancelled, ctx_obj.notes = used, cancelled, notes
    yield ctx_obj
    for d in (root / "run" / "a100" / "jobs").glob("*"):
        if d.is_dir():
            ctx.mps(d.name).stop()
    unmount_below(root)  # MPS directories (tmpfs) a test left mounted
    shutil.rmtree(root, ignore_errors=True)


def _env(job):
    return {"SLURM_JOB_ID": job, "SLURMD_NODENAME": "a100", "SLURM_JOB_GPUS": "0", "CUDA_VISIBLE_DEVICES": "0"}


def _shard_job(n, job="101", idx="0", ac="[gpushare:v1 req=mem=10G+sm=25 grant=gres:shard:10 kind=mps sm=25]"):
    n.jobs[job] = SHOW.format(job=job, node="a100", gres="shard:10", detail=f"shard:10(IDX:{idx})", ac=ac)


def _commands(n, job):
    log = n.ctx.job_dir(job) / "mps" / "log" / "commands.jsonl"
    return [json.loads(line)["command"] + " " + " ".join(json.loads(line)["args"])
            for line in log.read_text(errors="replace").splitlines()]


def test_shard_job_gets_its_own_daemon_limits_and_environment(node):
    _shard_job(node)
    assert prolog(node.ctx, _env("101")) == 0
    jd = node.ctx.job_dir("101")
    env = dict(line[len("export "):].split("=", 1) for line in (jd / "env").read_text().splitlines())
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=10G"
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == str(jd / "mps" / "pipe")
    assert "CUDA_VISIBLE_DEVICES" not in env  # Slurm's per-task value stands, translated by the TaskProlog
    assert re.fullmatch(r" 0=GPU-[0-9a-f-]{36} \n", (jd / "devices").read_text())  # the share's GPU: index 0
    assert "set_default_device_pinned_mem_limit 0 10G" in _commands(node, "101")
    assert "set_default_active_thread_percentage 25" in _commands(node, "101")
    assert oct((jd / "mps" / "pipe").stat().st_mode & 0o777) == "0o700"
    pid = node.ctx.mps("101").pid()
    assert pid and pid_alive(pid)
    assert read_state(jd)["phase"] == "ready"
    assert epilog(node.ctx, _env("101")) == 0
    assert not jd.exists() and not pid_alive(pid)
    assert not list((node.root / "run" / "a100" / "jobs").iterdir())  # no lock file left either
    assert epilog(node.ctx, _env("101")) == 0  # twice is harmless


def test_jobs_without_gpus_cost_nothing(node):
    env = {"SLURM_JOB_ID": "5", "SLURMD_NODENAME": "a100"}
    assert prolog(node.ctx, env) == 0 and not (node.root / "run").exists()


def test_whole_gpu_and_mig_jobs_start_no_daemon(node, monkeypatch):
    node.jobs["6"] = SHOW.format(job="6", node="a100", gres="gpu:a100:1", detail="gpu:a100:1(IDX:3)", ac="")
    assert prolog(node.ctx, _env("6")) == 0  # one GPU: nothing to prepare but the record of the run
    assert sorted(p.name for p in node.ctx.job_dir("6").iterdir()) == ["run.json"]
    assert epilog(node.ctx, _env("6")) == 0 and not node.ctx.job_dir("6").exists()
    node.jobs["7"] = SHOW.format(job="7", node="a100", gres="gpu:a100:2", detail="gpu:a100:2(IDX:0,2)", ac="")
    assert prolog(node.ctx, _env("7")) == 0
    assert not node.ctx.mps("7").alive() and not (node.ctx.job_dir("7") / "mps").exists()
    assert epilog(node.ctx, _env("7")) == 0 and not node.ctx.job_dir("7").exists()
    monkeypatch.setenv("GPUSHARE_NVML", f"fake:{node.root}/machines/mig.json")
    mig = HookContext(node.ctx.config, "mig", job_record=lambda j: as_job_json(node.jobs[str(j)], str(j)),
                      drain=node.ctx.drain)
    # device index 4 is the first 1g.10gb slice (slurmd groups the gpu records by type)
    node.jobs["8"] = SHOW.format(job="8", node="mig", gres="gpu:h100_1g.10gb:1",
                                 detail="gpu:h100_1g.10gb:1(IDX:4)", ac="")
    assert prolog(mig, {**_env("8"), "SLURMD_NODENAME": "mig"}) == 0
    assert (mig.job_dir("8") / "env").read_text() == ""
    assert re.fullmatch(r" 4=MIG-[0-9a-f-]{36} \n", (mig.job_dir("8") / "devices").read_text())
    # the device's own file (its GPU instance's cap, as gres.conf File= names it under node.toml device_dir)
    assert (mig.job_dir("8") / "files").read_text() == " 4=/dev/nvidia-caps/nvidia-cap336 \n"
    assert epilog(mig, {**_env("8"), "SLURMD_NODENAME": "mig"}) == 0 and not mig.job_dir("8").exists()


def test_epilog_after_a_prolog_that_died_half_way(node):
    # the Prolog started the daemon and died before writing the env file and the final state
    _shard_job(node, "102")
    jd = node.ctx.job_dir("102")
    jd.mkdir(parents=True)
    (jd / "state.json").write_text('{"version": 1, "phase": "starting"')  # truncated write
    from slurm_gpushare.node.plan import JobPlan
    d = node.ctx.mps("102", JobPlan("mps", "102", visible_devices="GPU-x"))
    d.start()
    pid = d.pid()
    assert epilog(node.ctx, _env("102")) == 0
    assert not jd.exists() and not pid_alive(pid)


def test_a_retried_prolog_replaces_a_half_started_daemon(node):
    _shard_job(node, "103")
    jd = node.ctx.job_dir("103")
    from slurm_gpushare.node.plan import JobPlan
    jd.mkdir(parents=True)
    stale = node.ctx.mps("103", JobPlan("mps", "103", visible_devices="GPU-x"))
    stale.start()
    old = stale.pid()
    assert prolog(node.ctx, _env("103")) == 0
    new = node.ctx.mps("103").pid()
    assert new != old and not pid_alive(old) and pid_alive(new)
    assert epilog(node.ctx, _env("103")) == 0


def test_daemon_ignoring_quit_is_killed_without_draining(node):
    node.mode.write_text("ignore-quit")
    _shard_job(node, "104")
    assert prolog(node.ctx, _env("104")) == 0
    pid = node.ctx.mps("104").pid()
    assert epilog(node.ctx, _env("104")) == 0
    assert not pid_alive(pid) and node.drained == []


def test_daemon_that_cannot_start_fails_the_job_not_the_node(node, capfd):
    # the daemon runs as the job's user, who can kill it while it starts: the job fails, the node stays up
    node.mode.write_text("crash-on-start")
    _shard_job(node, "105")
    assert prolog(node.ctx, _env("105")) == 0
    assert node.drained == [] and node.cancelled == ["105"]
    assert "job 105 failed, node kept up: MPS control daemon for job 105 failed" in capfd.readouterr().err
    # the hook exits 0: slurmd logs its output only at debug2, so the reason is in the node log too
    log = (node.ctx.run_dir / "node.log").read_text(errors="replace")
    assert " prolog: job 105 failed, node kept up: MPS control daemon" in log
    # issue 26 N11: the user reads why in the job's AdminComment (scontrol show job, sacct -o AdminComment),
    # after the audit already there, not only CANCELLED
    [(job, text)] = node.notes
    assert job == "105" and text.startswith("[gpushare:v1 req=mem=10G+sm=25 grant=gres:shard:10 kind=mps sm=25] ")
    assert "gpushare: cancelled by the Prolog on a100: MPS control daemon for job 105 failed" in text
    assert len(text) < 1000 and text.isprintable()


def test_unreadable_job_record_fails_the_job_not_the_node(node, capfd):
    node.ctx = replace(node.ctx, job_record=lambda j: '{"jobs": [{"job_id": 107, "user_id": "root"}]}')
    assert prolog(node.ctx, _env("107")) == 0
    assert node.drained == [] and node.cancelled == ["107"]
    assert "cannot read job 107 from slurmctld" in capfd.readouterr().err


def test_stale_description_is_a_node_fault_naming_the_fix(node):
    _shard_job(node, "106", idx="9")  # the A100 node has devices 0-7
    with pytest.raises(NodeFault, match="GPU index 9"):
        prolog(node.ctx, _env("106"))
    assert "regenerate" in str(node.drained[0][1]) or "stale" in str(node.drained[0][1])


def test_a_node_fault_is_raised_without_waiting_for_slurmctlds_answer(node):
    """The job record is asked in a thread while the node's devices are read: a node fault found there
    (no machine description) drains at once, even while slurmctld has not answered."""
    import threading
    from dataclasses import replace

    answered, returned = threading.Event(), threading.Event()
    _shard_job(node, "108")
    record = node.ctx.job_record

    def slow(job_id):
        answered.wait(5)  # slurmctld slow to answer
        returned.set()
        return record(job_id)

    (node.root / "machines" / "a100.json").unlink()
    ctx = replace(node.ctx, job_record=slow)
    with pytest.raises(NodeFault, match="no usable machine description"):
        prolog(ctx, _env("108"))
    assert not returned.is_set() and node.drained  # it did not wait for the record
    answered.set()


def test_stuck_daemon_drains_the_node_and_names_it(node):
    _shard_job(node, "107")
    assert prolog(node.ctx, _env("107")) == 0
    pid = node.ctx.mps("107").pid()
    # a daemon stuck in the kernel survives SIGKILL; here: a stop that reports it as a survivor
    class Stuck:
        def stop(self):
            return type("R", (), {"survivors": (pid,)})()

    stuck = HookContext(node.ctx.config, "a100", job_record=node.ctx.job_record, drain=node.ctx.drain)
    object.__setattr__(stuck, "mps", lambda job_id, plan=None: Stuck())
    assert epilog(stuck, _env("107")) == 1
    assert f"pid {pid}" in node.drained[-1][1] and "job 107" in node.drained[-1][1]
    assert node.ctx.job_dir("107").exists()  # kept for doctor; nothing hidden
    assert epilog(node.ctx, _env("107")) == 0  # the real stop kills it


def test_doctor_restarts_a_dead_daemon_and_removes_leftovers(node):
    _shard_job(node, "108")
    _shard_job(node, "109")
    assert prolog(node.ctx, _env("108")) == 0 and prolog(node.ctx, _env("109")) == 0
    dead = node.ctx.mps("108").pid()
    os.kill(dead, signal.SIGKILL)
    wait_until(lambda: not pid_alive(dead), f"the killed daemon {dead} gone")
    leftover = node.ctx.mps("109").pid()
    report = doctor(node.ctx, repair=False, running_jobs={"108"})
    assert sorted(f.job_id for f in report) == ["108", "109"] and node.ctx.job_dir("109").exists()
    fixed = doctor(node.ctx, repair=True, running_jobs={"108"})
    assert {f.job_id: f.action for f in fixed}["108"] == "restarted it with the job's limits"
    assert node.ctx.mps("108").alive() and not pid_alive(leftover) and not node.ctx.job_dir("109").exists()
    assert "set_default_device_pinned_mem_limit 0 10G" in _commands(node, "108")
    assert doctor(node.ctx, repair=True, running_jobs={"108"}) == []
    assert epilog(node.ctx, _env("108")) == 0


def test_taskprolog_prints_the_env_file(node, tmp_path):
    _shard_job(node, "110")
    assert prolog(node.ctx, _env("110")) == 0
    script = tmp_path / "tp.sh"
    shipped = (SITE / "taskprolog.sh").read_text()
    script.write_text(shipped.replace('RUN_DIR="/run/slurm-gpushare"', f'RUN_DIR="{node.root}/run/{{node}}"'))
    uuid = (node.ctx.job_dir("110") / "devices").read_text().split("=")[1].strip()
    task = {"SLURM_JOB_ID": "110", "SLURMD_NODENAME": "a100", "SLURM_JOB_GPUS": "0", "CUDA_VISIBLE_DEVICES": "0"}
    out = subprocess.run(["sh", str(script)], env=task, capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout == (f"export CUDA_VISIBLE_DEVICES={uuid}\n"
                                                  + (node.ctx.job_dir("110") / "env").read_text())
    # a step's task without the share's GPU: no GPU variable, and the MPS variables it inherited are unset
    inherited = dict(line[len("export "):].split("=", 1)
                     for line in (node.ctx.job_dir("110") / "env").read_text().splitlines())
    step = subprocess.run(["sh", str(script)], env={**task, "CUDA_VISIBLE_DEVICES": "", "SLURM_STEP_ID": "1",
                                                    **inherited}, capture_output=True, text=True)
    assert sorted(step.stdout.splitlines()) == sorted(f"unset {k}" for k in inherited)
    none = subprocess.run(["sh", str(script)], env={"SLURM_JOB_ID": "999", "SLURMD_NODENAME": "a100"},
                          capture_output=True, text=True)
    assert none.returncode == 0 and none.stdout == ""
    assert epilog(node.ctx, _env("110")) == 0


def test_taskprolog_keeps_a_device_slurm_already_names_by_uuid(tmp_path):
    """With AutoDetect=nvml Slurm gives each MIG device a UniqueId and prints it in CUDA_VISIBLE_DEVICES
    instead of the index (common_gres_set_env, gres_common.c); under task/cgroup a --gpus-per-task task then
    holds its own MIG UUID while SLURM_STEP_GPUS names the step's first device. Slurm's UUID is kept: the
    table translates indices only."""
    script = tmp_path / "tp.sh"
    shipped = (SITE / "taskprolog.sh").read_text()
    script.write_text(shipped.replace('RUN_DIR="/run/slurm-gpushare"', f'RUN_DIR="{tmp_path}/run"'))
    job = tmp_path / "run" / "jobs" / "120"
    job.mkdir(parents=True)
    (job / "devices").write_text(" 2=MIG-aaa 3=MIG-bbb \n")

    def task(**env):
        out = subprocess.run(["sh", str(script)], env={"SLURM_JOB_ID": "120", "SLURM_STEP_ID": "0", **env},
                             capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        return out.stdout

    # task 1 of a --gpus-per-task=1 step under task/cgroup: its own device, the step's first id
    assert task(SLURM_STEP_GPUS="2", CUDA_VISIBLE_DEVICES="MIG-bbb") == "export CUDA_VISIBLE_DEVICES=MIG-bbb\n"
    assert task(SLURM_STEP_GPUS="0,3", CUDA_VISIBLE_DEVICES="0,MIG-bbb") == "export CUDA_VISIBLE_DEVICES=0,MIG-bbb\n"
    # indices (a static gres.conf: no UniqueId) are translated as before
    assert task(SLURM_STEP_GPUS="2,3", CUDA_VISIBLE_DEVICES="2,3") == "export CUDA_VISIBLE_DEVICES=MIG-aaa,MIG-bbb\n"


def test_taskprolog_finds_a_confined_tasks_own_mig_devices_by_the_files_it_may_open(users):  # noqa: F811
    """Under task/cgroup with ConstrainDevices=yes slurmstepd names the step's first device in every task's
    SLURM_STEP_GPUS of a --gpus-per-task step and lets each task open only its own (measured on 22.05 to 26.05,
    tests/test_task_devices_slurm.py). The TaskProlog then takes the job's devices the task may open (test -r;
    here file modes stand in for the device cgroup: the script runs as a real unprivileged user), when they are
    as many as Slurm named; elsewhere Slurm's names stand."""
    tmp_path = Path(tempfile.mkdtemp(prefix="gps-tpf-", dir="/tmp"))  # a path the user can walk
    os.chmod(tmp_path, 0o755)
    script = tmp_path / "tp.sh"
    script.write_text((SITE / "taskprolog.sh").read_text().replace('RUN_DIR="/run/slurm-gpushare"',
                                                                   f'RUN_DIR="{tmp_path}/run"'))
    os.chmod(script, 0o755)
    devs = tmp_path / "dev"
    devs.mkdir(mode=0o755)
    for name in ("nvidia1", "cap4", "cap5", "cap6"):
        (devs / name).write_text("")
    job = tmp_path / "run" / "jobs" / "130"
    job.mkdir(parents=True)
    for d in (tmp_path / "run", tmp_path / "run" / "jobs", job):
        os.chmod(d, 0o755)
    (job / "devices").write_text(" 4=MIG-four 5=MIG-five 6=MIG-six \n")
    (job / "files").write_text(f" 1={devs}/nvidia1 4={devs}/cap4 5={devs}/cap5 6={devs}/cap6 \n")
    for f in ("devices", "files"):
        os.chmod(job / f, 0o644)

    def task(open_: tuple[str, ...], **env: str) -> str:
        for name in ("nvidia1", "cap4", "cap5", "cap6"):
            os.chmod(devs / name, 0o644 if name in open_ else 0o600)
        out = subprocess.run(["runuser", "-u", USERS[0], "--", "sh", str(script)],
                             env={"PATH": os.environ["PATH"], "SLURM_JOB_ID": "130", "SLURM_STEP_ID": "0", **env},
                             capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        return out.stdout

    # the second task of a --gpus-per-task=1 step: Slurm names device 4, the task may open only device 5
    assert task(("cap5",), SLURM_STEP_GPUS="4", CUDA_VISIBLE_DEVICES="0") == "export CUDA_VISIBLE_DEVICES=MIG-five\n"
    assert task(("cap4",), SLURM_STEP_GPUS="4", CUDA_VISIBLE_DEVICES="0") == "export CUDA_VISIBLE_DEVICES=MIG-four\n"
    # a mixed job's task that holds the MIG device while Slurm names the whole GPU 1
    assert task(("cap6",), SLURM_STEP_GPUS="1", CUDA_VISIBLE_DEVICES="0") == "export CUDA_VISIBLE_DEVICES=MIG-six\n"
    # ... and the task that holds the whole GPU keeps Slurm's value
    assert task(("nvidia1",), SLURM_STEP_GPUS="1", CUDA_VISIBLE_DEVICES="0") == ""
    # the task may open every device Slurm named (task/none, or the step's names are its own): Slurm's names
    everything = ("nvidia1", "cap4", "cap5", "cap6")
    assert task(everything, SLURM_STEP_GPUS="4,5", CUDA_VISIBLE_DEVICES="4,5") == (
        "export CUDA_VISIBLE_DEVICES=MIG-four,MIG-five\n")
    # it may open none of them (device files the user cannot read: a site's 0660 video group): Slurm's names
    assert task((), SLURM_STEP_GPUS="5", CUDA_VISIBLE_DEVICES="5") == "export CUDA_VISIBLE_DEVICES=MIG-five\n"
    # as many openable as named, but not the named ones, two of them: index order
    assert task(("cap5", "cap6"), SLURM_STEP_GPUS="4,5", CUDA_VISIBLE_DEVICES="0,1") == (
        "export CUDA_VISIBLE_DEVICES=MIG-five,MIG-six\n")
    shutil.rmtree(tmp_path)


def test_taskprolog_applies_the_ring_only_where_the_task_sees_every_gpu_and_no_binding_was_asked(node, tmp_path):
    node.jobs["111"] = SHOW.format(job="111", node="a100", gres="gpu:a100:2", detail="gpu:a100:2(IDX:0,2)",
                                   ac=GPUSHARE_AC)
    node.ctx = replace(node.ctx, config=replace(node.ctx.config, task_notes=True))  # a site that asks for notes
    assert prolog(node.ctx, _env("111")) == 0
    jd = node.ctx.job_dir("111")
    script = tmp_path / "tp.sh"
    script.write_text((SITE / "taskprolog.sh").read_text().replace(
        'RUN_DIR="/run/slurm-gpushare"', f'RUN_DIR="{node.root}/run/{{node}}"'))

    def task(**env: str) -> list[str]:
        base = {"SLURM_JOB_ID": "111", "SLURMD_NODENAME": "a100", "SLURM_LOCALID": "0", "SLURM_GTIDS": "0,1"}
        out = subprocess.run(["sh", str(script)], env={**base, **env}, capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        return out.stdout.splitlines()

    ring = (jd / "ring.2").read_text().splitlines()
    # Slurm gave the task both GPUs (ConstrainDevices numbers them 0,1): the ring, rank 0's hints, the note
    lines = task(CUDA_VISIBLE_DEVICES="0,1", SLURM_STEP_ID="0")
    assert lines[:3] == ring and lines[3:-1] == (jd / "task.2.0").read_text().splitlines()
    assert lines[-1].startswith("print slurm-gpushare: CUDA_VISIBLE_DEVICES names GPUs") and \
        lines[-1].endswith("Slurm set CUDA_VISIBLE_DEVICES=0,1")
    assert "print" not in " ".join(task(CUDA_VISIBLE_DEVICES="0,1", SLURM_LOCALID="1"))  # rank 0 says it once
    # a binding asked (per release: SLURM_GPU_BIND / SLURM_GPUS_PER_TASK on 22.05, SLURM_TRES_* later), or a
    # task Slurm gave one GPU: Slurm's value stands
    for asked in ({"SLURM_GPU_BIND": "none"}, {"SLURM_TRES_BIND": "gres/gpu:single:1"},
                  {"SLURM_GPUS_PER_TASK": "1"}, {"SLURM_TRES_PER_TASK": "gres/gpu:1"},
                  {"GPUSHARE_KEEP_GPU_ORDER": "1"}, {}):
        assert task(CUDA_VISIBLE_DEVICES="0,1" if asked else "0", **asked) == []
    assert task(CUDA_VISIBLE_DEVICES="0,1", SLURM_TRES_PER_TASK="cpu=4") == lines  # CPUs only: no GPU binding
    # a step's task inherits what the batch step's TaskProlog exported: those values are unset first
    inherited = dict(line[len("export "):].split("=", 1)
                     for line in ring + (jd / "task.1.0").read_text().splitlines())
    bound = task(**{**inherited, "CUDA_VISIBLE_DEVICES": "0", "SLURM_STEP_ID": "1", "SLURM_GTIDS": "0"})
    assert sorted(bound) == sorted(f"unset {k}" for k in inherited if k != "CUDA_VISIBLE_DEVICES")
    assert epilog(node.ctx, _env("111")) == 0


@pytest.fixture
def shared(node):
    from dataclasses import replace
    node.ctx = replace(node.ctx, config=replace(node.ctx.config, mps_mode="per-gpu"))
    return node


def test_a_shared_daemon_that_cannot_start_fails_the_job_not_the_node(shared, capfd):
    # the per-GPU daemon runs as the jobs' user too, who can kill it: that user's job fails, the node stays up
    shared.mode.write_text("crash-on-start")
    _shard_job(shared, "205")
    assert prolog(shared.ctx, _env("205")) == 0
    assert shared.drained == [] and shared.cancelled == ["205"]
    assert "job 205 failed, node kept up: shared MPS control daemon" in capfd.readouterr().err


def test_per_gpu_mode_shares_one_daemon_per_gpu_and_user(shared):
    n = shared
    _shard_job(n, "201", ac="[gpushare:v1 req=mem=10G grant=gres:shard:10 kind=mps]")
    n.jobs["202"] = SHOW.format(job="202", node="a100", gres="shard:30", detail="shard:30(IDX:0)",
                                ac="[gpushare:v1 req=mem=30G grant=gres:shard:30 kind=mps]")
    assert prolog(n.ctx, _env("201")) == 0 and prolog(n.ctx, _env("202")) == 0
    d = shared_dir(n.ctx, 0, 0)
    daemon = n.ctx.mps("-", base=d)
    pid = daemon.pid()
    env1 = (n.ctx.job_dir("201") / "env").read_text()
    env2 = (n.ctx.job_dir("202") / "env").read_text()
    assert f"CUDA_MPS_PIPE_DIRECTORY={d / 'pipe'}" in env1 and f"CUDA_MPS_PIPE_DIRECTORY={d / 'pipe'}" in env2
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=10G" in env1 and "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=30G" in env2
    commands = [json.loads(line) for line in (d / "log" / "commands.jsonl").read_text().splitlines()]
    # the server-side default is raised to the largest share when the second job joins
    assert [c["args"] for c in commands if c["command"] == "set_default_device_pinned_mem_limit"] == [
        ["0", "10G"], ["0", "30G"]]
    # ... and so is the server already running (read back)
    (server,) = daemon.server_pids()
    assert daemon.command(f"get_device_pinned_mem_limit {server} 0") == "30G"
    assert epilog(n.ctx, _env("201")) == 0
    assert pid_alive(pid) and json.loads((d / "jobs.json").read_text()) == {
        "202": {"mem_limit_mib": 30720, "sm_percent": None}}
    assert epilog(n.ctx, _env("202")) == 0
    assert not pid_alive(pid) and not d.exists()


def test_doctor_cleans_a_shared_daemon_of_jobs_gone_and_resets_compute_modes(shared):
    from slurm_gpushare.hardware.fake import FakeNvml
    n = shared
    _shard_job(n, "203")
    assert prolog(n.ctx, _env("203")) == 0
    d = shared_dir(n.ctx, 0, 0)
    pid = n.ctx.mps("-", base=d).pid()
    fake = FakeNvml(packaged_machine("8x-a100-nv12-bridge.json"))
    with fake:
        fake.set_compute_mode(3, "EXCLUSIVE_PROCESS")
    report = doctor(n.ctx, repair=False, running_jobs=set(), port=fake)
    assert {f.problem for f in report} >= {"GPU 3 is in compute mode EXCLUSIVE_PROCESS",
                                           "shared MPS daemon gpu0-uid0 lists jobs not running here"}
    doctor(n.ctx, repair=True, running_jobs=set(), port=fake)
    with fake:
        assert fake.compute_mode(3) == "DEFAULT"
    assert not pid_alive(pid) and not d.exists()


def test_low_priority_partition_sets_the_mps_client_priority(node):
    from dataclasses import replace
    ctx = HookContext(replace(node.ctx.config, low_priority_partitions=("nomig",)), "a100",
                      job_record=node.ctx.job_record, drain=node.ctx.drain)
    _shard_job(node, "301")  # the recorded job is in partition nomig
    assert prolog(ctx, _env("301")) == 0
    assert "export CUDA_MPS_CLIENT_PRIORITY=1\n" in (ctx.job_dir("301") / "env").read_text()
    assert "set_default_client_priority 1" in _commands(node, "301")
    assert epilog(ctx, _env("301")) == 0
    _shard_job(node, "302")
    assert prolog(node.ctx, _env("302")) == 0  # default: no priority set
    assert "CLIENT_PRIORITY" not in (node.ctx.job_dir("302") / "env").read_text()
    assert epilog(node.ctx, _env("302")) == 0


def test_low_priority_qos_sets_the_mps_client_priority_from_slurmctlds_record(node):
    """node.toml low_priority_qos: a job of such a QOS (as slurmctld holds it, never the job's environment)
    gets the same below-normal MPS client priority as a low-priority partition's (issue 30 item 5)."""
    from dataclasses import replace
    ctx = HookContext(replace(node.ctx.config, low_priority_qos=("preemptible",)), "a100",
                      job_record=node.ctx.job_record, drain=node.ctx.drain)
    for job, qos, low in (("311", "preemptible", True), ("312", "normal", False), ("313", "", False)):
        node.jobs[job] = SHOW.format(job=job, node="a100", gres="shard:10", detail="shard:10(IDX:0)",
                                     ac="[gpushare:v1 req=mem=10G grant=gres:shard:10 kind=mps]"
                                     ).replace("Reason=None", f"Reason=None QOS={qos}")
        # slurmctld's record decides; slurmd's SLURM_JOB_QOS (26.05's Prolog has it) only where it cannot be asked
        assert prolog(ctx, {**_env(job), "SLURM_JOB_QOS": "preemptible"}) == 0, job
        env = (ctx.job_dir(job) / "env").read_text()
        assert ("export CUDA_MPS_CLIENT_PRIORITY=1\n" in env) is low, (job, env)
        assert ("set_default_client_priority 1" in _commands(node, job)) is low, job
        assert epilog(ctx, _env(job)) == 0


def test_server_orphaned_by_a_killed_daemon_is_stopped_but_the_jobs_tasks_are_not(node):
    _shard_job(node, "401")
    assert prolog(node.ctx, _env("401")) == 0
    daemon = node.ctx.mps("401")
    pid = daemon.pid()
    children = [int(p) for p in open(f"/proc/{pid}/task/{pid}/children").read().split()]
    assert children, "the stand-in starts a server child"
    env = dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=str(daemon.pipe_dir))
    task = subprocess.Popen(["sleep", "60"], env=env)  # one of the job's tasks: same variable, not MPS
    try:
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: not pid_alive(pid), f"the killed daemon {pid} gone")
        assert all(pid_alive(c) for c in children)  # orphaned
        assert epilog(node.ctx, _env("401")) == 0
        assert not any(pid_alive(c) for c in children)
        assert task.poll() is None  # the task was left alone
    finally:
        task.kill()
        task.wait()


GPUSHARE_AC = "[gpushare:v1 req=mode=gpu grant=gres:gpu:a100:2 kind=gpu model=a100]"


def _exports(path: Path) -> dict[str, str]:
    return dict(line[len("export "):].split("=", 1) for line in path.read_text().splitlines())


def test_a_plain_multi_gpu_job_is_audited_and_its_gpus_left_alone(node):
    # Slurm gave the NVLink pair 0-2 on the idle bridged A100 node: no excess
    node.jobs["501"] = SHOW.format(job="501", node="a100", gres="gpu:a100:2", detail="gpu:a100:2(IDX:0,2)", ac="")
    node.used["a100"] = "GresUsed=gpu:a100:2(IDX:0,2),shard:a100:0(IDX:N/A)"
    assert prolog(node.ctx, _env("501")) == 0
    jd = node.ctx.job_dir("501")
    state = read_state(jd)
    assert state["placement"]["given"] == [0, 2] and state["placement"]["excess"] == 0
    # no gpushare request (no AdminComment segment) and gpu_order "gpushare": nothing for the TaskProlog
    assert sorted(p.name for p in jd.iterdir()) == ["run.json", "state.json"]
    assert "binding" not in state and state["gpu_order"] == "gpushare"
    assert epilog(node.ctx, _env("501")) == 0 and not jd.exists()


def test_the_epilog_of_a_job_that_never_had_an_mps_daemon_scans_no_process(node, monkeypatch):
    """A whole-GPU job has no MPS directory: its Epilog looks for no orphaned MPS process (a scan of every
    process's environment, about 20 ms of each GPU job's Epilog: benchmarks/plain_jobs)."""
    import psutil

    node.jobs["507"] = SHOW.format(job="507", node="a100", gres="gpu:a100:1", detail="gpu:a100:1(IDX:5)", ac="")
    assert prolog(node.ctx, _env("507")) == 0
    assert node.ctx.job_dir("507").exists() and not (node.ctx.job_dir("507") / "mps").exists()
    scanned: list = []
    monkeypatch.setattr(psutil, "process_iter", lambda *a, **k: scanned.append(a) or iter(()))
    assert epilog(node.ctx, _env("507")) == 0 and not node.ctx.job_dir("507").exists()
    assert scanned == []


def test_a_gpushare_job_gets_its_ring_and_cpu_hints_from_its_own_cores(node):
    # the job holds cores 40-43 (socket 1, cores 8-11) and runs 2 tasks; its GPUs 0 and 2 are near socket 0
    # (CPU affinity 0-31 in the description): the old binding hinted the cores near the GPUs, 0-15 and 16-31
    node.jobs["504"] = SHOW.format(job="504", node="a100", gres="gpu:a100:2", detail="gpu:a100:2(IDX:0,2)",
                                   ac=GPUSHARE_AC)
    node.ctx = replace(node.ctx, job_record=lambda j: as_job_json(node.jobs[str(j)], str(j),
                                                                   cores={"a100": ((1, 8), (1, 9), (1, 10), (1, 11))},
                                                                   tasks=2))
    assert prolog(node.ctx, _env("504")) == 0
    jd = node.ctx.job_dir("504")
    assert sorted(p.name for p in jd.iterdir()) == ["ring.2", "run.json", "state.json",
                                                    "task.1.0", "task.2.0", "task.2.1"]
    ring = _exports(jd / "ring.2")
    assert ring["CUDA_VISIBLE_DEVICES"].count("GPU-") == 2 and ring["GPUSHARE_GPU_RING"] in ("0,2", "2,0")
    cpus = [_exports(jd / f"task.2.{r}")["GPUSHARE_TASK_CPUS"] for r in (0, 1)]
    assert cpus == ["40-41", "42-43"]  # inside the job's cores, two each
    assert _exports(jd / "task.1.0")["GPUSHARE_TASK_CPUS"] == "40-43"
    # no note for the job's output unless node.toml's task_notes asks (issue 31 item 3); the ring is in ring.2
    assert not (jd / "note").exists()
    assert read_state(jd)["cores"] == [40, 41, 42, 43] and read_state(jd)["binding"]["ntasks"] == 2
    assert epilog(node.ctx, _env("504")) == 0 and not jd.exists()


def test_without_the_jobs_cores_there_are_no_cpu_hints(node):
    node.jobs["505"] = SHOW.format(job="505", node="a100", gres="gpu:a100:2", detail="gpu:a100:2(IDX:0,2)",
                                   ac=GPUSHARE_AC)
    assert prolog(node.ctx, _env("505")) == 0
    jd = node.ctx.job_dir("505")
    assert all("GPUSHARE_TASK_CPUS" not in _exports(jd / f"task.2.{r}") for r in (0, 1))
    assert "GPUSHARE_CPU_BIND" not in _exports(jd / "task.2.0")
    assert epilog(node.ctx, _env("505")) == 0


@pytest.mark.parametrize("order, ac, ring", [("all", "", True), ("none", GPUSHARE_AC, False)])
def test_the_node_config_decides_whose_gpus_are_ordered(node, order, ac, ring):
    node.ctx = replace(node.ctx, config=replace(node.ctx.config, gpu_order=order))
    node.jobs["506"] = SHOW.format(job="506", node="a100", gres="gpu:a100:2", detail="gpu:a100:2(IDX:0,2)", ac=ac)
    assert prolog(node.ctx, _env("506")) == 0
    assert (node.ctx.job_dir("506") / "ring.2").exists() == ring
    assert epilog(node.ctx, _env("506")) == 0


def test_multi_gpu_placement_audit_on_a_partly_busy_node(node):
    # a partly busy node: GPU 1 is another job's; Slurm gave 0,3 (SYS) although 0,2 (NV12) was free
    node.jobs["502"] = SHOW.format(job="502", node="a100", gres="gpu:a100:2", detail="gpu:a100:2(IDX:0,3)", ac="")
    node.used["a100"] = "GresUsed=gpu:a100:3(IDX:0-1,3),shard:a100:0(IDX:N/A)"
    assert prolog(node.ctx, _env("502")) == 0
    p = read_state(node.ctx.job_dir("502"))["placement"]
    assert p["given"] == [0, 3] and p["best"] in ([0, 2], [4, 5], [6, 7]) and p["excess"] > 0
    assert p["free_before"] == [0, 2, 3, 4, 5, 6, 7]  # GPU 1 was the other job's
    assert epilog(node.ctx, _env("502")) == 0


def test_another_jobs_shards_counted_per_device_make_their_gpu_busy(node):
    # 23.11.2+ (measured on 24.11.5): GresUsed gives shards as per-device counts, not IDX: another job's
    # 10 shards on GPU 1
    node.jobs["503"] = SHOW.format(job="503", node="a100", gres="gpu:a100:2", detail="gpu:a100:2(IDX:0,3)", ac="")
    node.used["a100"] = "GresUsed=gpu:a100:2(IDX:0,3),shard:a100:10(0/80,10/80,0/80,0/80,0/80,0/80,0/80,0/80)"
    assert prolog(node.ctx, _env("503")) == 0
    assert read_state(node.ctx.job_dir("503"))["placement"]["free_before"] == [0, 2, 3, 4, 5, 6, 7]
    assert epilog(node.ctx, _env("503")) == 0


def test_epilog_appends_one_accounting_record_per_gpu_device(node):
    from dataclasses import replace

    from slurm_gpushare.accounting import Spool
    ctx = HookContext(replace(node.ctx.config, spool_dir=str(node.root / "spool")), "a100",
                      job_record=node.ctx.job_record, drain=node.ctx.drain, show_node=node.ctx.show_node)
    _shard_job(node, "601", ac="[gpushare:v1 req=mem=10G grant=gres:shard:10 kind=mps mem=10240/10240MiB]")
    node.jobs["602"] = SHOW.format(job="602", node="a100", gres="gpu:a100:1", detail="gpu:a100:1(IDX:5)", ac="")
    for job in ("601", "602"):
        assert prolog(ctx, _env(job)) == 0
        assert epilog(ctx, {**_env(job), "SLURM_JOB_EXIT_CODE2": "0:0"}) == 0
    lines = [json.loads(line) for f in sorted((node.root / "spool").glob("*.jsonl"))
             for line in f.read_text().splitlines()]
    assert [(r["job_id"], r["mode"], r["gpu_index"]) for r in lines] == [
        ("601", "mps", 0), ("602", "gpu", 5)], lines
    assert lines[0]["mem_asked_mib"] == 10240 and lines[0]["mem_peak_mib"] is None  # no monitor: no data
    assert Spool(node.root / "spool", node="a100").node == "a100"


def test_epilog_records_what_the_monitor_measured_and_removes_its_file(node, capsys):
    from dataclasses import replace

    from slurm_gpushare.accounting.live import save_usage, usage_path
    from slurm_gpushare.accounting.record import UsageTracker
    ctx = HookContext(replace(node.ctx.config, spool_dir=str(node.root / "spool")), "a100",
                      job_record=node.ctx.job_record, drain=node.ctx.drain, show_node=node.ctx.show_node)
    node.jobs["603"] = SHOW.format(job="603", node="a100", gres="gpu:a100:1", detail="gpu:a100:1(IDX:5)", ac="")
    tracker = UsageTracker()
    for used, sm in ((1000, 10.0), (9000, 80.0), (4000, None)):
        tracker.add("603", 5, used_mib=used, sm_percent=sm)
    save_usage(ctx.run_dir, "603", "a100", tracker)
    assert epilog(ctx, {**_env("603"), "SLURM_JOB_GPUS": "5"}) == 0
    (rec,) = [json.loads(line) for f in (node.root / "spool").glob("*.jsonl") for line in f.read_text().splitlines()]
    got = (rec["mem_peak_mib"], rec["sm_mean_percent"], rec["sm_peak_percent"], rec["samples"])
    assert got == (9000, 45.0, 80.0, 3)
    assert not usage_path(ctx.run_dir, "603").exists()
    # a damaged usage file: the record is still written, with no data, and the log says why
    node.jobs["604"] = SHOW.format(job="604", node="a100", gres="gpu:a100:1", detail="gpu:a100:1(IDX:6)", ac="")
    usage_path(ctx.run_dir, "604").write_text("{half")
    assert epilog(ctx, {**_env("604"), "SLURM_JOB_GPUS": "6"}) == 0
    recs = [json.loads(line) for f in (node.root / "spool").glob("*.jsonl") for line in f.read_text().splitlines()]
    assert [(r["job_id"], r["mem_peak_mib"]) for r in recs] == [("603", 9000), ("604", None)]
    assert "job 604: monitor usage not used" in capsys.readouterr().err


def test_an_unreachable_slurmctld_costs_the_epilog_no_record(node, capsys):
    """slurmctld down when the job ends: the records are built from slurmd's Epilog environment (owner,
    partition, devices) and the Prolog's plan, and the log says so; nothing drains, nothing is dropped."""
    from dataclasses import replace

    from slurm_gpushare.errors import SlurmError

    def down(job_id):
        raise SlurmError("squeue: error: Unable to contact slurm controller (connect failure)")

    ctx = HookContext(replace(node.ctx.config, spool_dir=str(node.root / "spool")), "a100",
                      job_record=node.ctx.job_record, drain=node.ctx.drain, show_node=node.ctx.show_node)
    _shard_job(node, "611", ac="[gpushare:v1 req=mem=10G grant=gres:shard:10 kind=mps mem=10240/10240MiB]")
    # the job runs as root here (the test's run dir is root's); the name tells slurmd's from the record's
    env = {"SLURM_JOB_UID": "0", "SLURM_JOB_GID": "0", "SLURM_JOB_USER": "alice",
           "SLURM_JOB_PARTITION": "gpu", "SLURM_JOB_EXIT_CODE2": "0:0"}
    node.jobs["612"] = SHOW.format(job="612", node="a100", gres="gpu:a100:1", detail="gpu:a100:1(IDX:5)", ac="")
    gpu5 = {**_env("612"), **env, "SLURM_JOB_GPUS": "5", "CUDA_VISIBLE_DEVICES": "5"}
    assert prolog(ctx, {**_env("611"), **env}) == 0 and prolog(ctx, gpu5) == 0
    ctx = replace(ctx, job_record=down)
    assert epilog(ctx, {**_env("611"), **env}) == 0
    assert epilog(ctx, gpu5) == 0
    # an Epilog with no Prolog run to pair with (run again after the job's directory went) adds no record
    assert epilog(ctx, {**_env("611"), **env}) == 0
    recs = [json.loads(line) for f in (node.root / "spool").glob("*.jsonl") for line in f.read_text().splitlines()]
    got = [(r["job_id"], r["user"], r["partition"], r["mode"], r["gpu_index"]) for r in recs]
    assert got == [("611", "alice", "gpu", "mps", 0), ("612", "alice", "gpu", "gpu", 5)], recs
    assert recs[0]["mem_granted_mib"] == 10240
    assert not node.drained and not ctx.job_dir("611").exists()
    err = capsys.readouterr().err
    assert "job 612: slurmctld not reached" in err and "record from slurmd's environment" in err


def test_records_carry_nvmls_gpu_uuid_also_when_the_prolog_saved_a_plan(node):
    # bug found in a trial: MPS and multi-GPU records had gpu_uuid "" (the description's, from topo text)
    from dataclasses import replace

    from slurm_gpushare.hardware.ports import open_nvml
    ctx = HookContext(replace(node.ctx.config, spool_dir=str(node.root / "spool")), "a100",
                      job_record=node.ctx.job_record, drain=node.ctx.drain, show_node=node.ctx.show_node)
    _shard_job(node, "701", idx="2", ac="[gpushare:v1 req=mem=10G grant=gres:shard:10 kind=mps mem=10240/10240MiB]")
    assert prolog(ctx, {**_env("701"), "SLURM_JOB_GPUS": "2"}) == 0
    assert epilog(ctx, {**_env("701"), "SLURM_JOB_GPUS": "2"}) == 0
    (rec,) = [json.loads(line) for f in (node.root / "spool").glob("*.jsonl") for line in f.read_text().splitlines()]
    with open_nvml() as nvml:
        assert rec["gpu_index"] == 2 and rec["gpu_uuid"] == nvml.uuid(2)


def test_a_cancelled_job_is_recorded_signaled_although_slurmd_says_0_0(node):
    # found in a trial: for scancel and time limits slurmd gives the Epilog SLURM_JOB_EXIT_CODE2=0:0, while
    # slurmctld already holds ExitCode=0:15 (what sacct shows)
    from dataclasses import replace
    ctx = HookContext(replace(node.ctx.config, spool_dir=str(node.root / "spool")), "a100",
                      job_record=node.ctx.job_record, drain=node.ctx.drain, show_node=node.ctx.show_node)
    node.jobs["801"] = SHOW.format(job="801", node="a100", gres="gpu:a100:1", detail="gpu:a100:1(IDX:5)",
                                   ac="").replace("JobState=RUNNING", "JobState=COMPLETING ExitCode=0:15")
    node.jobs["802"] = SHOW.format(job="802", node="a100", gres="gpu:a100:1", detail="gpu:a100:1(IDX:6)",
                                   ac="").replace("JobState=RUNNING", "JobState=COMPLETING ExitCode=0:0")
    env = {"SLURM_JOB_EXIT_CODE2": "0:0", "SLURM_JOB_EXIT_CODE": "0"}
    assert epilog(ctx, {**_env("801"), "SLURM_JOB_GPUS": "5", **env}) == 0
    assert epilog(ctx, {**_env("802"), "SLURM_JOB_GPUS": "6", **env}) == 0
    recs = {r["job_id"]: r for f in (node.root / "spool").glob("*.jsonl")
            for r in map(json.loads, f.read_text().splitlines())}
    assert (recs["801"]["exit_state"], recs["801"]["exit_code"]) == ("SIGNALED", "0:15")
    assert (recs["802"]["exit_state"], recs["802"]["exit_code"]) == ("COMPLETED", "0:0")


def test_a_requeued_runs_record_keeps_its_own_restart_count_and_says_requeued(node):
    """Issue 26 N13: the Epilog of a run that was requeued sees slurmctld's raised restart count; the record keeps
    the run's own (the Prolog's run.json) and its state is REQUEUED, as sacct says, not COMPLETED."""
    from dataclasses import replace
    ctx = HookContext(replace(node.ctx.config, spool_dir=str(node.root / "spool")), "a100",
                      job_record=node.ctx.job_record, drain=node.ctx.drain, show_node=node.ctx.show_node)
    _shard_job(node, "811", idx="3", ac="[gpushare:v1 req=mem=10G grant=gres:shard:10 kind=mps mem=10240/10240MiB]")
    assert prolog(ctx, {**_env("811"), "SLURM_JOB_GPUS": "3"}) == 0
    env = {**_env("811"), "SLURM_JOB_GPUS": "3", "SLURM_JOB_RESTART_COUNT": "1", "SLURM_JOB_EXIT_CODE2": "0:0"}
    assert epilog(ctx, env) == 0
    (rec,) = [json.loads(line) for f in (node.root / "spool").glob("*.jsonl") for line in f.read_text().splitlines()]
    assert (rec["restart"], rec["exit_state"]) == (0, "REQUEUED"), rec


@pytest.mark.parametrize("prolog_knew, requeued, want", [
    (True, False, "ctld"),    # the Prolog asked slurmctld: run.json has the submit time
    (False, False, "ctld"),   # run.json without it (planned from slurmd's environment, an earlier release)
    (False, True, 0),         # ... and slurmctld has requeued the job: its submit time is the next run's
])
def test_the_record_carries_the_runs_submit_time(node, prolog_knew, requeued, want):
    """Issue 26 item 6: the record's ``submit`` is slurmctld's SubmitTime of the run: from the Prolog's run.json,
    else from slurmctld at the Epilog while the job is not requeued; 0 (not known) otherwise."""
    from dataclasses import replace

    from slurm_gpushare.node.jobdir import read_run, write_run
    ctx = HookContext(replace(node.ctx.config, spool_dir=str(node.root / "spool")), "a100",
                      job_record=node.ctx.job_record, drain=node.ctx.drain, show_node=node.ctx.show_node)
    submitted = "2026-11-29T12:00:00"
    _shard_job(node, "812", idx="3", ac="[gpushare:v1 req=mem=10G grant=gres:shard:10 kind=mps mem=10240/10240MiB]")
    node.jobs["812"] += f"   SubmitTime={submitted} EligibleTime={submitted}\n"
    assert prolog(ctx, {**_env("812"), "SLURM_JOB_GPUS": "3"}) == 0
    epoch = slurm_epoch(submitted)
    run = read_run(ctx.job_dir("812"))
    assert run is not None and run.submit == epoch
    if not prolog_knew:
        write_run(ctx.job_dir("812"), restart=0, start=run.start)
    env = {**_env("812"), "SLURM_JOB_GPUS": "3", "SLURM_JOB_RESTART_COUNT": "1" if requeued else "0"}
    assert epilog(ctx, env) == 0
    (rec,) = [json.loads(line) for f in (node.root / "spool").glob("*.jsonl") for line in f.read_text().splitlines()]
    assert rec["submit"] == (epoch if want == "ctld" else want), rec


@pytest.mark.parametrize("tres, job_gpus, want", [
    # Slurm 23.x and later write the gres/ prefix (seen on 24.11 and 26.05)
    ("gres/shard:10", "0", ("shard", "", 10, (0,))),
    ("gres/gpu:a100:2", "0,2", ("gpu", "a100", 2, (0, 2))),
    ("gres:gpu:a100:2", "0,2", ("gpu", "a100", 2, (0, 2))),
    ("gres:shard:10", "1", ("shard", "", 10, (1,))),
    ("gres:gpu:2,gres:gpushare:10", "0-1", ("gpu", "", 2, (0, 1))),
])
def test_epilog_reads_the_devices_from_slurm_job_gpus_typed_by_tres_per_node(tres, job_gpus, want):
    """The Epilog's fallback when slurmctld dropped the GRES detail: both TRES prefixes, typed or not."""
    from slurm_gpushare.node.epilog import _gres_from_env
    from slurm_gpushare.slurm.job import JobInfo

    (alloc,) = _gres_from_env(JobInfo("7", tres_per_node=tres), {"SLURM_JOB_GPUS": job_gpus})
    assert (alloc.name, alloc.type, alloc.count, alloc.indices) == want


def _gres_conf(n, shard_unit: str) -> dict[str, str]:
    """A slurm.conf dir whose gres.conf was generated for the a100 node with ``--shard-unit``; the Prolog env."""
    from slurm_gpushare.gresconf.render import generate_node_gres, render_gres_conf
    from slurm_gpushare.memsize import parse_shard_unit
    from slurm_gpushare.slurm.nodegres import GresOptions

    etc = n.root / "etc"
    etc.mkdir(exist_ok=True)
    machine = packaged_machine("8x-a100-nv12-bridge.json")
    opts = GresOptions(shard_unit_mib=parse_shard_unit(shard_unit))
    (etc / "gres.conf").write_text(render_gres_conf([generate_node_gres(machine, "a100", opts)]))
    (etc / "slurm.conf").write_text("ClusterName=test\n")
    return {**_env("101"), "SLURM_CONF": str(etc / "slurm.conf")}


def test_prolog_refuses_a_node_toml_shard_unit_that_gres_conf_was_not_written_with(node):
    # gres.conf has 2 shards per GiB (--shard-unit 512M), node.toml says 1 GiB: shard:10 would get a 10G
    # limit where Slurm reserved 5 GiB. The node is misconfigured: a node fault that names both units.
    _shard_job(node)
    env = _gres_conf(node, "512M")
    with pytest.raises(NodeFault, match=r'shard_unit = "512M"'):
        prolog(node.ctx, env)
    assert node.drained and "512M" in node.drained[0][1]
    assert not node.ctx.mps("101").alive()


def test_prolog_accepts_the_shard_unit_gres_conf_was_written_with(node):
    _shard_job(node)
    env = _gres_conf(node, "1G")
    assert prolog(node.ctx, env) == 0 and not node.drained
    assert epilog(node.ctx, env) == 0


def test_a_passed_shard_unit_check_is_remembered_until_gres_conf_changes(node):
    from slurm_gpushare.node.prolog import SHARD_UNIT_STAMP
    _shard_job(node)
    env = _gres_conf(node, "1G")
    assert prolog(node.ctx, env) == 0 and epilog(node.ctx, env) == 0
    stamp = node.ctx.run_dir / SHARD_UNIT_STAMP
    assert stamp.stat().st_mode & 0o777 == 0o600
    assert stamp.read_text().endswith((node.root / "etc" / "gres.conf").read_text())
    # gres.conf regenerated with another unit (and slurmd restarted): the remembered pass does not hide it
    env = _gres_conf(node, "512M")
    with pytest.raises(NodeFault, match=r'shard_unit = "512M"'):
        prolog(node.ctx, env)
    # a forged stamp for another gres.conf text is no pass either: the key holds the whole text
    stamp.write_text("1024 a100 - other\nNodeName=a100 Name=shard Count=640\n")
    with pytest.raises(NodeFault, match=r'shard_unit = "512M"'):
        prolog(node.ctx, env)


@pytest.mark.parametrize("kind", ["fifo", "link-to-fifo", "directory"])
def test_a_shard_unit_stamp_that_is_no_regular_file_neither_hangs_nor_fails_the_prolog(node, kind):
    """A FIFO at ``shard-unit.ok`` (or a link to one) would block the Prolog's open(2) until slurmd's
    PrologEpilogTimeout: the stamp is read only when it is a regular file of its own, of the key's size."""
    from slurm_gpushare.node.prolog import SHARD_UNIT_STAMP
    _shard_job(node)
    env = _gres_conf(node, "1G")
    stamp = node.ctx.run_dir / SHARD_UNIT_STAMP
    stamp.parent.mkdir(parents=True, exist_ok=True)
    if kind == "fifo":
        os.mkfifo(stamp)
    elif kind == "link-to-fifo":
        os.mkfifo(node.root / "fifo")
        stamp.symlink_to(node.root / "fifo")
    else:
        stamp.mkdir()

    class Hung(BaseException):  # not an OSError (TimeoutError is one, and the Prolog catches those)
        pass

    def expire(*_):
        raise Hung("the Prolog still runs after 10 s")

    old = signal.signal(signal.SIGALRM, expire)
    signal.alarm(10)
    try:
        assert prolog(node.ctx, env) == 0 and not node.drained
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    assert epilog(node.ctx, env) == 0


def test_an_epilog_whose_node_config_is_broken_still_stops_the_jobs_daemon(node, tmp_path):
    """An admin's typo in node.toml: the Epilog cannot build its context, but the job's MPS daemon
    (found by process) is stopped and its directory removed; the exit status says the config is broken."""
    from click.testing import CliRunner

    from slurm_gpushare.cli import main
    _shard_job(node, "801")
    assert prolog(node.ctx, _env("801")) == 0
    pid = node.ctx.mps("801").pid()
    assert pid and pid_alive(pid)
    broken = tmp_path / "node.toml"
    broken.write_text(f'version = 1\nrun_dir = "{node.root}/run/{{node}}"\nmps_controll = "typo"\n')
    out = CliRunner().invoke(main, ["hook", "epilog", "--config", str(broken)], env=_env("801"))
    assert out.exit_code == 1, out.output
    assert "node config not usable" in out.output and "mps_controll" in out.output
    wait_until(lambda: not pid_alive(pid), f"the daemon {pid} of job 801 stopped by the Epilog")
    assert not pid_alive(pid) and not node.ctx.job_dir("801").exists()


def test_doctor_finds_a_daemon_whose_job_directory_was_removed(node):
    _shard_job(node, "802")
    assert prolog(node.ctx, _env("802")) == 0
    pid = node.ctx.mps("802").pid()
    remove_tree(node.ctx.job_dir("802"))  # state, env, pipe dir (a tmpfs mount): no trace but the process
    assert pid and pid_alive(pid)
    report = doctor(node.ctx, repair=False, running_jobs=set())
    assert [(f.job_id, f.action) for f in report if "without its job directory" in f.problem] == [
        ("802", "would stop it")]
    assert pid_alive(pid)
    fixed = doctor(node.ctx, repair=True, running_jobs=set())
    assert [(f.job_id, f.action) for f in fixed] == [("802", "stopped it")]
    assert not pid_alive(pid)


def test_the_epilog_stops_a_daemon_whose_job_directory_was_removed(node):
    """Issue 26 D15: the job's directory removed while it ran (an administrator, a cleaner of /run): the Epilog
    finds the job's daemon by process and stops it, instead of leaving it to doctor --repair."""
    _shard_job(node, "804")
    assert prolog(node.ctx, _env("804")) == 0
    pid = node.ctx.mps("804").pid()
    remove_tree(node.ctx.job_dir("804"))
    assert pid and pid_alive(pid)
    assert epilog(node.ctx, _env("804")) == 0
    wait_until(lambda: not pid_alive(pid), f"job 804's daemon {pid} stopped by the Epilog")


def test_an_epilog_whose_node_config_is_broken_still_writes_the_record_it_can(node, tmp_path):
    """A typo in one key of node.toml: the keys that still read (run_dir, spool_dir, machine) give the
    Epilog what it needs for the job's accounting record; the daemon is stopped; exit 1 (config broken)."""
    from slurm_gpushare.accounting.spool import spool_files
    from slurm_gpushare.errors import ConfigError
    from slurm_gpushare.node.epilog import epilog_without_config
    _shard_job(node, "803")
    assert prolog(node.ctx, _env("803")) == 0
    pid = node.ctx.mps("803").pid()
    spool = tmp_path / "spool"
    broken = tmp_path / "node.toml"
    broken.write_text(f'version = 1\nrun_dir = "{node.root}/run/{{node}}"\n'
                      f'machine = "{node.root}/machines/{{node}}.json"\n'
                      f'spool_dir = "{spool}"\nmps_controll = "typo"\n')
    rc = epilog_without_config(_env("803"), broken, ConfigError("unknown key(s) mps_controll"),
                               context=lambda cfg, name: replace(node.ctx, config=cfg, node=name))
    assert rc == 1 and not pid_alive(pid) and not node.ctx.job_dir("803").exists()
    (path,) = spool_files(spool)
    (line,) = path.read_text().splitlines()
    assert json.loads(line)["job_id"] == "803" and json.loads(line)["mem_granted_mib"] == 10240


def _guarded(node, running: dict[str, int] | None, requeue_fails: bool = False):
    """The node's context with recorded requeues and the running jobs squeue reports (None: squeue fails)."""
    requeued: list[str] = []

    def requeue(job):
        if requeue_fails:
            raise SlurmError("scontrol requeue: Requested operation is presently disabled")
        requeued.append(job)

    def owners(_node):
        if running is None:
            raise SlurmError("squeue: slurm_load_jobs error: Unable to contact slurm controller")
        return running

    ctx = replace(node.ctx, requeue=requeue, job_owners=owners)
    return ctx, requeued


def _taskprolog(node, tmp_path) -> Path:
    script = tmp_path / "tp.sh"
    script.write_text((SITE / "taskprolog.sh").read_text().replace(
        'RUN_DIR="/run/slurm-gpushare"', f'RUN_DIR="{node.root}/run/{{node}}"'))
    return script


def test_the_script_of_a_run_the_prolog_requeued_never_starts(node, tmp_path):
    """Issue 26 N8: on 22.05 slurmd launches the batch script of the run the Prolog has just requeued (the Prolog
    exits 0; the requeue lands a moment later), and its processes ran ~6 s on the shared GPU. The Prolog marks the
    run refused (root's file, readable by the job's user); the TaskProlog of that run fails (slurmstepd then
    never execs the task: TaskProlog failed). The mark stays until a Prolog lets a later run of the job start."""
    _shard_job(node, job="101", idx="3")
    assert prolog(node.ctx, _env("101")) == 0  # a share on GPU 3
    node.jobs["6"] = SHOW.format(job="6", node="a100", gres="gpu:a100:1", detail="gpu:a100:1(IDX:3)", ac="")
    ctx, requeued = _guarded(node, {"101": 0, "6": 0})
    assert prolog(ctx, {**_env("6"), "SLURM_JOB_GPUS": "3", "SLURM_JOB_RESTART_COUNT": "2"}) == 0
    assert requeued == ["6"]
    mark = node.root / "run" / "a100" / "refused" / "6.2"
    assert mark.is_file() and (mark.stat().st_mode & 0o777) == 0o644
    script = _taskprolog(node, tmp_path)
    task = {"SLURM_JOB_ID": "6", "SLURMD_NODENAME": "a100", "SLURM_JOB_GPUS": "3", "CUDA_VISIBLE_DEVICES": "3"}
    refused = subprocess.run(["sh", str(script)], env={**task, "SLURM_RESTART_COUNT": "2"}, capture_output=True,
                             text=True)
    assert refused.returncode != 0 and "requeued by the Prolog" in refused.stdout, refused
    # its Epilog (slurmd's restart count already raised by the requeue) keeps the mark and requeues nothing more
    assert epilog(ctx, {**_env("6"), "SLURM_JOB_GPUS": "3", "SLURM_JOB_RESTART_COUNT": "3"}) == 0
    assert mark.exists() and requeued == ["6"]
    # the share has ended; the next run's Prolog lets it start: the mark is gone, its tasks start
    assert epilog(node.ctx, _env("101")) == 0
    assert prolog(ctx, {**_env("6"), "SLURM_JOB_GPUS": "3", "SLURM_JOB_RESTART_COUNT": "3"}) == 0
    assert requeued == ["6"] and not mark.exists()
    later = subprocess.run(["sh", str(script)], env={**task, "SLURM_RESTART_COUNT": "3"}, capture_output=True,
                           text=True)
    assert later.returncode == 0, later
    assert epilog(ctx, {**_env("6"), "SLURM_JOB_GPUS": "3", "SLURM_JOB_RESTART_COUNT": "3"}) == 0
    assert requeued == ["6"]


def test_a_rerun_that_slurmd_starts_without_the_prolog_is_stopped_and_requeued(node, tmp_path):
    """Issue 26 N12: slurmd runs the Prolog only for a job id it has not seen within its credential window
    (``first_job_run = !slurm_cred_jobid_cached()`` in src/slurmd/slurmd/req.c, 22.05; the window is cred_expire,
    120 s): a requeued run brought forward (the job's user may ``scontrol update StartTime=now`` it) starts
    without a Prolog, whole on a GPU another user's share still uses. Its TaskProlog finds the earlier run's
    refused mark, which only a Prolog that lets a run start removes, and fails; its Epilog requeues the job and
    marks this run refused too. The run after that, with its Prolog, starts."""
    _shard_job(node, job="101", idx="3")
    assert prolog(node.ctx, _env("101")) == 0  # a share on GPU 3
    node.jobs["6"] = SHOW.format(job="6", node="a100", gres="gpu:a100:1", detail="gpu:a100:1(IDX:3)", ac="")
    ctx, requeued = _guarded(node, {"101": 0, "6": 0})
    spool = tmp_path / "spool"
    ctx = replace(ctx, config=replace(ctx.config, spool_dir=str(spool)))
    run = {**_env("6"), "SLURM_JOB_GPUS": "3"}
    assert prolog(ctx, {**run, "SLURM_JOB_RESTART_COUNT": "0"}) == 0 and requeued == ["6"]
    assert epilog(ctx, {**run, "SLURM_JOB_RESTART_COUNT": "1"}) == 0 and requeued == ["6"]
    # run 1 starts at once, no Prolog: its task does not start
    script = _taskprolog(node, tmp_path)
    task = {"SLURM_JOB_ID": "6", "SLURMD_NODENAME": "a100", "SLURM_JOB_GPUS": "3", "CUDA_VISIBLE_DEVICES": "3",
            "SLURM_RESTART_COUNT": "1"}
    stopped = subprocess.run(["sh", str(script)], env=task, capture_output=True, text=True)
    assert stopped.returncode != 0, stopped
    assert "started without its Prolog" in stopped.stdout and "runs again later" in stopped.stdout, stopped
    # a step of that run (srun inside the batch script, had it started) is stopped the same way
    step = subprocess.run(["sh", str(script)], env={**task, "SLURM_STEP_ID": "0"}, capture_output=True, text=True)
    assert step.returncode != 0, step
    # its Epilog requeues the job and marks run 1 refused
    assert epilog(ctx, {**run, "SLURM_JOB_RESTART_COUNT": "1"}) == 0 and requeued == ["6", "6"]
    assert (node.root / "run" / "a100" / "refused" / "6.1").is_file()
    assert "job 6 requeued: run 1 started without its Prolog" in (node.root / "run" / "a100" / "node.log").read_text()
    # its record says what sacct says of that run: REQUEUED, not how its refused task ended
    from slurm_gpushare.accounting.spool import spool_files
    recs = [json.loads(line) for f in spool_files(spool) for line in f.read_text().splitlines()]
    assert [(r["restart"], r["exit_state"]) for r in recs if r["job_id"] == "6" and r["restart"] == 1] == \
        [(1, "REQUEUED")], recs
    assert not node.drained
    # the share ends; run 2 has its Prolog: it starts, the marks are gone
    assert epilog(node.ctx, _env("101")) == 0
    assert prolog(ctx, {**run, "SLURM_JOB_RESTART_COUNT": "2"}) == 0 and requeued == ["6", "6"]
    assert not list((node.root / "run" / "a100" / "refused").iterdir())
    ok = subprocess.run(["sh", str(script)], env={**task, "SLURM_RESTART_COUNT": "2"}, capture_output=True, text=True)
    assert ok.returncode == 0, ok
    assert epilog(ctx, {**run, "SLURM_JOB_RESTART_COUNT": "2"}) == 0 and requeued == ["6", "6"]
    # another job's tasks, with or without GPUs, never look at job 6's marks
    claims_refused = node.root / "run" / "a100" / "refused"
    (claims_refused / "6.7").write_text("x\n")
    other = subprocess.run(["sh", str(script)], env={**task, "SLURM_JOB_ID": "61"}, capture_output=True, text=True)
    assert other.returncode == 0, other
    # a task without GPUs (a run given none here) is not stopped; a mark a day old is removed by any Epilog
    cpu = {k: v for k, v in task.items() if k not in ("SLURM_JOB_GPUS", "CUDA_VISIBLE_DEVICES")}
    assert subprocess.run(["sh", str(script)], env=cpu, capture_output=True, text=True).returncode == 0
    os.utime(claims_refused / "6.7", (time.time() - 2 * 86400,) * 2)
    assert epilog(node.ctx, _env("101")) == 0 and not (claims_refused / "6.7").exists()


def test_a_whole_gpu_still_used_by_a_share_requeues_the_job_given_it(node):
    """Slurm 22.05 frees a GPU of shards when one of its shard jobs ends while another still runs there, and
    gives it whole to the next gpu job (tests/test_shard_sharing_slurm.py): the Prolog requeues that job."""
    _shard_job(node, job="101", idx="3")
    assert prolog(node.ctx, _env("101")) == 0  # a share on GPU 3
    node.jobs["6"] = SHOW.format(job="6", node="a100", gres="gpu:a100:1", detail="gpu:a100:1(IDX:3)", ac="")
    ctx, requeued = _guarded(node, {"101": 0, "6": 0})
    assert prolog(ctx, _env("6")) == 0 and requeued == ["6"]
    assert not ctx.job_dir("6").exists()  # nothing prepared: no run recorded for this start
    log = (node.root / "run" / "a100" / "node.log").read_text()
    assert "job 6 requeued" in log and "GPU 3 (job 101)" in log, log
    # another GPU, or a share whose job no longer runs (its directory outlived it), requeues nothing
    node.jobs["7"] = SHOW.format(job="7", node="a100", gres="gpu:a100:1", detail="gpu:a100:1(IDX:4)", ac="")
    ctx, requeued = _guarded(node, {"101": 0, "7": 0})
    assert prolog(ctx, _env("7")) == 0 and requeued == [] and (ctx.job_dir("7") / "run.json").exists()
    # slurmctld not reached: the share is taken as running (the job is tried again later)
    node.jobs["8"] = SHOW.format(job="8", node="a100", gres="gpu:a100:2", detail="gpu:a100:2(IDX:2-3)", ac="")
    ctx, requeued = _guarded(node, None)
    assert prolog(ctx, _env("8")) == 0 and requeued == ["8"]
    # a job that cannot be requeued is cancelled, the node stays up
    ctx, requeued = _guarded(node, {"101": 0, "8": 0}, requeue_fails=True)
    assert prolog(ctx, _env("8")) == 0 and node.cancelled == ["8"] and not node.drained
    # a share whose job no longer runs: its claim is forgotten, the job runs
    ctx, requeued = _guarded(node, {"6": 0})
    assert prolog(ctx, _env("6")) == 0 and requeued == [] and (ctx.job_dir("6") / "run.json").exists()
    assert sorted(p.name for p in (node.root / "run" / "a100" / "claims").iterdir()) == ["6", "7", "8.refused"]
    for job in ("101", "6", "7"):
        epilog(node.ctx, _env(job))


def test_a_share_of_a_gpu_held_whole_requeues_the_share_until_the_whole_job_ends(node):
    """The other order (also seen on 22.05 in the packing replay): a share given a GPU another job holds whole.
    The share's job yields (requeued, its run marked refused before the requeue, so a script slurmd launches
    meanwhile never starts); the whole job's Epilog leaves it to slurmctld's requeue delay."""
    node.jobs["6"] = SHOW.format(job="6", node="a100", gres="gpu:a100:1", detail="gpu:a100:1(IDX:3)", ac="")
    assert prolog(node.ctx, _env("6")) == 0 and (node.ctx.job_dir("6") / "run.json").exists()
    _shard_job(node, job="101", idx="3")
    mark = node.root / "run" / "a100" / "refused" / "101.0"
    seen: list[bool] = []
    ctx, requeued = _guarded(node, {"6": 0, "101": 0})
    ctx = replace(ctx, requeue=lambda job: (seen.append(mark.exists()), requeued.append(job)))
    assert prolog(ctx, _env("101")) == 0 and requeued == ["101"] and seen == [True]
    assert not (ctx.job_dir("101") / "state.json").exists()  # no MPS daemon started for it
    assert "given an MPS share of GPUs another job holds whole: GPU 3 (job 6)" in (
        node.root / "run" / "a100" / "node.log").read_text()
    assert epilog(ctx, _env("6")) == 0 and requeued == ["101"]
    # tried again, it runs, and its claim now makes a whole-GPU job given GPU 3 yield
    assert prolog(ctx, _env("101")) == 0 and (ctx.job_dir("101") / "state.json").exists()
    node.jobs["7"] = SHOW.format(job="7", node="a100", gres="gpu:a100:1", detail="gpu:a100:1(IDX:3)", ac="")
    ctx, requeued = _guarded(node, {"7": 0, "101": 0})
    assert prolog(ctx, _env("7")) == 0 and requeued == ["7"]
    # two shares of one GPU do not conflict
    _shard_job(node, job="102", idx="3")
    ctx, requeued = _guarded(node, {"7": 0, "101": 0, "102": 0})
    assert prolog(ctx, _env("102")) == 0 and requeued == []
    for job in ("101", "102", "7"):
        assert epilog(node.ctx, _env(job)) == 0


def test_claims_never_fail_the_epilog(node):
    """An Epilog whose claims cannot be updated (the run dir's claims path is not a directory) still ends the job
    cleanly."""
    node.jobs["6"] = SHOW.format(job="6", node="a100", gres="gpu:a100:1", detail="gpu:a100:1(IDX:3)", ac="")
    assert prolog(node.ctx, _env("6")) == 0
    claims_dir = node.root / "run" / "a100" / "claims"
    shutil.rmtree(claims_dir)
    claims_dir.write_text("not a directory")
    assert epilog(node.ctx, _env("6")) == 0 and not node.drained
    assert "claims not updated" in (node.root / "run" / "a100" / "node.log").read_text()
    claims_dir.unlink()
    _shard_job(node, job="101", idx="3")
    assert prolog(node.ctx, _env("101")) == 0 and epilog(node.ctx, _env("101")) == 0


def test_a_requeued_share_s_rerun_without_the_prolog_never_runs_without_its_daemon(node, tmp_path):
    """Issue 26 N12, on every release: a user requeues their own MPS share and brings its start forward; slurmd,
    the job id still in its credential cache, runs the rerun without the Prolog: no MPS daemon, no limit, on a
    GPU other users share. The requeued run's Epilog marks it refused; the rerun's tasks fail in the TaskProlog
    and its Epilog requeues the job; the run after that has its Prolog and its daemon."""
    _shard_job(node, job="101", idx="3")
    ctx, requeued = _guarded(node, {"101": 0})
    env0 = {**_env("101"), "SLURM_JOB_RESTART_COUNT": "0"}
    assert prolog(ctx, env0) == 0 and (ctx.job_dir("101") / "env").exists()
    # the user's scontrol requeue: the Epilog sees the raised count
    assert epilog(ctx, {**env0, "SLURM_JOB_RESTART_COUNT": "1"}) == 0 and requeued == []
    assert (node.root / "run" / "a100" / "refused" / "101.0").is_file()
    script = _taskprolog(node, tmp_path)
    task = {"SLURM_JOB_ID": "101", "SLURMD_NODENAME": "a100", "CUDA_VISIBLE_DEVICES": "3", "SLURM_RESTART_COUNT": "1"}
    stopped = subprocess.run(["sh", str(script)], env=task, capture_output=True, text=True)
    assert stopped.returncode != 0 and "started without its Prolog" in stopped.stdout, stopped
    assert epilog(ctx, {**env0, "SLURM_JOB_RESTART_COUNT": "1"}) == 0 and requeued == ["101"]
    assert prolog(ctx, {**env0, "SLURM_JOB_RESTART_COUNT": "2"}) == 0 and (ctx.job_dir("101") / "env").exists()
    assert subprocess.run(["sh", str(script)], env={**task, "SLURM_RESTART_COUNT": "2"}, capture_output=True,
                          text=True).returncode == 0
    assert epilog(ctx, {**env0, "SLURM_JOB_RESTART_COUNT": "2"}) == 0 and requeued == ["101"]
    assert not list((node.root / "run" / "a100" / "refused").iterdir())
    # a whole GPU the product did not prepare (a plain gpu job) is left to Slurm when requeued
    node.jobs["6"] = SHOW.format(job="6", node="a100", gres="gpu:a100:1", detail="gpu:a100:1(IDX:4)", ac="")
    assert prolog(ctx, {**_env("6"), "SLURM_JOB_RESTART_COUNT": "0"}) == 0
    assert epilog(ctx, {**_env("6"), "SLURM_JOB_RESTART_COUNT": "1"}) == 0
    assert not list((node.root / "run" / "a100" / "refused").iterdir())


def _claim_in_child(run_dir: str, job: str, kind: str, go, out) -> None:
    from slurm_gpushare.node import claims

    go.wait()
    with claims.claims_lock(Path(run_dir)):
        found = claims.conflicting(Path(run_dir), job, kind, (0,))
        if not found:
            claims.write_claim(Path(run_dir), claims.Claim(job, kind, (0,)))
    out.put((job, sorted(found)))


def test_prologs_that_start_at_once_on_one_gpu_see_each_other(tmp_path):
    """The check and the claim are one step under the node's lock: of a whole-GPU job and shares started at
    the same moment in separate processes, either the whole job claims the GPU and every share yields, or the
    shares claim it and the whole job yields; never both."""
    import multiprocessing

    mp = multiprocessing.get_context("fork")
    for _round in range(5):
        run_dir = tmp_path / f"r{_round}"
        go, out = mp.Event(), mp.Queue()
        jobs = [("1", "gpu"), ("2", "mps"), ("3", "mps"), ("4", "mps")]
        procs = [mp.Process(target=_claim_in_child, args=(str(run_dir), j, k, go, out)) for j, k in jobs]
        for p in procs:
            p.start()
        go.set()
        for p in procs:
            p.join(30)
        results = dict(out.get(timeout=5) for _ in jobs)
        claimed = sorted(p.name for p in (run_dir / "claims").iterdir())
        assert claimed in (["1"], ["2", "3", "4"]), (claimed, results)
        assert all(results[j] == [] for j in claimed)


def test_a_hook_that_runs_out_of_time_fails_the_job_or_drains_with_a_clear_reason(node):
    """Issue 26 item 2: each hook has its own time limit (node.toml hook_timeout), below slurmd's
    PrologEpilogTimeout: a Prolog that runs out cancels its job (a job fault, the node kept), an Epilog that
    runs out drains the node naming the job and the limit; neither leaves the node completing for ever."""
    import dataclasses
    import time

    from slurm_gpushare.node.hook import run_limited

    cfg = dataclasses.replace(node.ctx.config, hook_timeout=0.3)
    hung = HookContext(cfg, "a100", job_record=lambda j: time.sleep(30) or "", drain=node.ctx.drain,
                       cancel=node.cancelled.append, show_node=node.ctx.show_node)
    _shard_job(node, "901")
    started = time.monotonic()
    assert run_limited(hung, "prolog", _env("901"), prolog) == 0
    assert time.monotonic() - started < 5 and node.cancelled == ["901"]
    started = time.monotonic()
    assert run_limited(hung, "epilog", _env("902"), lambda ctx, env: time.sleep(30)) == 1
    assert time.monotonic() - started < 5
    assert node.drained[-1][1].startswith("gpushare epilog job 902: did not finish within 0.3 s")
    # in time: the hook's own status, and no timer left behind
    assert run_limited(hung, "epilog", _env("903"), lambda ctx, env: 0) == 0
    import signal
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def test_doctor_that_runs_out_of_time_returns_what_it_found_and_says_so(node):
    """Issue 26 item 2: doctor has a limit of its own. Something it waits on that never answers (here NVML, in a
    trial the user's FIFO pid file) returns within the limit what was found before, and says it did not finish."""
    from slurm_gpushare.hardware.fake import FakeNvml
    from slurm_gpushare.node.doctor import doctor_within

    class StuckNvml:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def compute_mode(self, index):
            time.sleep(3600)

    d = node.ctx.job_dir("107")
    d.mkdir(parents=True)
    t0 = time.monotonic()
    findings, finished = doctor_within(node.ctx, repair=False, limit=1.0, running_jobs={"108"}, port=StuckNvml())
    assert time.monotonic() - t0 < 10 and not finished
    assert findings == []  # NVML is asked first: nothing was found before it stuck
    # a doctor that finishes in time returns all it found
    findings, finished = doctor_within(node.ctx, repair=False, limit=30.0, running_jobs={"108"},
                                       port=FakeNvml(packaged_machine("8x-a100-nv12-bridge.json")))
    assert finished and [f.job_id for f in findings if f.job_id != "-"] == ["107"], findings


def test_a_prolog_run_inside_the_job_s_cgroup_sets_the_driver_s_memory_limit_there(node, monkeypatch):
    """Issue 27 item 3: with PrologFlags=RunInJob (24.11+) the Prolog runs in the job's cgroup, so it sets the
    share as the driver's per-cgroup limit on the share's GPU at once (nvmlDeviceSetMemoryLimits_v1); elsewhere
    (22.05, or no RunInJob) the cgroup does not exist yet and the node monitor sets it."""
    from slurm_gpushare.hardware.fake import FakeNvml
    from slurm_gpushare.hardware.machine import Machine
    from slurm_gpushare.node import membership

    point = node.root / "cgroup"
    job_dir = point / "system.slice" / "slurmstepd.scope" / "job_101"
    job_dir.mkdir(parents=True)
    fs = membership.CgroupFs(f"30 23 0:26 / {point} rw,nosuid - cgroup2 cgroup2 rw\n")
    monkeypatch.setattr(membership, "CgroupFs", lambda: fs)
    _shard_job(node)
    _shard_job(node, "102")
    cgroups = {"101": "0::/system.slice/slurmstepd.scope/job_101/step_extern\n", "102": "0::/system.slice/slurmd\n"}
    for job in ("101", "102"):
        monkeypatch.setattr(membership, "read_cgroup", lambda pid, job=job: cgroups[job])
        assert prolog(node.ctx, _env(job)) == 0
    machine = node.root / "machines" / "a100.json"
    with FakeNvml(Machine.load(machine), path=machine) as nvml:
        limits = nvml.memory_limits(0, str(job_dir))
    assert (limits.soft_mib, limits.hard_mib) == (10240, 10240)
    assert read_state(node.ctx.job_dir("101"))["gpu_memory_limit"] == {
        "outcome": "set", "cgroup": str(job_dir), "gpus": [0], "mib": 10240}
    assert "gpu_memory_limit" not in read_state(node.ctx.job_dir("102"))  # not in its cgroup: the monitor's part
