"""Generated gres.conf / slurm.conf judged by a real slurmd and slurmctld (every supported release).

A second dev cluster holds one node per recorded real machine (parsed from tests/data/topo), the
MIG node, and an A100 node generated without Links= as the control for the topology tests. The
cluster renders its files for its own release. One more node, the DGX A100 in NPS4 (GPU affinity to
a quarter of a socket), is rendered for 22.05 whatever the cluster runs: a release that refuses
its ``Cores=`` sets it INVAL, and ``gres-conf --check`` must say so exactly then.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from pathlib import Path

import pytest

from slurm_gpushare.gresconf.check import lint_gres_conf
from slurm_gpushare.gresconf.detected import compare_detected
from slurm_gpushare.gresconf.render import generate_node_gres
from slurm_gpushare.hardware.machine import CpuLayout
from slurm_gpushare.hardware.nvidia_smi import parse_topo_matrix
from slurm_gpushare.slurm.conf import parse_gres_conf, parse_slurm_conf_gres
from slurm_gpushare.slurm.nodegres import GresOptions
from slurm_gpushare.slurm.release import Release
from slurm_gpushare.slurm.slurmd import parse_slurmd_g
from slurm_gpushare_dev.cluster import DevCluster, packaged_machine
from tests.conftest import SlurmSession, wait_until

DATA = Path(__file__).parent / "data" / "topo"
#: node name -> (topo file, GPU name, memory MiB)
TOPO_NODES = {
    "dgx1-v100": ("dgx1-v100-sxm2-8gpu-1nic.txt", "Tesla V100-SXM2-16GB", 16160),
    "p100-pix": ("8x-p100-pcie-pix-phb-single-numa-tabs.txt", "Tesla P100-PCIE-16GB", 16280),
    "l40s-pcie": ("4x-l40s-pcie-node-sys-2nic.txt", "NVIDIA L40S", 46068),
    "a100x2-job": ("2x-a100-80gb-inside-slurm-job-empty-affinity.txt", "NVIDIA A100 80GB PCIe", 81920),
    "a100-bridge": ("8x-a100-nv12-bridge-nonadjacent-pairs-tabs.txt", "NVIDIA A100 80GB PCIe", 81920),
    "a100-nolinks": ("8x-a100-nv12-bridge-nonadjacent-pairs-tabs.txt", "NVIDIA A100 80GB PCIe", 81920),
    "rtx4090": ("8x-rtx4090-pcie-all-sys-2nic-tabs.txt", "NVIDIA GeForce RTX 4090", 24564),
    "dgxa100-nps4": ("dgx-a100-8gpu-nv12-nps4-12nic-tabs.txt", "NVIDIA A100-SXM4-40GB", 40536),
    "dgxa100-2205": ("dgx-a100-8gpu-nv12-nps4-12nic-tabs.txt", "NVIDIA A100-SXM4-40GB", 40536),
    "ws-3975wx": ("2x-rtx5090-workstation-threadripper-3975wx-one-range-tabs.txt", "NVIDIA GeForce RTX 5090", 32607),
}
#: CPU layouts as slurmd -C gives them, where the matrix alone would mislead (NUMA nodes are not sockets)
#: and where it does not show it (one unbroken range per GPU: 0-31 / 32-63 on the A100 bridge node)
TOPO_CPUS = {"dgxa100-nps4": CpuLayout(2, 64, 2), "dgxa100-2205": CpuLayout(2, 64, 2),
             "a100-bridge": CpuLayout(2, 32, 1), "a100-nolinks": CpuLayout(2, 32, 1),
             # Threadripper PRO 3975WX: 1 socket, 32 cores, 64 threads (AMD); 0-63 alone does not say so
             "ws-3975wx": CpuLayout(1, 32, 2)}
#: nodes whose gres.conf is written for another release than the cluster's (see the module doc)
PINNED = {"dgxa100-2205": GresOptions(release=Release(22, 5))}


def _machines():
    out = {}
    for node, (fname, name, mib) in TOPO_NODES.items():
        out[node] = parse_topo_matrix((DATA / fname).read_text(), source=fname, hostname=node,
                                      gpu_name=name, memory_mib=mib, cpus=TOPO_CPUS.get(node))
    out["h100-mig"] = packaged_machine("4x-h100-mig-mixed.json")
    return out


@pytest.fixture(scope="module")
def hw(cluster):
    """A cluster of every recorded machine, beside the session's default cluster (own dir and ports)."""
    root = Path(tempfile.mkdtemp(prefix="gpushare-hw-test-", dir="/tmp"))
    os.chmod(root, 0o755)
    c = DevCluster(root, cluster.port_base + 300, _machines(),
                   gres_options={"a100-nolinks": GresOptions(links=False), **PINNED}, unwaited=tuple(PINNED),
                   gpu_order="all")  # the site switch: plain --gres=gpu:N jobs get the ring too
    c.up(out=open(os.devnull, "w"))
    session = SlurmSession(c, root / "out")
    yield session
    session.cancel_all()
    c.down(out=open(os.devnull, "w"))
    shutil.rmtree(root, ignore_errors=True)


def test_every_generated_node_is_idle_with_the_expected_gres(hw):
    c = hw.cluster
    for name, m in c.nodes.items():
        if name in PINNED:
            continue
        fields = dict(kv.split("=", 1) for kv in hw.run(["scontrol", "-o", "show", "node", name]).stdout.split()
                      if "=" in kv)
        assert fields["State"] == "IDLE", (name, fields["State"], fields.get("Reason"))
        shown = fields["Gres"]
        for (gname, gtype), count in generate_node_gres(m, name, c.gres_options.get(name)).counts.items():
            if gname == "gpu":
                assert re.search(rf"(^|,)gpu:{re.escape(gtype)}:{count}(\(|,|$)", shown), (name, shown)
            else:  # shards are typed by Slurm after the GPU they sit on; sum them
                total = sum(int(n) for n in re.findall(r"shard:[^:,]+:(\d+)", shown))
                assert total == count, (name, shown)
        if m.cpus is not None:
            assert fields["CPUTot"] == str(m.cpus.cpus)


def test_no_gres_error_in_any_slurmd_log(hw):
    for name in hw.cluster.nodes:
        if name in PINNED:
            continue
        log = (hw.cluster.root / "log" / f"slurmd-{name}.log").read_text(errors="replace")
        bad = [ln for ln in log.splitlines()
               if re.search(r"error|fatal", ln, re.I) and re.search(r"gres|cores|links|file", ln, re.I)]
        assert bad == [], (name, bad)


def _node_fields(hw, name: str) -> dict[str, str]:
    text = hw.run(["scontrol", "show", "node", name]).stdout
    fields = dict(kv.split("=", 1) for kv in text.split() if "=" in kv)
    reason = re.search(r"Reason=(.*?)(?: \[|$)", text, re.M)
    fields["Reason"] = reason.group(1) if reason else ""
    return fields


def test_check_flags_the_cores_a_release_refuses_exactly_when_slurmd_does(hw):
    # the 22.05 form of the NPS4 node: Cores= of one NUMA node, a quarter of a socket
    c = hw.cluster
    release = Release.parse(c.slurm_release)
    node = "dgxa100-2205"
    fields: dict[str, str] = {}

    def registered() -> bool:  # slurmctld judged the node's registration: refused (INVAL) or in service
        nonlocal fields
        fields = _node_fields(hw, node)
        return "INVAL" in fields["State"] or "IDLE" in fields["State"]

    wait_until(registered, f"{node} INVAL or IDLE", describe=lambda: fields)
    installed = (c.root / "etc" / "gres.conf").read_text()
    findings = [f for f in lint_gres_conf(parse_gres_conf(installed, source="gres.conf"),
                                          parse_slurm_conf_gres((c.root / "etc" / "slurm.conf").read_text(),
                                                                source="slurm.conf"),
                                          nodes=[node], release=release)
                if "splits socket" in f.message]
    assert ("INVAL" in fields["State"]) == bool(findings), (release, fields["State"], fields["Reason"], findings)
    if findings:
        # the check quotes slurmd's own reason, word for word
        assert fields["Reason"] in findings[0].message, (fields["Reason"], findings[0].message)
    # and the file generated for this release is accepted: the same machine, rendered for it
    assert _node_fields(hw, "dgxa100-nps4")["State"] == "IDLE"


def test_mig_slice_job_runs_on_the_mig_node(hw):
    job = hw.wait(hw.sbatch("--gres=gpu:h100_1g.10gb:1", wrap="echo $CUDA_VISIBLE_DEVICES"))
    assert job.state == "COMPLETED", job.fields
    assert job.fields["NodeList"] == "h100-mig"
    assert job.output().strip() != ""


def _placements(hw, node: str, ids) -> list[dict]:
    """The Prolog's placement audit of each job (its state.json on the node), once its Prolog has finished:
    the job is RUNNING while its Prolog runs (:meth:`SlurmSession.wait_started`)."""
    out = []
    for job in ids:
        hw.wait_started(job)
        state = hw.cluster.root / "run" / "gpushare" / node / "jobs" / job.id / "state.json"
        assert state.exists(), f"the Prolog of job {job.id} finished without writing {state}"
        out.append(json.loads(state.read_text())["placement"])
    return out


def _running_pairs(hw, node: str, jobs: int = 4, audits: list | None = None) -> list[tuple[int, ...]]:
    ids = [hw.sbatch("-w", node, "--gres=gpu:2", wrap="sleep 120") for _ in range(jobs)]
    pairs = []
    for job in ids:
        hw.wait(job, {"RUNNING"})
        detail = hw.run(["scontrol", "-d", "show", "job", job.id]).stdout
        idx = re.search(r"GRES=gpu:[^(]*\(IDX:([0-9,-]+)\)", detail).group(1)
        gpus = []
        for part in idx.split(","):
            lo, _, hi = part.partition("-")
            gpus += range(int(lo), int(hi or lo) + 1)
        pairs.append(tuple(gpus))
    if audits is not None:
        audits += _placements(hw, node, ids)
    hw.run(["scancel", *(j.id for j in ids)])
    for job in ids:
        hw.wait(job)
    return pairs


def test_slurmd_g_of_the_mig_node_matches_the_real_print_and_the_generated_gres_conf(hw):
    # what this release's slurmd -G prints for the MIG node, read back and compared device by device
    proc = hw.run(["slurmd", "-G", "-N", "h100-mig"])
    records = parse_slurmd_g(proc.stdout + proc.stderr, source="slurmd -G")
    machine = hw.cluster.nodes["h100-mig"]
    devices, problems = compare_detected(records, generate_node_gres(machine, "h100-mig"))
    assert problems == [] and len(devices) == 10, (problems, devices)
    # the GPU instance capability devices slurmd reads are those of the real H100 node's print
    real = parse_slurmd_g((DATA.parent / "slurmd" / "h100-sxm5-mig-mixed-slurmd-G.txt").read_text())
    caps = sorted(f for r in records if r.name == "gpu" for f in r.files if "nvidia-cap" in f)
    real_caps = sorted(f for r in real for f in r.files if "nvidia-cap" in f)
    assert {c.rsplit("/", 1)[1] for c in real_caps} <= {c.rsplit("/", 1)[1] for c in caps}


def test_generated_links_give_2gpu_jobs_nvlink_pairs(hw):
    audits: list = []
    pairs = _running_pairs(hw, "a100-bridge", audits=audits)
    assert sorted(pairs) == [(0, 2), (1, 3), (4, 5), (6, 7)]
    # the Prolog's audit: every job got the best set that was free when Slurm chose it
    assert [a["excess"] for a in audits] == [0, 0, 0, 0], audits


def test_without_links_slurm_hands_out_sys_pairs(hw):
    # the control: the same hardware without Links= gets index-adjacent pairs, 0-1 and 2-3 are SYS
    pairs = _running_pairs(hw, "a100-nolinks")
    assert (0, 1) in pairs and (2, 3) in pairs
    # and the Prolog's audit says so: a job alone on the idle node got 0-1 (SYS) while every NVLink
    # pair was free (the audit compares with what was free when the Prolog ran)
    audits: list = []
    assert _running_pairs(hw, "a100-nolinks", jobs=1, audits=audits) == [(0, 1)]
    assert audits[0]["excess"] > 0 and audits[0]["best"] in ([0, 2], [1, 3], [4, 5], [6, 7])


def test_all_sys_node_keeps_2gpu_jobs_within_one_numa_node(hw):
    m = hw.cluster.nodes["rtx4090"]
    numa = {g.index: g.numa_node for g in m.gpus}
    pairs = _running_pairs(hw, "rtx4090")
    assert len(pairs) == 4 and all(numa[a] == numa[b] for a, b in pairs), pairs


def test_four_tasks_on_four_gpus_get_a_ring_and_their_nearest_nic(hw):
    # node.toml gpu_order = "all" on this cluster: a plain job gets the ring. DGX-1 V100: GPUs 0-3 are
    # one NVLink island on socket 0; mlx5_0 hangs off GPUs 2 and 3 (PIX)
    job = hw.wait(hw.sbatch("-w", "dgx1-v100", "--gres=gpu:4", "-n", "4", wrap=(
        "srun -n 4 bash -c 'echo task=$SLURM_LOCALID gpus=$CUDA_VISIBLE_DEVICES ring=$GPUSHARE_GPU_RING "
        "nic=$GPUSHARE_TASK_NIC devices=$GPUSHARE_TASK_DEVICES'")))
    assert job.state == "COMPLETED", (job.fields, job.output())
    rows = [dict(kv.split("=", 1) for kv in line.split()) for line in job.output().splitlines()
            if line.startswith("task=")]
    assert len(rows) == 4 and len({r["gpus"] for r in rows}) == 1  # one order for the whole job
    m = hw.cluster.nodes["dgx1-v100"]
    ring = [int(g) for g in rows[0]["ring"].split(",")]
    assert sorted(ring) == [0, 1, 2, 3]
    for a, b in zip(ring, ring[1:] + ring[:1], strict=True):
        assert m.link(a, b).nvlinks > 0, (ring, a, b)  # every hop of the ring is an NVLink
    # every task gets the one NIC of the node (the nearest there is for each of its GPUs)
    assert {r["nic"] for r in rows} == {"mlx5_0"}
