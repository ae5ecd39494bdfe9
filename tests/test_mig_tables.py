"""MIG tables and slurmd -G prints recorded on real machines: parsers, minor numbers, and the
``gres-conf --slurmd-g`` comparison.

Expected values are read off the recorded outputs (tests/data/mig, tests/data/slurmd) and the
driver's documented ``mig-minors`` numbering (NVIDIA MIG user guide, "Device Nodes and
Capabilities": ``config 1``, ``monitor 2``, ``gpu0/gi0/access 3``, ``gpu0/gi0/ci0/access 4`` ..,
15 GPU instances of 1 + 8 entries per GPU).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slurm_gpushare.errors import ParseError
from slurm_gpushare.gresconf.detected import compare_detected, split_type, types_agree
from slurm_gpushare.gresconf.render import generate_node_gres
from slurm_gpushare.hardware.machine import Machine, mig_cap_minors, mig_cap_owner
from slurm_gpushare.hardware.nvidia_smi import (
    mig_devices,
    parse_gpu_list,
    parse_mig_instances,
    parse_mig_profiles,
)
from slurm_gpushare.slurm.nodegres import GresOptions
from slurm_gpushare.slurm.release import Release
from slurm_gpushare.slurm.slurmd import parse_slurmd_g
from slurm_gpushare_dev.cluster import packaged_machine

DATA = Path(__file__).parent / "data"
LGI = DATA / "mig" / "h100-80gb-hbm3-lgip-lgi-lci-7x1g.txt"
PRINT = DATA / "slurmd" / "h100-sxm5-mig-mixed-slurmd-G.txt"
TEST_MACHINE = DATA / "machines" / "h100-sxm5-4gpu-mig-mixed.json"

#: Index= of the MIG lines of the real print, by parent GPU (the file's types: 4g.40gb first).
PRINT_MIG_INDEX = {2: (291, 336, 345, 354), 3: (417, 507, 516, 525)}


# --- nvidia-smi mig -lgip followed by -lgi and -lci ---------------------------------------------


def test_lgip_followed_by_lgi_and_lci_reads_the_profiles():
    # the file's -lgip table: 7 profiles of GPU 0, 1g.10gb = id 19, 7/7 free, 9.75 GiB, 16 SMs
    profiles = parse_mig_profiles(LGI.read_text(), source=LGI.name)
    assert list(profiles) == [0]
    assert [p.profile_id for p in profiles[0]] == [19, 20, 15, 14, 9, 5, 0]
    first = profiles[0][0]
    assert (first.name, first.max_instances, first.memory_mib, first.sm_count) == ("1g.10gb", 7, 9984, 16)


def test_lgi_and_lci_tables():
    t = parse_mig_instances(LGI.read_text(), source=LGI.name)
    assert t.has_gpu_instances and t.has_compute_instances
    # -lgi: GPU instance ids 7..13 at memory slices 0..6, profile 19, size 1
    assert [(g.gi_id, g.start, g.size, g.profile_id, g.profile) for g in t.gpu_instances] == \
        [(7 + k, k, 1, 19, "1g.10gb") for k in range(7)]
    # -lci: one compute instance 0 (profile 0) in each
    assert [(c.gi_id, c.ci_id, c.profile_id, c.start) for c in t.compute_instances] == \
        [(7 + k, 0, 0, 0) for k in range(7)]


def test_mig_devices_from_lgi_lci_use_the_driver_minors():
    devices = mig_devices(parse_mig_instances(LGI.read_text()), 0, 0)
    # gpu0/giI/access = 3 + 9 I, its ci0 the next minor: gi7 -> 66, 67 ... gi13 -> 120, 121
    assert [(d.gi_id, d.start, d.caps) for d in devices] == [(7 + k, k, (66 + 9 * k, 67 + 9 * k)) for k in range(7)]


def test_lgi_without_lci_is_refused_for_devices():
    text = LGI.read_text()
    only_lgi = text[:text.index("$ sudo nvidia-smi mig -i 0 -lci")]
    with pytest.raises(ParseError, match="-lci"):
        mig_devices(parse_mig_instances(only_lgi), 0, 0)


def test_bad_lgi_row_is_named():
    text = "| GPU instances: |\n|   0  MIG 1g.10gb   19   seven   0:1 |\n"
    with pytest.raises(ParseError, match="cannot read GPU instance row") as e:
        parse_mig_instances(text, source="x.txt")
    assert e.value.source == "x.txt:2"


def test_lci_of_an_unlisted_gpu_instance_is_refused():
    text = LGI.read_text().replace("|   0      7       MIG 1g.10gb", "|   0      5       MIG 1g.10gb")
    with pytest.raises(ParseError, match="GPU instance 5"):
        parse_mig_instances(text)


def test_a_compute_instance_listed_twice_is_refused():
    # one -lci row copied: GPU instance 12 holds one compute instance 0, not two MIG devices
    row = "|   0     12       MIG 1g.10gb          0         0          0:1     |\n"
    text = LGI.read_text()
    assert row in text
    with pytest.raises(ParseError, match="compute instance 0 of GPU instance 12 is listed twice"):
        parse_mig_instances(text.replace(row, row + row))


def test_gpu_instances_with_overlapping_placements_are_refused():
    # GPU instance 12 moved onto slice 4, which instance 11 holds (a 1g profile is one slice)
    text = LGI.read_text().replace("|   0  MIG 1g.10gb         19       12          5:1     |",
                                   "|   0  MIG 1g.10gb         19       12          4:1     |")
    with pytest.raises(ParseError, match="GPU instance 12 at 4:1 overlaps GPU instance 11 at 4:1"):
        parse_mig_instances(text)


# --- nvidia-smi -L ----------------------------------------------------------------------------


def test_nvidia_smi_L_with_mig_devices():
    gpus = parse_gpu_list((DATA / "mig" / "a100-sxm4-80gb-L-7x1g.txt").read_text())
    assert [(g.index, g.name, g.uuid) for g in gpus] == \
        [(0, "NVIDIA A100-SXM4-80GB", "GPU-7fdaf0a5-179b-f636-d15d-daf243e3ff16")]
    assert [(m.profile, m.device) for m in gpus[0].migs] == [("1g.10gb", k) for k in range(7)]
    assert gpus[0].migs[6].uuid == "MIG-1aae4990-b962-574e-8375-119d6d9b9687"


def test_nvidia_smi_L_two_3g_devices():
    gpus = parse_gpu_list((DATA / "mig" / "a100-80gb-pcie-L-2x3g.txt").read_text())
    assert [(m.profile, m.device, m.uuid) for m in gpus[0].migs] == [
        ("3g.40gb", 0, "MIG-0929581a-2be6-5dec-bf34-0954c6c529a6"),
        ("3g.40gb", 1, "MIG-3adbed3a-d03d-549f-a016-ba1fd7359f23")]


def test_nvidia_smi_L_refuses_orphan_mig_line():
    with pytest.raises(ParseError, match="before any GPU line"):
        parse_gpu_list("  MIG 1g.10gb     Device  0: (UUID: MIG-feb88891-0321-5fef-9c87-d4af3b54259e)\n")


# --- slurmd -G --------------------------------------------------------------------------------


def test_slurmd_g_real_print_with_wrapped_flags():
    records = parse_slurmd_g(PRINT.read_text(), source=PRINT.name)
    assert len(records) == 10
    assert [r.index for r in records] == [0, 1, 291, 417, 336, 345, 354, 507, 516, 525]
    assert records[0].files == ("/dev/nvidia0",) and records[0].type == "nvidia_h100_80gb_hbm3"
    assert records[2].type == "nvidia_h100_80gb_hbm3_4g.40gb"
    assert records[2].files == ("/dev/nvidia-caps/nvidia-cap291",)
    # the published wrap splits Flags= ("ENV_ONEAPI" / ",ENV_OPENCL"; "HAS_TYPE," / "ENV_NVML"): rejoined
    assert all(r.flags == ("HAS_FILE", "HAS_TYPE", "ENV_NVML", "ENV_RSMI", "ENV_ONEAPI", "ENV_OPENCL", "ENV_DEFAULT")
               for r in records)
    assert all(r.links == "" and r.count == 1 for r in records)


def test_slurmd_g_multiple_files_index_is_the_last_number():
    # 24.11 gpu_nvml.c: File=parent,gi-cap,ci-cap; gres.c prints as Index= the number ending File=
    line = ("slurmd: Gres Name=gpu Type=nvidia_h100_80gb_hbm3_4g.40gb Count=1 Index=292 ID=7696487 "
            "File=/dev/nvidia2,/dev/nvidia-caps/nvidia-cap291,/dev/nvidia-caps/nvidia-cap292 Links=(null) "
            "Flags=HAS_FILE,HAS_TYPE,ENV_NVML\n")
    (r,) = parse_slurmd_g(line)
    assert r.index == 292 and r.files[1] == "/dev/nvidia-caps/nvidia-cap291"


def test_slurmd_g_22_05_bare_null_links():
    (r,) = parse_slurmd_g("slurmd-n1: Gres Name=gpu Type=a100 Count=1 Index=0 ID=7696487 File=/dev/nvidia0 (null)\n")
    assert (r.type, r.index, r.flags) == ("a100", 0, ())


def test_slurmd_g_wrongly_joined_line_is_refused():
    text = ("slurmd-n1: Gres Name=gpu Type=h100 Count=1 Index=1 ID=7696487 File=/dev/nvidia1 Links=(null) Flags=HAS_\n"
            "FILE,HAS_TYPE\n"
            "slurmd-n1: Gres Name=gpu Type=h100 Count=1 Index=3 ID=7696487 File=/dev/nvidia\n"
            "2 Links=(null)\n")
    with pytest.raises(ParseError, match="Index=3 is not the number that ends File=/dev/nvidia"):
        parse_slurmd_g(text, source="p.txt")


def test_slurmd_g_nothing_found():
    with pytest.raises(ParseError, match="no 'Gres Name=...' line"):
        parse_slurmd_g("[user@node ~]$ slurmd -G\n[user@node ~]$\n")


# --- the driver's minor numbers, checked against the real print --------------------------------


def test_mig_cap_minors_documented_start():
    # the user guide's listing: gpu0/gi0/access 3, gpu0/gi0/ci0/access 4; gi1 starts 9 later
    assert mig_cap_minors(0, 0, 0) == (3, 4)
    assert mig_cap_minors(0, 1, 0) == (12, 13)
    assert mig_cap_minors(0, 14, 7) == (129, 137)
    assert mig_cap_minors(1, 0, 0) == (138, 139)   # gpu1 follows gpu0's 135 entries


def test_every_index_of_the_real_print_is_a_gpu_instance_access_minor():
    owners = [mig_cap_owner(i) for i in (291, 336, 345, 354, 417, 507, 516, 525)]
    # GPU 2: GI 2 (4g.40gb) and 7, 8, 9; GPU 3: GI 1 (4g.40gb) and 11, 12, 13: never a compute instance
    assert owners == [(2, 2, None), (2, 7, None), (2, 8, None), (2, 9, None),
                      (3, 1, None), (3, 11, None), (3, 12, None), (3, 13, None)]


@pytest.mark.parametrize("machine", [TEST_MACHINE, "packaged"])
def test_recorded_mig_machines_match_the_real_print(machine):
    m = packaged_machine("4x-h100-mig-mixed.json") if machine == "packaged" else Machine.load(TEST_MACHINE)
    by_gpu = {}
    for g in m.gpus:
        if g.mig_enabled:
            ordered = sorted(g.mig_instances, key=lambda i: (i.profile != "4g.40gb", i.gi_id))
            by_gpu[g.minor] = tuple(i.caps[0] for i in ordered)
            assert all(i.caps == mig_cap_minors(g.minor, i.gi_id, i.ci_id) for i in g.mig_instances)
    assert by_gpu == PRINT_MIG_INDEX


def test_test_machine_json_minors_are_written_as_the_driver_numbers_them():
    data = json.loads(TEST_MACHINE.read_text())
    for g in data["gpus"]:
        for inst in g.get("mig_instances", []):
            assert tuple(inst["caps"]) == mig_cap_minors(g["minor"], inst["gi_id"], inst["ci_id"])


# --- gres-conf --slurmd-g ---------------------------------------------------------------------


def test_types_agree_between_autodetect_and_product_names():
    assert split_type("nvidia_h100_80gb_hbm3_1g.10gb") == ("h100", "1g.10gb")
    assert types_agree("nvidia_h100_80gb_hbm3_4g.40gb", "h100_4g.40gb")
    assert types_agree("nvidia_h100_80gb_hbm3", "h100")
    assert not types_agree("nvidia_h100_80gb_hbm3_1g.10gb", "h100_4g.40gb")
    assert not types_agree("nvidia_a100_80gb_pcie", "h100")


@pytest.mark.parametrize("release", ["22.05", "24.11"])
def test_compare_real_print_with_recorded_machine(release):
    node = generate_node_gres(Machine.load(TEST_MACHINE), "gpu-node-02",
                              GresOptions(release=Release.parse(release)))
    devices, problems = compare_detected(parse_slurmd_g(PRINT.read_text()), node)
    assert problems == []
    assert [d.device.split(" ")[0] for d in devices] == (
        ["/dev/nvidia0", "/dev/nvidia1"] + [f"nvidia-cap{n}" for n in (291, 336, 345, 354, 417, 507, 516, 525)])
    assert all(d.ok for d in devices)


def test_compare_reports_each_device_that_differs():
    m = Machine.load(TEST_MACHINE)
    # GPU 2 recreated with the 4g.40gb as GPU instance 1 (what the machine said before): minor 282
    gpus = []
    for g in m.gpus:
        if g.index == 2:
            from dataclasses import replace
            g = replace(g, mig_instances=tuple(
                replace(i, gi_id=1, caps=mig_cap_minors(2, 1, 0)) if i.profile == "4g.40gb" else i
                for i in g.mig_instances))
        gpus.append(g)
    from dataclasses import replace as _r
    node = generate_node_gres(_r(m, gpus=tuple(gpus)), "gpu-node-02")
    devices, problems = compare_detected(parse_slurmd_g(PRINT.read_text()), node)
    bad = [d for d in devices if not d.ok]
    assert [d.device for d in bad] == ["nvidia-cap282 (GPU minor 2, GPU instance 1)",
                                       "nvidia-cap291 (GPU minor 2, GPU instance 2)"]
    assert "not detected by slurmd" in bad[0].detail and "not in gres.conf" in bad[1].detail
    assert len(problems) == 2   # the counts per type still agree (2x 4g.40gb on both sides)


# --- the command line -------------------------------------------------------------------------


def _cli(*args: str):
    from click.testing import CliRunner

    from slurm_gpushare.cli import main
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def test_cli_slurmd_g_matches_the_recorded_machine():
    r = _cli("gres-conf", str(TEST_MACHINE), "--slurm-version", "22.05", "--slurmd-g", str(PRINT))
    assert r.exit_code == 0, r.output
    assert "ok: nvidia-cap291 (GPU minor 2, GPU instance 2): nvidia_h100_80gb_hbm3_4g.40gb = h100_4g.40gb" \
        in r.output
    assert "all 10 GPU device(s)" in r.output


def test_cli_slurmd_g_reports_a_changed_mig_layout(tmp_path):
    # the node's GPU 3 lost one 1g.10gb (GPU instance 13, Index=525): slurmd shows 5 of the 6
    lines = PRINT.read_text().splitlines()
    at = next(k for k, line in enumerate(lines) if "nvidia-cap525" in line)
    text = "\n".join(lines[:at] + lines[at + 2:]) + "\n"
    (tmp_path / "g.txt").write_text(text)
    r = _cli("gres-conf", str(TEST_MACHINE), "--slurm-version", "24.11", "--slurmd-g", str(tmp_path / "g.txt"))
    assert r.exit_code == 1
    assert "DIFFERS: nvidia-cap525 (GPU minor 3, GPU instance 13): in gres.conf" in r.output
    assert "DIFFERS: gpu h100_1g.10gb: g.txt shows 5, gres.conf has 6" in r.output
    js = _cli("gres-conf", str(TEST_MACHINE), "--slurm-version", "24.11", "--slurmd-g", str(tmp_path / "g.txt"),
              "--format", "json")
    report = json.loads(js.output)
    assert js.exit_code == 1 and report["exit_status"] == 1 and "check" not in report
    detected = report["detected"]
    assert (detected["source"], detected["node"], len(detected["devices"])) == ("g.txt", "gpu-node-02", 10)
    assert [d["device"] for d in detected["devices"] if not d["ok"]] == [
        "nvidia-cap525 (GPU minor 3, GPU instance 13)"]
    assert any(p.startswith("gpu h100_1g.10gb: g.txt shows 5, gres.conf has 6") for p in detected["problems"])


def test_cli_slurmd_g_takes_one_machine():
    r = _cli("gres-conf", str(TEST_MACHINE), str(DATA / "machines" / "dgx-h100-8gpu-nvswitch.json"),
             "--slurmd-g", str(PRINT))
    assert r.exit_code == 2 and "give one machine" in r.output


def test_cli_mig_table_with_lgi_lci_gives_the_mig_devices():
    r = _cli("gres-conf", "--from-topo", str(DATA / "topo" / "dgx-h100-8gpu-nv18-no-nic.txt"),
             "--gpu-name", "NVIDIA H100 80GB HBM3", "--memory", "81559M", "--hostname", "n1",
             "--mig-table", str(LGI), "--slurm-version", "22.05", "--no-shards")
    assert r.exit_code == 0, r.output
    mig = [line for line in r.output.splitlines() if "Name=gpu Type=h100_1g.10gb" in line]
    # GPU 0 (minor 0): GPU instances 7..13 -> gpu0/giI/access = 3 + 9 I = 66, 75, ... 120
    assert [line.split("File=")[1].split()[0] for line in mig] == [
        f"/dev/nvidia-caps/nvidia-cap{3 + 9 * gi}" for gi in range(7, 14)]


def test_cli_mig_table_checks_an_nvidia_smi_L_listing(tmp_path):
    args = ["gres-conf", "--from-topo", str(DATA / "topo" / "dgx-h100-8gpu-nv18-no-nic.txt"),
            "--gpu-name", "NVIDIA H100 80GB HBM3", "--memory", "81559M", "--hostname", "n1", "--slurm-version", "22.05"]
    agreeing = tmp_path / "agree.txt"   # GPU 0: seven 1g.10gb in -lci and in -L
    agreeing.write_text(LGI.read_text() + (DATA / "mig" / "a100-sxm4-80gb-L-7x1g.txt").read_text())
    assert _cli(*args, "--mig-table", str(agreeing)).exit_code == 0
    disagreeing = tmp_path / "disagree.txt"   # GPU 0: -L lists two 3g.40gb
    disagreeing.write_text(LGI.read_text() + (DATA / "mig" / "a100-80gb-pcie-L-2x3g.txt").read_text())
    r = _cli(*args, "--mig-table", str(disagreeing))
    assert r.exit_code == 2
    assert "GPU 0: 'nvidia-smi -L' lists MIG devices ['3g.40gb', '3g.40gb']" in r.output


def test_compare_names_a_print_of_another_node_and_a_device_printed_twice():
    node = generate_node_gres(Machine.load(TEST_MACHINE), "h100-mig")
    text = PRINT.read_text()
    _devices, problems = compare_detected(parse_slurmd_g(text), node)
    assert problems == ["slurmd -G was printed on gpu-node-02 (its 'slurmd-gpu-node-02:' prefix), not on h100-mig"]
    mine = generate_node_gres(Machine.load(TEST_MACHINE), "gpu-node-02")
    first = next(line for line in text.splitlines() if "Index=0 " in line)
    _devices, problems = compare_detected(parse_slurmd_g(text + first + "\n"), mine)
    assert len(problems) == 1 and "/dev/nvidia0 is printed twice" in problems[0], problems
