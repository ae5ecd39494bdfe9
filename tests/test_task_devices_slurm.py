"""Slurm's per-task and per-step GPU binding is the product's input, never its output: on the MIG node
(h100-mig), every task of every step sees the ``CUDA_VISIBLE_DEVICES`` plain Slurm gives it, with only the
entries that name a MIG device or a GPU of an MPS share translated to their UUIDs; a task without GPU gets
no GPU variable and no MPS variable. Under task/none and under task/cgroup with ConstrainDevices=yes.

What plain Slurm gives is what slurmstepd sets, per task: ``SLURM_STEP_GPUS`` (the batch step:
``SLURM_JOB_GPUS``) names the task's devices by their gres.conf index, and ``CUDA_VISIBLE_DEVICES`` names
the same devices in the same order, by that index under task/none and by their position among the step's
devices under ConstrainDevices (``common_gres_set_env`` in src/plugins/gres/common/gres_common.c,
``gres_use_local_device_index`` in src/common/gres.c at slurm-22-05-8-1; measured on the dev cluster); a
step without GPU has neither. The product never changes ``SLURM_STEP_GPUS``, so each task's expected value
is computed from it; under ConstrainDevices from the devices the task may open, since slurmstepd then names
the step's first device in every task's ``SLURM_STEP_GPUS`` of a ``--gpus-per-task`` step.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import TEST_PORT, private_cluster
from tests.security.conftest import USERS, users  # noqa: F401  (the fixture)

pytestmark = pytest.mark.slurm

NODE = "h100-mig"
#: The node's GPU devices by gres.conf index (the packaged 4x-h100-mig-mixed.json, gres.conf in its order):
#: whole GPUs 0 and 1, MIG 4g.40gb devices 2 and 3, MIG 1g.10gb devices 4 to 9.
WHOLE = {0: "GPU-00000000-0000-4000-8000-000000000000", 1: "GPU-00000000-0000-4000-8000-000000000001"}
MIG = {2: "MIG-00000000-0000-4000-8000-000200000002", 3: "MIG-00000000-0000-4000-8000-000300000001",
       4: "MIG-00000000-0000-4000-8000-000200000007", 5: "MIG-00000000-0000-4000-8000-000200000008",
       6: "MIG-00000000-0000-4000-8000-000200000009", 7: "MIG-00000000-0000-4000-8000-000300000011",
       8: "MIG-00000000-0000-4000-8000-000300000012", 9: "MIG-00000000-0000-4000-8000-000300000013"}
#: What every task prints: its tag (the step's case), then ``key=value`` fields separated by ``|``.
#: ``acc``: the node's device files the task can open (``test -r``: the device cgroup's verdict under
#: ConstrainDevices), which tell the test what the task really holds.
PROBE = r"""#!/bin/sh
acc=""
for f in @DEV@/nvidia[0-9]* @DEV@/nvidia-caps/nvidia-cap*; do [ -r "$f" ] && acc="$acc ${f##*/}"; done
echo "TASK|tag=$1|step=${SLURM_STEP_ID:-batch}|local=$SLURM_LOCALID|cvd=${CUDA_VISIBLE_DEVICES-unset}"\
"|sg=$SLURM_STEP_GPUS|jg=$SLURM_JOB_GPUS|pipe=$CUDA_MPS_PIPE_DIRECTORY|lim=$CUDA_MPS_PINNED_DEVICE_MEM_LIMIT|acc=$acc"
"""


@pytest.fixture(scope="module", params=["task/none", "task/cgroup"])
def mig_node(request, users):  # noqa: F811
    """A one-node dev cluster (the MIG node) under task/none or under task/cgroup with ConstrainDevices=yes,
    and its probe script. The jobs are an unprivileged user's (the job directory's files are read as that user)."""
    cgroup = request.param == "task/cgroup"
    port = TEST_PORT + (900 if cgroup else 850)
    for c, root in private_cluster("gps-tdev-", port, {NODE: "4x-h100-mig-mixed.json"}, cgroup=cgroup):
        os.chmod(c.root, 0o755)
        (root / "out").mkdir()
        os.chmod(root / "out", 0o1777)
        probe = root / "probe.sh"
        probe.write_text(PROBE.replace("@DEV@", str(c.device_dir(NODE))))
        os.chmod(probe, 0o755)
        c.probe = str(probe)  # type: ignore[attr-defined]
        c.out = root / "out"  # type: ignore[attr-defined]
        yield c


def _submit(c, *args: str, script: str) -> tuple[str, Path]:
    out = c.out / f"out-{time.monotonic_ns()}.txt"
    proc = subprocess.run(["runuser", "-u", USERS[0], "--", "sbatch", "--parsable", "-w", NODE, f"--output={out}",
                           *args, "--wrap", script], env=c.env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip().split(";")[0], out


def _wait(c, jobs: list[tuple[str, Path]]) -> list[str]:
    """Each job's output once all ended (all COMPLETED)."""
    deadline = time.monotonic() + 150
    done: dict[str, str] = {}
    while len(done) < len(jobs) and time.monotonic() < deadline:
        for job, _ in jobs:
            text = subprocess.run(["scontrol", "show", "job", job], env=c.env, capture_output=True, text=True).stdout
            if any(f"JobState={s}" in text for s in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT")):
                done[job] = text
        time.sleep(0.5)
    outputs = [out.read_text() if out.exists() else "" for _, out in jobs]
    for (job, _), output in zip(jobs, outputs, strict=True):
        assert "JobState=COMPLETED" in done.get(job, ""), (job, done.get(job), output)
    return outputs


def _tasks(output: str) -> list[dict[str, str]]:
    return [dict(part.split("=", 1) for part in line.split("|")[1:])
            for line in output.splitlines() if line.startswith("TASK|")]


def _gres_files(c) -> dict[str, int]:
    """The node's GPU devices: the device file that is each one's own (``File=``, or the last of
    ``MultipleFiles=``: a MIG device's compute-instance cap) -> its gres.conf index."""
    out: dict[str, int] = {}
    for line in (c.root / "etc" / "gres.conf").read_text().splitlines():
        fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
        if fields.get("NodeName") == NODE and fields.get("Name") == "gpu":
            files = fields.get("File") or fields["MultipleFiles"]
            out[files.split(",")[-1].rsplit("/", 1)[-1]] = len(out)
    return out


def _expected(task: dict[str, str], cgroup: bool, share: dict[int, str], files: dict[str, int]) -> str:
    """Plain Slurm's CUDA_VISIBLE_DEVICES for the task, MIG devices and the share's GPUs as UUIDs. Under
    ConstrainDevices the task's devices are those the device cgroup lets it open (slurmstepd names the step's
    first device in every task's SLURM_STEP_GPUS of a --gpus-per-task step, measured on 22.05 to 26.05), in
    index order, each at its position among them; otherwise the gres.conf indices slurmstepd names."""
    if cgroup:
        ids = ",".join(str(i) for i in sorted(files[f] for f in task["acc"].split() if f in files))
    else:
        ids = task["jg"] if task["tag"] == "batch" else task["sg"]  # 26.05 gives the batch step SLURM_STEP_ID=-5
    if not ids:
        return "unset"
    table = {**MIG, **share}
    return ",".join(table.get(int(g), str(pos) if cgroup else g) for pos, g in enumerate(ids.split(",")))


def test_each_task_sees_slurms_devices_translated_only_for_mig_and_mps(mig_node):
    c = mig_node
    cgroup = c.cgroup
    p = c.probe
    files = _gres_files(c)
    mig = _submit(c, "-n2", "-c2", "--mem=1G", "--gres=gpu:h100_1g.10gb:3", script="; ".join([
        f"{p} batch",
        f"srun -n2 -c2 --gpus-per-task=1 --exclusive {p} per-task",
        f"srun -n2 -c2 --gpu-bind=single:1 {p} single",
        f"srun -n2 -c2 --gpu-bind=map_gpu:1,0 {p} map",
        f"srun -n1 -c2 --gpus=h100_1g.10gb:1 {p} one-of-three",
        f"srun -n1 -c2 --gres=none {p} gres-none",
        f"srun -n1 -c2 --gpus=0 {p} gpus-0",
        f"(srun -n1 -c2 --gpus=1 --mem=100M --exact sh -c '{p} conc; sleep 2' &"
        f" srun -n1 -c2 --gpus=1 --mem=100M --exact sh -c '{p} conc; sleep 2' & wait)",
        f"(srun -n1 -c2 --mem=100M sh -c '{p} under; sleep 3' & sleep 1;"
        f" srun -n1 --overlap --gpus=1 --mem=100M {p} overlap; wait)"]))
    shard = _submit(c, "-n1", "-c2", "--mem=1G", "--gres=shard:10", script="; ".join([
        f"{p} batch", f"srun {p} step", f"srun --gres=none {p} gres-none"]))
    mixed = _submit(c, "-n2", "-c2", "--mem=1G", "--gres=gpu:h100:1,gpu:h100_4g.40gb:1", script="; ".join([
        f"{p} batch", f"srun -n2 -c2 --gpus-per-task=1 {p} per-task", f"srun -n1 -c2 --gres=none {p} gres-none"]))
    out_mig, out_shard, out_mixed = _wait(c, [mig, shard, mixed])

    tasks = _tasks(out_mig)
    by_tag: dict[str, list[dict[str, str]]] = {}
    for t in tasks:
        by_tag.setdefault(t["tag"], []).append(t)
    assert sorted((k, len(v)) for k, v in by_tag.items()) == sorted(
        [("batch", 1), ("per-task", 2), ("single", 2), ("map", 2), ("one-of-three", 1), ("gres-none", 1),
         ("gpus-0", 1), ("conc", 2), ("under", 1), ("overlap", 1)]), out_mig
    for t in tasks:
        assert t["cvd"] == _expected(t, cgroup, {}, files), (t, out_mig)
        assert not (t["pipe"] or t["lim"]), t
    assert by_tag["batch"][0]["cvd"].count("MIG-") == 3
    for tag in ("per-task", "single", "map", "one-of-three", "conc", "overlap"):
        assert all(t["cvd"].startswith("MIG-") and "," not in t["cvd"] for t in by_tag[tag]), (tag, out_mig)
    assert len({t["cvd"] for t in by_tag["per-task"]}) == 2, out_mig  # one slice each, a different one
    assert len({t["cvd"] for t in by_tag["conc"]}) == 2  # concurrent steps: one slice each, a different one
    assert by_tag["gres-none"][0]["cvd"] == by_tag["gpus-0"][0]["cvd"] == "unset", out_mig

    tasks = _tasks(out_shard)
    held = int(next(t["jg"] for t in tasks if t["tag"] == "batch"))
    share = {held: WHOLE[held]}
    for t in tasks:
        assert t["cvd"] == _expected(t, cgroup, share, files), (t, out_shard)
        if t["tag"] == "gres-none":  # a GPU-less step of a shard job: no GPU, no MPS pipe, no limit
            assert t["cvd"] == "unset" and not (t["pipe"] or t["lim"]), (t, out_shard)
        else:
            assert t["cvd"] == WHOLE[held] and t["pipe"] and t["lim"], (t, out_shard)

    tasks = _tasks(out_mixed)
    assert len(tasks) == 4, out_mixed
    for t in tasks:
        assert t["cvd"] == _expected(t, cgroup, {}, files), (t, out_mixed)
        assert not (t["pipe"] or t["lim"]), t
    per_task = sorted(t["cvd"] for t in tasks if t["tag"] == "per-task")
    assert per_task[0].isdigit() and per_task[1].startswith("MIG-"), out_mixed  # the whole GPU keeps Slurm's form
