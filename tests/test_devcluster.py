"""The dev cluster: real slurmctld/slurmd with simulated GPUs from machine descriptions."""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path

import pytest

from slurm_gpushare.devcluster import DEFAULT_NODES, DevCluster, _pid_alive
from slurm_gpushare.gresconf import node_gres


def test_render_has_one_node_line_and_gres_per_machine(tmp_path):
    c = DevCluster.default(tmp_path, 20000)
    files = c.render()
    conf = files["etc/slurm.conf"]
    for name, m in c.nodes.items():
        line = next(ln for ln in conf.splitlines() if ln.startswith(f"NodeName={name} "))
        assert f"Gres={node_gres(m, name).gres_value}" in line
        assert "NodeAddr=127.0.0.1" in line
    ports = sorted(int(p) for p in re.findall(r" Port=(\d+)", conf))
    assert ports == [20011, 20012, 20013, 20014]
    assert "SlurmctldPort=20000" in conf and "SlurmdParameters=config_overrides" in conf
    gres = files["etc/gres.conf"]
    assert gres.splitlines()[1] == "AutoDetect=off"
    assert str(tmp_path / "dev" / "h100-nvs" / "nvidia0") in gres


def test_default_cluster_has_three_gpu_models_and_a_mig_node():
    c = DevCluster.default("/tmp/unused", 20000)
    models = {g.model for m in c.nodes.values() for g in m.gpus}
    assert {"h100", "a100", "rtx4090"} <= models
    assert any(g.mig_enabled and g.mig_instances for m in c.nodes.values() for g in m.gpus)
    assert list(c.nodes) == list(DEFAULT_NODES)


@pytest.mark.slurm
def test_nodes_idle_with_their_gres(cluster, slurm):
    out = slurm.run(["sinfo", "-h", "-N", "-o", "%N|%T|%G"]).stdout
    rows = {n: (st, g) for n, st, g in (line.split("|") for line in out.splitlines())}
    assert set(rows) == set(cluster.nodes)
    for name, m in cluster.nodes.items():
        state, gres = rows[name]
        assert state == "idle", (name, state)
        expected = node_gres(m, name)
        for (gname, gtype), count in expected.counts.items():
            if gname == "gpu":
                assert re.search(rf"gpu:{re.escape(gtype)}:{count}\b", gres), (name, gres)
        shown = slurm.run(["scontrol", "-o", "show", "node", name]).stdout
        assert f"gpu:{m.gpus[0].model}" in shown
    models = {g.model for m in cluster.nodes.values() for g in m.gpus}
    assert len(models) >= 3


@pytest.mark.slurm
def test_gpu_job_sees_cuda_visible_devices(slurm):
    job = slurm.wait(slurm.sbatch("--gres=gpu:1", "-p", "gpu", wrap="env | sort"))
    assert job.state == "COMPLETED", job.fields
    env = dict(line.split("=", 1) for line in job.output().splitlines() if "=" in line)
    assert re.fullmatch(r"\d+", env.get("CUDA_VISIBLE_DEVICES", "")), job.output()
    assert env["SLURM_JOB_GPUS"] == env["CUDA_VISIBLE_DEVICES"]


@pytest.mark.slurm
def test_typed_gpu_request_lands_on_that_model(cluster, slurm):
    job = slurm.wait(slurm.sbatch("--gres=gpu:rtx4090:2", wrap="echo $CUDA_VISIBLE_DEVICES"))
    assert job.state == "COMPLETED", job.fields
    assert job.fields["NodeList"] == "rtx4090-pcie"
    assert len(job.output().strip().split(",")) == 2


@pytest.mark.slurm
def test_up_twice_is_harmless(cluster):
    before = {d: cluster.pid(d) for d in cluster.daemons()}
    cluster.up(out=open(os.devnull, "w"))
    after = {d: cluster.pid(d) for d in cluster.daemons()}
    assert before == after and all(after.values())
    assert cluster.all_idle()


@pytest.mark.slurm
def test_down_leaves_no_daemon_of_the_cluster(cluster):
    # a second, one-node cluster beside the session's one: other directory, other ports
    # (munged needs every parent of its socket executable by all: not pytest's 0700 tmp_path)
    root = Path(tempfile.mkdtemp(prefix="gpushare-down-test-", dir="/tmp"))
    os.chmod(root, 0o755)
    small = DevCluster(root / "c2", cluster.port_base + 100,
                       {"downtest": cluster.nodes["rtx4090-pcie"]})
    small.up(out=open(os.devnull, "w"))
    pids = {d: small.pid(d) for d in small.daemons()}
    assert all(pids.values()) and all(_pid_alive(p) for p in pids.values())
    small.down(out=open(os.devnull, "w"))
    assert [d for d, p in pids.items() if _pid_alive(p)] == []
    assert not list((root / "c2" / "run").glob("*.pid"))
    # the session's cluster is untouched
    assert cluster.alive("slurmctld") and cluster.all_idle()
    shutil.rmtree(root)
