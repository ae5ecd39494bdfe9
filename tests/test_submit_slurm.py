"""The submit path on the real dev cluster: job_submit.lua + cli_filter.lua + filterd in front of slurmctld.

Partitions of the default cluster: ``gpu`` (all nodes, default; h100-mig has 1g.10gb MIG slices),
``nomig`` (no MIG node), ``pcie`` (RTX 4090 only, 24 GiB GPUs).
"""

from __future__ import annotations

import os
import re
import signal
import statistics
import subprocess
import time

import pytest

from tests.conftest import bare, parse_scontrol_record, wait_until

pytestmark = pytest.mark.slurm


def _show(slurm, job_id):
    return slurm.show_job(job_id)


def test_gpushare_10g_runs_on_a_mig_slice_where_one_fits(slurm):
    job = slurm.wait(slurm.sbatch("--gres=gpushare:mem=10G", wrap="echo ok"))
    assert job.state == "COMPLETED", job.fields
    assert bare(job.fields["TresPerNode"]) == "gpu:h100_1g.10gb:1"
    assert job.fields["NodeList"] == "h100-mig"
    ac = job.fields["AdminComment"]
    assert re.search(r"\[gpushare:v1 req=mem=10G grant=gres[:/]gpu:h100_1g\.10gb:1 kind=mig model=h100 ", ac), ac


def test_gpushare_10g_runs_as_10_shards_where_no_mig_fits(slurm):
    job = slurm.wait(slurm.sbatch("-p", "nomig", "--gres=gpushare:mem=10G", wrap="echo $SLURM_SHARDS_ON_NODE"))
    assert job.state == "COMPLETED", job.fields
    assert bare(job.fields["TresPerNode"]) == "shard:10"
    assert job.output().strip() == "10"
    assert "kind=mps" in job.fields["AdminComment"]


def test_salloc_gives_the_same_result(slurm):
    proc = slurm.run(["salloc", "-p", "nomig", "--gres=gpushare:mem=10G", "bash", "-c",
                      "scontrol show job $SLURM_JOB_ID"])
    fields = parse_scontrol_record(proc.stdout)
    assert bare(fields["TresPerNode"]) == "shard:10"
    assert re.search(r"\[gpushare:v1 req=mem=10G grant=gres[:/]shard:10 ", fields["AdminComment"]), fields


def test_srun_without_allocation_gives_the_same_result(slurm):
    proc = slurm.run(["srun", "-p", "nomig", "--gres=gpushare:mem=10G", "bash", "-c",
                      "echo $SLURM_JOB_ID $SLURM_SHARDS_ON_NODE"])
    job_id, shards = proc.stdout.split()
    assert shards == "10"
    fields = _show(slurm, job_id)
    assert bare(fields["TresPerNode"]) == "shard:10"
    # the audit names the user's request (on 22.05 through cli_filter.lua's mark: via=cli_filter; from 23.11 on
    # srun submits the request itself, as sbatch does)
    assert "req=mem=10G" in fields["AdminComment"]
    assert "gpushare-request" not in fields.get("Comment", "")


def test_srun_mig_slice(slurm):
    proc = slurm.run(["srun", "--gres=gpushare:mem=10G", "bash", "-c", "echo $SLURM_JOB_ID"])
    fields = _show(slurm, proc.stdout.strip())
    assert bare(fields["TresPerNode"]) == "gpu:h100_1g.10gb:1" and fields["NodeList"] == "h100-mig"


@pytest.mark.parametrize("args, problem", [
    (["--gres=gpushare:mem=200G"], r"mem=200G"),
    (["--gres=gpushare:mem=abc"], r"'abc' is not a memory size"),
    (["--gres=gpushare:mem=0"], r"mem=0"),
    (["--gres=gpushare:mem=10G+colour=red"], r"unknown knob 'colour'"),
    (["-p", "pcie", "--gres=gpushare:mem=40G"], r"mem=40G"),
])
def test_bad_requests_get_one_gpushare_line_and_the_gres_error(slurm, args, problem):
    proc = slurm.sbatch(*args, check=False, wrap="true")
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    ours = [ln for ln in lines if ln.startswith("sbatch: error: gpushare: ")]
    assert len(ours) == 1, proc.stderr
    assert re.search(problem, ours[0]), ours[0]
    assert lines[-1] == ("sbatch: error: Batch job submission failed: "
                         "Invalid generic resource (gres) specification"), proc.stderr


def test_refusals_name_an_alternative(slurm):
    big = slurm.sbatch("--gres=gpushare:mem=200G", check=False, wrap="true").stderr
    assert "80" in big and "h100" in big  # the largest GPU in the partition, and what to ask instead
    pcie = slurm.sbatch("-p", "pcie", "--gres=gpushare:mem=40G", check=False, wrap="true").stderr
    assert "rtx4090" in pcie or "24" in pcie


def test_direct_shard_requests_are_policed(slurm):
    ok = slurm.wait(slurm.sbatch("-p", "pcie", "--gres=shard:8", wrap="echo $SLURM_SHARDS_ON_NODE"))
    assert ok.state == "COMPLETED" and ok.output().strip() == "8"
    assert "kind=shard-direct" in ok.fields["AdminComment"]
    bad = slurm.sbatch("-p", "pcie", "--gres=shard:30", check=False, wrap="true")
    assert bad.returncode != 0 and "sbatch: error: gpushare: " in bad.stderr, bad.stderr


def test_a_typed_direct_shard_is_judged_against_that_types_gpus(slurm):
    # accepted before, these pended for ever: an RTX 4090 holds 23 shards (Reason=Resources), and a MIG
    # type has none (shard:h100_1g.10gb:0 in sinfo; BadConstraints, or refused by slurmctld on 22.05)
    big = slurm.sbatch("-p", "gpu", "--gres=shard:rtx4090:50", check=False, wrap="true")
    assert big.returncode != 0 and "(23 shards on rtx4090)" in big.stderr and "shard:23 at most" in big.stderr, \
        big.stderr
    mig = slurm.sbatch("-p", "gpu", "--gres=shard:h100_1g.10gb:10", check=False, wrap="true")
    assert mig.returncode != 0 and "no GPU of type h100_1g.10gb in partition gpu has shards" in mig.stderr, \
        mig.stderr
    ok = slurm.wait(slurm.sbatch("-p", "gpu", "--gres=shard:rtx4090:8", wrap="echo $SLURM_SHARDS_ON_NODE"))
    assert ok.state == "COMPLETED" and ok.output().strip() == "8", ok.fields
    assert ok.fields["NodeList"] == "rtx4090-pcie" and "model=rtx4090" in ok.fields["AdminComment"]


def test_scontrol_update_goes_through_the_same_checks(slurm):
    # (Slurm itself refuses to turn a gpu request into a shard one: start from a job without GRES)
    job = slurm.sbatch("-H", "-p", "nomig", wrap="true")
    slurm.run(["scontrol", "update", f"jobid={job.id}", "gres=gpushare:mem=10G"])
    fields = _show(slurm, job.id)
    assert bare(fields["TresPerNode"]) == "shard:10"
    assert "req=mem=10G" in fields["AdminComment"]
    bad = slurm.run(["scontrol", "update", f"jobid={job.id}", "gres=gpushare:mem=500G"], check=False)
    assert bad.returncode != 0 and "Invalid generic resource" in bad.stderr
    assert bare(_show(slurm, job.id)["TresPerNode"]) == "shard:10"


def test_a_move_to_a_partition_without_the_granted_slice_is_refused_and_says_why(slurm):
    """Issue 26 D19/N10 and N11: a pending job granted a MIG slice moved to a partition without one was accepted
    and pended for ever; it is refused, and from 24.11 on the user reads the product's reason (job_submit.lua's
    slurm.log_user reaches the user from slurm_job_modify since 23.02; 22.05 discards it, and its user reads
    only Slurm's "Invalid generic resource")."""
    job = slurm.sbatch("-H", "-p", "gpu", "--gres=gpushare:mem=10G", wrap="true")
    assert bare(_show(slurm, job.id)["TresPerNode"]) == "gpu:h100_1g.10gb:1"
    moved = slurm.run(["scontrol", "update", f"jobid={job.id}", "partition=pcie"], check=False)
    assert moved.returncode != 0, moved
    assert _show(slurm, job.id)["Partition"] == "gpu"
    if slurm.cluster.slurm_release != "22.05":
        assert "is on no usable node of partition pcie" in moved.stderr, moved.stderr
    slurm.run(["scancel", job.id])


def _submit_times(slurm, n: int, gres: str) -> list[float]:
    times = []
    for _ in range(n):
        t = time.perf_counter()
        j = slurm.sbatch("-H", f"--gres={gres}", wrap="true")
        times.append(time.perf_counter() - t)
        slurm.run(["scancel", j.id])
    return times


def test_filter_service_down_then_restarted(cluster, slurm):
    ctld = cluster.pid("slurmctld")
    before = statistics.median(_submit_times(slurm, 8, "gpu:1"))
    os.kill(cluster.pid("filterd"), signal.SIGKILL)
    wait_until(lambda: not cluster.alive("filterd"), "the killed filterd gone")
    try:
        t = time.perf_counter()
        proc = slurm.sbatch("--gres=gpushare:mem=10G", check=False, wrap="true")
        elapsed = time.perf_counter() - t
        assert proc.returncode != 0 and elapsed < 3.0  # the shim's timeout is 2 s; a dead socket fails at once
        assert "sbatch: error: gpushare: the GPU-sharing service cannot decide this request now" in proc.stderr
        assert "--gres=gpu:N" in proc.stderr
        # jobs without gpushare keep submitting at full speed
        during = statistics.median(_submit_times(slurm, 8, "gpu:1"))
        assert during < max(2 * before, before + 0.05), (before, during)
    finally:
        cluster.start_filterd()
    job = slurm.wait(slurm.sbatch("-p", "nomig", "--gres=gpushare:mem=10G", wrap="true"))
    assert bare(job.fields["TresPerNode"]) == "shard:10"
    assert cluster.pid("slurmctld") == ctld  # slurmctld was not touched


def test_plain_jobs_never_reach_the_service(cluster, slurm):
    log = cluster.root / "log" / "filterd.log"
    before = log.read_text().count('"event": "decision"')
    slurm.wait(slurm.sbatch("--gres=gpu:1", wrap="true"))
    slurm.wait(slurm.sbatch(wrap="true"))
    assert log.read_text().count('"event": "decision"') == before
    subprocess.run(["true"])


def test_sighup_reloads_the_inventory(cluster):
    log = cluster.root / "log" / "filterd.log"

    def reloads() -> list[str]:  # the inventory line of each reload (the policy's line follows it)
        return [ln for ln in log.read_text().splitlines() if '"event": "inventory", "reason": "SIGHUP"' in ln]

    before = len(reloads())
    os.kill(cluster.pid("filterd"), signal.SIGHUP)
    wait_until(lambda: len(reloads()) > before, "filterd's reload on SIGHUP logged")
    lines = reloads()
    assert len(lines) == before + 1 and '"usable": 4' in lines[-1], lines[-1:]


def test_update_to_plain_gres_drops_the_stale_audit(slurm):
    job = slurm.sbatch("-H", "--gres=gpushare:mem=10G", wrap="true")
    assert "[gpushare:v1" in _show(slurm, job.id)["AdminComment"]
    slurm.run(["scontrol", "update", f"jobid={job.id}", "gres=gpu:h100:1"])
    fields = _show(slurm, job.id)
    assert bare(fields["TresPerNode"]) == "gpu:h100:1"
    assert "[gpushare:v1" not in fields.get("AdminComment", "")
