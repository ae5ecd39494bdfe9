"""probe_machine: machine descriptions from an NVML port; round trips through the fake."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from slurm_gpushare.errors import MachineDescriptionError, NvmlError
from slurm_gpushare.hardware.fake import FakeNvml, fake_gpu_uuid
from slurm_gpushare.hardware.machine import CpuLayout, Gpu, GpuProcess, Link, Machine, Nic
from slurm_gpushare.hardware.port import (
    NVML_ERROR_GPU_IS_LOST,
    NVML_ERROR_UNKNOWN,
    NvLinkPeer,
)
from slurm_gpushare.hardware.probe import normalize_bus_id, probe_machine

MACHINES = Path(__file__).parent.parent / "data" / "machines"
FIXTURES = sorted(p.name for p in MACHINES.glob("*.json"))


def load(name: str) -> Machine:
    return Machine.load(MACHINES / name)


def probe(fake: FakeNvml, m: Machine) -> Machine:
    with fake:
        return probe_machine(fake, hostname=m.hostname, cpus=m.cpus)


def test_there_are_fixtures():
    assert len(FIXTURES) >= 3


@pytest.mark.parametrize("name", FIXTURES)
def test_round_trip(name):
    m = load(name)
    with FakeNvml(m) as fake:
        assert probe_machine(fake, hostname=m.hostname, cpus=m.cpus) == m


@pytest.mark.parametrize("name", FIXTURES)
def test_round_trip_survives_json(name):
    m = load(name)
    again = Machine.from_json(probe(FakeNvml(m), m).to_json())
    assert again == m


def test_probe_sees_state_changes():
    m = load("h100-sxm5-4gpu-mig-mixed.json")
    fake = FakeNvml(m)
    with fake:
        fake.destroy_gpu_instance(3, 13)
        created = fake.create_gpu_instance(3, 15, start=6)
        fake.set_processes(1, [GpuProcess(7, 512)])
        probed = probe_machine(fake, hostname=m.hostname, cpus=m.cpus)
    gi1, gi11, gi12, _ = m.gpus[3].mig_instances
    assert created.gi_id == 2
    assert probed.gpus[3].mig_instances == (gi1, created, gi11, gi12)
    assert probed.gpus[1].processes == (GpuProcess(7, 512),)
    assert probed.gpus[2] == m.gpus[2]


def test_sparse_description_is_completed_and_then_stable():
    m = Machine(hostname="pcie1", gpus=tuple(Gpu(index=i, minor=i, name="NVIDIA L40S", memory_mib=46068)
                                             for i in range(3)),
                links=(Link(0, 1, nvlinks=4),))
    first = probe(FakeNvml(m), m)
    assert [g.uuid for g in first.gpus] == [fake_gpu_uuid("pcie1", i) for i in range(3)]
    assert first.links == (Link(0, 1, nvlinks=4, pcie="SYS"), Link(0, 2, pcie="SYS"), Link(1, 2, pcie="SYS"))
    assert first.source == "nvml"
    assert probe(FakeNvml(first), first) == first


def test_switched_fabric_becomes_all_pairs_via_nvswitch():
    m = load("dgx-h100-8gpu-nvswitch.json")
    probed = probe(FakeNvml(m), m)
    assert len(probed.links) == 28
    assert all(ln.via_nvswitch and ln.nvlinks == 18 for ln in probed.links)


def test_unequal_switch_link_counts_give_the_smaller():
    gpus = tuple(Gpu(index=i, minor=i, name="NVIDIA A100-SXM4-80GB", memory_mib=81920) for i in range(3))
    m = Machine(hostname="sw1", gpus=gpus, links=(Link(0, 1, nvlinks=12, via_nvswitch=True, pcie="SYS"),
                                                  Link(0, 2, nvlinks=8, via_nvswitch=True, pcie="SYS"),
                                                  Link(1, 2, nvlinks=8, via_nvswitch=True, pcie="SYS")))
    probed = probe(FakeNvml(m), m)
    assert probed.links == m.links


class _OtherBusIdForm(FakeNvml):
    """A port whose NVLink remote bus ids use the short sysfs form (``0000:17:00.0``, lower case)."""

    def nvlink_peers(self, index):
        return tuple(NvLinkPeer(p.link, p.remote_bus_id[4:].lower(), p.remote_type)
                     for p in super().nvlink_peers(index))


def test_bus_ids_are_compared_in_one_form():
    m = load("a100-pcie-4gpu-nvlink-pairs.json")
    assert probe(_OtherBusIdForm(m), m) == m
    assert normalize_bus_id("0000:ca:00.0") == "00000000:CA:00.0"
    assert normalize_bus_id("07:00.0") == "00000000:07:00.0"
    assert normalize_bus_id("not a bus id") == "NOT A BUS ID"


def test_gpu_errors_gain_the_gpu_as_context():
    m = load("a100-pcie-4gpu-nvlink-pairs.json")
    fake = FakeNvml(m, fail={"nvmlDeviceGetUUID": lambda gpu: NVML_ERROR_GPU_IS_LOST if gpu == 3 else None})
    with pytest.raises(NvmlError) as err:
        probe(fake, m)
    assert err.value.code == NVML_ERROR_GPU_IS_LOST
    assert str(err.value).startswith("probing GPU 3: nvmlDeviceGetUUID(gpu 3): GPU is lost")


def test_pair_and_link_errors_gain_context():
    m = load("a100-pcie-4gpu-nvlink-pairs.json")
    fake = FakeNvml(m)
    fake.fail_next("nvmlDeviceGetTopologyCommonAncestor", NVML_ERROR_UNKNOWN)
    with pytest.raises(NvmlError, match=r"^probing the path GPU 0 - GPU 1: nvmlDeviceGetTopologyCommonAncestor"):
        probe(fake, m)
    fake = FakeNvml(m)
    fake.fail_next("nvmlDeviceGetNvLinkRemoteDeviceType", NVML_ERROR_UNKNOWN, gpu=2)
    with pytest.raises(NvmlError, match=r"^probing NVLinks of GPU 2: nvmlDeviceGetNvLinkRemoteDeviceType"
                                        r"\(gpu 2, link 0\)"):
        probe(fake, m)
    fake = FakeNvml(m, fail={"nvmlDeviceGetCount": NVML_ERROR_UNKNOWN})
    with pytest.raises(NvmlError, match=r"^probing gpu-small-01: nvmlDeviceGetCount\(\)"):
        probe(fake, m)


def test_only_not_supported_means_no_mig():
    m = load("a100-pcie-4gpu-nvlink-pairs.json")
    fake = FakeNvml(m)
    fake.fail_next("nvmlDeviceGetMigMode", NVML_ERROR_UNKNOWN, gpu=1)
    with pytest.raises(NvmlError, match=r"^probing GPU 1: nvmlDeviceGetMigMode\(gpu 1\)"):
        probe(fake, m)


def test_affinity_outside_the_cpu_layout_is_an_error():
    m = load("a100-pcie-4gpu-nvlink-pairs.json")
    with FakeNvml(m) as fake:
        with pytest.raises(MachineDescriptionError, match="outside the CPU layout"):
            probe_machine(fake, hostname=m.hostname, cpus=CpuLayout(sockets=1, cores_per_socket=8))
        assert probe_machine(fake, hostname=m.hostname).cpus is None


def test_probe_needs_an_open_port():
    m = load("a100-pcie-4gpu-nvlink-pairs.json")
    with pytest.raises(NvmlError, match="NVML is not initialized"):
        probe_machine(FakeNvml(m), hostname=m.hostname)


def test_nics_are_not_nvml_facts():
    # NICs are not NVML facts: a description with NICs does not round-trip, by design
    m = load("a100-pcie-4gpu-nvlink-pairs.json")
    with_nic = replace(m, nics=(Nic(0, "mlx5_0", ("PIX", "PIX", "SYS", "SYS")),))
    assert probe(FakeNvml(with_nic), with_nic) == m
