"""Task binding on a dev cluster that confines devices (task/cgroup, ConstrainDevices=yes): what each task
of a multi-GPU job is told (``CUDA_VISIBLE_DEVICES``, the product's hints) against what it can open and
what the job holds.

What a task can open is measured, not assumed: each fake ``nvidiaN`` is a character device without a
driver behind it, so opening one the task's device cgroup allows fails with ENXIO ("No such device or
address"), one it denies with EPERM ("Operation not permitted"). A ``CUDA_VISIBLE_DEVICES`` entry names
a device the task can open when it is a ``GPU-`` UUID of an allowed device, or an index below the number
of allowed devices (CUDA numbers the devices a process can open from 0; with ConstrainDevices Slurm
numbers the step's GPUs from 0 too: ``gres_use_local_device_index`` in src/interfaces/gres.c at
slurm-24-11-5-1, src/common/gres.c at slurm-22-05-8-1).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from slurm_gpushare.hardware.fake import FakeNvml
from slurm_gpushare.hardware.machine import Machine
from slurm_gpushare.slurm.job import parse_gres_detail
from slurm_gpushare_dev.cluster import DevCluster, packaged_machine
from tests.conftest import TEST_PORT, _skip_or_fail, _slurm_unavailable
from tests.security.conftest import USERS, users  # noqa: F401  (the fixture)

pytestmark = pytest.mark.slurm

NODE = "a100-nvb"
#: What every task prints: one line, ``key=value`` fields separated by ``|``.
PROBE = r"""#!/bin/sh
dev="$1"
ok=""
for f in "$dev"/nvidia[0-9]*; do
  if head -c1 "$f" 2>&1 | grep -q "not permitted"; then :; else ok="$ok,${f##*/nvidia}"; fi
done
echo "TASK|step=${SLURM_STEP_ID:-batch}|local=$SLURM_LOCALID|cvd=$CUDA_VISIBLE_DEVICES|open=${ok#,}"\
"|ring=$GPUSHARE_GPU_RING|cpus=$GPUSHARE_TASK_CPUS|nic=$NCCL_IB_HCA|devs=$GPUSHARE_TASK_DEVICES"
"""


@pytest.fixture(scope="module")
def cg(users):  # noqa: F811
    """A one-node dev cluster (the NVLink-bridged A100 node) with ConstrainDevices=yes, and its probe script.
    Its jobs are an unprivileged user's (what a job's user can read and list differs from root's)."""
    reason = _slurm_unavailable()
    if reason:
        _skip_or_fail(reason)
    root = Path(tempfile.mkdtemp(prefix="gps-bind-", dir="/tmp"))
    os.chmod(root, 0o755)
    c = DevCluster(root / "c", TEST_PORT + 600, {NODE: packaged_machine("8x-a100-nv12-bridge.json")}, cgroup=True)
    c.up(out=open(os.devnull, "w"))
    os.chmod(c.root, 0o755)
    (root / "out").mkdir(mode=0o1777)
    os.chmod(root / "out", 0o1777)
    probe = root / "probe.sh"
    probe.write_text(PROBE)
    os.chmod(probe, 0o755)
    c.probe = f"{probe} {c.device_dir(NODE)}"  # type: ignore[attr-defined]
    c.machine = Machine.load(c.root / "machines" / f"{NODE}.json")  # type: ignore[attr-defined]
    try:
        yield c
    finally:
        c.down(out=open(os.devnull, "w"))
        shutil.rmtree(root, ignore_errors=True)


def _run(c: DevCluster, *args: str, script: str) -> tuple[str, dict[str, str]]:
    """Submit ``script`` with ``args`` as the first test user, wait for the job to end; its output and
    ``scontrol -d show job`` fields."""
    out = Path(c.root).parent / "out" / f"out-{time.monotonic_ns()}.txt"
    proc = subprocess.run(["runuser", "-u", USERS[0], "--", "sbatch", "--parsable", "-w", NODE, f"--output={out}",
                           *args, "--wrap", script],
                          env=c.env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    job = proc.stdout.strip().split(";")[0]
    detail = ""
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        text = subprocess.run(["scontrol", "-d", "show", "job", job], env=c.env, capture_output=True,
                              text=True).stdout
        if "CPU_IDs=" in text and "(IDX:" in text:  # the GRES detail is gone once the job completes
            detail = text
        if "JobState=COMPLETED" in text or "JobState=FAILED" in text or "JobState=CANCELLED" in text:
            break
        time.sleep(0.3)
    assert "JobState=COMPLETED" in text, (text, out.read_text() if out.exists() else "")
    line = next((ln for ln in detail.splitlines() if "CPU_IDs=" in ln), "")
    fields = dict(kv.split("=", 1) for kv in line.split() if "=" in kv)  # Nodes= CPU_IDs= Mem= GRES=
    return out.read_text(), fields


def _tasks(output: str) -> list[dict[str, str]]:
    rows = []
    for line in output.splitlines():
        if line.startswith("TASK|"):
            rows.append(dict(part.split("=", 1) for part in line.split("|")[1:]))
    return rows


def _opens(c: DevCluster, task: dict[str, str]) -> bool:
    """Whether every entry of the task's CUDA_VISIBLE_DEVICES names a device the task can open."""
    minor = {u: m for u, m in _uuids(c).values()}
    allowed = [int(m) for m in task["open"].split(",") if m]
    for entry in filter(None, task["cvd"].split(",")):
        if entry.isdigit():
            if int(entry) >= len(allowed):
                return False
        elif minor.get(entry) not in allowed:
            return False
    return True


def _uuids(c: DevCluster) -> dict[int, tuple[str, int]]:
    """NVML index -> (UUID, device minor) of the node's fake GPUs (what every fake NVML of the node says)."""
    with FakeNvml(c.machine) as port:  # type: ignore[attr-defined]
        return {i: (port.uuid(i), port.minor_number(i)) for i in range(port.device_count())}


def _cpus_of_job(c: DevCluster, fields: dict[str, str]) -> set[int]:
    """The logical CPUs of the cores the job holds: ``CPU_IDs`` of ``scontrol -d show job`` are Slurm's
    abstract CPU ids, ``threads_per_core`` consecutive ids per core (scontrol(1)); a core's threads are
    its logical CPUs by the machine's layout (``core_of_cpu``, or core ``c`` = CPU ``c`` mod cores)."""
    layout = c.machine.cpus  # type: ignore[attr-defined]
    ids: set[int] = set()
    for part in fields["CPU_IDs"].split(","):
        lo, _, hi = part.partition("-")
        ids.update(range(int(lo), int(hi or lo) + 1))
    cores = {i // layout.threads_per_core for i in ids}
    return {cpu for cpu in range(layout.cpus)
            if (layout.core_of_cpu[cpu] if layout.core_of_cpu else cpu % layout.cores) in cores}


def _cpulist(text: str) -> set[int]:
    out: set[int] = set()
    for part in filter(None, text.split(",")):
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


def test_a_plain_four_gpu_job_keeps_slurms_devices_and_gets_no_hints(cg):
    output, _ = _run(cg, "--gres=gpu:4", "-n", "4", script=f"{cg.probe}; srun {cg.probe}")
    tasks = _tasks(output)
    assert len(tasks) == 5, output
    # ConstrainDevices: Slurm numbers the job's (and the step's) four GPUs 0-3 and the task opens four
    assert all(t["cvd"] == "0,1,2,3" and len(t["open"].split(",")) == 4 for t in tasks), output
    assert all(_opens(cg, t) for t in tasks), output
    assert all(not (t["ring"] or t["cpus"] or t["nic"] or t["devs"]) for t in tasks), output
    assert "slurm-gpushare:" not in output


def test_gpus_per_task_gives_each_task_the_one_gpu_it_can_open(cg):
    output, _ = _run(cg, "--gpus-per-task=1", "-n", "4", script=f"srun {cg.probe}")
    tasks = _tasks(output)
    assert len(tasks) == 4, output
    # Slurm binds one GPU per task (--gpus-per-task implies --gpu-bind=per_task:1) and confines the task to it
    assert all(t["cvd"] == "0" and len(t["open"].split(",")) == 1 for t in tasks), output
    assert len({t["open"] for t in tasks}) == 4, output  # four different GPUs
    assert all(_opens(cg, t) for t in tasks), output
    assert all(not (t["ring"] or t["cpus"]) for t in tasks), output


def test_gpu_bind_single_in_a_gpushare_job_keeps_slurms_binding(cg):
    output, _ = _run(cg, "--gres=gpushare:mode=gpu:4", "-n", "4",
                     script=f"{cg.probe}; srun --gpu-bind=single:1 {cg.probe}")
    tasks = _tasks(output)
    steps = [t for t in tasks if t["step"] == "0"]
    assert len(steps) == 4, output
    assert all(t["cvd"] == "0" and len(t["open"].split(",")) == 1 for t in steps), output
    assert all(_opens(cg, t) for t in tasks), output
    # nothing the batch step's TaskProlog exported is left in the bound tasks
    assert all(not (t["ring"] or t["cpus"] or t["nic"] or t["devs"]) for t in steps), output


def test_a_gpushare_job_gets_the_ring_it_can_open_and_cpu_hints_inside_its_cpus(cg):
    output, fields = _run(cg, "--gres=gpushare:mode=gpu:4", "-n", "4", "-c", "3",
                          script=f"{cg.probe}; srun {cg.probe}; srun -n 2 {cg.probe}")
    tasks = _tasks(output)
    assert len(tasks) == 1 + 4 + 2, output
    by_index = _uuids(cg)
    assert fields.get("GRES"), fields
    held = parse_gres_detail(fields["GRES"])[0].indices
    assert len(held) == 4, fields
    uuids = {by_index[i][0] for i in held}
    for t in tasks:
        entries = t["cvd"].split(",")
        assert set(entries) == uuids and _opens(cg, t), (t, output)
        ring = [int(g) for g in t["ring"].split(",")]
        assert entries == [by_index[g][0] for g in ring]
        # NVLink partners (the description's links with nvlinks > 0) are ring neighbours
        for link in cg.machine.links:
            if link.nvlinks and link.a in ring and link.b in ring:
                i, j = ring.index(link.a), ring.index(link.b)
                assert (i - j) % len(ring) in (1, len(ring) - 1), (ring, link)
    assert len({t["cvd"] for t in tasks}) == 1  # every task sees the same list (CUDA IPC between ranks)
    job_cpus = _cpus_of_job(cg, fields)
    for t in tasks:
        assert t["cpus"] and _cpulist(t["cpus"]) <= job_cpus, (t, sorted(job_cpus))
    for step in ("0", "1"):
        mine = [_cpulist(t["cpus"]) for t in tasks if t["step"] == step]
        assert all(not (a & b) for i, a in enumerate(mine) for b in mine[i + 1:]), mine  # disjoint
    # the TaskProlog prints no note into the job's output unless node.toml's task_notes asks (issue 31 item 3)
    assert "slurm-gpushare: CUDA_VISIBLE_DEVICES names GPUs" not in output, output


def test_a_share_is_held_to_its_memory_by_the_driver_s_limit_on_its_job_cgroup(cg):
    """Issue 27 item 3, on real daemons: where the driver keeps a per-cgroup memory limit
    (nvmlDeviceSetMemoryLimits_v1, R615+; the fake NVML models it), the node monitor sets a 10G share's limit on
    the job's cgroup (task/cgroup makes it when the job's first step starts, after the Prolog on 22.05) as soon
    as it sees a process of the job. Then a third process that would take the job past 10 GiB, inside MPS
    (the per-client MPS limit would let it) or outside MPS, fails its allocation at once, where the monitor
    alone would act after its grace; the job's processes within the share run on, nothing is killed."""
    limits = cg.root / "machines" / f"{NODE}.json.memlimits.json"
    app = cg.fake_gpu_app
    script = (
        f"{app} --mem 1G --seconds 60 & first=$!\n"
        # the monitor sets the limit on its first sample that sees a process of the job
        f"for i in $(seq 300); do grep -q \"job_$SLURM_JOB_ID\\\"\" {limits} 2>/dev/null && break; sleep 0.1; done\n"
        f"grep -q \"job_$SLURM_JOB_ID\\\"\" {limits} && echo LIMIT=set\n"
        f"{app} --mem 6G --seconds 60 & second=$!\n"
        "sleep 1\n"
        f"{app} --mem 6G --seconds 1; echo THIRD=$?\n"
        f"env -u CUDA_MPS_PIPE_DIRECTORY {app} --mem 4G --seconds 1; echo OUTSIDE=$?\n"
        f"{app} --mem 2G --seconds 1; echo WITHIN=$?\n"
        "kill $first $second; wait\n")
    output, _ = _run(cg, "--gres=gpushare:mem=10G", script=script)
    assert "LIMIT=set" in output, output
    assert "THIRD=2" in output and "OUTSIDE=2" in output and "WITHIN=0" in output, output
    assert "out of memory (its cgroup's device memory limit 10G, of which its other processes hold 7G)" in output
    log = (cg.root / "log" / f"monitor-{NODE}.log").read_text()
    assert "the driver holds its processes to 10240 MiB on GPU" in log, log[-2000:]
    assert "enforce:" not in log, log[-2000:]  # the monitor had nothing to act on
