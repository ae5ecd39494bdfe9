"""Billing and QOS limits on a dev cluster with slurmdbd: the ``TRESBillingWeights`` that ``gres-conf``
prints bill a ``shard:10`` job on an 80-shard GPU 10/80 of a whole-GPU job, and QOS limits in GPU-memory
terms (``gres/shard=``, ``billing=``) hold an unprivileged user's job past them.

Expected values are Slurm's documented rules (slurm.conf(5) TRESBillingWeights, tres.html: billing is the
sum of count x weight; fairshare uses it as a double, the ``billing`` TRES is "stored as an integer and
truncated") and the GPU's facts (an A100 80GB PCIe: 81920 MiB, 80 shards of 1 GiB).
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
import uuid
from importlib import resources
from pathlib import Path

import pytest

from slurm_gpushare_dev.cluster import DEFAULT_NODES
from tests.conftest import (
    DEADLINE,
    FINAL_STATES,
    TEST_DIR,
    TEST_PORT,
    Job,
    SlurmSession,
    add_user,
    parse_scontrol_record,
    wait_until,
)
from tests.test_dbd_slurm import dbd_session

pytestmark = pytest.mark.slurm

CLI = [sys.executable, "-m", "slurm_gpushare"]
NODE = "a100-nvb"  # 8 x A100 80GB PCIe, 81920 MiB: 80 shards per GPU
SHARDS_PER_GPU = 80
MIG_NODE = "h100-mig"  # 2 whole H100s, 2 with a 4g.40gb and three 1g.10gb devices each
BILL_DIR = os.environ.get("GPUSHARE_TEST_BILLING_DIR", f"{TEST_DIR}-billing")
#: beside the session's cluster, test_gres_slurm's (+300) and test_dbd_slurm's (+600); ports up to +691
BILL_PORT = TEST_PORT + 650


def _partition_line(*args: str, node: str = NODE) -> str:
    """The ``PartitionName=`` line that ``gres-conf`` prints for the node (the product's output)."""
    machine = resources.files("slurm_gpushare") / "data" / "machines" / DEFAULT_NODES[node]
    r = subprocess.run([*CLI, "gres-conf", str(machine), "--node-name", node, *args], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    return next(ln for ln in r.stdout.splitlines() if ln.startswith("PartitionName="))


@pytest.fixture(scope="module")
def billing() -> SlurmSession:
    """A slurmdbd cluster with two partitions of the A100 node, weighed as ``gres-conf`` prints: ``gpu1``
    (a GPU bills 1, the default) and ``gpu80`` (a GPU bills its 80 shards), and ``mig`` of the MIG node
    (MIG devices by memory slices); limits enforced."""
    extra = (_partition_line("--partition", f"gpu1={NODE}"),
             _partition_line("--partition", f"gpu80={NODE}", "--billing-gpu-weight", str(SHARDS_PER_GPU)),
             _partition_line("--partition", f"mig={MIG_NODE}", node=MIG_NODE),
             "AccountingStorageEnforce=associations,limits,qos")
    yield from dbd_session(Path(BILL_DIR), BILL_PORT, [NODE, MIG_NODE], extra_conf=extra)


def _billable(session: SlurmSession, job_id: str) -> float:
    """The job's billable TRES as a double (``squeue --json`` ``billable_tres``: a number on 22.05, a
    ``{"set", "number"}`` object from 23.02's data parser on)."""
    jobs = json.loads(session.run(["squeue", "--json"]).stdout)["jobs"]
    value = next(j["billable_tres"] for j in jobs if str(j["job_id"]) == job_id)
    if isinstance(value, dict):
        assert value.get("set"), value
        value = value["number"]
    return float(value)


def _tres(fields: dict[str, str]) -> dict[str, str]:
    """The allocated TRES of ``scontrol show job`` as a dict (``billing`` absent when it is 0): ``TRES=`` on
    22.05, ``AllocTRES=`` (beside ``ReqTRES=``) from 23.02 on."""
    text = fields["AllocTRES"] if "AllocTRES" in fields else fields["TRES"]
    return dict(item.split("=", 1) for item in text.split(",") if item)


def _sleeper(go: Path) -> str:
    return f"until [ -e {shlex.quote(str(go))} ]; do sleep 0.2; done"


def test_a_shard_10_job_bills_ten_eightieths_of_a_whole_gpu_job(billing):
    go = billing.cluster.root / "test-output" / f"go-{time.monotonic_ns()}"
    jobs: dict[tuple[str, str], Job] = {}
    for part in ("gpu1", "gpu80"):
        jobs[(part, "gpu")] = billing.sbatch("-p", part, "--gres=gpu:1", wrap=_sleeper(go))
        # the product's request form: the filter grants shard:10 (10 GiB of one GPU's 80)
        jobs[(part, "shard")] = billing.sbatch("-p", part, "--gres=gpushare:mem=10G", wrap=_sleeper(go))
    for job in jobs.values():
        billing.wait(job, states={"RUNNING"})
    tres = {k: _tres(billing.show_job(j.id)) for k, j in jobs.items()}
    billable = {k: _billable(billing, j.id) for k, j in jobs.items()}
    for part, gpu_weight in (("gpu1", 1.0), ("gpu80", float(SHARDS_PER_GPU))):
        shard, whole = tres[(part, "shard")], tres[(part, "gpu")]
        # a shard job holds no gres/gpu at all: only its shards can bill it
        assert shard.get("gres/shard") == "10" and "gres/gpu" not in shard, shard
        assert whole.get("gres/gpu") == "1" and whole.get("gres/gpu:a100") == "1", whole
        assert billable[(part, "gpu")] == gpu_weight
        assert billable[(part, "shard")] == pytest.approx(gpu_weight * 10 / SHARDS_PER_GPU)
    # the billing TRES is the sum truncated to an integer: 0.125 is 0 (not shown), 1, 10, 80
    assert "billing" not in tres[("gpu1", "shard")] and tres[("gpu1", "gpu")]["billing"] == "1"
    assert tres[("gpu80", "shard")]["billing"] == "10" and tres[("gpu80", "gpu")]["billing"] == "80"

    go.touch()
    for job in jobs.values():
        billing.wait(job)
    rows: dict[str, str] = {}

    def recorded() -> bool:
        out = billing.run(["sacct", "-X", "-n", "-P", "-o", "JobID,State,AllocTRES",
                           "-j", ",".join(j.id for j in jobs.values())]).stdout
        rows.clear()
        for line in out.splitlines():
            job_id, state, alloc = line.split("|")
            if state.split(" ")[0] in FINAL_STATES:
                rows[job_id] = alloc
        return len(rows) == len(jobs)

    wait_until(recorded, "sacct's end records of the four jobs", describe=lambda: rows)
    alloc = {k: dict(i.split("=", 1) for i in rows[j.id].split(",")) for k, j in jobs.items()}
    assert alloc[("gpu80", "shard")]["billing"] == "10" and alloc[("gpu80", "gpu")]["billing"] == "80"
    assert "billing" not in alloc[("gpu1", "shard")] and alloc[("gpu1", "gpu")]["billing"] == "1"


def test_a_mig_device_bills_its_share_of_the_gpu_memory(billing):
    go = billing.cluster.root / "test-output" / f"go-{time.monotonic_ns()}"
    # H100 MIG memory is 8 slices: a 1g.10gb holds 1, a 4g.40gb 4 (NVIDIA MIG user guide); a whole GPU bills 1
    want = {"h100_1g.10gb": 1 / 8, "h100_4g.40gb": 4 / 8, "h100": 1.0}
    jobs = {t: billing.sbatch("-p", "mig", f"--gres=gpu:{t}:1", wrap=_sleeper(go)) for t in want}
    for job in jobs.values():
        billing.wait(job, states={"RUNNING"})
    for t, job in jobs.items():
        tres = _tres(billing.show_job(job.id))
        # a MIG device is one gres/gpu like a whole GPU: only its typed TRES tells them apart
        assert tres.get("gres/gpu") == "1" and tres.get(f"gres/gpu:{t}") == "1", tres
        assert _billable(billing, job.id) == pytest.approx(want[t]), t
    go.touch()
    for job in jobs.values():
        billing.wait(job)


@pytest.fixture
def user(billing):
    """An unprivileged user with an account and the QOS ``gpumem`` (MaxTRESPerUser=gres/shard=15: 15 GiB of
    GPU memory) and ``gpubill`` (MaxTRESPerUser=billing=15, in gpu80 also 15 GiB)."""
    if os.geteuid() != 0:
        pytest.skip("creating users needs root")
    name = f"gpsq{uuid.uuid4().hex[:6]}"
    add_user(name)
    submitted: list[str] = []
    mgr = ["sacctmgr", "-i"]
    billing.run([*mgr, "add", "qos", "gpumem", "MaxTRESPerUser=gres/shard=15"], check=False)
    billing.run([*mgr, "add", "qos", "gpubill", "MaxTRESPerUser=billing=15"], check=False)
    billing.run([*mgr, "add", "account", "gpsqos"], check=False)
    billing.run([*mgr, "add", "user", name, "account=gpsqos", "qos=normal,gpumem,gpubill"])
    yield name, submitted
    if submitted:
        billing.run(["scancel", *submitted], check=False)
    billing.run([*mgr, "delete", "user", name], check=False)
    # userdel refuses while a process of the user runs (its jobs' steps end a moment after scancel)
    wait_until(lambda: subprocess.run(["userdel", name], capture_output=True).returncode == 0,
               f"userdel {name} once its jobs' processes are gone")


def _submit_as(session: SlurmSession, user: str, *args: str, wrap: str) -> str:
    """sbatch as ``user``; retried until slurmctld knows the user's new association (slurmdbd pushes it)."""
    cmd = ["runuser", "-u", user, "--", "env", f"SLURM_CONF={session.cluster.slurm_conf}", "sbatch",
           "--parsable", "--output=/dev/null", *args, "--wrap", wrap]
    proc: subprocess.CompletedProcess | None = None

    def accepted() -> bool:
        nonlocal proc
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=DEADLINE)
        if proc.returncode != 0:
            assert "Invalid account" in proc.stderr or "Invalid qos" in proc.stderr, proc.stderr
        return proc.returncode == 0

    wait_until(accepted, f"sbatch {' '.join(args)} as {user}", describe=lambda: proc.stderr if proc else "")
    assert proc is not None
    return proc.stdout.strip().split(";")[0]


def _state(session: SlurmSession, job_id: str) -> tuple[str, str]:
    proc = session.run(["scontrol", "show", "job", job_id])
    fields = parse_scontrol_record(proc.stdout)
    return fields.get("JobState", ""), fields.get("Reason", "")


@pytest.mark.parametrize(("qos", "reason"), [("gpumem", "QOSMaxGRESPerUser"), ("gpubill", "QOSMaxBillingPerUser")])
def test_a_qos_limit_in_gpu_memory_holds_the_job_past_it(billing, user, qos, reason):
    name, submitted = user
    go = billing.cluster.root / "test-output" / f"go-{time.monotonic_ns()}"
    go.parent.mkdir(parents=True, exist_ok=True)
    args = ("-p", "gpu80", f"--qos={qos}")
    first = _submit_as(billing, name, *args, "--gres=gpushare:mem=10G", wrap=_sleeper(go))
    submitted.append(first)
    wait_until(lambda: _state(billing, first)[0] == "RUNNING", f"job {first} running",
               describe=lambda: _state(billing, first))
    # 10 + 10 GiB is past the 15 the QOS allows; 10 + 5 is not
    second = _submit_as(billing, name, *args, "--gres=gpushare:mem=10G", wrap=_sleeper(go))
    third = _submit_as(billing, name, *args, "--gres=gpushare:mem=5G", wrap=_sleeper(go))
    submitted += [second, third]
    wait_until(lambda: _state(billing, third)[0] == "RUNNING", f"job {third} (5 GiB) running beside the first",
               describe=lambda: _state(billing, third))
    wait_until(lambda: _state(billing, second) == ("PENDING", reason), f"job {second} held by {reason}",
               describe=lambda: _state(billing, second))
    go.touch()
    wait_until(lambda: _state(billing, second)[0] in FINAL_STATES | {"RUNNING"},
               f"job {second} started once the others ended", describe=lambda: _state(billing, second))
