"""Tests of slurm_gpushare.hardware.nvidia_smi against recorded nvidia-smi output (tests/data/topo, tests/data/mig)."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest

from slurm_gpushare.errors import ParseError
from slurm_gpushare.hardware.machine import CpuLayout, Machine
from slurm_gpushare.hardware.nvidia_smi import (
    MAX_DIRECT_NVLINKS,
    SEVEN_SLICE_PLACEMENTS,
    cpu_layout_unknown,
    infer_cpu_layout,
    parse_cpu_list,
    parse_mig_profiles,
    parse_topo_matrix,
    topo_sections,
)

DATA = Path(__file__).parent / "data"
TOPO = DATA / "topo"
MIG = DATA / "mig"

L40S = "4x-l40s-pcie-node-sys-2nic.txt"
A100_PAIRS = "8x-a100-nv12-bridge-nonadjacent-pairs-tabs.txt"
A100_JOB = "2x-a100-80gb-inside-slurm-job-empty-affinity.txt"
P100 = "8x-p100-pcie-pix-phb-single-numa-tabs.txt"
RTX4090 = "8x-rtx4090-pcie-all-sys-2nic-tabs.txt"
DGX_H100 = "dgx-h100-8gpu-nv18-no-nic.txt"
DGX1 = "dgx1-v100-sxm2-8gpu-1nic.txt"
WORKSTATION = "2x-rtx5090-workstation-threadripper-3975wx-one-range-tabs.txt"
DGX_A100 = "dgx-a100-8gpu-nv12-nps4-12nic-tabs.txt"
TWO_HOSTS = DATA / "topo-multi" / "2-hosts-clush-b-l40s-rtx4090.txt"

#: file -> (GPU count, NIC names in index order, inferred (sockets, cores_per_socket, threads) or None)
EXPECTED = {
    A100_JOB: (2, ["NIC0", "NIC1"], None),
    L40S: (4, ["mlx5_0", "mlx5_1"], (2, 96, 2)),
    # one unbroken range per GPU (0-31 / 32-63): SMT off, or siblings numbered next to each other
    A100_PAIRS: (8, [], None),
    # 0-63 on one NUMA node: a 32-core/64-thread Threadripper PRO 3975WX reads like 64 cores without SMT
    WORKSTATION: (2, [], None),
    P100: (8, [], (2, 8, 2)),
    RTX4090: (8, ["NIC0", "NIC1"], (2, 56, 2)),
    DGX_H100: (8, [], (2, 48, 2)),
    DGX1: (8, ["mlx5_0"], (2, 12, 2)),
    # NPS4: the text shows 8 NUMA nodes of 16 cores, not the 2 sockets of 64 behind them
    DGX_A100: (8, [f"mlx5_{i}" for i in range(12)], (8, 16, 2)),
}


def topo(name: str, **kwargs) -> Machine:
    kwargs.setdefault("memory_mib", 81920)
    return parse_topo_matrix((TOPO / name).read_text(), source=name, **kwargs)


def parse_error(text: str, **kwargs) -> str:
    kwargs.setdefault("memory_mib", 1024)
    with pytest.raises(ParseError) as info:
        parse_topo_matrix(text, source="t.txt", **kwargs)
    return str(info.value)


def test_every_recorded_topology_has_an_expectation():
    assert sorted(p.name for p in TOPO.glob("*.txt")) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_recorded_topology_parses(name):
    gpus, nics, layout = EXPECTED[name]
    m = topo(name, hostname="n1", gpu_name="NVIDIA X100")
    assert [g.index for g in m.gpus] == list(range(gpus))
    assert [g.minor for g in m.gpus] == list(range(gpus))
    assert {g.name for g in m.gpus} == {"NVIDIA X100"}
    assert {g.memory_mib for g in m.gpus} == {81920}
    assert len(m.links) == gpus * (gpus - 1) // 2
    assert [n.name for n in m.nics] == nics
    assert [n.index for n in m.nics] == list(range(len(nics)))
    assert all(len(n.paths) == gpus for n in m.nics)
    got = (m.cpus.sockets, m.cpus.cores_per_socket, m.cpus.threads_per_core) if m.cpus else None
    assert got == layout
    assert m.hostname == "n1"
    assert m.source == f"nvidia-smi topo -m {name}"


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_machine_json_round_trip(name):
    m = topo(name)
    assert Machine.from_json(m.to_json()) == m


@pytest.mark.parametrize("name", [A100_PAIRS, P100, RTX4090])
def test_tab_expanded_copy_parses_the_same(name):
    text = (TOPO / name).read_text()
    assert "\t" in text
    spaced = parse_topo_matrix(text.expandtabs(8), source=name, memory_mib=1)
    assert spaced == parse_topo_matrix(text, source=name, memory_mib=1)


@pytest.mark.parametrize("name", [DGX1, L40S, DGX_H100])
def test_collapsed_or_indented_copy_parses_the_same(name):
    text = (TOPO / name).read_text()
    want = parse_topo_matrix(text, source=name, memory_mib=1)
    collapsed = "\n".join(re.sub(r"(?<=\S)  +", " ", line) for line in text.splitlines())
    assert collapsed != text
    assert parse_topo_matrix(collapsed, source=name, memory_mib=1) == want
    indented = "\n".join("    " + line for line in text.splitlines())
    assert parse_topo_matrix(indented, source=name, memory_mib=1) == want


def test_default_gpu_name_is_a_placeholder():
    assert {g.name for g in topo(P100).gpus} == {"unknown GPU"}


def test_empty_cpu_affinity_cell_does_not_shift_columns():
    m = topo(A100_JOB)
    assert m.gpu(0).cpu_affinity == tuple(range(64))
    assert m.gpu(0).numa_node == 0
    assert m.gpu(1).cpu_affinity == ()
    assert m.gpu(1).numa_node == 1
    assert [(n.name, n.paths) for n in m.nics] == [("NIC0", ("NODE", "SYS")), ("NIC1", ("SYS", "NODE"))]
    assert m.link(0, 1).pcie == "SYS"
    # the lists were clipped by the job's cpuset: no layout can be inferred from them
    assert m.cpus is None


def test_empty_affinity_in_tab_separated_text():
    text = ("\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n"
            "GPU0\t X \tSYS\t0-63\t0\t\tN/A\n"
            "GPU1\tSYS\t X \t\t1\t\tN/A\n")
    m = parse_topo_matrix(text, memory_mib=1)
    assert [(g.cpu_affinity[:1], g.numa_node) for g in m.gpus] == [((0,), 0), ((), 1)]


def test_dgx_h100_links_are_nv18_through_nvswitch():
    m = topo(DGX_H100)
    assert len(m.links) == 28
    assert {(ln.nvlinks, ln.via_nvswitch, ln.pcie) for ln in m.links} == {(18, True, None)}
    assert m.nics == ()


def test_a100_bridge_pairs_are_direct_nv12_and_the_rest_sys():
    m = topo(A100_PAIRS)
    pairs = {(0, 2), (1, 3), (4, 5), (6, 7)}
    for ln in m.links:
        if (ln.a, ln.b) in pairs:
            assert (ln.nvlinks, ln.via_nvswitch, ln.pcie) == (12, False, None)
        else:
            assert (ln.nvlinks, ln.via_nvswitch, ln.pcie) == (0, False, "SYS")
    assert sum(ln.nvlinks > 0 for ln in m.links) == 4


def test_dgx1_hybrid_cube_mesh_is_direct():
    m = topo(DGX1)
    assert m.link(0, 1).nvlinks == 1
    assert m.link(3, 0).nvlinks == 2
    assert m.link(0, 4).nvlinks == 2
    assert m.link(0, 5).pcie == "SYS"
    assert not any(ln.via_nvswitch for ln in m.links)
    assert m.nics[0].paths == ("NODE", "NODE", "PIX", "PIX", "SYS", "SYS", "SYS", "SYS")
    assert m.gpu(4).cpu_affinity == (*range(12, 24), *range(36, 48))


def test_numa_node_derived_from_the_cpu_layout_without_a_numa_column():
    # the old header has no NUMA Affinity column; the inferred layout (2 sockets x 12 cores x 2
    # threads) puts GPU0-3's CPUs 0-11,24-35 on socket 0 and GPU4-7's 12-23,36-47 on socket 1
    m = topo(DGX1)
    assert (m.cpus.sockets, m.cpus.cores_per_socket, m.cpus.threads_per_core) == (2, 12, 2)
    assert [g.numa_node for g in m.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    # the same with the layout given
    given = topo(DGX1, cpus=CpuLayout(sockets=2, cores_per_socket=12, threads_per_core=2))
    assert [g.numa_node for g in given.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]


def test_derived_numa_node_needs_all_affinity_cpus_on_one_socket():
    text = ("\tGPU0\tGPU1\tGPU2\tCPU Affinity\n"
            "GPU0\t X \tSYS\tSYS\t0-7\n"
            "GPU1\tSYS\t X \tSYS\t4-11\n"
            "GPU2\tSYS\tSYS\t X \tN/A\n")
    m = parse_topo_matrix(text, memory_mib=1, cpus=CpuLayout(sockets=2, cores_per_socket=8))
    # GPU0 on socket 0; GPU1 spans both sockets; GPU2's affinity is unknown
    assert [g.numa_node for g in m.gpus] == [0, None, None]
    # without a layout nothing is derived
    assert [g.numa_node for g in parse_topo_matrix(text, memory_mib=1).gpus] == [None, None, None]


def test_reported_numa_affinity_is_kept():
    # NUMA Affinity says 3 (e.g. 4 NUMA nodes per socket): the reported value wins over the socket
    text = ("\tGPU0\tCPU Affinity\tNUMA Affinity\n"
            "GPU0\t X \t0-7\t3\n")
    m = parse_topo_matrix(text, memory_mib=1, cpus=CpuLayout(sockets=2, cores_per_socket=16))
    assert m.gpu(0).numa_node == 3


def test_p100_pix_quads_joined_by_phb():
    m = topo(P100)
    for ln in m.links:
        same_quad = ln.a // 4 == ln.b // 4
        assert ln.pcie == ("PIX" if same_quad else "PHB")
        assert ln.nvlinks == 0
    assert {g.numa_node for g in m.gpus} == {0}


def test_rtx4090_nics_hang_off_gpu6():
    m = topo(RTX4090)
    assert [n.paths for n in m.nics] == [("SYS",) * 6 + ("PHB", "SYS")] * 2
    assert m.gpu(4).cpu_affinity == (*range(56, 112), *range(168, 224))


def test_switch_inference_counts_links_over_all_peers():
    def matrix(cell: str, n: int) -> str:
        head = "\t" + "\t".join(f"GPU{i}" for i in range(n)) + "\tCPU Affinity\n"
        rows = "".join(f"GPU{i}\t" + "\t".join(" X " if i == j else cell for j in range(n)) + "\t0-7\n"
                       for i in range(n))
        return head + rows

    # DGX A100: NV12 to 7 peers (84 links) is switched; two bridged cards (12) or 4-GPU NV6 (18) are not
    switched = parse_topo_matrix(matrix("NV12", 8), memory_mib=1)
    assert all(ln.via_nvswitch for ln in switched.links)
    for cell, n in (("NV12", 2), ("NV6", 4)):
        direct = parse_topo_matrix(matrix(cell, n), memory_mib=1)
        assert all(ln.nvlinks and not ln.via_nvswitch for ln in direct.links)
        assert sum(ln.nvlinks for ln in direct.links if 0 in (ln.a, ln.b)) <= MAX_DIRECT_NVLINKS


def test_legacy_soc_reads_as_sys_and_na_gives_no_link():
    text = ("$ nvidia-smi topo -m\n"
            "\tGPU0\tGPU1\tGPU2\tmlx4_0\tCPU Affinity\n"
            "GPU0\t X \tSOC\tN/A\tSOC\t0-7\n"
            "GPU1\tSOC\t X \tPHB\tN/A\t8-15\n"
            "GPU2\tN/A\tPHB\t X \tPHB\t8-15\n"
            "mlx4_0\tSYS\tN/A\tPHB\t X \n")
    m = parse_topo_matrix(text, memory_mib=1)
    assert m.link(0, 1).pcie == "SYS"
    assert m.link(0, 2) is None
    assert m.link(1, 2).pcie == "PHB"
    assert [(n.index, n.name, n.paths) for n in m.nics] == [(0, "mlx4_0", ("SYS", None, "PHB"))]
    assert m.cpus is None  # one range per GPU (0-7 / 8-15): SMT off or siblings numbered next to each other


def test_nic_names_argument_overrides_the_legend():
    m = topo(L40S, nic_names={1: "ib1"})
    assert [n.name for n in m.nics] == ["mlx5_0", "ib1"]


# --- the CPU layout: inferred only where the lists show it, a given one checked against every column --


def test_one_range_workstation_layout_is_unknown_and_the_reason_names_what_fits():
    # AMD Threadripper PRO 3975WX: 1 socket, 32 cores, 64 threads. "0-63" alone fits 1x64x1 as well.
    m = topo(WORKSTATION)
    assert m.cpus is None
    why = cpu_layout_unknown(m.gpus)
    assert "one unbroken range (0-63)" in why and "1x64x1" in why and "1x32x2" in why


def test_workstation_with_its_layout_gets_core_ids_0_31():
    # 32 cores: Slurm core ids 0-31, the SMT siblings 32-63 collapse onto them (gres.conf(5) Cores)
    m = topo(WORKSTATION, cpus=CpuLayout(sockets=1, cores_per_socket=32, threads_per_core=2))
    assert [m.cpus.core_ids(g.cpu_affinity) for g in m.gpus] == [tuple(range(32))] * 2
    assert {g.numa_node for g in m.gpus} == {0}


def test_dual_socket_smt_layout_puts_the_numa_node_1_gpus_on_socket_1():
    # DGX A100: 2x EPYC 7742 (64 cores, 128 threads each); socket 1 holds Slurm cores 64-127
    m = topo(DGX_A100, cpus=CpuLayout(sockets=2, cores_per_socket=64, threads_per_core=2))
    for g in m.gpus:
        cores = m.cpus.core_ids(g.cpu_affinity)
        on_socket_1 = g.numa_node >= 4        # NPS4: nodes 0-3 on socket 0, 4-7 on socket 1
        assert all((c >= 64) == on_socket_1 for c in cores), (g.index, g.numa_node, cores)


@pytest.mark.parametrize("name, layout, message", [
    # the lists are two runs 192 apart (SMT siblings of 192 cores): one thread per core cannot be
    (L40S, (2, 192, 1), "two runs 192 CPUs apart"),
    # 96-core sockets split in two: NUMA node 0 (0-95) would span sockets 0 and 1
    (L40S, (4, 48, 2), "GPU 0 is on NUMA node 0, but the CPU layout 4x48x2 puts its CPU Affinity on sockets 0, 1"),
    # DGX A100 (2x 64 cores x 2 threads) given as 2x128x1
    (DGX_A100, (2, 128, 1), "the CPU layout 2x128x1 has 256 cores x 1 thread"),
    # a layout with fewer CPUs than the lists name
    (L40S, (2, 48, 2), "GPU 0: CPU Affinity holds CPU 192, but the CPU layout 2x48x2 has 192 logical CPUs"),
    # 0-63 as 16 cores of 4 threads numbered Linux-style (c, c+16, c+32, c+48) is fine, as 2x16x2 too;
    # but 1x48x2 leaves CPUs 64-95, the siblings of cores 16-31 (CPUs 16-31 are in the list), outside
    (WORKSTATION, (1, 48, 2), "holds part of core 16 but not its CPU 64"),
])
def test_given_layout_that_the_columns_contradict_is_refused(name, layout, message):
    with pytest.raises(ParseError) as info:
        topo(name, cpus=CpuLayout(*layout))
    assert message in str(info.value)
    assert "--cpus" in info.value.hint


def test_given_cpu_layout_is_used_and_checked():
    layout = CpuLayout(sockets=2, cores_per_socket=56, threads_per_core=2)
    assert topo(RTX4090, cpus=layout).cpus == layout
    with pytest.raises(ParseError) as info:
        topo(RTX4090, cpus=CpuLayout(sockets=1, cores_per_socket=8))
    assert f"{RTX4090}:9:" in str(info.value) and "but the CPU layout 1x8x1 has 8 logical CPUs" in str(info.value)


def test_single_gpu_machine():
    m = parse_topo_matrix("\tGPU0\tCPU Affinity\tNUMA Affinity\nGPU0\t X \t0-15\t0\n", memory_mib=1)
    assert (len(m.gpus), m.links, m.gpu(0).numa_node) == (1, (), 0)


# --- errors ------------------------------------------------------------------------------------

GOOD = ("# a comment\n"
        "\tGPU0\tGPU1\tGPU2\tCPU Affinity\tNUMA Affinity\n"
        "GPU0\t X \tNV2\tSYS\t0-7\t0\n"
        "GPU1\tNV2\t X \tSYS\t0-7\t0\n"
        "GPU2\tSYS\tSYS\t X \t8-15\t1\n")


def test_good_synthetic_matrix_parses():
    m = parse_topo_matrix(GOOD, memory_mib=1)
    assert (m.link(0, 1).nvlinks, m.link(1, 2).pcie, m.gpu(2).numa_node) == (2, "SYS", 1)


def test_missing_header():
    msg = parse_error("$ nvidia-smi topo -m\nNVIDIA-SMI has failed\n")
    assert "t.txt:2" in msg and "header" in msg


def test_truncated_matrix_missing_row():
    msg = parse_error(GOOD.rsplit("GPU2", 1)[0] + "\nLegend:\n")
    assert "t.txt:4" in msg and "truncated" in msg and "GPU2" in msg


def test_truncated_row():
    msg = parse_error(GOOD.replace("GPU1\tNV2\t X \tSYS\t0-7\t0", "GPU1\tNV2\t X "))
    assert "t.txt:4" in msg and "truncated" in msg and "GPU1" in msg


def test_row_missing_affinity_cells():
    msg = parse_error(GOOD.replace("GPU2\tSYS\tSYS\t X \t8-15\t1", "GPU2\tSYS\tSYS\t X \t8-15"))
    assert "t.txt:5" in msg and "NUMA Affinity" in msg


@pytest.mark.parametrize("token", ["NVX", "FOO", "NV0", "X"])
def test_unknown_token(token):
    msg = parse_error(GOOD.replace("GPU2\tSYS\tSYS", f"GPU2\tSYS\t{token}"))
    assert "t.txt:5" in msg and repr(token) in msg


def test_asymmetric_matrix_names_both_cells():
    msg = parse_error(GOOD.replace("GPU2\tSYS\tSYS", "GPU2\tSYS\tPHB"))
    assert "t.txt:5" in msg and "asymmetric" in msg
    assert "GPU1/GPU2 is 'SYS' (line 4)" in msg and "GPU2/GPU1 is 'PHB' (line 5)" in msg


def test_self_cell_not_x():
    msg = parse_error(GOOD.replace("GPU1\tNV2\t X ", "GPU1\tNV2\tPIX"))
    assert "t.txt:4" in msg and "GPU1/GPU1" in msg and "'PIX'" in msg


@pytest.mark.parametrize("cpulist", ["0-x", "7-3", "0,,4"])
def test_bad_cpu_list(cpulist):
    msg = parse_error(GOOD.replace("8-15", cpulist))
    assert "t.txt:5" in msg and "is not a CPU id or an ascending range" in msg and repr(cpulist) in msg


def test_bad_numa_affinity():
    msg = parse_error(GOOD.replace("8-15\t1", "8-15\tone"))
    assert "t.txt:5" in msg and "'one'" in msg


@pytest.mark.parametrize("memory", [None, 0, -5])
def test_missing_or_bad_memory(memory):
    msg = parse_error(GOOD, memory_mib=memory)
    assert "t.txt:2" in msg and "memory_mib" in msg and "--memory" in msg


def test_extra_cell_after_affinity():
    msg = parse_error(GOOD.replace("8-15\t1", "8-15\t1\t7"))
    assert "t.txt:5" in msg and "'7' is extra" in msg


def test_unknown_header_column():
    msg = parse_error(GOOD.replace("NUMA Affinity", "NUMA Affinity\tPower"))
    assert "t.txt:2" in msg and "'Power'" in msg


def test_nvlink_to_a_nic_is_rejected():
    text = ("\tGPU0\tNIC0\tCPU Affinity\n"
            "GPU0\t X \tNV4\t0-7\n"
            "NIC0\tNV4\t X \n")
    msg = parse_error(text)
    assert "t.txt:2" in msg and "'NV4'" in msg


def test_parse_errors_carry_the_source():
    with pytest.raises(ParseError) as info:
        parse_topo_matrix(GOOD.replace("NV2\tSYS\t0-7", "NV2\tFOO\t0-7"), source="node7.txt", memory_mib=1)
    assert info.value.source == "node7.txt:3"


# --- CPU lists and layouts ---------------------------------------------------------------------


def test_parse_cpu_list():
    assert parse_cpu_list("0-3,8,10-11") == (0, 1, 2, 3, 8, 10, 11)
    assert parse_cpu_list(" N/A ") == ()
    assert parse_cpu_list("") == ()
    with pytest.raises(ParseError, match=r"lst:3: '1-' in '1-' is not a CPU id or an ascending range a-b"):
        parse_cpu_list("1-", source="lst:3")


@pytest.mark.parametrize("lists, numa, want", [
    (["0-7,16-23"], [0], (2, 8, 2)),               # P100: GPUs on one socket, SMT offset shows both
    (["0-31", "32-63"], [0, 1], None),             # one range each: threads per core unseen
    (["0-31"], [None], None),                      # 0-31 is 32x1 or 16x2 (siblings right after)
    (["0-31", "32-63"], [0, 2], None),             # NUMA node 2 beyond the two domains seen
    (["0-7,16-23", "8-11,24-27"], [0, 1], None),   # domains of different sizes
    (["0-7,16-23", "8-15,32-39"], [0, 1], None),   # inconsistent SMT offsets
    (["0-3,8-11,16-19"], [0], None),               # three runs
    (["4-11"], [0], None),                         # run not aligned to its size
    (["0-15", ""], [0, 1], None),                  # clipped by a cpuset
])
def test_infer_cpu_layout(lists, numa, want):
    from slurm_gpushare.hardware.machine import Gpu
    gpus = [Gpu(index=i, minor=i, name="g", memory_mib=1, cpu_affinity=parse_cpu_list(cl), numa_node=n)
            for i, (cl, n) in enumerate(zip(lists, numa, strict=True))]
    layout = infer_cpu_layout(gpus)
    got = (layout.sockets, layout.cores_per_socket, layout.threads_per_core) if layout else None
    assert got == want


# --- several matrices in one text ------------------------------------------------------------------


def test_two_hosts_in_one_file_are_refused_without_a_choice():
    text = TWO_HOSTS.read_text()
    assert topo_sections(text) == [("gpu01", 14), ("gpu02", 39)]
    message = parse_error(text)
    assert "2 'nvidia-smi topo -m' matrices (line 14 under gpu01, line 39 under gpu02)" in message
    assert message.startswith("t.txt:39:")


def test_each_host_of_a_two_host_file_parses_as_its_own_recording():
    text = TWO_HOSTS.read_text()
    first = parse_topo_matrix(text, memory_mib=1, section=0)
    second = parse_topo_matrix(text, memory_mib=1, section=1)
    assert first == parse_topo_matrix((TOPO / L40S).read_text(), memory_mib=1)
    assert second == parse_topo_matrix((TOPO / RTX4090).read_text(), memory_mib=1)
    assert (len(first.gpus), len(second.gpus)) == (4, 8)


def test_a_single_recording_is_one_unlabelled_section_and_p2p_tables_are_not_matrices():
    assert topo_sections((TOPO / L40S).read_text()) == [(None, 6)]
    p2p = "\n \tGPU0\tGPU1\t\n GPU0\tX\tGNS\t\n GPU1\tGNS\tX\t\n"   # nvidia-smi topo -p2p rw, as reports add it
    text = (TOPO / WORKSTATION).read_text() + p2p
    assert len(topo_sections(text)) == 1
    assert len(parse_topo_matrix(text, memory_mib=1).gpus) == 2


# --- nvidia-smi mig -lgip ----------------------------------------------------------------------


def lgip(name: str):
    return parse_mig_profiles((MIG / name).read_text(), source=name)


def test_h100_lgip_four_gpus_seven_profiles():
    profiles = lgip("h100-sxm5-80gb-x4-lgip.txt")
    assert sorted(profiles) == [0, 1, 2, 3]
    assert all(len(p) == 7 for p in profiles.values())
    assert len({p for p in profiles.values()}) == 1
    first = profiles[0][0]
    assert (first.name, first.profile_id, first.slices, first.memory_mib, first.max_instances,
            first.sm_count) == ("1g.10gb", 19, 1, 9984, 7, 16)
    assert first.placements == tuple((s, 1) for s in range(7))
    assert [p.name for p in profiles[3]] == ["1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb",
                                             "4g.40gb", "7g.80gb"]
    whole = profiles[2][-1]
    assert (whole.profile_id, whole.slices, whole.memory_mib, whole.sm_count, whole.placements) == \
        (0, 7, 81152, 132, ((0, 8),))


def test_a100_40gb_lgip():
    profiles = lgip("a100-pcie-40gb-lgip.txt")
    assert list(profiles) == [0]
    by_name = {p.name: p for p in profiles[0]}
    assert len(by_name) == 7
    me = by_name["1g.5gb+me"]
    assert (me.profile_id, me.slices, me.memory_mib, me.max_instances) == (20, 1, 4864, 1)
    double = by_name["1g.10gb"]
    assert (double.profile_id, double.slices, double.max_instances) == (15, 1, 4)
    assert double.placements == ((0, 2), (2, 2), (4, 2), (6, 2))
    assert by_name["3g.20gb"].placements == ((0, 4), (4, 4))
    assert by_name["3g.20gb"].memory_mib == round(19.62 * 1024)
    assert by_name["4g.20gb"].placements == ((0, 4),)


@pytest.mark.parametrize("name", sorted(p.name for p in MIG.glob("*.txt") if "GPU instance profiles:" in p.read_text()))
def test_placements_agree_with_instance_counts(name):
    for profiles in lgip(name).values():
        for p in profiles:
            starts = [s for s, _ in p.placements]
            assert len(starts) >= p.max_instances
            assert all(start + size <= 8 for start, size in p.placements)
            assert SEVEN_SLICE_PLACEMENTS[p.profile_id][0] == p.slices


def test_profiles_round_trip_through_a_machine_description():
    m = topo(DGX_H100)
    profiles = lgip("h100-sxm5-80gb-x4-lgip.txt")[0]
    with_mig = replace(m, gpus=tuple(replace(g, mig_enabled=True, mig_profiles=profiles) for g in m.gpus))
    assert Machine.from_json(with_mig.to_json()) == with_mig


A30_ROW = ("|   0  MIG 1g.6gb        14     4/4        5.81       No     14     1     0   |\n"
           "|   0  MIG 4g.24gb        0     1/1        23.69      No     56     4     0   |\n")


def test_placements_unknown_without_a_seven_slice_profile():
    profiles = parse_mig_profiles(A30_ROW)[0]
    assert [(p.name, p.profile_id, p.slices, p.placements) for p in profiles] == \
        [("1g.6gb", 14, 1, ()), ("4g.24gb", 0, 4, ())]


def test_lgip_in_mib():
    text = ("| GPU   Name             ID    Instances   Memory     P2P    SM    DEC   ENC  |\n"
            "|                              Free/Total   MiB              CE    JPEG  OFA  |\n" + A30_ROW)
    assert parse_mig_profiles(text)[0][0].memory_mib == 6


@pytest.mark.parametrize("row, token", [
    ("|   0  MIG 1g.10gb       19     7/7        9.75       No     |", "MIG 1g.10gb"),
    ("|   0  MIG 1x.10gb       19     7/7        9.75       No     16     1     0   |", "'1x.10gb'"),
    ("|   0  MIG 1g.10gb       19     7/7        lots       No     16     1     0   |", "lots"),
])
def test_lgip_bad_rows(row, token):
    text = "$ nvidia-smi mig -lgip\n" + row + "\n"
    with pytest.raises(ParseError) as info:
        parse_mig_profiles(text, source="l.txt")
    assert "l.txt:2" in str(info.value) and token in str(info.value)


def test_lgip_duplicate_profile():
    with pytest.raises(ParseError, match=r"l.txt:2: profile id 14 \(1g.6gb\) is listed twice for GPU 0"):
        parse_mig_profiles(A30_ROW.splitlines()[0] + "\n" + A30_ROW, source="l.txt")


def test_lgip_without_profiles():
    with pytest.raises(ParseError, match=r"l.txt:1: no GPU instance profiles found"):
        parse_mig_profiles("No MIG-enabled devices found.\n", source="l.txt")


def test_a_header_row_underlined_by_terminal_escapes_is_read():
    """collect_env scripts (sglang, vLLM) print the header row between ANSI underline codes (issue 28 item 6)."""
    text = (TOPO / L40S).read_text()
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if line.strip().startswith("GPU0") and " X " not in line)
    lines[at] = "\x1b[4m" + lines[at] + "\x1b[0m"
    lines[at + 1] = "\x1b[1m" + lines[at + 1][:4] + "\x1b[0m" + lines[at + 1][4:]
    assert parse_topo_matrix("\n".join(lines), source=L40S, memory_mib=1) == \
        parse_topo_matrix(text, source=L40S, memory_mib=1)


def test_a_pcie_only_matrix_of_topo_mp_is_refused_not_read_as_one_without_nvlink():
    """``nvidia-smi topo -mp`` prints the PCIe paths only: its legend has no NV# line, and every NVLink of the
    machine would be missing from what the product reads (issue 28 item 6). ``-m``'s legend always has it."""
    text = (TOPO / L40S).read_text()
    assert "NV#" in text
    mp = "\n".join(line for line in text.splitlines() if "NV#" not in line)
    message = parse_error(mp)
    assert "nvidia-smi topo -mp" in message and "nvidia-smi topo -m" in message, message
    # a legend cut short before its PIX line (a copy that stops early) says nothing either way: read
    cut = "\n".join(line for line in text.splitlines() if "NV#" not in line and "PIX  =" not in line)
    assert parse_topo_matrix(cut, source=L40S, memory_mib=1) == parse_topo_matrix(text, source=L40S, memory_mib=1)
