"""Tests of slurm_gpushare.topology.hops: hop matrix, gres.conf Links=, graph queries.

The four real machines are the public ``nvidia-smi topo -m`` outputs in tests/data/topo (copied from
../machines/topo with their source headers). Each is built here by hand, and also parsed with
``slurm_gpushare.hardware.nvidia_smi.parse_topo_matrix`` where that module exists; both must give the
literal expected hop matrices written below (not recomputed with the module's formula).
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest

from slurm_gpushare.errors import InputError, MachineDescriptionError
from slurm_gpushare.hardware.machine import Gpu, Link, Machine, Nic
from slurm_gpushare.topology.hops import (
    Topology,
    format_links,
    format_table,
    hop_matrix,
    nearest_nic,
    numa_groups,
    nvlink_islands,
    slurm_links,
)

TOPO = Path(__file__).parent / "data" / "topo"

DGX1_FILE = "dgx1-v100-sxm2-8gpu-1nic.txt"
A100_FILE = "8x-a100-nv12-bridge-nonadjacent-pairs-tabs.txt"
RTX4090_FILE = "8x-rtx4090-pcie-all-sys-2nic-tabs.txt"
P100_FILE = "8x-p100-pcie-pix-phb-single-numa-tabs.txt"

# --- expected hop matrices, written out ----------------------------------------------------------

_1 = 1.5                 # NV1: 1 + 1/2
_2 = 1.3333333333333333  # NV2: 1 + 1/3
_S = 3.8                 # PCIe SYS

DGX1_HOP = [
    [0.0, _1, _1, _2, _2, _S, _S, _S],
    [_1, 0.0, _2, _1, _S, _2, _S, _S],
    [_1, _2, 0.0, _2, _S, _S, _1, _S],
    [_2, _1, _2, 0.0, _S, _S, _S, _1],
    [_2, _S, _S, _S, 0.0, _1, _1, _2],
    [_S, _2, _S, _S, _1, 0.0, _2, _1],
    [_S, _S, _1, _S, _1, _2, 0.0, _2],
    [_S, _S, _S, _1, _2, _1, _2, 0.0],
]

_12 = 1.0769230769230769  # NV12: 1 + 1/13

A100_HOP = [
    [0.0, 3.8, _12, 3.8, 3.8, 3.8, 3.8, 3.8],
    [3.8, 0.0, 3.8, _12, 3.8, 3.8, 3.8, 3.8],
    [_12, 3.8, 0.0, 3.8, 3.8, 3.8, 3.8, 3.8],
    [3.8, _12, 3.8, 0.0, 3.8, 3.8, 3.8, 3.8],
    [3.8, 3.8, 3.8, 3.8, 0.0, _12, 3.8, 3.8],
    [3.8, 3.8, 3.8, 3.8, _12, 0.0, 3.8, 3.8],
    [3.8, 3.8, 3.8, 3.8, 3.8, 3.8, 0.0, _12],
    [3.8, 3.8, 3.8, 3.8, 3.8, 3.8, _12, 0.0],
]

RTX4090_HOP = [
    [0.0, 3.8, 3.8, 3.8, 3.8, 3.8, 3.8, 3.8],
    [3.8, 0.0, 3.8, 3.8, 3.8, 3.8, 3.8, 3.8],
    [3.8, 3.8, 0.0, 3.8, 3.8, 3.8, 3.8, 3.8],
    [3.8, 3.8, 3.8, 0.0, 3.8, 3.8, 3.8, 3.8],
    [3.8, 3.8, 3.8, 3.8, 0.0, 3.8, 3.8, 3.8],
    [3.8, 3.8, 3.8, 3.8, 3.8, 0.0, 3.8, 3.8],
    [3.8, 3.8, 3.8, 3.8, 3.8, 3.8, 0.0, 3.8],
    [3.8, 3.8, 3.8, 3.8, 3.8, 3.8, 3.8, 0.0],
]

P100_HOP = [  # PIX quads (3.0) joined through the host bridge (PHB 3.4)
    [0.0, 3.0, 3.0, 3.0, 3.4, 3.4, 3.4, 3.4],
    [3.0, 0.0, 3.0, 3.0, 3.4, 3.4, 3.4, 3.4],
    [3.0, 3.0, 0.0, 3.0, 3.4, 3.4, 3.4, 3.4],
    [3.0, 3.0, 3.0, 0.0, 3.4, 3.4, 3.4, 3.4],
    [3.4, 3.4, 3.4, 3.4, 0.0, 3.0, 3.0, 3.0],
    [3.4, 3.4, 3.4, 3.4, 3.0, 0.0, 3.0, 3.0],
    [3.4, 3.4, 3.4, 3.4, 3.0, 3.0, 0.0, 3.0],
    [3.4, 3.4, 3.4, 3.4, 3.0, 3.0, 3.0, 0.0],
]

# --- the same machines built by hand -------------------------------------------------------------


def _machine(hostname: str, gpu_name: str, memory_mib: int, numa: list[int | None],
             nvlinks: dict[tuple[int, int], int], pcie: dict[tuple[int, int], str] | None = None,
             default_pcie: str = "SYS", nics: tuple[Nic, ...] = ()) -> Machine:
    """8 GPUs; NVLinked pairs from ``nvlinks`` (no PCIe level, as topo -m prints only NV#), every
    other pair at its ``pcie`` level or ``default_pcie``."""
    n = len(numa)
    gpus = tuple(Gpu(index=i, minor=i, name=gpu_name, memory_mib=memory_mib, numa_node=numa[i])
                 for i in range(n))
    links = []
    for a, b in itertools.combinations(range(n), 2):
        if (a, b) in nvlinks:
            links.append(Link(a, b, nvlinks=nvlinks[(a, b)]))
        else:
            links.append(Link(a, b, pcie=(pcie or {}).get((a, b), default_pcie)))
    return Machine(hostname=hostname, gpus=gpus, links=tuple(links), nics=nics, source=f"{hostname} by hand")


def dgx1() -> Machine:
    nv = {(0, 1): 1, (0, 2): 1, (0, 3): 2, (0, 4): 2, (1, 2): 2, (1, 3): 1, (1, 5): 2, (2, 3): 2,
          (2, 6): 1, (3, 7): 1, (4, 5): 1, (4, 6): 1, (4, 7): 2, (5, 6): 2, (5, 7): 1, (6, 7): 2}
    nic = Nic(0, "mlx5_0", ("NODE", "NODE", "PIX", "PIX", "SYS", "SYS", "SYS", "SYS"))
    return _machine("dgx1", "Tesla V100-SXM2-16GB", 16160, [None] * 8, nv, nics=(nic,))


def a100_bridge() -> Machine:
    nv = {(0, 2): 12, (1, 3): 12, (4, 5): 12, (6, 7): 12}
    return _machine("a100", "NVIDIA A100 80GB PCIe", 81920, [0, 0, 0, 0, 1, 1, 1, 1], nv)


def rtx4090() -> Machine:
    nics = (Nic(0, "NIC0", ("SYS",) * 6 + ("PHB", "SYS")), Nic(1, "NIC1", ("SYS",) * 6 + ("PHB", "SYS")))
    return _machine("rtx", "NVIDIA GeForce RTX 4090", 24564, [0, 0, 0, 0, 1, 1, 1, 1], {}, nics=nics)


def p100() -> Machine:
    quads = [(0, 1, 2, 3), (4, 5, 6, 7)]
    pix = {pair: "PIX" for q in quads for pair in itertools.combinations(q, 2)}
    return _machine("p100", "Tesla P100-PCIE-16GB", 16280, [0] * 8, {}, pcie=pix, default_pcie="PHB")


MACHINES = {
    "dgx1": (dgx1, DGX1_FILE, "Tesla V100-SXM2-16GB", 16160, DGX1_HOP),
    "a100": (a100_bridge, A100_FILE, "NVIDIA A100 80GB PCIe", 81920, A100_HOP),
    "rtx4090": (rtx4090, RTX4090_FILE, "NVIDIA GeForce RTX 4090", 24564, RTX4090_HOP),
    "p100": (p100, P100_FILE, "Tesla P100-PCIE-16GB", 16280, P100_HOP),
}


def parsed(name: str) -> Machine:
    """The machine parsed from its recorded ``nvidia-smi topo -m`` text (skips without the parser)."""
    nvidia_smi = pytest.importorskip("slurm_gpushare.hardware.nvidia_smi")
    _, file, gpu_name, memory_mib, _ = MACHINES[name]
    text = (TOPO / file).read_text()
    return nvidia_smi.parse_topo_matrix(text, source=file, hostname=name, gpu_name=gpu_name,
                                        memory_mib=memory_mib)


# --- hop matrix ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(MACHINES))
def test_hop_matrix_of_hand_built_machine(name):
    build, _, _, _, expected = MACHINES[name]
    hop = hop_matrix(build())
    assert hop.dtype == np.float64
    assert hop.shape == (8, 8)
    np.testing.assert_allclose(hop, np.array(expected), rtol=0, atol=1e-12)
    np.testing.assert_array_equal(hop, hop.T)


@pytest.mark.parametrize("name", sorted(MACHINES))
def test_hop_matrix_of_parsed_topo_text(name):
    machine = parsed(name)
    np.testing.assert_allclose(hop_matrix(machine), np.array(MACHINES[name][4]), rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", sorted(MACHINES))
def test_parsed_machine_has_the_hand_built_queries(name):
    machine, by_hand = parsed(name), MACHINES[name][0]()
    np.testing.assert_array_equal(slurm_links(machine), slurm_links(by_hand))
    assert nvlink_islands(machine) == nvlink_islands(by_hand)


def test_nvlink_weight_more_links_nearer():
    assert hop_matrix(dgx1())[0, 3] < hop_matrix(dgx1())[0, 1]  # NV2 nearer than NV1
    assert 1.0 < hop_matrix(a100_bridge())[0, 2] < hop_matrix(dgx1())[0, 3]  # NV12 nearer still


def test_nvswitch_pairs_are_hop_2_and_links_10():
    gpus = tuple(Gpu(i, i, "NVIDIA H100 80GB HBM3", 81559, numa_node=i // 2) for i in range(4))
    links = tuple(Link(a, b, nvlinks=18, via_nvswitch=True) for a, b in itertools.combinations(range(4), 2))
    m = Machine("h100", gpus, links)
    np.testing.assert_array_equal(hop_matrix(m), np.array([
        [0.0, 2.0, 2.0, 2.0],
        [2.0, 0.0, 2.0, 2.0],
        [2.0, 2.0, 0.0, 2.0],
        [2.0, 2.0, 2.0, 0.0],
    ]))
    np.testing.assert_array_equal(slurm_links(m), np.array([
        [-1, 10, 10, 10],
        [10, -1, 10, 10],
        [10, 10, -1, 10],
        [10, 10, 10, -1],
    ]))
    assert nvlink_islands(m) == [frozenset({0, 1, 2, 3})]


def test_undescribed_pair_is_sys_even_on_one_numa_node():
    gpus = (Gpu(0, 0, "g", 1024, numa_node=0), Gpu(1, 1, "g", 1024, numa_node=0),
            Gpu(2, 2, "g", 1024, numa_node=1), Gpu(3, 3, "g", 1024, numa_node=None))
    # unknown means no useful connection, never nearer than a known one: every undescribed pair is
    # SYS, also 0-1 on one NUMA node; a link with no facts counts as none
    m = Machine("n", gpus, links=(Link(0, 3),))
    np.testing.assert_allclose(hop_matrix(m), np.array([
        [0.0, 3.8, 3.8, 3.8],
        [3.8, 0.0, 3.8, 3.8],
        [3.8, 3.8, 0.0, 3.8],
        [3.8, 3.8, 3.8, 0.0],
    ]), rtol=0, atol=1e-12)
    assert (slurm_links(m)[~np.eye(4, dtype=bool)] == 0).all()


def test_description_without_links_invents_no_paths():
    # a hand-written description with GPUs and NUMA nodes but no links: no NODE paths, no Links=1
    gpus = tuple(Gpu(i, i, "NVIDIA A100 80GB PCIe", 81920, numa_node=i // 2) for i in range(4))
    t = Topology.from_machine(Machine("n", gpus))
    assert {v for i, row in enumerate(t.hop) for j, v in enumerate(row) if i != j} == {3.8}
    assert {v for i, row in enumerate(t.links) for j, v in enumerate(row) if i != j} == {0}


def test_nvlink_wins_over_pcie_level():
    gpus = tuple(Gpu(i, i, "g", 1024) for i in range(3))
    m = Machine("n", gpus, links=(Link(0, 1, nvlinks=2, pcie="SYS"), Link(0, 2, pcie="SYS"),
                                  Link(1, 2, pcie="PXB")))
    np.testing.assert_allclose(hop_matrix(m), np.array([
        [0.0, 1.3333333333333333, 3.8],
        [1.3333333333333333, 0.0, 3.2],
        [3.8, 3.2, 0.0],
    ]), rtol=0, atol=1e-12)


def test_legacy_soc_is_refused_by_the_models():
    # nvidia_smi reads the pre-2017 SOC as SYS; a description never holds it (Machine.validate refuses it)
    gpus = tuple(Gpu(i, i, "g", 1024) for i in range(2))
    with pytest.raises(MachineDescriptionError, match="unknown PCIe level 'SOC'"):
        hop_matrix(Machine("n", gpus, links=(Link(0, 1, pcie="SOC"),)))


def test_non_contiguous_gpu_indices_keep_ascending_order():
    gpus = (Gpu(5, 5, "g", 1024, numa_node=1), Gpu(2, 2, "g", 1024, numa_node=1))
    m = Machine("n", gpus, links=(Link(2, 5, nvlinks=4),))
    np.testing.assert_allclose(hop_matrix(m), np.array([[0.0, 1.2], [1.2, 0.0]]), rtol=0, atol=1e-12)
    assert nvlink_islands(m) == [frozenset({2, 5})]
    assert numa_groups(m) == {1: (2, 5)}


def test_empty_machine_has_empty_matrices():
    m = Machine("n", ())
    assert hop_matrix(m).shape == (0, 0)
    assert slurm_links(m).shape == (0, 0)
    assert nvlink_islands(m) == []


_G3 = tuple(Gpu(i, i, "g", 1024) for i in range(3))


@pytest.mark.parametrize("links, words", [
    ((Link(0, 1, nvlinks=2), Link(1, 0, pcie="SYS")), "described twice"),
    ((Link(0, 1, pcie="PIX"), Link(0, 1, pcie="PIX")), "described twice"),
    ((Link(1, 1, nvlinks=1),), "itself"),
    ((Link(0, 7, nvlinks=1),), "not described"),
    ((Link(0, 1, via_nvswitch=True),), "NVSwitch"),
    ((Link(0, 1, nvlinks=-1),), "negative"),
    ((Link(0, 1, pcie="QPI"),), "unknown PCIe level"),
])
def test_contradictory_description_is_refused(links, words):
    m = Machine("n", _G3, links=links, source="bad.json")
    with pytest.raises(MachineDescriptionError, match=words) as exc:
        hop_matrix(m)
    assert exc.value.source == "bad.json"
    with pytest.raises(MachineDescriptionError):
        nvlink_islands(m)


def test_duplicate_gpu_indices_are_refused():
    m = Machine("n", (Gpu(0, 0, "g", 1), Gpu(0, 1, "g", 1)))
    with pytest.raises(MachineDescriptionError, match="duplicate"):
        hop_matrix(m)


# --- Links= -------------------------------------------------------------------------------------


def test_slurm_links_dgx1_literal():
    np.testing.assert_array_equal(slurm_links(dgx1()), np.array([
        [-1, 11, 11, 12, 12, 0, 0, 0],
        [11, -1, 12, 11, 0, 12, 0, 0],
        [11, 12, -1, 12, 0, 0, 11, 0],
        [12, 11, 12, -1, 0, 0, 0, 11],
        [12, 0, 0, 0, -1, 11, 11, 12],
        [0, 12, 0, 0, 11, -1, 12, 11],
        [0, 0, 11, 0, 11, 12, -1, 12],
        [0, 0, 0, 11, 12, 11, 12, -1],
    ]))


def test_slurm_links_rows_of_a100_p100_rtx4090():
    assert slurm_links(a100_bridge())[0].tolist() == [-1, 0, 22, 0, 0, 0, 0, 0]
    assert slurm_links(a100_bridge())[5].tolist() == [0, 0, 0, 0, 22, -1, 0, 0]
    assert slurm_links(p100())[0].tolist() == [-1, 4, 4, 4, 2, 2, 2, 2]
    assert slurm_links(p100())[6].tolist() == [2, 2, 2, 2, 4, 4, -1, 4]
    assert slurm_links(rtx4090())[3].tolist() == [0, 0, 0, -1, 0, 0, 0, 0]


def _every_kind() -> Machine:
    """One GPU pair of each kind: NV1, NV2, NV12, NVSwitch, PIX, PXB, PHB, NODE, SYS, unknown."""
    gpus = tuple(Gpu(i, i, "g", 1024, numa_node=i % 2) for i in range(6))
    links = (Link(0, 1, nvlinks=1), Link(0, 2, nvlinks=2), Link(0, 3, nvlinks=12),
             Link(0, 4, nvlinks=6, via_nvswitch=True), Link(0, 5, pcie="PIX"), Link(1, 2, pcie="PXB"),
             Link(1, 3, pcie="PHB"), Link(1, 4, pcie="NODE"), Link(1, 5, pcie="SYS"))
    return Machine("mixed", gpus, links)  # pairs 2-3, 2-4, 2-5, 3-4, 3-5, 4-5 are undescribed


@pytest.mark.parametrize("build", [dgx1, a100_bridge, rtx4090, p100, _every_kind])
def test_slurm_links_properties(build):
    m = build()
    links, hop = slurm_links(m), hop_matrix(m)
    n = len(m.gpus)
    assert np.issubdtype(links.dtype, np.integer)
    np.testing.assert_array_equal(links, links.T)
    assert (np.diag(links) == -1).all()
    off = ~np.eye(n, dtype=bool)
    assert (links[off] >= 0).all()
    assert (links[off & np.isclose(hop, 3.8)] == 0).all()  # SYS (and unknown taken as SYS) is 0
    nvlink = off & (hop < 3.0)
    pcie = off & (hop >= 3.0)
    if nvlink.any() and pcie.any():
        assert links[nvlink].min() > links[pcie].max()
    # strictly monotone: nearer (smaller hop) is always a larger Links value
    pairs = [(i, j) for i in range(n) for j in range(n) if i != j]
    for p, q in itertools.product(pairs, repeat=2):
        if hop[p] < hop[q] - 1e-9:
            assert links[p] > links[q], (p, q)


def test_slurm_links_every_kind_literal():
    # NV1 11, NV2 12, NV12 22, NVSwitch 10, PIX 4, PXB 3, PHB 2, NODE 1, SYS 0; undescribed pairs
    # are SYS = 0, also 2-4 and 3-5 that share a NUMA node
    np.testing.assert_array_equal(slurm_links(_every_kind()), np.array([
        [-1, 11, 12, 22, 10, 4],
        [11, -1, 3, 2, 1, 0],
        [12, 3, -1, 0, 0, 0],
        [22, 2, 0, -1, 0, 0],
        [10, 1, 0, 0, -1, 0],
        [4, 0, 0, 0, 0, -1],
    ]))


def test_slurm_links_from_hop_array_and_topology_agree_with_machine():
    m = dgx1()
    np.testing.assert_array_equal(slurm_links(hop_matrix(m)), slurm_links(m))
    np.testing.assert_array_equal(slurm_links(Topology.from_machine(m)), slurm_links(m))


@pytest.mark.parametrize("hop, words", [
    ([[0.0, 2.5], [2.5, 0.0]], "not a value"),
    ([[0.0, 3.0], [3.2, 0.0]], "symmetric"),
    ([[1.0, 3.0], [3.0, 0.0]], "diagonal"),
    ([[0.0, 3.0, 3.0]], "square"),
])
def test_slurm_links_refuses_foreign_matrices(hop, words):
    with pytest.raises(InputError, match=words):
        slurm_links(np.array(hop))


def test_format_links():
    assert format_links(slurm_links(a100_bridge())[0]) == "Links=-1,0,22,0,0,0,0,0"
    assert format_links([2, -1]) == "Links=2,-1"
    for bad in ([], [-2, 0], [0.5, -1]):
        with pytest.raises(InputError):
            format_links(bad)


# --- graph queries ------------------------------------------------------------------------------


def test_nvlink_islands():
    assert nvlink_islands(a100_bridge()) == [frozenset({0, 2}), frozenset({1, 3}), frozenset({4, 5}),
                                             frozenset({6, 7})]
    assert nvlink_islands(dgx1()) == [frozenset(range(8))]
    assert nvlink_islands(rtx4090()) == [frozenset({i}) for i in range(8)]


def test_numa_groups():
    assert numa_groups(rtx4090()) == {0: (0, 1, 2, 3), 1: (4, 5, 6, 7)}
    assert numa_groups(p100()) == {0: tuple(range(8))}
    assert numa_groups(dgx1()) == {None: tuple(range(8))}
    gpus = (Gpu(0, 0, "g", 1, numa_node=None), Gpu(1, 1, "g", 1, numa_node=3), Gpu(2, 2, "g", 1, numa_node=1))
    assert list(numa_groups(Machine("n", gpus)).items()) == [(1, (2,)), (3, (1,)), (None, (0,))]


def test_nearest_nic():
    m = dgx1()
    for gpu in (2, 3):
        nic = nearest_nic(m, gpu)
        assert nic is not None and nic.name == "mlx5_0" and nic.paths[gpu] == "PIX"
    assert nearest_nic(m, 0).name == "mlx5_0"  # NODE is still the nearest there is
    assert nearest_nic(rtx4090(), 6).name == "NIC0"  # PHB to both: the first NIC wins
    assert nearest_nic(a100_bridge(), 0) is None  # no NICs
    unknown = Machine("n", (Gpu(0, 0, "g", 1),), nics=(Nic(0, "mlx5_0", (None,)),))
    assert nearest_nic(unknown, 0) is None
    with pytest.raises(MachineDescriptionError):
        nearest_nic(m, 9)


def test_nearest_nic_parsed_dgx1():
    m = parsed("dgx1")
    assert nearest_nic(m, 2).name == "mlx5_0"
    assert nearest_nic(m, 3).name == "mlx5_0"


def test_numa_groups_and_islands_parsed():
    assert numa_groups(parsed("rtx4090")) == {0: (0, 1, 2, 3), 1: (4, 5, 6, 7)}
    assert nvlink_islands(parsed("a100")) == [frozenset({0, 2}), frozenset({1, 3}), frozenset({4, 5}),
                                              frozenset({6, 7})]


# --- snapshot and table -------------------------------------------------------------------------


def test_topology_snapshot_and_json():
    m = dgx1()
    t = Topology.from_machine(m)
    assert t.gpus == tuple(range(8))
    np.testing.assert_allclose(t.hop_array, np.array(DGX1_HOP), rtol=0, atol=1e-12)
    np.testing.assert_array_equal(np.array(t.links).reshape(8, 8), slurm_links(m))
    assert t.islands == (frozenset(range(8)),)
    assert t.nearest_nics[2] == ("mlx5_0", "PIX")
    hash(t)  # frozen and hashable: a snapshot
    d = json.loads(json.dumps(t.to_dict()))
    assert d["version"] == 1
    assert d["hostname"] == "dgx1"
    assert d["gres_links"][0] == "Links=-1,11,11,12,12,0,0,0"
    assert d["nvlink_islands"] == [list(range(8))]
    assert d["numa_groups"] == [{"numa_node": None, "gpus": list(range(8))}]
    assert d["nearest_nics"][0] == {"gpu": 0, "nic": "mlx5_0", "path": "NODE"}
    assert d["hop"][0][3] == pytest.approx(1.3333333333333333)
    assert d["links"][4][7] == 12


def test_format_table_a100_bridge():
    text = format_table(Topology.from_machine(a100_bridge()))
    lines = text.splitlines()
    assert lines[1] == "        GPU0  GPU1  GPU2  GPU3  GPU4  GPU5  GPU6  GPU7"
    assert lines[2] == "GPU0    0.00  3.80  1.08  3.80  3.80  3.80  3.80  3.80"
    assert lines[9] == "GPU7    3.80  3.80  3.80  3.80  3.80  3.80  1.08  0.00"
    assert text.endswith("\n")
    tail = text.split("\n\n", 1)[1]
    assert tail == (
        "NVLink islands:\n"
        "  GPU0,GPU2\n"
        "  GPU1,GPU3\n"
        "  GPU4,GPU5\n"
        "  GPU6,GPU7\n"
        "NUMA groups:\n"
        "  node 0: GPU0,GPU1,GPU2,GPU3\n"
        "  node 1: GPU4,GPU5,GPU6,GPU7\n"
    )


def test_format_table_lists_nearest_nics():
    text = format_table(Topology.from_machine(dgx1()))
    assert "Nearest NIC:\n  GPU0: mlx5_0 (NODE)\n  GPU1: mlx5_0 (NODE)\n  GPU2: mlx5_0 (PIX)\n" in text
    assert "  unknown: GPU0,GPU1,GPU2,GPU3,GPU4,GPU5,GPU6,GPU7\n" in text


def test_parsed_dgx_h100_nvswitch_is_hop_2_everywhere():
    nvidia_smi = pytest.importorskip("slurm_gpushare.hardware.nvidia_smi")
    file = "dgx-h100-8gpu-nv18-no-nic.txt"
    m = nvidia_smi.parse_topo_matrix((TOPO / file).read_text(), source=file, hostname="h100",
                                     gpu_name="NVIDIA H100 80GB HBM3", memory_mib=81559)
    hop = hop_matrix(m)
    off = ~np.eye(8, dtype=bool)
    assert (hop[off] == 2.0).all()
    assert (slurm_links(m)[off] == 10).all()
    assert numa_groups(m) == {0: (0, 1, 2, 3), 1: (4, 5, 6, 7)}
