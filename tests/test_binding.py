"""Tests of slurm_gpushare.topology.binding: rank order along NVLink, nearest NICs, cores, the environment.

Machines are the recorded ``nvidia-smi topo -m`` outputs in tests/data/topo (DGX-1 with one mlx5 NIC,
4x L40S with two) and synthetic descriptions built here.
"""

from __future__ import annotations

import itertools
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from slurm_gpushare.errors import InputError, MachineDescriptionError
from slurm_gpushare.hardware.machine import PCIE_LEVELS, CpuLayout, Gpu, Link, Machine
from slurm_gpushare.hardware.nvidia_smi import parse_topo_matrix
from slurm_gpushare.topology.binding import bind, cpu_list, gpu_ring
from slurm_gpushare.topology.hops import nearest_nic

TOPO = Path(__file__).parent / "data" / "topo"
DGX1_FILE = "dgx1-v100-sxm2-8gpu-1nic.txt"
L40S_FILE = "4x-l40s-pcie-node-sys-2nic.txt"
A100_2_FILE = "2x-a100-80gb-inside-slurm-job-empty-affinity.txt"
FILES = sorted(p.name for p in TOPO.glob("*.txt"))


def machine(fname: str) -> Machine:
    return parse_topo_matrix((TOPO / fname).read_text(), source=fname, memory_mib=1)


def nvlinked(m: Machine, a: int, b: int) -> bool:
    ln = m.link(a, b)
    return ln is not None and ln.nvlinks > 0


# --- rank order -------------------------------------------------------------------------------------


def test_dgx1_four_gpu_ring_follows_nvlink():
    m = machine(DGX1_FILE)
    b = bind(m, [0, 1, 4, 5])
    # index order would put SYS between 1 and 4; the ring goes 0 -NV1- 1 -NV2- 5 -NV1- 4 -NV2- 0
    assert b.ring == (0, 1, 5, 4)
    assert [t.gpus for t in b.tasks] == [(0,), (1,), (5,), (4,)]
    assert b.job_environment()["CUDA_VISIBLE_DEVICES"] == "0,1,5,4"


def test_every_nvlink_ring_of_four_dgx1_gpus_is_found():
    m = machine(DGX1_FILE)
    found = 0
    for gpus in itertools.combinations(range(8), 4):
        has_ring = any(all(nvlinked(m, c[i], c[(i + 1) % 4]) for i in range(4))
                       for c in ((gpus[0], *p) for p in itertools.permutations(gpus[1:])))
        ring = bind(m, gpus).ring
        if has_ring:
            found += 1
            assert all(nvlinked(m, ring[i], ring[(i + 1) % 4]) for i in range(4)), (gpus, ring)
    assert found == 8  # the quads 0-3 and 4-7, and six 4-cycles across the sockets


def test_ring_heuristic_for_many_gpus():
    # 16 GPUs on two NVSwitch boards joined by SYS: the ring crosses between the boards only twice
    h = np.full((16, 16), 3.8)
    h[:8, :8] = h[8:, 8:] = 2.0
    np.fill_diagonal(h, 0)
    rng = np.random.default_rng(0)
    perm = rng.permutation(16)
    shuffled = h[np.ix_(perm, perm)]
    ring = gpu_ring(shuffled)
    assert sorted(ring) == list(range(16)) and ring[0] == 0 and ring[1] < ring[-1]
    edges = [shuffled[ring[i], ring[(i + 1) % 16]] for i in range(16)]
    assert sorted(edges)[-2:] == [3.8, 3.8] and edges.count(3.8) == 2


def test_given_ring_is_used_and_checked():
    m = machine(DGX1_FILE)
    assert bind(m, [0, 1, 4, 5], ring=[4, 5, 1, 0]).ring == (4, 5, 1, 0)
    with pytest.raises(InputError, match="is not an order of the allocated GPUs"):
        bind(m, [0, 1, 4, 5], ring=[0, 1, 2, 3])


# --- NICs -------------------------------------------------------------------------------------------


def test_dgx1_gpus_2_and_3_get_mlx5_0_over_pix():
    b = bind(machine(DGX1_FILE), [0, 1, 2, 3])
    nics = {t.gpus[0]: (t.nic, t.nic_path) for t in b.tasks}
    assert nics[2] == nics[3] == ("mlx5_0", "PIX")
    assert nics[0] == nics[1] == ("mlx5_0", "NODE")
    env = b.task_environment(b.ring.index(2))
    assert env["NCCL_IB_HCA"] == "=mlx5_0:1" and env["UCX_NET_DEVICES"] == "mlx5_0:1"
    assert b.task_environment(0, port=2)["UCX_NET_DEVICES"] == "mlx5_0:2"


def test_l40s_gpus_2_and_3_get_the_node_nics_one_each():
    m = machine(L40S_FILE)
    b = bind(m, [2, 3])
    assert [(t.gpus, t.nic, t.nic_path) for t in b.tasks] == [((2,), "mlx5_0", "NODE"), ((3,), "mlx5_1", "NODE")]
    whole = bind(m, [0, 1, 2, 3])
    got = {t.gpus[0]: (t.nic, t.nic_path) for t in whole.tasks}
    assert got[2][1] == got[3][1] == "NODE" and {got[2][0], got[3][0]} == {"mlx5_0", "mlx5_1"}
    assert got[0][1] == got[1][1] == "SYS"  # no nearer NIC exists for the socket-0 GPUs


@pytest.mark.parametrize("fname", [f for f in FILES if machine(f).nics])
def test_every_task_gets_a_nearest_nic(fname):
    m = machine(fname)
    n = len(m.gpus)
    for k in range(1, n + 1):
        for gpus in itertools.islice(itertools.combinations(range(n), k), 40):
            for t in bind(m, gpus).tasks:
                near = nearest_nic(m, t.gpus[0])
                level = near.paths[t.gpus[0]]
                assert t.nic_path == level, (gpus, t)
                assert PCIE_LEVELS.index(t.nic_path) == PCIE_LEVELS.index(level)


def test_placeholder_nic_names_give_no_nccl_variables():
    m = machine(A100_2_FILE)
    assert [nic.name for nic in m.nics] == ["NIC0", "NIC1"]
    env = bind(m, [0, 1]).task_environment(0)
    assert env["GPUSHARE_TASK_NIC"] == "NIC0"
    assert "NCCL_IB_HCA" not in env and "UCX_NET_DEVICES" not in env


def test_no_nics():
    b = bind(machine("dgx-h100-8gpu-nv18-no-nic.txt"), [0, 1])
    assert all(t.nic is None and t.nic_path is None for t in b.tasks)
    assert "NCCL_IB_HCA" not in b.task_environment(1)


# --- cores ------------------------------------------------------------------------------------------


def test_dgx1_tasks_get_disjoint_contiguous_cores_near_their_gpu():
    m = machine(DGX1_FILE)
    assert m.cpus == CpuLayout(2, 12, 2)
    b = bind(m, [0, 1, 2, 3])
    assert [t.cores for t in b.tasks] == [(0, 1, 2), (3, 4, 5), (6, 7, 8), (9, 10, 11)]
    assert b.tasks[0].cpus == (0, 1, 2, 24, 25, 26)  # both hardware threads of each core
    assert b.task_environment(0)["GPUSHARE_TASK_CPUS"] == "0-2,24-26"
    assert b.job_environment()["GPUSHARE_CPU_BIND"].startswith("mask_cpu:0x7000007,0x38000038,")
    mixed = bind(m, [0, 1, 4, 5])
    assert [t.cores for t in mixed.tasks] == [(0, 1, 2, 3, 4, 5), (6, 7, 8, 9, 10, 11),
                                             (12, 13, 14, 15, 16, 17), (18, 19, 20, 21, 22, 23)]


def test_job_cores_go_to_the_tasks_they_are_near():
    m = machine(DGX1_FILE)
    # GPU 4 is on socket 1 (cores 12-23), GPU 0 on socket 0: whatever the rank order, each gets its side
    b = bind(m, [4, 0], cores=[12, 13, 0, 1, 14, 2])
    cores = {t.gpus[0]: t.cores for t in b.tasks}
    assert cores == {0: (0, 1, 2), 4: (12, 13, 14)}
    # only far cores allocated: the tasks still get them, split evenly
    far = bind(m, [0, 1], cores=range(12, 16))
    assert [t.cores for t in far.tasks] == [(12, 13), (14, 15)]
    with pytest.raises(InputError, match=r"core id\(s\) \[24\] outside the node's 24 cores"):
        bind(m, [0], cores=[24])


def test_fewer_cores_than_tasks_are_shared():
    b = bind(machine(DGX1_FILE), [0, 1, 2], cores=[0, 1])
    assert [t.cores for t in b.tasks] == [(0, 1)] * 3


def test_unknown_cpu_layout_gives_no_cpu_hints():
    m = machine(A100_2_FILE)  # GPU1's CPU Affinity is empty inside a job: no layout can be inferred
    assert m.cpus is None
    b = bind(m, [0, 1])
    assert all(t.cores == () and t.cpus == () for t in b.tasks)
    assert "GPUSHARE_CPU_BIND" not in b.job_environment() and "GPUSHARE_TASK_CPUS" not in b.task_environment(0)
    with pytest.raises(InputError, match="no CPU layout"):
        bind(m, [0], cores=[0])


# --- tasks and GPUs ---------------------------------------------------------------------------------


def test_fewer_and_more_tasks_than_gpus():
    m = machine(DGX1_FILE)
    two = bind(m, [0, 1, 4, 5], ntasks=2)
    assert [(t.gpus, t.devices) for t in two.tasks] == [((0, 1), (0, 1)), ((5, 4), (2, 3))]
    assert two.task_environment(1)["GPUSHARE_TASK_DEVICES"] == "2,3"
    four = bind(m, [2, 3], ntasks=4)
    assert [t.devices for t in four.tasks] == [(0,), (0,), (1,), (1,)]


def test_cuda_visible_devices_forms():
    m = machine(DGX1_FILE)
    b = bind(m, [4, 5, 0, 1])
    assert b.cuda_visible_devices() == "0,1,5,4"
    # with ConstrainDevices the job sees its GPUs renumbered 0..3 in index order: 0,1,4,5 -> 0,1,2,3
    assert b.cuda_visible_devices(local_numbers=True) == "0,1,3,2"
    with_uuids = replace(m, gpus=tuple(replace(g, uuid=f"GPU-{g.index:08d}-aaaa") for g in m.gpus))
    u = bind(with_uuids, [4, 5, 0, 1])
    assert u.job_environment()["CUDA_VISIBLE_DEVICES"] == \
        "GPU-00000000-aaaa,GPU-00000001-aaaa,GPU-00000005-aaaa,GPU-00000004-aaaa"
    assert u.job_environment(local_numbers=True)["CUDA_VISIBLE_DEVICES"].startswith("GPU-00000000")
    assert u.tasks[2].gpu_uuids == ("GPU-00000005-aaaa",)
    env = u.task_environment(3)
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID" and env["GPUSHARE_GPU_RING"] == "0,1,5,4"


def test_to_dict():
    d = bind(machine(DGX1_FILE), [0, 1]).to_dict()
    assert d["version"] == 1 and d["ring"] == [0, 1] and len(d["tasks"]) == 2
    assert d["tasks"][0]["nic"] == "mlx5_0" and d["tasks"][0]["cores"]


def test_bad_input():
    m = machine(DGX1_FILE)
    with pytest.raises(InputError, match="at least one GPU"):
        bind(m, [])
    with pytest.raises(InputError, match="names a GPU twice"):
        bind(m, [0, 0])
    with pytest.raises(MachineDescriptionError, match="no GPU with index 9"):
        bind(m, [9])
    with pytest.raises(InputError, match="at least one task"):
        bind(m, [0], ntasks=0)
    b = bind(m, [0])
    with pytest.raises(InputError, match="no task with local id 1"):
        b.task_environment(1)
    with pytest.raises(InputError, match="square"):
        gpu_ring(np.zeros((2, 3)))


def test_cpu_list():
    assert cpu_list([3, 0, 1, 2, 7, 9, 10]) == "0-3,7,9-10"
    assert cpu_list([]) == ""


def test_synthetic_machine_with_core_map():
    # a layout whose logical CPUs do not follow the usual numbering: core_of_cpu maps them
    cpus = CpuLayout(sockets=1, cores_per_socket=4, threads_per_core=2, core_of_cpu=(0, 0, 1, 1, 2, 2, 3, 3))
    gpus = tuple(Gpu(index=i, minor=i, name="NVIDIA H100", memory_mib=81920, cpu_affinity=tuple(range(8)),
                     numa_node=0) for i in range(2))
    m = Machine(hostname="n", gpus=gpus, links=(Link(0, 1, nvlinks=18),), cpus=cpus)
    b = bind(m, [0, 1])
    assert [t.cores for t in b.tasks] == [(0, 1), (2, 3)]
    assert [t.cpus for t in b.tasks] == [(0, 1, 2, 3), (4, 5, 6, 7)]
