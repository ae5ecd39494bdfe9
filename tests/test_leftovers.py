"""GPU processes a job leaves behind (issue #14 item 5), without Slurm: real processes of the fake GPU
application registered in the fake NVML's process table, found through ``nvmlDeviceGetComputeRunningProcesses``
by the Epilog and ``doctor``."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from slurm_gpushare.hardware.fake import PROCESS_TABLE_ENV
from slurm_gpushare.node.context import HookContext
from slurm_gpushare.node.doctor import LEFT_ALONE, doctor
from slurm_gpushare.node.epilog import epilog
from slurm_gpushare.node.leftovers import EndedJob, Holder, drain_reason, judge, user_label
from slurm_gpushare.procinfo import pid_alive
from slurm_gpushare_dev.cluster import PACKAGE_DIRS, job_python
from tests.test_hooks import SHOW, node  # noqa: F401 - the simulated node fixture

ROOT = 0
NOBODY = pwd.getpwnam("nobody").pw_uid


def _holder(pid=4242, uid=1001, cgroup_job=None, started=1000.0, gpu=0, gi_id=None):
    return Holder(pid, uid, gpu, "GPU-x", gi_id, 100, cgroup_job, started)


ENDED = EndedJob("42", uid=1001, start=900.0, devices=frozenset({(0, None)}))


@pytest.mark.parametrize("holder, running, tracked, daemons, want", [
    (_holder(cgroup_job="42"), {}, {}, set(), "kill"),            # escaped the kill, still in the job's cgroup
    (_holder(cgroup_job="41"), {}, {}, set(), "kill"),            # cgroup of another job that no longer runs
    (_holder(cgroup_job="43"), {"43": 1001}, {}, set(), "keep"),  # a running job's process on a shared GPU
    (_holder(), {"43": 1001}, {4242: "43"}, set(), "keep"),       # Slurm tracks it for a running job
    (_holder(), {}, {}, {4242}, "keep"),                          # a running job's MPS server
    (_holder(), {}, {}, set(), "kill"),                           # the user's, started during the job, alone
    (_holder(), {"43": 1001}, {}, set(), "drain"),                # the user has another job: may be its
    (_holder(started=800.0), {}, {}, set(), "drain"),             # started before the job: outside any job
    (_holder(uid=1002), {}, {}, set(), "drain"),                  # another user
    (_holder(uid=0), {}, {}, set(), "drain"),                     # root
    (_holder(uid=None), {}, {}, set(), "drain"),                  # uid unreadable
])
def test_what_the_epilog_does_with_each_process_on_the_jobs_gpu(holder, running, tracked, daemons, want):
    assert judge(holder, ended=ENDED, running=running, tracked=tracked, daemons=daemons).action == want


def test_a_slurm_failure_kills_and_drains_nothing_it_would_need_slurm_for():
    def verdict(h, running, tracked):
        return judge(h, ended=ENDED, running=running, tracked=tracked, daemons=set()).action

    assert verdict(_holder(cgroup_job="42"), None, None) == "kill"  # the cgroup alone proves it
    assert verdict(_holder(cgroup_job="41"), None, {}) == "unknown"  # does job 41 still run? squeue failed
    assert verdict(_holder(uid=1002), None, {}) == "unknown"
    assert verdict(_holder(uid=1002), {"43": 1002}, None) == "unknown"  # bob's running job may own it
    assert verdict(_holder(uid=1002), {}, None) == "drain"  # bob has no job here
    assert verdict(_holder(), {"43": 1001}, None) == "drain"  # the ended job's user: ambiguous either way


def test_doctor_kills_only_what_a_cgroup_proves():
    assert judge(_holder(cgroup_job="41"), ended=None, running={}, tracked={}, daemons=set()).action == "kill"
    assert judge(_holder(cgroup_job="41"), ended=None, running={"41": None}, tracked={},
                 daemons=set()).action == "keep"
    assert judge(_holder(), ended=None, running={}, tracked={}, daemons=set()).action == "drain"


def test_a_whole_gpu_job_holds_its_mig_devices_and_a_mig_job_only_its_own():
    whole = EndedJob("1", devices=frozenset({(0, None)}))
    mig = EndedJob("2", devices=frozenset({(0, 3)}))
    assert whole.holds(_holder(gi_id=5)) and mig.holds(_holder(gi_id=3)) and not mig.holds(_holder(gi_id=5))
    assert not whole.holds(_holder(gpu=1))


def test_the_drain_reason_holds_no_user_bytes_and_fits_slurm():
    v = judge(_holder(uid=NOBODY), ended=ENDED, running={}, tracked={}, daemons=set())
    reason = drain_reason("42", [v, v])
    assert reason.startswith("gpushare epilog job 42: pid 4242 of nobody(") and "GPU 0 (GPU-x)" in reason
    assert "+1 more" in reason and len(reason) <= 250
    assert user_label(None) == "unknown user" and user_label(2**31 - 7) == f"uid {2**31 - 7}"


# --- the Epilog and doctor on a simulated node, with real fake-app processes ------------------------------


@pytest.fixture(scope="module")
def lib(tmp_path_factory) -> Path:
    """The product, the dev package, click and psutil where every user can import them (as the dev cluster's
    ``lib/``): the fake app runs as another user with an interpreter every user can run."""
    d = tmp_path_factory.mktemp("lib")
    for package in PACKAGE_DIRS:
        shutil.copytree(package, d / package.name, ignore=shutil.ignore_patterns("__pycache__"))
    for p in [d, *d.parents]:
        if p == Path("/"):
            break
        p.chmod(p.stat().st_mode | 0o755)
    for p in d.rglob("*"):
        p.chmod(0o755 if p.is_dir() else 0o644)
    return d


@pytest.fixture
def table(node, monkeypatch, lib):  # noqa: F811
    node.root.chmod(0o755)
    (node.root / "machines").chmod(0o755)
    node.lib = lib
    t = node.root / "procs"
    t.mkdir(mode=0o1777)
    t.chmod(0o1777)
    monkeypatch.setenv(PROCESS_TABLE_ENV, str(t))
    return t


def start_app(node, table: Path, *, devices="0", uid: int | None = None) -> subprocess.Popen:  # noqa: F811
    """The fake GPU application on ``devices`` as ``uid`` (a real process; NVML reports its pid)."""
    argv = [job_python(), "-s", "-m", "slurm_gpushare_dev.fakeapp",
            "--machine", str(node.root / "machines" / "a100.json"), "--table", str(table),
            "--devices", devices, "--mem", "2G", "--seconds", "120"]
    env = {**os.environ, "PYTHONPATH": str(node.lib)}
    proc = subprocess.Popen(argv, env=env, user=uid, cwd="/")
    deadline = time.monotonic() + 30
    while not (table / f"{proc.pid}.json").exists():
        assert proc.poll() is None and time.monotonic() < deadline, "the fake app did not register"
        time.sleep(0.05)
    return proc


def _ctx(node, owners=None):  # noqa: F811
    return HookContext(node.ctx.config, "a100", job_record=node.ctx.job_record, drain=node.ctx.drain,
                       job_owners=lambda n: dict(owners or {}), listpids=lambda n: "")


def _gpu_job(node, job, idx="0"):  # noqa: F811
    node.jobs[job] = SHOW.format(job=job, node="a100", gres="gpu:a100:1", detail=f"gpu:a100:1(IDX:{idx})", ac="")
    return {"SLURM_JOB_ID": job, "SLURMD_NODENAME": "a100", "SLURM_JOB_GPUS": idx, "CUDA_VISIBLE_DEVICES": idx,
            "SLURM_JOB_UID": str(os.getuid())}


def _wait_gone(pid: int) -> bool:
    deadline = time.monotonic() + 10
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not pid_alive(pid)


def test_the_epilog_kills_a_process_of_the_ended_job_and_the_node_stays_up(node, table):  # noqa: F811
    from slurm_gpushare.node.prolog import prolog

    env = _gpu_job(node, "201")
    assert prolog(node.ctx, env) == 0
    app = start_app(node, table)  # the job's user's, started while the job ran, outliving it
    try:
        assert epilog(_ctx(node), env) == 0
        assert _wait_gone(app.pid) and node.drained == []  # (psutil reaps our child: no -9 to see)
        log = (node.root / "run" / "a100" / "node.log").read_text(errors="replace")
        assert f"job 201: killed pid {app.pid} of " in log and "on GPU 0 (" in log
    finally:
        app.kill()


def test_another_users_process_on_the_jobs_gpu_drains_the_node_naming_pid_user_and_gpu(node, table):  # noqa: F811
    from slurm_gpushare.node.prolog import prolog

    env = _gpu_job(node, "202", idx="1")
    assert prolog(node.ctx, env) == 0
    other = start_app(node, table, devices="1", uid=NOBODY)
    elsewhere = start_app(node, table, devices="2", uid=NOBODY)  # not on the job's GPU: not this Epilog's
    try:
        assert epilog(_ctx(node), env) == 1
        assert other.poll() is None and elsewhere.poll() is None  # nothing killed
        (drained,) = node.drained
        assert drained[0] == "a100"
        assert f"pid {other.pid} of nobody({NOBODY}) on GPU 1 (GPU-" in drained[1], drained
        assert str(elsewhere.pid) not in drained[1]
        # doctor reports both, kills neither (no cgroup proves their job)
        report = doctor(_ctx(node), repair=True, running_jobs=set())
        left = [f for f in report if "holds the GPU" in f.problem]
        assert {f.problem.split()[1] for f in left} == {str(other.pid), str(elsewhere.pid)}
        assert all(f.action.startswith(LEFT_ALONE) for f in left)
        assert other.poll() is None and elsewhere.poll() is None
    finally:
        other.kill()
        elsewhere.kill()


def test_a_process_of_the_same_user_with_another_job_running_drains_instead_of_killing(node, table):  # noqa: F811
    from slurm_gpushare.node.prolog import prolog

    env = _gpu_job(node, "203")
    assert prolog(node.ctx, env) == 0
    app = start_app(node, table)
    try:
        assert epilog(_ctx(node, owners={"203": os.getuid(), "204": os.getuid()}), env) == 1
        assert app.poll() is None
        assert "running job 204" in node.drained[-1][1]
    finally:
        app.kill()


def test_doctor_kills_a_process_whose_cgroup_names_a_job_gone(node, table):  # noqa: F811
    app = start_app(node, table, devices="3")
    try:
        ctx = _ctx(node)
        cgroup = "4:devices:/slurm/uid_0/job_77/step_batch/task_0\n"
        from slurm_gpushare.node import leftovers

        real = leftovers.read_cgroup
        leftovers.read_cgroup = lambda pid: cgroup if pid == app.pid else real(pid)
        try:
            report = doctor(ctx, repair=False, running_jobs=set())
            (f,) = [f for f in report if "holds the GPU" in f.problem]
            assert f.job_id == "77" and f.action == "would kill it" and app.poll() is None
            (f,) = [f for f in doctor(ctx, repair=True, running_jobs=set()) if "holds the GPU" in f.problem]
            assert f.action == "killed it" and _wait_gone(app.pid)
        finally:
            leftovers.read_cgroup = real
    finally:
        app.kill()


def test_a_process_in_a_mig_device_is_named_by_the_mig_devices_uuid():
    from slurm_gpushare.errors import NvmlError
    from slurm_gpushare.hardware.fake import FakeNvml, ScheduledProcess
    from slurm_gpushare.node.leftovers import gpu_holders
    from slurm_gpushare_dev.cluster import packaged_machine

    fake = FakeNvml(packaged_machine("4x-h100-mig-mixed.json"))
    with fake:
        gpu = next(g for g in range(fake.device_count()) if fake.gpu_instances(g))
        inst = fake.gpu_instances(gpu)[-1]
    fake.add_process(ScheduledProcess(os.getpid(), gpu, start=0.0, steps=((0, 512, None),), gi_id=inst.gi_id))
    with fake:
        (h,) = gpu_holders(fake, [gpu])
    assert (h.pid, h.gi_id, h.uuid, h.uid) == (os.getpid(), inst.gi_id, inst.uuid, os.getuid())
    # NVML is asked per MIG device handle, and a failure names that device, as in the real port
    failing = FakeNvml(packaged_machine("4x-h100-mig-mixed.json"), fail={"nvmlDeviceGetComputeRunningProcesses": 15})
    with failing, pytest.raises(NvmlError, match=rf"nvmlDeviceGetComputeRunningProcesses\(gpu {gpu}, mig 0\)"):
        failing.processes(gpu)
