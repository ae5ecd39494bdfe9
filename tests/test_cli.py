"""The command line through click's CliRunner: output, golden gres.conf files, and bad input."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from slurm_gpushare.cli import main
from slurm_gpushare.hardware.machine import Machine

DATA = Path(__file__).parent / "data"
ROOT = Path(__file__).parent.parent
MACHINES = ROOT / "slurm_gpushare" / "data" / "machines"
UPDATE = os.environ.get("GPUSHARE_UPDATE_GOLDEN") == "1"

TOPO_ARGS = {
    "dgx1-v100": ["--from-topo", str(DATA / "topo/dgx1-v100-sxm2-8gpu-1nic.txt"),
                  "--gpu-name", "Tesla V100-SXM2-16GB", "--memory", "16160M"],
    "a100-bridge": ["--from-topo", str(DATA / "topo/8x-a100-nv12-bridge-nonadjacent-pairs-tabs.txt"),
                    "--gpu-name", "NVIDIA A100 80GB PCIe", "--memory", "80G"],
    "rtx4090": ["--from-topo", str(DATA / "topo/8x-rtx4090-pcie-all-sys-2nic-tabs.txt"),
                "--gpu-name", "NVIDIA GeForce RTX 4090", "--memory", "24564M"],
    "p100": ["--from-topo", str(DATA / "topo/8x-p100-pcie-pix-phb-single-numa-tabs.txt"),
             "--gpu-name", "Tesla P100-PCIE-16GB", "--memory", "16280M"],
}


def run(*args: str, input: str | None = None):
    return CliRunner().invoke(main, list(args), input=input, catch_exceptions=False)


def _golden(name: str, text: str) -> None:
    path = DATA / "golden" / name
    if UPDATE:
        path.write_text(text)
    assert text == path.read_text(), f"{name} changed; review and regenerate with GPUSHARE_UPDATE_GOLDEN=1"


@pytest.mark.parametrize("node", sorted(TOPO_ARGS))
def test_gres_conf_golden_from_topo(node):
    r = run("gres-conf", *TOPO_ARGS[node], "--hostname", node)
    assert r.exit_code == 0, r.output
    _golden(f"gres-conf-{node}.txt", r.output)


def test_gres_conf_golden_mig_node():
    r = run("gres-conf", str(MACHINES / "4x-h100-mig-mixed.json"))
    assert r.exit_code == 0, r.output
    _golden("gres-conf-h100-mig.txt", r.output)


def test_gres_conf_a100_bridge_links_prefer_the_bridged_pairs():
    out = run("gres-conf", *TOPO_ARGS["a100-bridge"], "--hostname", "n").output
    links = {int(m.group(1)): [int(v) for v in m.group(2).split(",")]
             for m in re.finditer(r"File=/dev/nvidia(\d) Cores=\S+ Links=(\S+)", out)}
    assert len(links) == 8
    for gpu, row in links.items():
        best = max(v for j, v in enumerate(row) if j != gpu)
        assert row.index(best) == {0: 2, 2: 0, 1: 3, 3: 1, 4: 5, 5: 4, 6: 7, 7: 6}[gpu]
        assert row[gpu] == -1


def test_gres_conf_cores_are_core_ids_never_smt_siblings():
    out = run("gres-conf", *TOPO_ARGS["rtx4090"], "--hostname", "n").output
    cores = set(re.findall(r"Cores=(\S+)", out))
    assert cores == {"0-55", "56-111"}  # affinity 0-55,112-167 / 56-111,168-223 on 2x56 cores x2 threads


def test_gres_conf_shard_unit_and_output_dir(tmp_path):
    r = run("gres-conf", *TOPO_ARGS["rtx4090"], "--hostname", "n", "--shard-unit", "512M",
            "--output-dir", str(tmp_path))
    assert r.exit_code == 0, r.output
    gres = (tmp_path / "gres.conf").read_text()
    assert gres.count("Name=shard Count=47 ") == 8  # 24564 MiB // 512 MiB
    assert "Gres=gpu:rtx4090:8,shard:376" in (tmp_path / "slurm.conf.gres").read_text()


def test_inventory_from_topo_writes_a_valid_description(tmp_path):
    out = tmp_path / "m.json"
    r = run("inventory", *TOPO_ARGS["dgx1-v100"], "--hostname", "dgx1", "-o", str(out))
    assert r.exit_code == 0, r.output
    m = Machine.load(out)
    assert m.hostname == "dgx1" and len(m.gpus) == 8 and m.nics[0].name == "mlx5_0"
    assert m.gpus[0].memory_mib == 16160 and m.gpus[0].model == "v100"


def test_inventory_with_mig_table_attaches_profiles():
    r = run("inventory", *TOPO_ARGS["a100-bridge"], "--mig-table", str(DATA / "mig/a100-pcie-40gb-lgip.txt"))
    m = Machine.from_json(r.output)
    assert [p.name for p in m.gpus[0].mig_profiles][:2] == ["1g.5gb", "1g.5gb+me"]


def test_topology_json_and_table():
    r = run("topology", *TOPO_ARGS["a100-bridge"], "--json")
    data = json.loads(r.output)
    assert sorted(map(sorted, data["nvlink_islands"])) == [[0, 2], [1, 3], [4, 5], [6, 7]]
    table = run("topology", *TOPO_ARGS["a100-bridge"]).output
    assert "GPU0,GPU2" in table and "1.08" in table


@pytest.mark.parametrize("args, message", [
    (["--from-topo", "/nonexistent/topo.txt", "--memory", "80G"], "cannot read /nonexistent/topo.txt"),
    (["--from-topo", str(DATA / "topo/dgx1-v100-sxm2-8gpu-1nic.txt")], "--from-topo needs --memory"),
    (["--from-topo", str(DATA / "topo/dgx1-v100-sxm2-8gpu-1nic.txt"), "--memory", "lots"],
     "--memory: 'lots' is not a memory size"),
    (["--from-topo", str(DATA / "topo/dgx1-v100-sxm2-8gpu-1nic.txt"), "--memory", "16G", "--cpus", "2x"],
     "--cpus '2x' is not a CPU layout"),
    (["--gpu-name", "x"], "--gpu-name, --memory and --mig-table go with --from-topo"),
])
def test_bad_options_give_one_clear_line(args, message):
    r = CliRunner().invoke(main, ["gres-conf", *args])
    assert r.exit_code == 2, r.output
    assert message in r.output and "Traceback" not in r.output
    assert r.output.startswith("slurm-gpushare: error: ")


def test_bad_topology_text_names_file_line_and_token(tmp_path):
    text = (DATA / "topo/8x-a100-nv12-bridge-nonadjacent-pairs-tabs.txt").read_text().replace("\tNV12\t", "\tNVX\t", 1)
    f = tmp_path / "broken.txt"
    f.write_text(text)
    r = CliRunner().invoke(main, ["topology", "--from-topo", str(f), "--memory", "80G"])
    assert r.exit_code == 2
    assert re.search(r"broken\.txt:\d+: .*NVX", r.output), r.output
    assert "Traceback" not in r.output


def test_truncated_and_asymmetric_matrices(tmp_path):
    lines = (DATA / "topo/8x-p100-pcie-pix-phb-single-numa-tabs.txt").read_text().splitlines()
    header = next(i for i, ln in enumerate(lines) if ln.startswith("\tGPU0"))
    (tmp_path / "cut.txt").write_text("\n".join(lines[: header + 4]) + "\n")
    r = CliRunner().invoke(main, ["topology", "--from-topo", str(tmp_path / "cut.txt"), "--memory", "16G"])
    assert r.exit_code == 2 and "cut.txt:" in r.output, r.output
    asym = list(lines)
    asym[header + 1] = asym[header + 1].replace("PIX", "SYS", 1)
    (tmp_path / "asym.txt").write_text("\n".join(asym) + "\n")
    r = CliRunner().invoke(main, ["topology", "--from-topo", str(tmp_path / "asym.txt"), "--memory", "16G"])
    assert r.exit_code == 2 and "asym.txt:" in r.output and "symmetric" in r.output.lower(), r.output


def test_bad_machine_description_is_named(tmp_path):
    f = tmp_path / "m.json"
    f.write_text('{"version": 1, "hostname": "x", "gpus": [], "bogus": 1}')
    r = CliRunner().invoke(main, ["gres-conf", str(f)])
    assert r.exit_code == 2 and f"{f}: unknown key(s) bogus" in r.output, r.output


def test_every_command_is_documented_in_docs_cli():
    doc = (ROOT / "docs" / "cli.md").read_text()
    for name, cmd in main.commands.items():
        assert f"## `slurm-gpushare {name}`" in doc, f"docs/cli.md does not document {name}"
        for p in cmd.params:
            for opt in getattr(p, "opts", []):
                if opt.startswith("--"):
                    assert opt in doc, f"docs/cli.md: {name} option {opt} undocumented"


@pytest.mark.parametrize("fname", sorted(p.name for p in MACHINES.glob("*.json")))
def test_inventory_probe_path_served_by_the_fake_nvml(fname, monkeypatch):
    # the production probe (NVML port -> machine description), served by the fake: every packaged
    # description reads back with the same GPUs, links and MIG devices
    m = Machine.load(MACHINES / fname)
    monkeypatch.setenv("GPUSHARE_NVML", f"fake:{MACHINES / fname}")
    r = CliRunner().invoke(main, ["inventory", "--hostname", m.hostname])
    assert r.exit_code == 0, r.output
    probed = Machine.from_json(r.output)
    assert [(g.index, g.name, g.memory_mib, g.cpu_affinity, g.mig_instances) for g in probed.gpus] == \
        [(g.index, g.name, g.memory_mib, g.cpu_affinity, g.mig_instances) for g in m.gpus]
    assert probed.source == "nvml" and probed.cpus == m.cpus


def test_nvml_failure_is_named(monkeypatch):
    monkeypatch.setenv("GPUSHARE_NVML", "bogus")
    r = CliRunner().invoke(main, ["inventory"])
    assert r.exit_code == 2 and "GPUSHARE_NVML='bogus' is not an NVML port" in r.output


def test_nvml_error_without_a_driver_names_the_call(monkeypatch):
    from tests.conftest import _nvml_unavailable

    if _nvml_unavailable() is None:
        pytest.skip("this host has a working NVML")
    monkeypatch.delenv("GPUSHARE_NVML", raising=False)
    r = CliRunner().invoke(main, ["inventory"])
    assert r.exit_code == 3, r.output
    assert r.output.startswith("slurm-gpushare: error: nvmlInit(): ") and "--from-topo" in r.output
    assert "Traceback" not in r.output


def test_check_passes_on_what_it_generated_and_names_each_difference(tmp_path):
    args = [*TOPO_ARGS["a100-bridge"], "--hostname", "a100"]
    assert run("gres-conf", *args, "--output-dir", str(tmp_path)).exit_code == 0
    slurm_conf = tmp_path / "slurm.conf"
    slurm_conf.write_text((tmp_path / "slurm.conf.gres").read_text())
    check = ["gres-conf", *args, "--check", "--gres-conf", str(tmp_path / "gres.conf"),
             "--slurm-conf", str(slurm_conf)]
    ok = run(*check)
    assert ok.exit_code == 0, ok.output
    assert "match the hardware" in ok.output
    gres = (tmp_path / "gres.conf").read_text()
    # an administrator's edit: all-zero Links on GPU 3, a lost shard line, a wrong Gres= count
    lines = gres.splitlines()
    lines = [ln.replace("Links=0,22,0,-1,0,0,0,0", "Links=0,0,0,-1,0,0,0,0") for ln in lines
             if "Name=shard" not in ln or "nvidia7" not in ln]
    (tmp_path / "gres.conf").write_text("\n".join(lines) + "\n")
    slurm_conf.write_text(slurm_conf.read_text().replace("gpu:a100:8", "gpu:a100:4"))
    bad = CliRunner().invoke(main, check)
    assert bad.exit_code == 1, bad.output
    out = bad.output
    assert "gpu File=/dev/nvidia3: Links differ: installed 0,0,0,-1,0,0,0,0 expected 0,22,0,-1,0,0,0,0" in out
    assert "missing in installed: NodeName=a100 Name=shard Count=80 File=/dev/nvidia7" in out
    assert "gpu:a100:4" in out and "problem(s)" in out


def test_check_finds_hyperthread_ids_in_a_real_generated_file(tmp_path):
    # the real DeepOps file Slurm rejected, checked against a DGX A100 layout (2x64 cores x2 threads)
    real = (DATA / "gres/deepops-dgx-a100-cpus-hyperthread.conf").read_text()
    (tmp_path / "gres.conf").write_text("\n".join(f"NodeName=dgx {ln}" if ln.startswith("Name=") else ln
                                                 for ln in real.splitlines()) + "\n")
    (tmp_path / "slurm.conf").write_text("NodeName=dgx Sockets=2 CoresPerSocket=64 ThreadsPerCore=2 Gres=gpu:8\n")
    r = CliRunner().invoke(main, ["gres-conf", *TOPO_ARGS["a100-bridge"], "--hostname", "dgx", "--cpus", "2x64x2",
                                  "--check", "--gres-conf", str(tmp_path / "gres.conf"),
                                  "--slurm-conf", str(tmp_path / "slurm.conf")])
    assert r.exit_code == 1
    assert "CPUs= lists CPU ids 176-191 beyond the node's 128 cores" in r.output
    assert "use core ids 48-63" in r.output
