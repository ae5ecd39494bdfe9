"""The stand-in GPU application: schedule syntax, device resolution, the MPS memory limit."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from slurm_gpushare.errors import InputError
from slurm_gpushare.hardware.fake import FakeNvml, ProcessTable
from slurm_gpushare.hardware.machine import Machine
from slurm_gpushare_dev.cluster import packaged_machine
from slurm_gpushare_dev.fakeapp import EXIT_OOM, EXIT_USAGE, mps_limits, parse_schedule, resolve_devices
from tests.conftest import DEADLINE, wait_until


def test_schedule_syntax():
    assert parse_schedule("0:2G:20,3:8G:90,4:512:-") == ((0.0, 2048, 20.0), (3.0, 8192, 90.0), (4.0, 512, None))
    for bad, words in (("0:2G", "SECONDS:SIZE:SM"), ("x:2G:1", "seconds"), ("0:2G:101", "percentage"),
                       ("2:1G:1,1:1G:1", "ascend"), ("0:lots:1", "not a memory size")):
        with pytest.raises(InputError, match=words):
            parse_schedule(bad)


def test_mps_limit_variable():
    assert mps_limits("0=10G,1=512M") == {0: 10240, 1: 512}
    assert mps_limits("") == {}
    with pytest.raises(InputError, match="ORDINAL=SIZE"):
        mps_limits("10G")


def test_devices_resolve_like_cuda_visible_devices():
    fake = FakeNvml(packaged_machine("4x-h100-mig-mixed.json"))
    with fake:
        mig = fake.gpu_instances(2)[0]
        assert resolve_devices(fake, f"1,{fake.uuid(3)},{mig.uuid}") == [(1, None), (3, None), (2, mig.gi_id)]
        for bad in ("", "9", "GPU-nope"):
            with pytest.raises(InputError):
                resolve_devices(fake, bad)


def _run(tmp_path, *args, env=None):
    m = tmp_path / "m.json"
    m.write_text(packaged_machine("8x-a100-nv12-bridge.json").to_json())
    (tmp_path / "t").mkdir(exist_ok=True)
    return subprocess.Popen([sys.executable, "-m", "slurm_gpushare_dev.fakeapp", "--machine", str(m),
                             "--table", str(tmp_path / "t"), *args],
                            env={"PATH": "/usr/bin:/bin", **(env or {})}, stderr=subprocess.PIPE, text=True)


def test_the_app_is_on_the_gpu_while_it_runs_and_gone_after(tmp_path):
    proc = _run(tmp_path, "--mem", "3G", "--sm", "30", "--seconds", "3", env={"CUDA_VISIBLE_DEVICES": "4,5"})
    fake = FakeNvml(packaged_machine("8x-a100-nv12-bridge.json"), process_table=tmp_path / "t")
    with fake:
        wait_until(lambda: fake.processes(5) or proc.poll() is not None, "the app in the fake GPU table")
        assert [(p.pid, p.used_memory_mib, p.sm_util) for p in fake.processes(4)] == [(proc.pid, 3072, 30.0)]
        assert proc.wait(timeout=DEADLINE) == 0
        assert fake.processes(4) == () and not list((tmp_path / "t").glob("*.json"))


def _pipe_dir(tmp_path):
    """A pipe directory with a control daemon's socket in it (a file named ``control`` is what the app looks for)."""
    pipe = tmp_path / "pipe"
    pipe.mkdir()
    (pipe / "control").touch()
    return str(pipe)


def test_above_the_mps_limit_the_app_fails_like_cudamalloc(tmp_path):
    proc = _run(tmp_path, "--schedule", "0:2G:10,0.5:12G:80", "--seconds", "120",
                env={"CUDA_VISIBLE_DEVICES": "0", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=10G",
                     "CUDA_MPS_PIPE_DIRECTORY": _pipe_dir(tmp_path)})
    t0 = time.time()
    assert proc.wait(timeout=2 * DEADLINE) == EXIT_OOM
    assert time.time() - t0 < 60  # it failed when the step came (0.5 s in), not at the end (120 s)
    assert "out of memory" in proc.stderr.read() and not ProcessTable(tmp_path / "t").live()


@pytest.mark.parametrize("client", [True, False])
def test_the_app_is_an_mps_client_only_where_a_daemon_listens(tmp_path, client):
    """Like the CUDA driver: with a control daemon's socket in ``CUDA_MPS_PIPE_DIRECTORY`` the app is an MPS client
    (nvmlDeviceGetMPSComputeRunningProcesses lists it) and its limit holds; without one (the variable unset, or no
    daemon there) it runs a context of its own, past the limit."""
    env = {"CUDA_VISIBLE_DEVICES": "1", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=10G"}
    env["CUDA_MPS_PIPE_DIRECTORY"] = _pipe_dir(tmp_path) if client else str(tmp_path / "no-daemon")
    proc = _run(tmp_path, "--schedule", "0:2G:10,3:12G:80", "--seconds", "5", env=env)
    fake = FakeNvml(packaged_machine("8x-a100-nv12-bridge.json"), process_table=tmp_path / "t")
    with fake:
        wait_until(lambda: fake.processes(1) or proc.poll() is not None, "the app in the fake GPU table")
        assert [p.pid for p in fake.processes(1)] == [proc.pid]
        assert fake.mps_client_pids(1) == ({proc.pid} if client else set())
    assert proc.wait(timeout=DEADLINE) == (EXIT_OOM if client else 0)


def test_bad_usage_says_what_is_missing(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "slurm_gpushare_dev.fakeapp"], capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin"})
    assert proc.returncode == EXIT_USAGE and "GPUSHARE_NVML" in proc.stderr
    proc = _run(tmp_path, env={})
    assert proc.wait(timeout=10) == EXIT_USAGE and "CUDA_VISIBLE_DEVICES is empty" in proc.stderr.read()


@pytest.mark.parametrize("visible, mem", [("3", "100G"), ("MIG", "20G")])
def test_more_than_the_device_holds_fails_like_cudamalloc(tmp_path, visible, mem):
    # found in a trial: 100G "fit" on an 80 GB A100 and 20G in a 1g.10gb slice
    m = tmp_path / "m.json"
    machine = packaged_machine("4x-h100-mig-mixed.json")
    m.write_text(machine.to_json())
    if visible == "MIG":
        with FakeNvml(machine) as fake:
            visible = next(i.uuid for i in fake.gpu_instances(2) if i.profile == "1g.10gb")
    proc = subprocess.run([sys.executable, "-m", "slurm_gpushare_dev.fakeapp", "--machine", str(m), "--table",
                           str(tmp_path), "--mem", mem, "--seconds", "3"], capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "CUDA_VISIBLE_DEVICES": visible}, timeout=20)
    assert proc.returncode == EXIT_OOM and "out of memory" in proc.stderr and "device memory" in proc.stderr


@pytest.mark.parametrize("args, words", [
    (["--seconds", "nan"], "--seconds"), (["--seconds", "-1"], "--seconds"),
    (["--schedule", "nan:1G:50"], "seconds"), (["--machine", "/nonexistent.json"], "/nonexistent.json"),
    (["--table", "/nonexistent-dir/x"], "does not exist"),
])
def test_bad_arguments_are_refused(tmp_path, args, words):
    m = tmp_path / "m.json"
    m.write_text(packaged_machine("8x-a100-nv12-bridge.json").to_json())
    base = {"--machine": str(m), "--table": str(tmp_path)}
    for i in range(0, len(args), 2):
        base[args[i]] = args[i + 1]
    argv = [x for kv in base.items() for x in kv]
    proc = subprocess.run([sys.executable, "-m", "slurm_gpushare_dev.fakeapp", *argv], capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "CUDA_VISIBLE_DEVICES": "0"}, timeout=20)
    assert proc.returncode == EXIT_USAGE and words in proc.stderr, proc.stderr
    assert not Path("/nonexistent-dir").exists()


@pytest.mark.parametrize("args", [["--bogus"], ["--seconds", "soon"], ["--mem"]])
def test_a_usage_error_exits_64_not_2_which_means_out_of_memory(tmp_path, args):
    proc = subprocess.run([sys.executable, "-m", "slurm_gpushare_dev.fakeapp", *args], capture_output=True,
                          text=True, env={"PATH": "/usr/bin:/bin"}, timeout=20)
    assert proc.returncode == EXIT_USAGE != EXIT_OOM, proc.stderr
    assert proc.stderr.startswith("fake-gpu-app: error: ") and len(proc.stderr.splitlines()) == 1, proc.stderr


def test_the_app_reads_the_driver_s_limit_of_its_job_cgroup(tmp_path, monkeypatch):
    """A process in a job cgroup that the driver limits (nvmlDeviceSetMemoryLimits_v1, kept by the fake NVML)
    gets the hard limit and what the cgroup's other processes hold; outside a job cgroup, or on a MIG device,
    nothing."""
    from slurm_gpushare.node.membership import CgroupFs
    from slurm_gpushare_dev import fakeapp

    job = tmp_path / "cgroup" / "devices" / "slurm" / "uid_1000" / "job_7"
    job.mkdir(parents=True)
    monkeypatch.setattr(fakeapp, "CgroupFs", lambda: CgroupFs(
        f"36 25 0:31 / {tmp_path / 'cgroup' / 'devices'} rw - cgroup cgroup rw,devices\n"))
    monkeypatch.setattr(fakeapp, "read_cgroup", lambda pid: "5:devices:/slurm/uid_1000/job_7/step_0/task_0\n")
    m = tmp_path / "m.json"
    m.write_text(packaged_machine("4x-h100-mig-mixed.json").to_json())
    fake = FakeNvml(Machine.load(m), path=m)
    with fake:
        assert fakeapp.cgroup_limit(fake, (0, None), fakeapp.own_job_cgroup()) is None  # no limit set
        fake.set_memory_limits(0, str(job), 4096, 4096)
        assert fakeapp.cgroup_limit(fake, (0, None), fakeapp.own_job_cgroup()) == (4096, 0)
        assert fakeapp.cgroup_limit(fake, (1, None), fakeapp.own_job_cgroup()) is None  # another GPU
        mig = fake.gpu_instances(2)[0]
        assert fakeapp.cgroup_limit(fake, (2, mig.gi_id), fakeapp.own_job_cgroup()) is None
    monkeypatch.setattr(fakeapp, "read_cgroup", lambda pid: "5:devices:/user.slice\n")
    with fake:
        assert fakeapp.cgroup_limit(fake, (0, None), fakeapp.own_job_cgroup()) is None
