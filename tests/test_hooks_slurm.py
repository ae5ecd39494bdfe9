"""On real daemons: a job that needs nothing from slurmctld is run by the node hooks without asking it, so a
slurmctld the hooks cannot reach neither fails such a job nor drains its node.

A two-node dev cluster whose gres.conf has no shards (an A100 node and a MIG node, as ``gres-conf
--no-shards`` would write them): there slurmd's Prolog environment says all a whole-GPU or MIG job
can need (:func:`slurm_gpushare.node.prolog.plan_from_env`). The hooks' Slurm clients (``squeue``,
``scontrol``, ``scancel``) are replaced, through the wrappers' ``PATH``, by stand-ins that log the call
and fail the way an unreachable slurmctld does; the jobs themselves are submitted with the real clients.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from slurm_gpushare.slurm.nodegres import GresOptions
from slurm_gpushare_dev.cluster import DevCluster, packaged_machine
from tests.conftest import TEST_PORT, _skip_or_fail, _slurm_unavailable, wait_until

pytestmark = pytest.mark.slurm

NODES = {"a100-noshard": "8x-a100-nv12-bridge.json", "mig-noshard": "4x-h100-mig-mixed.json"}

UNREACHABLE = """\
#!/bin/sh
# a Slurm client that cannot reach slurmctld: log the call, fail as scontrol/squeue do
echo "${SLURM_SCRIPT_CONTEXT:-?} job=${SLURM_JOB_ID:-?} $(basename "$0") $*" >> "@LOG@"
echo "$(basename "$0"): error: Unable to contact slurm controller (connect failure)" >&2
exit 1
"""


@pytest.fixture(scope="module")
def ns():
    reason = _slurm_unavailable()
    if reason:
        _skip_or_fail(reason)
    root = Path(tempfile.mkdtemp(prefix="gps-ns-", dir="/tmp"))
    os.chmod(root, 0o755)
    c = DevCluster(root / "c", TEST_PORT + 650, {n: packaged_machine(f) for n, f in NODES.items()},
                   gres_options={n: GresOptions(shards=False) for n in NODES})
    c.up(out=open(os.devnull, "w"))
    stubs, log = root / "stubs", root / "slurm-calls.log"
    stubs.mkdir()
    log.touch(mode=0o666)
    for name in ("squeue", "scontrol", "scancel", "sinfo"):
        (stubs / name).write_text(UNREACHABLE.replace("@LOG@", str(log)))
        os.chmod(stubs / name, 0o755)
    for hook in ("prolog.sh", "epilog.sh"):
        path = c.root / "scripts" / hook
        head, body = path.read_text().split("\n", 1)
        path.write_text(f"{head}\nPATH={stubs}:${{PATH:-/usr/bin:/bin}}; export PATH\n{body}")
    c.calls = log  # type: ignore[attr-defined]
    try:
        yield c
    finally:
        c.down(out=open(os.devnull, "w"))
        shutil.rmtree(root, ignore_errors=True)


def _run(c: DevCluster, *args: str) -> tuple[str, str, str]:
    """Submit a job with the real clients, wait for its end; its final state and output."""
    out = c.root / f"out-{os.urandom(4).hex()}.txt"
    p = subprocess.run(["sbatch", "--parsable", f"--output={out}", *args, "--wrap",
                        'echo "CVD=$CUDA_VISIBLE_DEVICES"'], env=c.env, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    job = p.stdout.strip().split(";")[0]

    def ended() -> str | None:
        text = subprocess.run(["scontrol", "show", "job", job], env=c.env, capture_output=True, text=True).stdout
        state = next((kv.split("=", 1)[1] for kv in text.split() if kv.startswith("JobState=")), "")
        return state if state not in ("", "PENDING", "CONFIGURING", "RUNNING", "COMPLETING") else None

    state = wait_until(ended, f"job {job} to end")
    return job, state, out.read_text() if out.exists() else ""


def _drained(c: DevCluster, node: str) -> str:
    text = subprocess.run(["scontrol", "show", "node", node], env=c.env, capture_output=True, text=True).stdout
    return " ".join(kv for kv in text.split() if kv.startswith(("State=", "Reason=")))


def _prolog_calls(c: DevCluster, job: str) -> list[str]:
    return [line for line in c.calls.read_text().splitlines()  # type: ignore[attr-defined]
            if line.startswith("prolog_slurmd ") and f" job={job} " in line]


def test_whole_gpu_and_mig_jobs_run_with_slurmctld_unreachable_from_the_hooks(ns):
    for args in (["-w", "a100-noshard", "--gres=gpu:1"], ["-w", "mig-noshard", "--gres=gpu:h100_1g.10gb:1"],
                 ["-w", "a100-noshard"]):
        job, state, output = _run(ns, *args)
        assert state == "COMPLETED", (args, state, output, ns.calls.read_text())
        assert _prolog_calls(ns, job) == [], args
        node = args[1]
        assert "DRAIN" not in _drained(ns, node), (args, _drained(ns, node))
        if "h100_1g" in args[-1]:
            assert output.startswith("CVD=MIG-"), output  # the slice's UUID, from slurmd's device index
    # the Epilog asks slurmctld only for a GPU job's accounting record; a job without GPUs not at all
    assert not [line for line in ns.calls.read_text().splitlines()
                if line.startswith("epilog_slurmd ") and f" job={job} " in line]
