"""A GPU that shares out shards is never also given whole while one of its shares still runs.

The product's guard (the Prolog, :func:`slurm_gpushare.node.prolog.wait_for_gpus`) requeues such a job: it
waits, and runs once the share has ended; the share's job and the node are not touched.

Measured on the dev cluster (Slurm 22.05.8, a node of 2 A100 80GB with 80 shards each): two shard jobs on
GPU 0, a whole-GPU job on GPU 1; the first shard job ends; a new ``gpu:1`` job then got GPU 0
(``GRES=gpu:a100:1(IDX:0)``) while the second shard job still ran there: slurmctld marked the GPU free of
shards when one of its shard jobs ended. The whole-GPU job's user is told 80 GB that the share's MPS limit
also promised.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import tempfile
from dataclasses import replace
from datetime import datetime
from pathlib import Path

import pytest

from slurm_gpushare.slurm.nodegres import GresOptions
from slurm_gpushare_dev.cluster import DevCluster, packaged_machine
from tests.conftest import (
    FINAL_STATES,
    TEST_PORT,
    Job,
    SlurmSession,
    _skip_or_fail,
    _slurm_unavailable,
    wait_until,
)

pytestmark = pytest.mark.slurm

NODE = "a2"
PORT = TEST_PORT + 700


def _two_gpus():
    m = packaged_machine("8x-a100-nv12-bridge.json")
    keep = {0, 1}
    return replace(m, gpus=m.gpus[:2], links=tuple(lk for lk in m.links if lk.a in keep and lk.b in keep),
                   nics=tuple(replace(n, paths=n.paths[:2]) for n in m.nics))


@pytest.fixture(scope="module")
def two_gpu() -> SlurmSession:
    """A one-node dev cluster: 2 A100 80GB, 80 shards (1 GiB) each."""
    reason = _slurm_unavailable()
    if reason:
        _skip_or_fail(reason)
    root = Path(tempfile.mkdtemp(prefix="gps-shares-", dir="/tmp"))
    os.chmod(root, 0o755)
    c = DevCluster(root / "c", PORT, {NODE: _two_gpus()}, gres_options={NODE: GresOptions(shard_unit_mib=1024)})
    c.up(out=open(os.devnull, "w"))
    session = SlurmSession(c, c.root / "test-output")
    try:
        yield session
    finally:
        session.cancel_all()
        c.down(out=open(os.devnull, "w"))
        shutil.rmtree(root, ignore_errors=True)


def _idx(slurm: SlurmSession, job: Job) -> str:
    """The GPU indices slurmctld gave the job on the node, from ``scontrol -d show job``: ``GRES=...(IDX:0)``
    (22.05; whole GPUs on every release) or, for shards from 23.11, per-GPU counts ``GRES=shard:30(30/80,0/80)``
    (the GPUs whose count is not 0)."""
    out = slurm.run(["scontrol", "show", "job", "-d", job.id]).stdout
    m = re.search(r" GRES=\S*\(IDX:([0-9,-]+)\)", out)
    if m:
        return m.group(1)
    m = re.search(r" GRES=shard\S*?\(([0-9/,]+)\)", out)
    if m:
        return ",".join(str(i) for i, c in enumerate(m.group(1).split(",")) if not c.startswith("0/"))
    return ""


def test_a_gpu_is_not_given_whole_while_one_of_its_shares_still_runs(two_gpu, tmp_path):
    slurm = two_gpu
    go = tmp_path / "go"
    hold = f"until [ -e {go} ]; do sleep 0.2; done"
    a = slurm.sbatch("--gres=shard:30", wrap=hold)
    app = shlex.quote(str(slurm.cluster.fake_gpu_app))
    # b's app holds GPU memory on GPU 0 (a GPU process the late job's Epilog must leave alone)
    b = slurm.sbatch("--gres=shard:30", wrap=f"{app} --mem 20G --sm 30 --seconds 600 & {hold}; kill $!; wait")
    whole = slurm.sbatch("--gres=gpu:1", wrap=hold)
    for job in (a, b, whole):
        slurm.wait_started(job)
    assert _idx(slurm, a) == _idx(slurm, b) == "0" and _idx(slurm, whole) == "1", \
        [_idx(slurm, j) for j in (a, b, whole)]
    slurm.run(["scancel", a.id])
    slurm.wait(a)
    # GPU 0 still holds b's share: a whole-GPU job must not run there while b runs
    late = slurm.sbatch("--gres=gpu:1", wrap='echo "CVD=$CUDA_VISIBLE_DEVICES"')
    shown: dict[str, str] = {}

    def decided() -> bool:
        nonlocal shown
        shown = slurm.show_job(late.id)
        # pending once the scheduler has looked at it (a Reason), or ended (RUNNING and COMPLETING pass:
        # the requeue of 22.05 goes through them back to PENDING)
        state = shown.get("JobState", "")
        return (state == "PENDING" and shown.get("Reason") not in ("None", "", None)) or state in FINAL_STATES

    wait_until(decided, f"the scheduler deciding job {late.id}", describe=lambda: shown)
    # Slurm kept it pending (24.11, 26.05), or gave it GPU 0 and the Prolog requeued it (22.05: it waits for
    # its BeginTime); its script never ran
    assert shown.get("JobState") == "PENDING", (shown, _idx(slurm, late), _idx(slurm, b))
    assert "CVD=" not in late.output(), late.output()
    assert slurm.show_job(b.id).get("JobState") == "RUNNING"
    node = slurm.run(["scontrol", "show", "node", NODE]).stdout
    assert "DRAIN" not in node and "Reason=" not in node, node
    requeued = slurm.show_job(late.id)
    if requeued.get("Reason") == "BeginTime":
        # 22.05: requeued by the Prolog. Brought forward while b's share still runs (its user may do this; so did
        # the product's own Epilog once), slurmd launched the rerun without the Prolog, whole beside b's share
        # (issue 26 N12): that run is stopped, by the Prolog or by its TaskProlog and Epilog, and requeued again
        runs = int(requeued.get("Restarts", 0))
        slurm.run(["scontrol", "update", f"JobId={late.id}", "StartTime=now"])
        wait_until(lambda: int((shown := slurm.show_job(late.id)).get("Restarts", 0)) > runs
                   and shown.get("JobState") == "PENDING", f"job {late.id} started again and requeued",
                   describe=lambda: slurm.show_job(late.id))
        assert "CVD=" not in late.output(), late.output()
        assert slurm.show_job(b.id).get("JobState") == "RUNNING"
        node = slurm.run(["scontrol", "show", "node", NODE]).stdout
        assert "DRAIN" not in node, node
        requeued = slurm.show_job(late.id)
    go.touch()
    slurm.wait(b)
    slurm.wait(whole)
    # once the share has ended, GPU 0 is free: the late job runs, a requeued one after slurmctld's requeue delay,
    # never earlier: brought forward, slurmd would run it without the Prolog (issue 26 N12)
    done = slurm.wait(late)
    assert done.state == "COMPLETED" and "CVD=" in done.output(), (done.fields, done.output())
    if requeued.get("Reason") == "BeginTime":
        begins = datetime.fromisoformat(requeued["StartTime"]).timestamp()
        started = datetime.fromisoformat(done.fields["StartTime"]).timestamp()
        assert started >= begins, (requeued["StartTime"], done.fields["StartTime"])
