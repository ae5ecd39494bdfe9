"""Tests of slurm_gpushare.hardware.machine: the strict machine description (values, ranges, JSON)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from slurm_gpushare.errors import MachineDescriptionError
from slurm_gpushare.hardware.machine import MAX_MEMORY_MIB, CpuLayout, Gpu, Machine, node_name_problem

DATA = Path(__file__).parent / "data" / "machines"
PACKAGED = Path(__file__).parent.parent / "slurm_gpushare" / "data" / "machines"
SMALL = DATA / "a100-pcie-4gpu-nvlink-pairs.json"
MIG = DATA / "h100-sxm5-4gpu-mig-mixed.json"


def description(path: Path = SMALL) -> dict:
    return json.loads(path.read_text())


def refused(data: dict) -> str:
    with pytest.raises(MachineDescriptionError) as err:
        Machine.from_dict(data, source="m.json")
    return str(err.value)


@pytest.mark.parametrize("path", sorted([*DATA.glob("*.json"), *PACKAGED.glob("*.json")]), ids=lambda p: p.name)
def test_every_recorded_description_is_valid(path):
    Machine.load(path)


@pytest.mark.parametrize("hostname, problem", [
    ("", "is empty"),
    ("gpu 01", "contains ' '"),
    ("gpu[01-02]", "contains '[', ']'"),
    ("a,b", "contains ','"),
    ("gpu\t1", "contains '\\t'"),
])
def test_hostname_must_be_a_slurm_node_name(hostname, problem):
    data = description()
    data["hostname"] = hostname
    text = refused(data)
    assert text.startswith(f"m.json: hostname {hostname!r} {problem} (")
    assert "letters, digits, '-', '_' and '.'" in text


def test_node_names_that_are_fine():
    for name in ("gpu-01", "node_7", "n1.cluster", "A100x8"):
        assert node_name_problem(name) is None


# (path to the value, bad value, text that must be in the message)
RANGES = [
    (("gpus", 0, "index"), -1, "gpus[0].index is -1, out of range (allowed 0 or more"),
    (("gpus", 0, "minor"), -1, "gpus[0].minor is -1, out of range (allowed 0-254"),
    (("gpus", 0, "minor"), 255, "gpus[0].minor is 255, out of range (allowed 0-254"),
    (("gpus", 1, "memory_mib"), 0, "gpus[1].memory_mib is 0, out of range (allowed 1-16777216"),
    (("gpus", 1, "memory_mib"), MAX_MEMORY_MIB + 1, "gpus[1].memory_mib is 16777217, out of range"),
    (("gpus", 0, "numa_node"), -1, "gpus[0].numa_node is -1, out of range (allowed 0-1023"),
    (("cpus", "sockets"), 0, "cpus.sockets is 0, out of range (allowed 1-64"),
    (("cpus", "sockets"), 65, "cpus.sockets is 65, out of range (allowed 1-64"),
    (("cpus", "cores_per_socket"), 1025, "cpus.cores_per_socket is 1025, out of range (allowed 1-1024"),
    (("cpus", "threads_per_core"), 0, "cpus.threads_per_core is 0, out of range (allowed 1-16"),
    (("cpus", "threads_per_core"), 17, "cpus.threads_per_core is 17, out of range (allowed 1-16"),
    (("links", 0, "nvlinks"), 65, "links[0].nvlinks is 65, out of range (allowed 0-64"),
    (("links", 0, "nvlinks"), -1, "links[0].nvlinks is -1, out of range (allowed 0-64"),
]


@pytest.mark.parametrize("path, value, message", RANGES, ids=[m.split(" is")[0] + f"={v}" for _, v, m in RANGES])
def test_values_outside_their_range_name_the_key_and_the_range(path, value, message):
    data = description()
    node = data
    for step in path[:-1]:
        node = node[step]
    node[path[-1]] = value
    assert message in refused(data)


def test_gpu_name_must_not_be_empty():
    data = description()
    data["gpus"][2]["name"] = "  "
    assert "m.json: gpus[2].name is empty (" in refused(data)


def test_cpu_affinity_ids_are_not_negative():
    data = description()
    data["cpus"] = None
    data["gpus"][0]["cpu_affinity"] = [0, -3]
    assert "gpus[0].cpu_affinity is -3, out of range (allowed 0 or more" in refused(data)


def test_core_of_cpu_must_cover_every_cpu():
    data = description()
    data["cpus"]["core_of_cpu"] = [0, 1]
    assert "cpus.core_of_cpu has 2 entries for 64 logical CPUs" in refused(data)


@pytest.mark.parametrize("where, key, value, message", [
    ("mig_profiles", "slices", 9, "gpus[0].mig_profiles[0].slices is 9, out of range (allowed 1-8"),
    ("mig_profiles", "memory_mib", 0, "gpus[0].mig_profiles[0].memory_mib is 0, out of range"),
    ("mig_profiles", "max_instances", 99, "gpus[0].mig_profiles[0].max_instances is 99, out of range (allowed 0-8"),
    ("mig_profiles", "placements", [[7, 2]], "gpus[0].mig_profiles[0].placements: [7, 2] ends after memory slice 8"),
    ("mig_profiles", "placements", [[9, 1]], "gpus[0].mig_profiles[0].placements is 9, out of range (allowed 0-7"),
    ("mig_instances", "gi_id", 15, "gpus[0].mig_instances[0].gi_id is 15, out of range (allowed 0-14"),
    ("mig_instances", "ci_id", 8, "gpus[0].mig_instances[0].ci_id is 8, out of range (allowed 0-7"),
    ("mig_instances", "start", -1, "gpus[0].mig_instances[0].start is -1, out of range (allowed 0-7"),
    ("mig_instances", "caps", [-5], "gpus[0].mig_instances[0].caps is -5, out of range"),
])
def test_mig_values_must_be_plausible(where, key, value, message):
    data = description(MIG)
    gpu = next(g for g in data["gpus"] if g.get("mig_instances"))
    data["gpus"] = [gpu, *[g for g in data["gpus"] if g is not gpu]]
    data["gpus"][0][where][0][key] = value
    assert message in refused(data)


def test_duplicate_keys_are_refused_with_the_key_named():
    text = SMALL.read_text().replace('"minor": 1,', '"minor": 1, "minor": 3,', 1)
    assert text != SMALL.read_text()
    with pytest.raises(MachineDescriptionError) as err:
        Machine.from_json(text, source="m.json")
    assert str(err.value).startswith("m.json: key 'minor' is given twice in one object (")
    top = '{"version": 1, "hostname": "a", "hostname": "b", "gpus": []}'
    with pytest.raises(MachineDescriptionError, match="key 'hostname' is given twice"):
        Machine.from_json(top)


def test_non_utf8_file_is_one_clear_error(tmp_path):
    f = tmp_path / "m.json"
    f.write_bytes(b'{"version": 1, "hostname": "\xff\xfe"}')
    with pytest.raises(MachineDescriptionError) as err:
        Machine.load(f)
    assert str(err.value).startswith(f"{f} is not text (UTF-8)")


def test_validate_checks_machines_built_in_code_too():
    gpu = Gpu(index=0, minor=300, name="NVIDIA A100 80GB PCIe", memory_mib=81920)
    with pytest.raises(MachineDescriptionError, match=r"gpus\[0\]\.minor is 300"):
        Machine("n1", (gpu,)).validate()
    with pytest.raises(MachineDescriptionError, match=r"cpus\.sockets is 100"):
        Machine("n1", (), cpus=CpuLayout(100, 8)).validate()


def test_a_valid_description_round_trips():
    m = Machine.load(SMALL)
    assert Machine.from_json(m.to_json()) == m
    data = copy.deepcopy(description())
    assert Machine.from_dict(data) == m


# --- GPU type names (docs/admin-guide.md, "GPU type names") ----------------------------------------

@pytest.mark.parametrize("name, model", [
    # the names of the golden files and packaged machines stay what they were
    ("NVIDIA H100 80GB HBM3", "h100"), ("NVIDIA A100 80GB PCIe", "a100"), ("NVIDIA A100-SXM4-40GB", "a100"),
    ("NVIDIA A100-SXM4-80GB", "a100"), ("NVIDIA GeForce RTX 4090", "rtx4090"), ("Tesla V100-SXM2-16GB", "v100"),
    ("Tesla P100-PCIE-16GB", "p100"), ("NVIDIA L40S", "l40s"), ("Quadro RTX 6000", "rtx6000"),
    # board, memory size and edition words do not make another model
    ("NVIDIA H100 PCIe", "h100"), ("NVIDIA H100 NVL", "h100"), ("NVIDIA GH200 480GB", "gh200"),
    ("NVIDIA RTX 4000 SFF Ada Generation", "rtx4000ada"), ("NVIDIA RTX 4000 Ada Generation", "rtx4000ada"),
    ("NVIDIA RTX PRO 6000 Blackwell Server Edition", "rtxpro6000blackwell"),
    ("NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition", "rtxpro6000blackwell"),
    ("NVIDIA B300 SXM6 AC", "b300"),  # the board (SXM6) and its air cooling (AC) are not the model
    ("NVIDIA GB300", "gb300"),
    # other models get other names (the old rule gave the second of each pair the first's name)
    ("NVIDIA RTX 6000 Ada Generation", "rtx6000ada"), ("NVIDIA GeForce RTX 3090 Ti", "rtx3090ti"),
    ("NVIDIA TITAN V", "titanv"), ("NVIDIA TITAN RTX", "titanrtx"),
    ("NVIDIA RTX PRO 4500 Blackwell", "rtxpro4500blackwell"),
    ("Tesla V100S-PCIE-32GB", "v100s"), ("NVIDIA RTX A6000", "rtxa6000"),
])
def test_gpu_model_names_one_type_per_model(name, model):
    from slurm_gpushare.hardware.machine import gpu_model
    assert gpu_model(name) == model


def test_quadro_rtx_6000_and_rtx_6000_ada_do_not_collide():
    # Quadro RTX 6000: Turing TU102, 24 GB; RTX 6000 Ada Generation: AD102, 48 GB (NVIDIA product pages)
    from slurm_gpushare.hardware.machine import gpu_model
    assert gpu_model("Quadro RTX 6000") != gpu_model("NVIDIA RTX 6000 Ada Generation")


@pytest.mark.parametrize(("text", "message"), [
    ("[" * 100_000 + "]" * 100_000, "m.json: JSON nested too deeply"),
    ('{"version": 1, "gpus": [' + "[" * 100_000, "m.json: JSON nested too deeply"),
    ('{"version": 1,\n "gpus": [}', "m.json: not valid JSON: line 2 column 11 ("),
])
def test_unreadable_json_is_one_description_error(text, message):
    # the loader every command shares (gres-conf, mig plan, the node hooks): no RecursionError, one line
    with pytest.raises(MachineDescriptionError) as err:
        Machine.from_json(text, source="m.json")
    assert str(err.value).startswith(message) and "\n" not in str(err.value), str(err.value)
