"""Fake NVML processes whose memory and SM utilization change over time, in-process and across processes."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from slurm_gpushare.errors import MachineDescriptionError
from slurm_gpushare.hardware.fake import FakeNvml, ProcessTable, ScheduledProcess
from slurm_gpushare.hardware.machine import GpuProcess
from slurm_gpushare.hardware.ports import open_nvml
from slurm_gpushare_dev.cluster import packaged_machine


class Clock:
    def __init__(self, t: float = 1000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def a100():
    return packaged_machine("8x-a100-nv12-bridge.json")


def test_a_scheduled_process_follows_its_steps(a100):
    clock = Clock()
    fake = FakeNvml(a100, clock=clock)
    fake.add_process(ScheduledProcess(42, 1, start=1000.0, steps=((0, 2048, 20), (3, 8192, 90), (5, 1024, None))))
    fake.add_process(ScheduledProcess(43, 1, start=1001.0, steps=((0, 512, 5),)))
    with fake:
        seen = []
        for t in (999.0, 1000.0, 1000.5, 1002.9, 1003.0, 1004.0, 1005.0, 1100.0):
            clock.t = t
            seen.append((fake.memory_used_mib(1), fake.utilization(1).gpu_percent))
        assert fake.processes(0) == ()
        clock.t = 1003.5
        assert fake.processes(1) == (GpuProcess(42, 8192, 90.0), GpuProcess(43, 512, 5.0))
    # before its start the process is not there; each step holds until the next; a step without SM adds none
    assert seen == [(0, 0), (2048, 20), (2048, 20), (2560, 25), (8704, 95), (8704, 95), (1536, 5), (1536, 5)]
    fake.remove_process(42)
    with fake:
        assert [p.pid for p in fake.processes(1)] == [43]


def test_utilization_is_capped_and_a_set_value_wins(a100):
    clock = Clock()
    fake = FakeNvml(a100, clock=clock)
    for pid in (1, 2):
        fake.add_process(ScheduledProcess(pid, 0, start=0.0, steps=((0, 100, 70),)))
    with fake:
        assert fake.utilization(0).gpu_percent == 100
        fake.set_utilization(0, 12)
        assert fake.utilization(0).gpu_percent == 12


@pytest.mark.parametrize("steps, words", [
    ((), "no steps"),
    (((2, 10, 1), (1, 10, 1)), "not ascending"),
    (((0, -1, 1),), "memory -1"),
    (((0, 10, 101),), "not a percentage"),
    (((0, 10),), "not (seconds, MiB, SM%)"),
])
def test_bad_schedules_are_refused_with_the_reason(steps, words):
    with pytest.raises(MachineDescriptionError, match=words.replace("(", r"\(").replace(")", r"\)")):
        ScheduledProcess(1, 0, start=0.0, steps=steps)


def test_a_process_on_a_gpu_the_machine_lacks_is_refused(a100):
    with pytest.raises(MachineDescriptionError, match="no GPU with index 9"):
        FakeNvml(a100).add_process(ScheduledProcess(1, 9, start=0.0, steps=((0, 1, 1),)))


def test_the_process_table_serves_live_processes_of_other_programs(a100, tmp_path, monkeypatch):
    table = ProcessTable(tmp_path / "procs")
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        table.register([ScheduledProcess(child.pid, 2, start=0.0, steps=((0, 3000, 40),)),
                        ScheduledProcess(child.pid, 3, start=0.0, steps=((0, 1000, None),), gi_id=None)])
        # a dead pid's entry is ignored (NVML forgets exited processes) and pruned
        dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True).stdout.strip()
        (tmp_path / "procs" / f"{dead}.json").write_text(json.dumps(
            [ScheduledProcess(int(dead), 2, start=0.0, steps=((0, 5, 5),)).to_dict()]))
        monkeypatch.setenv("GPUSHARE_FAKE_GPU_PROCESSES", str(tmp_path / "procs"))
        path = tmp_path / "m.json"
        path.write_text(a100.to_json())
        with open_nvml(f"fake:{path}") as port:
            assert port.processes(2) == (GpuProcess(child.pid, 3000, 40.0),)
            assert port.memory_used_mib(3) == 1000
        assert table.prune() == [int(dead)]
        assert oct((tmp_path / "procs").stat().st_mode & 0o7777) == "0o1777"
    finally:
        child.kill()
        child.wait()
    with FakeNvml(a100, process_table=tmp_path / "procs") as fake:
        assert fake.processes(2) == ()  # exited: gone
    table.unregister(child.pid)
    assert not list((tmp_path / "procs").glob("*.json"))


def test_a_corrupt_table_entry_names_its_file(a100, tmp_path):
    (tmp_path / "procs").mkdir()
    import os
    (tmp_path / "procs" / f"{os.getpid()}.json").write_text("{not json")
    with FakeNvml(a100, process_table=tmp_path / "procs") as fake, \
            pytest.raises(MachineDescriptionError, match=f"{os.getpid()}.json"):
        fake.processes(0)


def test_one_table_entry_is_one_pid(tmp_path):
    from slurm_gpushare.errors import InputError
    with pytest.raises(InputError, match="one pid"):
        ProcessTable(tmp_path).register([ScheduledProcess(1, 0, 0.0, ((0, 1, 1),)),
                                         ScheduledProcess(2, 0, 0.0, ((0, 1, 1),))])


def test_an_entry_whose_pid_now_names_another_process_is_not_served(a100, tmp_path):
    """A fake app killed with SIGKILL leaves its entry; once the kernel gives its pid to another process (pid_max
    is 32768 on a default Debian host: a long test session wraps around), that process must not "hold" a GPU:
    real NVML reports only processes with a CUDA context. The entry keeps the registering process's start time
    (``psutil.Process.create_time``) and counts only while the pid's process started then."""
    table = ProcessTable(tmp_path / "procs")
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        entry = table.register([ScheduledProcess(child.pid, 2, start=0.0, steps=((0, 3000, 40),))])
        with FakeNvml(a100, process_table=tmp_path / "procs") as fake:
            assert [p.pid for p in fake.processes(2)] == [child.pid]
        # the same file as an earlier process of that pid would have left it: born 100 s before this one
        data = json.loads(entry.read_text())
        for d in data:
            d["born"] -= 100.0
        entry.write_text(json.dumps(data))
        with FakeNvml(a100, process_table=tmp_path / "procs") as fake:
            assert fake.processes(2) == ()
        assert table.prune() == [child.pid]
        assert not entry.exists()
    finally:
        child.kill()
        child.wait()


def test_an_entry_describes_its_own_process_only_and_strict_values(a100, tmp_path):
    """A table file is written by an unprivileged user's process: it may describe that process only. One naming
    another pid (another user's, with "mps": false, to have it taken for a process outside MPS) is not read, and
    an "mps" that is not true/false/null, an infinite number or a NaN time is refused, naming the file."""
    import os

    procs = tmp_path / "procs"
    table = ProcessTable(procs)
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        table.register([ScheduledProcess(victim.pid, 2, start=0.0, steps=((0, 3000, 40),), mps=True)])
        forged = [{"pid": victim.pid, "gpu": 2, "start": 0, "gi_id": None, "steps": [[0, 1, 1]], "mps": False}]
        (procs / f"{os.getpid()}.json").write_text(json.dumps(forged))
        with FakeNvml(a100, process_table=procs) as fake:
            assert fake.mps_client_pids(2) == {victim.pid}
            assert [p.used_memory_mib for p in fake.processes(2)] == [3000]
        for bad in ({"mps": "no"}, {"mps": []}, {"mps": 0}, {"pid": 1e400}, {"steps": [[float("nan"), 1, 1]]},
                    {"start": float("inf")}):
            entry = {"pid": os.getpid(), "gpu": 2, "start": 0, "gi_id": None, "steps": [[0, 1, 1]], **bad}
            (procs / f"{os.getpid()}.json").write_text(json.dumps([entry]))
            with FakeNvml(a100, process_table=procs) as fake, \
                    pytest.raises(MachineDescriptionError, match=f"{os.getpid()}.json"):
                fake.processes(2)
    finally:
        victim.kill()
        victim.wait()
