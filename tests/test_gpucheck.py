"""scripts/gpu-check: the check prepared for a machine with a real GPU. Here (no driver) every step skips with
its reason; the NVML step's comparison with ``nvidia-smi topo -m`` runs against the fake NVML and a recorded
matrix; the wheels it carries fit the device tool's carry."""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from slurm_gpushare.hardware.machine import Machine
from slurm_gpushare.hardware.nvidia_smi import parse_topo_matrix
from slurm_gpushare_dev import gpucheck

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "gpu-check"
MACHINES = ROOT / "slurm_gpushare" / "data" / "machines"
TOPO = ROOT / "tests" / "data" / "topo"


def _has_driver() -> bool:
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return True


def _fake_smi(tmp_path: Path, topo: Path) -> dict[str, str]:
    """PATH with an ``nvidia-smi`` that prints ``topo`` for ``topo -m`` (and fails otherwise)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text(f'#!/bin/sh\n[ "$1 $2" = "topo -m" ] && exec cat {topo}\nexit 1\n')
    smi.chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}


def _check(*args: str, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=120)


@pytest.mark.skipif(_has_driver(), reason="this host has an NVIDIA driver: the steps run (tests marked gpu)")
def test_without_a_driver_every_step_skips_with_its_reason_and_the_result_is_written(tmp_path):
    r = _check("--out", str(tmp_path))
    assert r.returncode == 0, r.stdout + r.stderr
    rows = json.loads((tmp_path / "gpu-check.json").read_text())
    assert [(x["step"], x["status"]) for x in rows] == [(s, "skip") for s in gpucheck.STEPS]
    assert all(x["detail"] for x in rows)
    assert "no NVIDIA driver here" in rows[0]["detail"] and "libcuda" in rows[1]["detail"]
    assert (tmp_path / "gpu-check.txt").read_text() == r.stdout


def test_the_nvml_step_agrees_with_the_matrix_the_machine_was_recorded_from(tmp_path):
    env = _fake_smi(tmp_path, TOPO / "8x-a100-nv12-bridge-nonadjacent-pairs-tabs.txt")
    r = _check("--nvml", f"fake:{MACHINES / '8x-a100-nv12-bridge.json'}", "--step", "nvml", "--out", str(tmp_path),
               env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    (row,) = json.loads((tmp_path / "gpu-check.json").read_text())
    assert row["status"] == "pass" and "8x NVIDIA A100 80GB PCIe" in row["detail"] and "topo -m agrees" in row["detail"]
    assert len(row["data"]["nvml"]["links"]) == 28


def test_the_nvml_step_fails_on_every_disagreement_with_topo_m_and_names_it(tmp_path):
    # the same 8 GPUs as an all-PCIe box: every bridged pair differs in its NVLink count
    env = _fake_smi(tmp_path, TOPO / "8x-rtx4090-pcie-all-sys-2nic-tabs.txt")
    r = _check("--nvml", f"fake:{MACHINES / '8x-a100-nv12-bridge.json'}", "--step", "nvml", env=env)
    assert r.returncode == 1, r.stdout + r.stderr
    assert " fail " in r.stdout and "NVLinks by NVML, 0 by topo -m" in r.stdout, r.stdout


def test_compare_machines_names_affinity_numa_and_pcie_differences():
    m = Machine.load(MACHINES / "8x-rtx4090-pcie.json")
    topo = parse_topo_matrix((TOPO / "8x-rtx4090-pcie-all-sys-2nic-tabs.txt").read_text(), gpu_name=m.gpus[0].name,
                             memory_mib=m.gpus[0].memory_mib)
    assert gpucheck.compare_machines(m, topo) == []
    from dataclasses import replace

    gpus = list(m.gpus)
    gpus[1] = replace(gpus[1], cpu_affinity=(0,), numa_node=7)
    links = tuple(replace(x, pcie="PIX") if (x.a, x.b) == (0, 1) else x for x in m.links)
    moved = replace(m, gpus=tuple(gpus), links=links)
    found = gpucheck.compare_machines(moved, topo)
    assert [f.split(":")[0] for f in found] == ["GPU 1", "GPU 1", "GPUs 0,1"], found
    assert gpucheck.compare_machines(replace(m, gpus=m.gpus[:4], links=()), topo) == [
        "NVML has 4 GPUs, nvidia-smi topo -m 8"]


def test_prepare_fetches_wheels_that_fit_the_device_carry(tmp_path):
    """The folder the device run carries: every package the steps import beyond the image's, for its Python."""
    r = _check("--prepare", str(tmp_path / "wheels"))
    assert r.returncode == 0, r.stdout + r.stderr
    names = {p.name.split("-")[0].lower() for p in (tmp_path / "wheels").glob("*.whl")}
    assert names == {"nvidia_ml_py", "psutil"}, names
    assert "fits a 64 MiB carry" in r.stdout, r.stdout


@pytest.mark.gpu
def test_gpu_check_passes_on_a_real_gpu(tmp_path):
    if not _has_driver():
        pytest.skip("no NVIDIA driver here (libnvidia-ml.so.1 not found)")
    r = _check("--out", str(tmp_path))
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_mig_step_creates_and_destroys_an_instance_where_there_is_room_and_never_makes_room(tmp_path):
    import shutil

    from slurm_gpushare.hardware.ports import open_nvml

    machine = tmp_path / "mig.json"  # the fake writes MIG changes back to its description
    shutil.copy(MACHINES / "4x-h100-mig-mixed.json", machine)
    opts = gpucheck.Options(nvml=f"fake:{machine}")
    (full,) = gpucheck.run_steps(opts, ["mig"], 30)
    assert full.status == "skip" and full.detail.startswith("no room for a GPU instance on any MIG GPU"), full
    assert "GPU 2: no free placement" in full.detail and "GPU 3: no free placement" in full.detail
    with open_nvml(f"fake:{machine}") as port:
        port.destroy_gpu_instance(3, port.gpu_instances(3)[-1].gi_id)
        before = [(i.gi_id, i.profile) for i in port.gpu_instances(3)]
    (done,) = gpucheck.run_steps(opts, ["mig"], 30)
    assert done.status == "pass" and done.detail.startswith("GPU 3: a 1g.10gb GPU instance created and destroyed"), done
    with open_nvml(f"fake:{machine}") as port:
        assert [(i.gi_id, i.profile) for i in port.gpu_instances(3)] == before
    assert [r.status for r in gpucheck.run_steps(gpucheck.Options(nvml=f"fake:{MACHINES / '8x-rtx4090-pcie.json'}"),
                                                  ["mig"], 30)] == ["skip"]
