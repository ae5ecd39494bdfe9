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
    # one range per GPU (0-31 / 32-63) does not show the threads per core: given, as before inferred
    "a100-bridge": ["--from-topo", str(DATA / "topo/8x-a100-nv12-bridge-nonadjacent-pairs-tabs.txt"),
                    "--gpu-name", "NVIDIA A100 80GB PCIe", "--memory", "80G", "--cpus", "2x32x1"],
    "rtx4090": ["--from-topo", str(DATA / "topo/8x-rtx4090-pcie-all-sys-2nic-tabs.txt"),
                "--gpu-name", "NVIDIA GeForce RTX 4090", "--memory", "24564M"],
    "p100": ["--from-topo", str(DATA / "topo/8x-p100-pcie-pix-phb-single-numa-tabs.txt"),
             "--gpu-name", "Tesla P100-PCIE-16GB", "--memory", "16280M"],
}
#: DGX A100 in NPS4 (tests/data/topo): 2 sockets of 64 cores, 8 NUMA nodes; the layout as slurmd -C gives it
DGX_A100_NPS4 = ["--from-topo", str(DATA / "topo/dgx-a100-8gpu-nv12-nps4-12nic-tabs.txt"),
                 "--gpu-name", "NVIDIA A100-SXM4-40GB", "--memory", "40536M", "--cpus", "2x64x2"]


def run(*args: str, input: str | None = None):
    return CliRunner().invoke(main, list(args), input=input, catch_exceptions=False)


def _golden(name: str, text: str) -> None:
    path = DATA / "golden" / name
    if UPDATE:
        path.write_text(text)
    assert text == path.read_text(), f"{name} changed; review and regenerate with GPUSHARE_UPDATE_GOLDEN=1"


@pytest.fixture(autouse=True)
def no_site_slurm_conf(monkeypatch, tmp_path):
    """gres-conf reads the site's slurm.conf ($SLURM_CONF, else /etc/slurm/slurm.conf) for AccountingStorageType:
    these tests name none, whatever the host has."""
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "no-site-slurm.conf"))


@pytest.mark.parametrize("node", sorted(TOPO_ARGS))
def test_gres_conf_golden_from_topo(node):
    r = run("gres-conf", *TOPO_ARGS[node], "--hostname", node, "--slurm-version", "22.05")
    assert r.exit_code == 0, r.output
    _golden(f"gres-conf-{node}.txt", r.output)


# The point of these: what differs between releases (docs/admin-guide.md), one golden file per release.
@pytest.mark.parametrize("release", ["22.05", "24.11", "26.05"])
def test_gres_conf_golden_mig_node_per_release(release):
    # MultipleFiles= from 23.11 (22.05 splits it next to shards); File=<gi cap> before
    r = run("gres-conf", str(MACHINES / "4x-h100-mig-mixed.json"), "--slurm-version", release)
    assert r.exit_code == 0, r.output
    _golden(f"gres-conf-h100-mig-{release}.txt", r.output)
    assert ("MultipleFiles=" in r.output) == (release != "22.05")


@pytest.mark.parametrize("release", ["22.05", "24.11", "26.05"])
def test_gres_conf_golden_sub_socket_affinity_per_release(release):
    # DGX A100, NPS4: each GPU pair is local to a quarter of a socket. 22.05 takes those cores;
    # 24.11 and 26.05 set the node INVAL for Cores= that split a socket, so they get whole sockets.
    r = run("gres-conf", *DGX_A100_NPS4, "--hostname", "dgxa100", "--slurm-version", release)
    assert r.exit_code == 0, r.output
    _golden(f"gres-conf-dgx-a100-nps4-{release}.txt", r.output)
    cores = set(re.findall(r"Cores=(\S+)", r.output))
    assert cores == ({"48-63", "16-31", "112-127", "80-95"} if release == "22.05" else {"0-63", "64-127"})


@pytest.mark.parametrize("release", ["22.05", "24.11", "26.05"])
def test_gres_conf_a100_bridge_links_prefer_the_bridged_pairs(release):
    # 22.05's scheduler takes the GPU with the most Links= to those a job holds, 24.05 and later the one
    # with the fewest (slurm.gresrules.links_for_release): the bridged partner is the max, then the min
    out = run("gres-conf", *TOPO_ARGS["a100-bridge"], "--hostname", "n", "--slurm-version", release).output
    links = {int(m.group(1)): [int(v) for v in m.group(2).split(",")]
             for m in re.finditer(r"File=/dev/nvidia(\d) Cores=\S+ Links=(\S+)", out)}
    assert len(links) == 8
    pick = max if release == "22.05" else min
    for gpu, row in links.items():
        best = pick(v for j, v in enumerate(row) if j != gpu)
        assert [j for j, v in enumerate(row) if v == best and j != gpu] == \
            [{0: 2, 2: 0, 1: 3, 3: 1, 4: 5, 5: 4, 6: 7, 7: 6}[gpu]]
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


DGX1_TOPO = str(DATA / "topo/dgx1-v100-sxm2-8gpu-1nic.txt")
A100_JOB_TOPO = str(DATA / "topo/2x-a100-80gb-inside-slurm-job-empty-affinity.txt")
V100 = ["--gpu-name", "Tesla V100-SXM2-16GB"]


def one_line_error(r, message: str, code: int = 2) -> None:
    """The project's error style: one line, the given exit status, no traceback."""
    assert r.exit_code == code, r.output
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    assert r.output.startswith("slurm-gpushare: error: "), r.output
    assert r.output.count("\n") == 1, r.output
    assert message in r.output, r.output
    assert "Traceback" not in r.output


@pytest.mark.parametrize("args, message", [
    (["--from-topo", "/nonexistent/topo.txt", *V100, "--memory", "80G"], "cannot read /nonexistent/topo.txt"),
    (["--from-topo", DGX1_TOPO, *V100], "--from-topo needs --memory"),
    (["--from-topo", DGX1_TOPO], "--from-topo needs --gpu-name and --memory"),
    (["--from-topo", DGX1_TOPO, "--memory", "16G"], "--from-topo needs --gpu-name"),
    (["--from-topo", DGX1_TOPO, *V100, "--memory", "lots"],
     "--memory: 'lots' is not a memory size"),
    (["--from-topo", DGX1_TOPO, *V100, "--memory", "16G", "--cpus", "2x"],
     "--cpus '2x' is not a CPU layout"),
    (["--gpu-name", "x"], "--gpu-name, --memory, --mig-table and --host go with --from-topo"),
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


def test_probe_checks_given_cpus_against_nvml_affinity(monkeypatch):
    # 8x RTX 4090 node: GPU 0's affinity 0-55,112-167 is 56 cores' two threads; 2x112x1 cannot be
    monkeypatch.setenv("GPUSHARE_NVML", f"fake:{MACHINES / '8x-rtx4090-pcie.json'}")
    one_line_error(CliRunner().invoke(main, ["inventory", "--cpus", "2x112x1"]),
                   "--cpus 2x112x1: GPU 0: CPU Affinity is two runs 112 CPUs apart")
    assert run("inventory", "--cpus", "2x56x2").exit_code == 0


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
    # 22.05's Links= (from 24.05 they are written reversed: test_gres_conf_a100_bridge_links_prefer_...)
    args = [*TOPO_ARGS["a100-bridge"], "--hostname", "a100", "--slurm-version", "22.05"]
    assert run("gres-conf", *args, "--output-dir", str(tmp_path)).exit_code == 0
    slurm_conf = tmp_path / "slurm.conf"
    slurm_conf.write_text((tmp_path / "slurm.conf.gres").read_text())
    check = ["gres-conf", *args, "--check", "--gres-conf", str(tmp_path / "gres.conf"),
             "--slurm-conf", str(slurm_conf)]
    ok = run(*check)
    assert ok.exit_code == 0, ok.output
    assert "match the hardware" in ok.output
    # shards on the node and no cgroup.conf beside slurm.conf: a warning, not a problem (issue 28 item 7)
    assert f"warning: {tmp_path / 'cgroup.conf'}: {tmp_path / 'cgroup.conf'} not found, so ConstrainDevices is no" \
        in ok.output, ok.output
    (tmp_path / "cgroup.conf").write_text("ConstrainDevices=yes\n")
    ok = run(*check)
    assert ok.exit_code == 0 and "ConstrainDevices" not in ok.output, ok.output
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
    # the same findings as one JSON object (what a Nagios check or Ansible parses), the same exit status
    js = CliRunner().invoke(main, [*check, "--format", "json"])
    assert js.exit_code == 1, js.output
    report = json.loads(js.output)
    assert (report["nodes"], report["release"], report["exit_status"]) == (["a100"], "22.05", 1)
    assert report["check"]["gres_conf"] == str(tmp_path / "gres.conf") and report["check"]["exit_status"] == 1
    messages = [(p["file"], p["message"]) for p in report["check"]["problems"]]
    assert ("gres.conf", "missing in installed: NodeName=a100 Name=shard Count=80 File=/dev/nvidia7") in messages
    assert any(f == "slurm.conf" and "gpu:a100:4" in m for f, m in messages)
    assert len(report["check"]["problems"]) == out.count("\n") - 1 - len(report["check"]["warnings"])
    good = json.loads(run(*check[:-1], str(tmp_path / "slurm.conf.gres"), "--format", "json").output)
    assert good["check"]["exit_status"] == 1  # gres.conf still differs
    # --format json reports a check; generating prints the files
    gen = CliRunner().invoke(main, ["gres-conf", *args, "--format", "json"])
    assert gen.exit_code == 2 and "--format json reports --check" in gen.output


def test_check_finds_hyperthread_ids_in_a_real_generated_file(tmp_path):
    # the real DeepOps file Slurm rejected, checked against a DGX A100 layout (2x64 cores x2 threads)
    real = (DATA / "gres/deepops-dgx-a100-cpus-hyperthread.conf").read_text()
    (tmp_path / "gres.conf").write_text("\n".join(f"NodeName=dgx {ln}" if ln.startswith("Name=") else ln
                                                 for ln in real.splitlines()) + "\n")
    (tmp_path / "slurm.conf").write_text("NodeName=dgx Sockets=2 CoresPerSocket=64 ThreadsPerCore=2 Gres=gpu:8\n")
    # (the recorded DGX A100 matrix: the A100 bridge recording's lists 0-31 / 32-63 cannot be 2x64x2, refused)
    r = CliRunner().invoke(main, ["gres-conf", *DGX_A100_NPS4, "--hostname", "dgx",
                                  "--check", "--gres-conf", str(tmp_path / "gres.conf"),
                                  "--slurm-conf", str(tmp_path / "slurm.conf")])
    assert r.exit_code == 1
    assert "CPUs= lists CPU ids 176-191 beyond the node's 128 cores" in r.output
    assert "use core ids 48-63" in r.output


# --- problems a new user found --------------------------------------------------------------------

A100_JSON = str(MACHINES / "8x-a100-nv12-bridge.json")     # node a100-nvb
RTX_JSON = str(MACHINES / "8x-rtx4090-pcie.json")          # node rtx4090-pcie
SLURMDBD = "AccountingStorageType=accounting_storage/slurmdbd\n"


def _cluster_files(tmp_path: Path, *, slurm_head: str = SLURMDBD) -> tuple[Path, Path]:
    """The cluster-wide gres.conf and slurm.conf of a two-node cluster, as generated."""
    out = tmp_path / "gen"
    assert run("gres-conf", A100_JSON, RTX_JSON, "--output-dir", str(out)).exit_code == 0
    slurm_conf = tmp_path / "slurm.conf"
    slurm_conf.write_text(slurm_head + (out / "slurm.conf.gres").read_text())
    return out / "gres.conf", slurm_conf


def _check(machine: str, gres_conf: Path, slurm_conf: Path, *more: str):
    return CliRunner().invoke(main, ["gres-conf", machine, *more, "--check", "--gres-conf", str(gres_conf),
                                     "--slurm-conf", str(slurm_conf)])


def test_check_one_node_against_the_cluster_wide_files(tmp_path):
    gres_conf, slurm_conf = _cluster_files(tmp_path)
    # the other node's lines, even a broken one, are not this node's business
    gres_conf.write_text(gres_conf.read_text().replace(
        "NodeName=rtx4090-pcie Name=gpu Type=rtx4090 File=/dev/nvidia0 Cores=0-55",
        "NodeName=rtx4090-pcie Name=gpu Type=rtx4090 File=/dev/nvidia0 Cores=0-55,112-167"))
    r = _check(A100_JSON, gres_conf, slurm_conf)
    assert r.exit_code == 0, r.output
    assert "extra in installed" not in r.output and "rtx4090" not in r.output
    assert "match the hardware (1 node(s), Slurm " in r.output
    # the broken line is found when its own node is checked
    r = _check(RTX_JSON, gres_conf, slurm_conf)
    assert r.exit_code == 1, r.output
    assert "Cores differ: installed 0-55,112-167 expected 0-55" in r.output
    assert "a100" not in r.output


def test_check_one_node_still_sees_lines_without_nodename_and_shared_hostlists(tmp_path):
    gres_conf, slurm_conf = _cluster_files(tmp_path)
    text = gres_conf.read_text().replace("NodeName=rtx4090-pcie Name=shard Count=23 File=/dev/nvidia7",
                                         "NodeName=rtx4090-pcie,a100-nvb Name=shard Count=23 File=/dev/nvidia7")
    gres_conf.write_text(text + "Name=mps Count=100\n")
    r = _check(A100_JSON, gres_conf, slurm_conf)
    assert r.exit_code == 1, r.output
    assert "extra in installed: NodeName=a100-nvb Name=mps Count=100" in r.output
    # the shared line is a100-nvb's second shard line for /dev/nvidia7
    assert "extra in installed: NodeName=a100-nvb Name=shard Count=23 File=/dev/nvidia7" in r.output
    assert "node a100-nvb: gres.conf has 663 shard but slurm.conf Gres= says shard:640" in r.output
    assert "rtx4090-pcie" not in r.output


def test_check_without_slurmdbd_does_not_demand_accounting_tres(tmp_path):
    for head in ("", "AccountingStorageType=accounting_storage/none\n"):
        gres_conf, slurm_conf = _cluster_files(tmp_path, slurm_head=head)
        # without slurmdbd the line must go: slurmctld 22.05 refuses GRES TRES without it, and with it the
        # GRES billing weights, which name those TRES
        slurm_conf.write_text("".join(ln for ln in slurm_conf.read_text().splitlines(keepends=True)
                                      if not ln.startswith(("AccountingStorageTRES=", "PartitionName="))))
        r = _check(A100_JSON, gres_conf, slurm_conf)
        assert r.exit_code == 0, r.output
        assert "AccountingStorageTRES" not in r.output
    # with slurmdbd it is still demanded
    gres_conf, slurm_conf = _cluster_files(tmp_path)
    slurm_conf.write_text(slurm_conf.read_text().replace("AccountingStorageTRES=", "# AccountingStorageTRES="))
    r = _check(A100_JSON, gres_conf, slurm_conf)
    assert r.exit_code == 1 and "AccountingStorageTRES lacks gres/gpu" in r.output, r.output


def test_check_reports_gres_tres_without_slurmdbd(tmp_path):
    gres_conf, slurm_conf = _cluster_files(tmp_path, slurm_head="AccountingStorageType=accounting_storage/none\n")
    r = _check(A100_JSON, gres_conf, slurm_conf)
    assert r.exit_code == 1, r.output
    assert f"error: {slurm_conf}:4: AccountingStorageTRES lists gres/gpu,gres/gpu:a100,gres/shard,gres/gpu:rtx4090 " \
           "but there is no slurmdbd" in r.output


def test_check_parse_errors_name_the_installed_file(tmp_path):
    gres_conf, slurm_conf = _cluster_files(tmp_path)
    lines = gres_conf.read_text().splitlines()
    lines[21] = lines[21] + " Colour=red"
    gres_conf.write_text("\n".join(lines) + "\n")
    r = _check(A100_JSON, gres_conf, slurm_conf)
    one_line_error(r, f"{gres_conf}:22: unknown gres.conf key 'Colour'")
    assert "installed gres.conf" not in r.output


def test_check_compares_a_range_line_per_device(tmp_path):
    gres_conf, slurm_conf = _cluster_files(tmp_path)
    lines = [ln for ln in gres_conf.read_text().splitlines()
             if not (ln.startswith("NodeName=a100-nvb Name=gpu") or ln.startswith("NodeName=a100-nvb Name=shard"))]
    lines += ["NodeName=a100-nvb Name=gpu Type=a100 File=/dev/nvidia[0-7] Cores=0-31",
              "NodeName=a100-nvb Name=shard Count=640 File=/dev/nvidia[0-7]"]
    gres_conf.write_text("\n".join(lines) + "\n")
    r = _check(A100_JSON, gres_conf, slurm_conf, "--no-links")
    assert r.exit_code == 1, r.output
    problems = [ln for ln in r.output.splitlines() if ln.startswith("gres.conf: ")]
    assert problems == [f"gres.conf: node a100-nvb: gpu File=/dev/nvidia{i}: Cores differ: installed 0-31 "
                        "expected 32-63" for i in range(4, 8)], r.output


def test_gres_conf_and_inventory_need_the_gpu_name_with_from_topo(tmp_path):
    for cmd in ("gres-conf", "inventory"):
        r = CliRunner().invoke(main, [cmd, "--from-topo", DGX1_TOPO, "--memory", "16G"])
        one_line_error(r, "--from-topo needs --gpu-name")
        assert "Type=unknown" not in r.output


def test_topology_from_topo_needs_neither_memory_nor_gpu_name():
    r = run("topology", "--from-topo", DGX1_TOPO)
    assert r.exit_code == 0, r.output
    assert "GPU0" in r.output and "1.50" in r.output
    r = run("topology", "--from-topo", DGX1_TOPO, "--json")
    assert json.loads(r.output)["gres_links"][0] == "Links=-1,11,11,12,12,0,0,0"


def test_memory_hint_has_no_nested_parentheses():
    r = CliRunner().invoke(main, ["inventory", "--from-topo", DGX1_TOPO, *V100])
    one_line_error(r, "--from-topo needs --memory")
    assert r.output.count("(") == 1 and r.output.count(")") == 1, r.output


def test_topology_of_an_old_topo_file_has_numa_groups_from_the_cpu_layout():
    r = run("topology", "--from-topo", DGX1_TOPO)
    assert "NUMA groups:\n  node 0: GPU0,GPU1,GPU2,GPU3\n  node 1: GPU4,GPU5,GPU6,GPU7\n" in r.output
    assert "unknown" not in r.output


def test_gpus_with_unknown_cpu_affinity_are_named_in_gres_conf():
    args = ["gres-conf", "--from-topo", A100_JOB_TOPO, "--gpu-name", "NVIDIA A100 80GB PCIe", "--memory", "80G",
            "--hostname", "a100job"]
    out = run(*args, "--cpus", "2x64x1").output
    assert "# GPU 1: CPU affinity unknown, no Cores=\n" in out
    assert "NodeName=a100job Name=gpu Type=a100 File=/dev/nvidia0 Cores=0-63\n" in out
    assert "NodeName=a100job Name=gpu Type=a100 File=/dev/nvidia1\n" in out
    # without a CPU layout (it cannot be inferred from clipped lists) GPU 0's Cores= cannot be written: refused
    r = CliRunner().invoke(main, args)
    one_line_error(r, "the CPU layout cannot be read from the matrix: the CPU Affinity of GPU 1 is empty")
    assert "--cpus" in r.output


@pytest.mark.parametrize("args, message", [
    (["--node-name", "gpu 01"], "--node-name 'gpu 01' contains ' '"),
    (["--node-name", "gpu[1-2]"], "--node-name 'gpu[1-2]' contains '[', ']'"),
    (["--hostname", "a,b"], "--hostname 'a,b' contains ','"),
    (["--hostname", ""], "--hostname '' is empty"),
    (["--device-dir", "dev"], "--device-dir 'dev' is not an absolute path"),
    (["--device-dir", "/my dev"], "--device-dir '/my dev' contains white space"),
    (["--cpus", "100x8x2"], "--cpus '100x8x2': sockets is 100, out of range (allowed 1-64"),
    (["--cpus", "2x2000x2"], "--cpus '2x2000x2': cores_per_socket is 2000, out of range (allowed 1-1024"),
    (["--cpus", "2x8x32"], "--cpus '2x8x32': threads_per_core is 32, out of range (allowed 1-16"),
    (["--memory", "80"], "--memory: '80' has no unit (write 80G or 81920M"),
    (["--memory", "800000000000000000000G"], "--memory: '800000000000000000000G' is more than 16T"),
    (["--shard-unit", "1"], "--shard-unit: '1' has no unit"),
    (["--shard-unit", "128G"], "shard unit 128G is larger than GPU 0 (Tesla V100-SXM2-16GB, 16160M)"),
])
def test_bad_values_are_refused_with_the_allowed_form(args, message):
    opts = {"--memory": "16160M"}
    for i in range(0, len(args), 2):
        opts[args[i]] = args[i + 1]
    flat = [x for kv in opts.items() for x in kv]
    r = CliRunner().invoke(main, ["gres-conf", "--from-topo", DGX1_TOPO, *V100, *flat])
    one_line_error(r, message)


def test_node_name_is_checked_for_machine_files_too():
    one_line_error(CliRunner().invoke(main, ["gres-conf", A100_JSON, "--node-name", "a b"]), "contains ' '")
    one_line_error(CliRunner().invoke(main, ["inventory", A100_JSON, "--hostname", "a b"]), "contains ' '")


def test_source_options_do_not_silently_go_with_a_machine_file():
    r = CliRunner().invoke(main, ["gres-conf", A100_JSON, "--gpu-name", "NVIDIA H100"])
    one_line_error(r, "--gpu-name, --memory, --mig-table and --host go with --from-topo")
    r = CliRunner().invoke(main, ["gres-conf", A100_JSON, "--cpus", "2x32x1"])
    one_line_error(r, "--cpus goes with --from-topo or NVML")


def _not_utf8(path: Path) -> Path:
    path.write_bytes(b"\tGPU0\tCPU Affinity\nGPU0\t X \t0-7 \xff\xfe\n")
    return path


def test_non_utf8_inputs_give_one_line(tmp_path):
    bad = _not_utf8(tmp_path / "bad.txt")
    topo = ["--from-topo", DGX1_TOPO, *V100, "--memory", "16G"]
    for args in (["topology", "--from-topo", str(bad)],
                 ["inventory", "--from-topo", str(bad), *V100, "--memory", "16G"],
                 ["inventory", *topo, "--mig-table", str(bad)],
                 ["gres-conf", str(bad)],
                 ["topology", str(bad)]):
        one_line_error(CliRunner().invoke(main, args), f"{bad} is not text (UTF-8)")
    r = CliRunner().invoke(main, ["topology", "--from-topo", "-"], input=bad.read_bytes())
    one_line_error(r, "<stdin> is not text (UTF-8)")


def test_non_utf8_installed_files_give_one_line(tmp_path):
    gres_conf, slurm_conf = _cluster_files(tmp_path)
    bad = _not_utf8(tmp_path / "bad.conf")
    one_line_error(_check(A100_JSON, bad, slurm_conf), f"{bad} is not text (UTF-8)")
    one_line_error(_check(A100_JSON, gres_conf, bad), f"{bad} is not text (UTF-8)")


def test_missing_files_and_directories_give_one_line(tmp_path):
    topo = ["--from-topo", DGX1_TOPO, *V100, "--memory", "16G"]
    cases = [
        (["gres-conf", str(tmp_path)], "Is a directory"),
        (["topology", "--from-topo", str(tmp_path)], "Is a directory"),
        (["inventory", *topo, "--mig-table", "/nonexistent/lgip.txt"], "No such file or directory"),
        (["inventory", *topo, "--mig-table", str(tmp_path)], "Is a directory"),
        (["topology", "/nonexistent/m.json"], "No such file or directory"),
        (["gres-conf", *topo, "--output-dir", str(DATA / "topo" / "dgx1-v100-sxm2-8gpu-1nic.txt")],
         "is not a directory"),
        (["inventory", *topo, "-o", str(tmp_path)], "Is a directory"),
    ]
    for args, message in cases:
        one_line_error(CliRunner().invoke(main, args), message)
    gres_conf, _ = _cluster_files(tmp_path)
    one_line_error(_check(A100_JSON, gres_conf, tmp_path), "Is a directory")
    one_line_error(_check(A100_JSON, tmp_path, gres_conf), "Is a directory")


def test_output_dir_creates_only_its_last_component(tmp_path):
    topo = ["--from-topo", DGX1_TOPO, *V100, "--memory", "16G"]
    deep = tmp_path / "no" / "such" / "dir"
    r = CliRunner().invoke(main, ["gres-conf", *topo, "--output-dir", str(deep)])
    one_line_error(r, f"cannot create {deep}: its parent {deep.parent} does not exist")
    assert not (tmp_path / "no").exists()
    new = tmp_path / "gres"
    r = CliRunner().invoke(main, ["gres-conf", *topo, "--output-dir", str(new)])
    assert r.exit_code == 0, r.output
    assert f"created {new}" in r.output
    assert sorted(p.name for p in new.iterdir()) == ["gres.conf", "slurm.conf.gres"]


def test_inventory_output_to_a_missing_directory_fails_cleanly(tmp_path):
    topo = ["--from-topo", DGX1_TOPO, *V100, "--memory", "16G"]
    r = CliRunner().invoke(main, ["inventory", *topo, "-o", "/nonexistent/x.json"])
    one_line_error(r, "cannot write /nonexistent/x.json: No such file or directory")
    afile = tmp_path / "afile"
    afile.write_text("")
    r = CliRunner().invoke(main, ["inventory", *topo, "-o", str(afile / "x.json")])
    one_line_error(r, f"cannot write {afile / 'x.json'}: Not a directory")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]


# --- the release that reads the files ------------------------------------------------------------


def test_slurm_version_is_checked():
    r = run("gres-conf", A100_JSON, "--slurm-version", "latest")
    assert r.exit_code != 0 and "--slurm-version 'latest' is not a Slurm release" in r.output
    r = run("gres-conf", A100_JSON, "--slurm-version", "21.08")
    assert r.exit_code != 0 and "Slurm 21.08 is older than 22.05" in r.output


def test_slurm_version_default_is_the_installed_slurmd():
    from slurm_gpushare.slurm.commands import node_release

    r = run("gres-conf", A100_JSON)
    assert r.exit_code == 0, r.output
    assert f"gres.conf for Slurm {node_release()} generated" in r.output


def _nps4_files(tmp_path: Path, release: str) -> tuple[Path, Path]:
    out = tmp_path / f"gen-{release}"
    assert run("gres-conf", *DGX_A100_NPS4, "--hostname", "dgx", "--slurm-version", release,
               "--output-dir", str(out)).exit_code == 0
    slurm_conf = out / "slurm.conf"
    slurm_conf.write_text((out / "slurm.conf.gres").read_text())
    return out / "gres.conf", slurm_conf


def test_check_flags_sub_socket_cores_for_the_releases_that_refuse_them(tmp_path):
    gres_conf, slurm_conf = _nps4_files(tmp_path, "22.05")
    check = ["gres-conf", *DGX_A100_NPS4, "--hostname", "dgx", "--check", "--gres-conf", str(gres_conf),
             "--slurm-conf", str(slurm_conf)]
    assert run(*check, "--slurm-version", "22.05").exit_code == 0
    for release in ("24.11", "26.05"):
        r = run(*check, "--slurm-version", release)
        assert r.exit_code == 1, r.output
        assert (f"node dgx: Cores=48-63 splits socket 0 (cores 0-63) of the node's 2 x 64 cores: Slurm {release} "
                "takes Cores=") in r.output
        assert ("'gres/gpu GRES core specification 48-63 for node dgx doesn't match socket boundaries. "
                "(Socket 0 is cores 0-63)'") in r.output
        assert "write Cores=0-63" in r.output
        # what it generates for that release passes
        ok_gres, ok_slurm = _nps4_files(tmp_path, release)
        ok = run("gres-conf", *DGX_A100_NPS4, "--hostname", "dgx", "--check", "--gres-conf", str(ok_gres),
                 "--slurm-conf", str(ok_slurm), "--slurm-version", release)
        assert ok.exit_code == 0, ok.output


def test_check_follows_include_lines_relative_to_slurm_conf(tmp_path):
    gres_conf, slurm_conf = _nps4_files(tmp_path, "24.11")
    etc = tmp_path / "etc"
    (etc / "gres.d").mkdir(parents=True)
    # gres.conf holds only an Include; the included file names another one relative to slurm.conf's
    # directory (not its own): both as slurmd reads them
    lines = gres_conf.read_text().splitlines()
    (etc / "gres.d" / "gpus.conf").write_text("\n".join(ln for ln in lines if "Name=gpu" in ln) +
                                              "\ninclude gres.d/shards.conf\n")
    (etc / "gres.d" / "shards.conf").write_text("\n".join(ln for ln in lines if "Name=shard" in ln) + "\n")
    (etc / "gres.conf").write_text("AutoDetect=off\nInclude gres.d/gpus.conf\n")
    (etc / "nodes.conf").write_text(slurm_conf.read_text())
    (etc / "slurm.conf").write_text("ClusterName=Site\nInclude %c-nodes.conf\n")
    (etc / "site-nodes.conf").write_text(slurm_conf.read_text())
    check = ["gres-conf", *DGX_A100_NPS4, "--hostname", "dgx", "--slurm-version", "24.11", "--check",
             "--gres-conf", str(etc / "gres.conf"), "--slurm-conf", str(etc / "slurm.conf")]
    r = run(*check)
    assert r.exit_code == 0, r.output
    # a rule broken in an included file is reported at that file's line
    shards = (etc / "gres.d" / "shards.conf")
    shards.write_text(shards.read_text().replace("Count=39 File=/dev/nvidia7", "Count=39 File=/dev/nvidia7 "
                                                 "Flags=nvidia_gpu_env,no_gpu_env"))
    r = run(*check)
    assert r.exit_code == 1 and f"error: {shards}:8: Flags=nvidia_gpu_env,no_gpu_env has no_gpu_env" in r.output
    # a missing include is one clear line naming the Include line and where slurmd looks
    (etc / "gres.conf").write_text("AutoDetect=off\nInclude gpus.conf\n")
    r = CliRunner().invoke(main, check)
    assert r.exit_code != 0 and "Traceback" not in r.output
    assert f"{etc / 'gres.conf'}:2" in r.output and f"cannot read {etc / 'gpus.conf'}" in r.output
    assert f"the directory of slurm.conf ({etc})" in r.output


def test_check_accepts_a_sites_flags_and_the_autodetect_its_release_knows(tmp_path):
    gres_conf, slurm_conf = _nps4_files(tmp_path, "24.11")
    text = gres_conf.read_text().replace("AutoDetect=off", "AutoDetect=nvidia")
    gres_conf.write_text(text.replace("Name=gpu Type=a100", "Name=gpu Flags=nvidia_gpu_env Type=a100"))
    check = ["gres-conf", *DGX_A100_NPS4, "--hostname", "dgx", "--check", "--gres-conf", str(gres_conf),
             "--slurm-conf", str(slurm_conf)]
    r = run(*check, "--slurm-version", "24.11")
    assert r.exit_code == 0, r.output
    r = run(*check, "--slurm-version", "22.05")
    assert r.exit_code == 1
    assert "AutoDetect=nvidia is not a mechanism Slurm 22.05 knows" in r.output


# --- CPU layouts the matrix does not show, several hosts in one file, type collisions --------------

WORKSTATION_TOPO = str(DATA / "topo/2x-rtx5090-workstation-threadripper-3975wx-one-range-tabs.txt")
TWO_HOSTS_TOPO = str(DATA / "topo-multi/2-hosts-clush-b-l40s-rtx4090.txt")
RTX5090 = ["--gpu-name", "NVIDIA GeForce RTX 5090", "--memory", "32607M"]


def test_one_range_workstation_needs_cpus_and_gets_core_ids_with_them():
    # Threadripper PRO 3975WX: 1 socket, 32 cores, 64 threads (AMD). "0-63" does not show that, so no guess
    args = ["gres-conf", "--from-topo", WORKSTATION_TOPO, *RTX5090, "--hostname", "ws", "--slurm-version", "22.05"]
    r = CliRunner().invoke(main, args)
    one_line_error(r, "every CPU Affinity list is one unbroken range (0-63)")
    assert "--cpus" in r.output and "1x32x2" in r.output
    out = run(*args, "--cpus", "1x32x2").output
    assert "NodeName=ws Name=gpu Type=rtx5090 File=/dev/nvidia0 Cores=0-31 " in out
    assert "NodeName=ws Name=gpu Type=rtx5090 File=/dev/nvidia1 Cores=0-31 " in out
    assert "NodeName=ws Sockets=1 CoresPerSocket=32 ThreadsPerCore=2 Gres=" in out
    # the inventory needs it as much; topology does not use the layout
    one_line_error(CliRunner().invoke(main, ["inventory", "--from-topo", WORKSTATION_TOPO, *RTX5090]), "--cpus")
    assert run("topology", "--from-topo", WORKSTATION_TOPO).exit_code == 0


def test_cpus_that_the_numa_column_contradicts_are_refused():
    # L40S node: NUMA node 0 holds 0-95,192-287; 4 sockets of 48 cores would split it over sockets 0 and 1
    r = CliRunner().invoke(main, ["gres-conf", "--from-topo", str(DATA / "topo/4x-l40s-pcie-node-sys-2nic.txt"),
                                  "--gpu-name", "NVIDIA L40S", "--memory", "46068M", "--cpus", "4x48x2"])
    one_line_error(r, "GPU 0 is on NUMA node 0, but the CPU layout 4x48x2 puts its CPU Affinity on sockets 0, 1")


def test_a_file_of_two_hosts_needs_host_and_host_names_the_node():
    r = CliRunner().invoke(main, ["gres-conf", "--from-topo", TWO_HOSTS_TOPO, "--gpu-name", "NVIDIA L40S",
                                  "--memory", "46068M", "--slurm-version", "22.05"])
    one_line_error(r, "the text holds 2 'nvidia-smi topo -m' matrices (line 14 under gpu01, line 39 under gpu02)")
    out = run("gres-conf", "--from-topo", TWO_HOSTS_TOPO, "--host", "gpu02", "--gpu-name", "NVIDIA GeForce RTX 4090",
              "--memory", "24564M", "--slurm-version", "22.05").output
    assert "NodeName=gpu02 Sockets=2 CoresPerSocket=56 ThreadsPerCore=2 Gres=gpu:rtx4090:8," in out
    assert "NodeName=gpu02 Name=gpu Type=rtx4090 File=/dev/nvidia7 Cores=56-111\n" in out
    out = run("gres-conf", "--from-topo", TWO_HOSTS_TOPO, "--host", "gpu01", "--gpu-name", "NVIDIA L40S",
              "--memory", "46068M", "--slurm-version", "22.05").output
    assert "NodeName=gpu01 Sockets=2 CoresPerSocket=96 ThreadsPerCore=2 Gres=gpu:l40s:4," in out
    r = CliRunner().invoke(main, ["gres-conf", "--from-topo", TWO_HOSTS_TOPO, "--host", "gpu03",
                                  "--gpu-name", "NVIDIA L40S", "--memory", "46068M"])
    one_line_error(r, "--host gpu03: 2-hosts-clush-b-l40s-rtx4090.txt has no 'nvidia-smi topo -m' output under a "
                      "header naming it (hosts: gpu01, gpu02)")
    one_line_error(CliRunner().invoke(main, ["gres-conf", str(MACHINES / "8x-rtx4090-pcie.json"), "--host", "x"]),
                   "--host go with --from-topo")


def test_check_flags_one_type_for_two_models(tmp_path):
    # an installed file from the old naming rule: Type=rtx6000 for a Quadro RTX 6000 and an RTX 6000 Ada
    files = []
    for host, name in (("ws1", "Quadro RTX 6000"), ("ws2", "NVIDIA RTX 6000 Ada Generation")):
        path = tmp_path / f"{host}.json"
        run("inventory", "--from-topo", WORKSTATION_TOPO, "--gpu-name", name, "--memory", "24G", "--cpus", "1x32x2",
            "--hostname", host, "-o", str(path))
        files.append(str(path))
    out = run("gres-conf", *files, "--slurm-version", "22.05").output
    assert "NodeName=ws1 Name=gpu Type=rtx6000 File=/dev/nvidia0" in out
    assert "NodeName=ws2 Name=gpu Type=rtx6000ada File=/dev/nvidia0" in out
    gres_text, slurm_text = out.replace("rtx6000ada", "rtx6000").split("# ===== slurm.conf (merge these lines) =====\n")
    (tmp_path / "gres.conf").write_text(gres_text)
    (tmp_path / "slurm.conf").write_text(slurm_text)
    r = CliRunner().invoke(main, ["gres-conf", *files, "--slurm-version", "22.05", "--check", "--gres-conf",
                                  str(tmp_path / "gres.conf"), "--slurm-conf", str(tmp_path / "slurm.conf")])
    assert r.exit_code == 1, r.output
    assert ("node ws2: Type=rtx6000 is given to a NVIDIA RTX 6000 Ada Generation (model rtx6000ada) here and to a "
            "Quadro RTX 6000 (model rtx6000) at ") in r.output


def test_host_finds_its_matrix_under_a_hostlist_header(tmp_path):
    # clush -b (and dshbak -c) print one block for hosts with identical output: "gpu[01-02] (2)"
    text = (DATA / "topo/8x-rtx4090-pcie-all-sys-2nic-tabs.txt").read_text()
    f = tmp_path / "both.txt"
    f.write_text("---------------\ngpu[01-02] (2)\n---------------\n" + text)
    out = run("gres-conf", "--from-topo", str(f), "--host", "gpu02", "--gpu-name", "NVIDIA GeForce RTX 4090",
              "--memory", "24564M", "--slurm-version", "22.05").output
    assert "NodeName=gpu02 Sockets=2 CoresPerSocket=56 ThreadsPerCore=2 Gres=gpu:rtx4090:8," in out


def test_a_layout_read_from_numa_nodes_says_so_and_names_the_option():
    """A DGX A100 in NPS4 shows 8 NUMA nodes of 16 cores: 'nvidia-smi topo -m' cannot show that they are 2
    sockets (2x AMD EPYC 7742, 64 cores each), so a layout read from it is one socket per NUMA node, and
    the command says so instead of passing it off as known."""
    args = [a for a in DGX_A100_NPS4 if a not in ("--cpus", "2x64x2")]
    r = CliRunner().invoke(main, ["gres-conf", *args, "--hostname", "dgx", "--slurm-version", "22.05"])
    assert r.exit_code == 0, r.output
    assert "8 sockets x 16 cores x 2 threads" in r.stderr and "--cpus" in r.stderr and "NUMA" in r.stderr
    given = CliRunner().invoke(main, ["gres-conf", *DGX_A100_NPS4, "--hostname", "dgx", "--slurm-version", "22.05"])
    assert given.exit_code == 0 and "NUMA node" not in given.stderr


def test_one_host_under_two_headers_is_refused_not_the_first_taken(tmp_path):
    """Two collections of one host in one file (the second header renamed from gpu02): nothing says which
    output is current, so neither is taken; the same for a hostlist header that overlaps a plain one."""
    text = Path(TWO_HOSTS_TOPO).read_text()
    again = tmp_path / "again.txt"
    again.write_text(text.replace("\ngpu02\n", "\ngpu01\n"))
    assert again.read_text() != text
    r = CliRunner().invoke(main, ["gres-conf", "--from-topo", str(again), "--host", "gpu01", "--gpu-name",
                                  "NVIDIA L40S", "--memory", "46068M", "--slurm-version", "22.05"])
    one_line_error(r, "--host gpu01: again.txt has 2 'nvidia-smi topo -m' outputs for it (at lines 14, 39)")
    overlap = tmp_path / "overlap.txt"
    overlap.write_text(text.replace("\ngpu01\n", "\ngpu[01-02]\n"))
    r = CliRunner().invoke(main, ["gres-conf", "--from-topo", str(overlap), "--host", "gpu02", "--gpu-name",
                                  "NVIDIA L40S", "--memory", "46068M", "--slurm-version", "22.05"])
    one_line_error(r, "--host gpu02: overlap.txt has 2 'nvidia-smi topo -m' outputs for it")


@pytest.mark.parametrize("name", ["NVIDIA", "NVIDIA 80GB", "GPU \u00c4\u00d6"])
def test_a_gpu_name_that_names_no_model_is_refused(name):
    # each would have become the bare Type=gpu, shared by every other unnamed model
    r = CliRunner().invoke(main, ["gres-conf", "--from-topo", str(DATA / "topo/dgx-h100-8gpu-nv18-no-nic.txt"),
                                  "--gpu-name", name, "--memory", "80G", "--slurm-version", "22.05"])
    one_line_error(r, "names no GPU model")


def test_gres_conf_prints_only_lines_that_start_slurmctld_without_slurmdbd(tmp_path, monkeypatch):
    """Issue 28 item 1: without slurmdbd, AccountingStorageTRES with GRES stops slurmctld ("slurmdbd is required
    to run with TRES gres/gpu") and so does a GRES billing weight ("failed to parse tres weights str"). gres-conf
    printed both whatever the site ran; it now reads the site's slurm.conf (or --no-slurmdbd)."""
    args = ["gres-conf", *TOPO_ARGS["a100-bridge"], "--hostname", "a100", "--slurm-version", "22.05"]
    site = tmp_path / "slurm.conf"
    site.write_text("SlurmctldHost=head\nClusterName=c\n")  # no AccountingStorageType: accounting_storage/none
    monkeypatch.setenv("SLURM_CONF", str(site))
    out = run(*args).output
    assert "AccountingStorageTRES=" not in out and "TRESBillingWeights=" not in out, out
    assert "# no slurmdbd" in out and "GresTypes=gpu,shard,gpushare" in out and "NodeName=a100 " in out
    # with slurmdbd the TRES and the weights are printed, as with --slurmdbd whatever the file says
    site.write_text("SlurmctldHost=head\nAccountingStorageType=accounting_storage/slurmdbd\n")
    with_dbd = run(*args).output
    assert "AccountingStorageTRES=gres/gpu" in with_dbd and "TRESBillingWeights=" in with_dbd
    assert run(*args, "--no-slurmdbd").output == out
    site.write_text("SlurmctldHost=head\n")
    assert run(*args, "--slurmdbd").output == with_dbd
    both = CliRunner().invoke(main, ["gres-conf", "--slurmdbd", "--no-slurmdbd"])
    assert both.exit_code == 2 and "--slurmdbd and --no-slurmdbd contradict each other" in both.output
    # no readable slurm.conf: as with slurmdbd, and the output says how to tell otherwise
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "missing.conf"))
    unknown = run(*args).output
    assert "AccountingStorageTRES=gres/gpu" in unknown and "--no-slurmdbd" in unknown, unknown


def test_the_version_is_printed_for_minus_v_as_for_version():
    """-V as Slurm's own commands take it (sinfo -V, sbatch -V), beside --version (issue 31 item 7)."""
    from slurm_gpushare import __version__

    for flag in ("-V", "--version"):
        r = run(flag)
        assert r.exit_code == 0 and r.output == f"slurm-gpushare, version {__version__}\n", (flag, r.output)


def test_doctor_prints_its_findings_as_json_for_monitoring_scripts(tmp_path, monkeypatch):
    """``doctor --format json`` (issue 31 item 7): what Nagios/cron scripts parse, with the same exit status."""
    import json as _json

    monkeypatch.setenv("GPUSHARE_NVML", f"fake:{MACHINES / '8x-rtx4090-pcie.json'}")
    cfg = tmp_path / "node.toml"
    cfg.write_text(f'version = 1\nrun_dir = "{tmp_path}/run"\n')
    (tmp_path / "run" / "jobs" / "4711").mkdir(parents=True)  # a job directory of no running job
    monkeypatch.setattr("slurm_gpushare.slurm.commands.running_jobs", lambda node: [])  # slurmctld: none runs here
    text = CliRunner().invoke(main, ["doctor", "--config", str(cfg), "--node", "n1"])
    r = CliRunner().invoke(main, ["doctor", "--config", str(cfg), "--node", "n1", "--format", "json"])
    assert r.exit_code == text.exit_code == 1, (r.output, text.output)
    data = _json.loads(r.output)
    assert (data["node"], data["repair"], data["finished"], data["exit_status"]) == ("n1", False, True, 1)
    assert data["findings"] and all(set(f) == {"job_id", "problem", "action"} for f in data["findings"])
    assert len(data["findings"]) == len(text.output.splitlines())  # the same findings, one line each in text
    assert any(f["job_id"] == "4711" for f in data["findings"]), data


# --- real-input shapes (issue 28 item 6) ---------------------------------------------------------------------


def test_a_box_of_mixed_models_takes_a_name_and_a_memory_size_per_gpu():
    topo = ["--from-topo", str(DATA / "topo-shapes/4x-mixed-a100-nvlink-pair-l40s-pair-tabs.txt"), "--cpus", "2x16x1"]
    r = run("gres-conf", *topo, "--gpu-name", "0-1=NVIDIA A100 80GB PCIe;2-3=NVIDIA L40S",
            "--memory", "0-1=80G;2-3=46068M", "--slurm-version", "22.05", "--no-slurmdbd")
    assert r.exit_code == 0, r.output
    types = re.findall(r"Name=gpu Type=(\w+) File=/dev/nvidia(\d)", r.output)
    assert types == [("a100", "0"), ("a100", "1"), ("l40s", "2"), ("l40s", "3")]
    assert re.findall(r"Name=shard Count=(\d+)", r.output) == ["80", "80", "44", "44"]
    # every GPU must be named; an item that is not INDICES=VALUE is refused, naming it
    r = run("gres-conf", *topo, "--gpu-name", "0-1=NVIDIA A100 80GB PCIe", "--memory", "80G")
    assert r.exit_code != 0 and "--gpu-name per GPU must name each GPU" in r.output and "missing 2,3" in r.output
    r = run("gres-conf", *topo, "--gpu-name", "0-1=NVIDIA A100 80GB PCIe;L40S", "--memory", "80G")
    assert r.exit_code != 0 and "--gpu-name item 'L40S' is not INDICES=VALUE" in r.output


def test_a_gh200_numa_affinity_list_of_gpu_memory_nodes_reads_as_the_cpu_s_node():
    """GH200: NUMA Affinity ``0,5-11`` (the CPU's node and the GPU memory's nodes) is the CPU's node 0."""
    topo = DATA / "topo-shapes" / "1x-gh200-numa-affinity-lists-gpu-memory-nodes-tabs.txt"
    r = run("inventory", "--from-topo", str(topo),
            "--gpu-name", "NVIDIA GH200 480GB", "--memory", "97871M", "--cpus", "1x72x1")
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["gpus"][0]["numa_node"] == 0


def test_a_file_of_matrices_without_host_headers_takes_one_by_position():
    topo = ["--from-topo", str(DATA / "topo-shapes/2x-matrices-one-file-no-host-headers-tabs.txt")]
    r = run("topology", *topo)
    assert r.exit_code != 0 and "--host @N for the Nth matrix" in r.output
    first, second = run("topology", *topo, "--host", "@1"), run("topology", *topo, "--host", "@2")
    assert first.exit_code == 0 and second.exit_code == 0, first.output + second.output
    assert "1.08" in first.output and "1.08" not in second.output  # NV12 in the first, NV4 in the second
    r = run("topology", *topo, "--host", "@3")
    assert r.exit_code != 0 and "holds 2 'nvidia-smi topo -m' matrices" in r.output and "@1 to @2" in r.output
