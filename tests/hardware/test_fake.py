"""FakeNvml: a machine description served as NVML would serve it, with MIG rules and failure injection."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest

from slurm_gpushare.errors import InputError, MachineDescriptionError, MigPlacementError, NvmlError
from slurm_gpushare.hardware.fake import FakeNvml, fake_bus_id, fake_gpu_uuid, mig_caps
from slurm_gpushare.hardware.machine import Gpu, GpuProcess, Link, Machine, MigInstance
from slurm_gpushare.hardware.port import (
    NVML_ERROR_GPU_IS_LOST,
    NVML_ERROR_INVALID_ARGUMENT,
    NVML_ERROR_LIBRARY_NOT_FOUND,
    NVML_ERROR_NO_PERMISSION,
    NVML_ERROR_NOT_FOUND,
    NVML_ERROR_NOT_SUPPORTED,
    NVML_ERROR_UNINITIALIZED,
    NVML_ERROR_UNKNOWN,
    MigMode,
    NvmlPort,
    Utilization,
)

MACHINES = Path(__file__).parent.parent / "data" / "machines"
A100 = "a100-pcie-4gpu-nvlink-pairs.json"
H100_MIG = "h100-sxm5-4gpu-mig-mixed.json"
DGX = "dgx-h100-8gpu-nvswitch.json"


def load(name: str) -> Machine:
    return Machine.load(MACHINES / name)


def opened(name: str, **kwargs) -> FakeNvml:
    fake = FakeNvml(load(name), **kwargs)
    fake.init()
    return fake


def sparse(n: int = 2, **gpu_fields) -> Machine:
    """GPUs with only the required facts: no UUIDs, bus ids, links."""
    return Machine(hostname="sparse1", gpus=tuple(Gpu(index=i, minor=i, name="NVIDIA L40S", memory_mib=46068,
                                                      **gpu_fields) for i in range(n)))


def h100_empty_mig() -> Machine:
    """The H100 fixture with every MIG instance removed."""
    m = load(H100_MIG)
    return replace(m, gpus=tuple(replace(g, mig_instances=()) for g in m.gpus))


# --- the port contract ----------------------------------------------------------------------------


def test_fake_is_an_nvml_port():
    assert isinstance(FakeNvml(load(A100)), NvmlPort)


def test_calls_before_init_fail_like_nvml():
    fake = FakeNvml(load(A100))
    with pytest.raises(NvmlError) as err:
        fake.uuid(0)
    assert err.value.code == NVML_ERROR_UNINITIALIZED
    assert err.value.source == "nvmlDeviceGetHandleByIndex(gpu 0)"  # the first NVML call of uuid()
    with pytest.raises(NvmlError, match=r"^nvmlSystemGetDriverVersion\(\): NVML is not initialized"):
        fake.driver_version()


def test_init_is_reference_counted_and_context_managed():
    fake = FakeNvml(load(A100))
    with fake as port:
        assert port is fake and fake.initialized
        with fake:
            pass
        assert fake.initialized
        fake.uuid(0)
    assert not fake.initialized
    with pytest.raises(NvmlError) as err:
        fake.shutdown()
    assert err.value.code == NVML_ERROR_UNINITIALIZED


def test_serves_the_description():
    m = load(A100)
    fake = opened(A100)
    assert fake.driver_version() == "550.54.15"
    assert fake.device_count() == 4
    for g in m.gpus:
        i = g.index
        assert (fake.name(i), fake.uuid(i), fake.minor_number(i), fake.pci_bus_id(i)) == \
            (g.name, g.uuid, g.minor, g.pci_bus_id)
        assert fake.memory_total_mib(i) == g.memory_mib
        assert fake.cpu_affinity(i) == g.cpu_affinity
        assert fake.numa_node(i) == g.numa_node


def test_bad_index_fails_in_get_handle():
    fake = opened(A100)
    with pytest.raises(NvmlError) as err:
        fake.name(4)
    assert err.value.code == NVML_ERROR_INVALID_ARGUMENT
    assert err.value.source == "nvmlDeviceGetHandleByIndex(gpu 4)"


def test_missing_ids_are_derived_deterministically():
    fake = FakeNvml(sparse(3))
    with fake:
        uuids = [fake.uuid(i) for i in range(3)]
        buses = [fake.pci_bus_id(i) for i in range(3)]
    assert all(re.fullmatch(r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-5[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}", u)
               for u in uuids)
    assert uuids == [fake_gpu_uuid("sparse1", i) for i in range(3)]
    assert len(set(uuids)) == 3
    assert buses == ["00000000:07:00.0", "00000000:17:00.0", "00000000:27:00.0"]
    assert fake_bus_id(17) == "00000001:17:00.0"
    # another host with the same GPUs gets other UUIDs
    assert fake_gpu_uuid("sparse2", 0) != uuids[0]


def test_mig_ids_and_caps_are_derived_like_the_driver():
    m = load(H100_MIG)
    gpu3 = m.gpus[3]
    stripped = replace(m, gpus=(*m.gpus[:3], replace(gpu3, mig_instances=tuple(
        replace(inst, uuid="", caps=()) for inst in gpu3.mig_instances))))
    with FakeNvml(stripped) as fake:
        insts = fake.gpu_instances(3)
    # the fixture's caps are the driver's numbers (as in slurmd -G on a real H100 node: 417, 507, 516, 525)
    assert [inst.caps for inst in insts] == [inst.caps for inst in gpu3.mig_instances]
    assert [inst.caps[0] for inst in insts] == [417, 507, 516, 525]
    assert mig_caps(0, 1, 0) == (12, 13)
    assert all(inst.uuid.startswith("MIG-") for inst in insts)
    assert len({inst.uuid for inst in insts}) == 4


# --- topology -------------------------------------------------------------------------------------


def test_topology_levels_from_links():
    fake = opened(A100)
    assert fake.topology_common_ancestor(0, 1) == "NODE"
    assert fake.topology_common_ancestor(1, 0) == "NODE"
    assert fake.topology_common_ancestor(0, 2) == "SYS"
    with pytest.raises(NvmlError) as err:
        fake.topology_common_ancestor(1, 1)
    assert err.value.code == NVML_ERROR_INVALID_ARGUMENT


def test_unknown_pcie_level_is_reported_as_sys():
    m = replace(sparse(3), links=(Link(0, 1, nvlinks=4),))
    with FakeNvml(m) as fake:
        assert fake.topology_common_ancestor(0, 1) == "SYS"
        assert fake.topology_common_ancestor(1, 2) == "SYS"


def test_direct_nvlinks_point_at_the_other_gpu():
    fake = opened(A100)
    peers = fake.nvlink_peers(0)
    assert [p.link for p in peers] == list(range(12))
    assert {(p.remote_bus_id, p.remote_type) for p in peers} == {(fake.pci_bus_id(1), "GPU")}
    assert {p.remote_bus_id for p in fake.nvlink_peers(3)} == {fake.pci_bus_id(2)}


def test_switched_nvlinks_point_at_nvswitches():
    fake = opened(DGX)
    peers = fake.nvlink_peers(5)
    assert len(peers) == 18
    assert {p.remote_type for p in peers} == {"SWITCH"}
    assert len({p.remote_bus_id for p in peers}) == 4


def test_no_nvlinks_on_a_pcie_machine():
    with FakeNvml(sparse(2)) as fake:
        assert fake.nvlink_peers(0) == ()


def test_p2p_status():
    fake = opened(A100)
    linked = fake.p2p_status(0, 1)
    assert linked.nvlink_ok and linked.read_ok
    far = fake.p2p_status(1, 2)
    assert (far.read, far.nvlink) == ("IOH_TOPOLOGY_NOT_SUPPORTED", "NOT_SUPPORTED")
    assert opened(DGX).p2p_status(0, 7).nvlink_ok


# --- MIG ------------------------------------------------------------------------------------------


def test_mig_mode_and_profiles():
    m = load(H100_MIG)
    fake = opened(H100_MIG)
    assert fake.mig_mode(2) == MigMode(current=True, pending=True)
    assert fake.gpu_instance_profiles(2) == m.gpus[2].mig_profiles
    assert fake.gpu_instances(3) == m.gpus[3].mig_instances
    with pytest.raises(NvmlError) as err:
        fake.mig_mode(0)
    assert err.value.code == NVML_ERROR_NOT_SUPPORTED
    assert fake.gpu_instance_profiles(0) == ()
    assert fake.gpu_instances(0) == ()


def test_profiles_are_hidden_while_mig_is_disabled():
    m = load(H100_MIG)
    gpu2 = replace(m.gpus[2], mig_enabled=False, mig_instances=())
    with FakeNvml(replace(m, gpus=(*m.gpus[:2], gpu2, m.gpus[3]))) as fake:
        assert fake.mig_mode(2) == MigMode(current=False, pending=False)
        assert fake.gpu_instance_profiles(2) == ()


def test_overlapping_instance_is_refused():
    fake = opened(H100_MIG)
    with pytest.raises(MigPlacementError) as err:
        fake.create_gpu_instance(2, 19, start=4)
    text = str(err.value)
    assert "GPU 2" in text and "1g.10gb (profile 19)" in text and "overlaps" in text
    assert "0-3 4g.40gb (GI 2)" in text and "4 1g.10gb (GI 7)" in text


def test_start_outside_the_placements_is_refused():
    fake = FakeNvml(h100_empty_mig())
    with fake:
        with pytest.raises(MigPlacementError) as err:
            fake.create_gpu_instance(2, 9, start=2)
    assert "3g.40gb (profile 9) cannot start at memory slice 2" in str(err.value)
    assert "allowed starts for 3g.40gb: 0, 4" in str(err.value)


def test_max_count_is_enforced():
    fake = opened(H100_MIG)
    with pytest.raises(MigPlacementError) as err:
        fake.create_gpu_instance(3, 5)
    assert "4g.40gb (profile 5)" in str(err.value) and "1 of at most 1 already exist" in str(err.value)

    empty = FakeNvml(h100_empty_mig())
    with empty:
        starts = [empty.create_gpu_instance(2, 19).start for _ in range(7)]
        assert starts == list(range(7))
        with pytest.raises(MigPlacementError, match="7 of at most 7"):
            empty.create_gpu_instance(2, 19)


def test_mig_off_is_refused():
    fake = opened(H100_MIG)
    with pytest.raises(MigPlacementError, match="GPU 0: MIG mode is not enabled"):
        fake.create_gpu_instance(0, 19)


def test_unknown_profile_is_refused():
    fake = opened(H100_MIG)
    with pytest.raises(MigPlacementError) as err:
        fake.create_gpu_instance(2, 42)
    assert "unknown GPU instance profile id 42" in str(err.value)
    assert "19 (1g.10gb)" in err.value.hint


def test_full_gpu_has_no_free_placement():
    fake = opened(H100_MIG)
    with pytest.raises(MigPlacementError, match="no free placement for MIG 1g.20gb"):
        fake.create_gpu_instance(2, 15)


def test_create_then_destroy_frees_slices():
    m = load(H100_MIG)
    fake = opened(H100_MIG)
    fake.destroy_gpu_instance(2, 9)  # 1g.10gb at slice 6
    assert [inst.gi_id for inst in fake.gpu_instances(2)] == [2, 7, 8]
    created = fake.create_gpu_instance(2, 15, start=6)  # 1g.20gb over slices 6-7
    assert (created.profile, created.gi_id, created.ci_id, created.start) == ("1g.20gb", 1, 0, 6)
    assert created.caps == (282, 283)  # gpu2/gi1/access = 3 + 135*2 + 9*1
    assert created.uuid.startswith("MIG-")
    assert created in fake.gpu_instances(2)
    with pytest.raises(MigPlacementError, match="overlaps"):
        fake.create_gpu_instance(2, 9, start=4)
    for gi in (7, 8, 1):
        fake.destroy_gpu_instance(2, gi)
    assert fake.create_gpu_instance(2, 9).start == 4  # (0, 4) is held by the 4g.40gb
    # the other MIG GPU is untouched
    assert fake.gpu_instances(3) == m.gpus[3].mig_instances


def test_destroying_an_unknown_instance_fails_like_nvml():
    fake = opened(H100_MIG)
    with pytest.raises(NvmlError) as err:
        fake.destroy_gpu_instance(2, 99)
    assert err.value.code == NVML_ERROR_NOT_FOUND
    assert err.value.source == "nvmlDeviceGetGpuInstanceById(gpu 2, gi 99)"


@pytest.mark.parametrize("change, words", [
    (lambda g: replace(g, mig_instances=(*g.mig_instances, MigInstance("1g.10gb", 5, 0, 2, ""))), "overlaps"),
    (lambda g: replace(g, mig_instances=(*g.mig_instances, MigInstance("1g.10gb", 5, 0, 7, ""))), "slice 7"),
    (lambda g: replace(g, mig_instances=(MigInstance("5g.50gb", 5, 0, 0, ""),)), "unknown profile"),
    (lambda g: replace(g, mig_enabled=False), "MIG is not enabled"),
    (lambda g: replace(g, mig_profiles=(replace(g.mig_profiles[0], placements=()),)), "no placements"),
])
def test_descriptions_breaking_the_mig_rules_are_rejected(change, words):
    m = load(H100_MIG)
    bad = replace(m, gpus=(*m.gpus[:2], change(m.gpus[2]), m.gpus[3]))
    with pytest.raises(MachineDescriptionError, match=words):
        FakeNvml(bad)


def test_descriptions_the_fake_cannot_serve_are_rejected():
    m = load(DGX)
    with pytest.raises(MachineDescriptionError, match="via_nvswitch"):
        FakeNvml(replace(m, links=tuple(ln for ln in m.links if (ln.a, ln.b) != (2, 5))))
    with pytest.raises(MachineDescriptionError, match="not 0..1"):
        FakeNvml(replace(sparse(2), gpus=(sparse(2).gpus[0], replace(sparse(2).gpus[1], index=2))))
    two = sparse(2)
    with pytest.raises(MachineDescriptionError, match="duplicate PCI bus ids"):
        FakeNvml(replace(two, gpus=tuple(replace(g, pci_bus_id="00000000:07:00.0") for g in two.gpus)))
    with pytest.raises(MachineDescriptionError, match="at most 36"):
        FakeNvml(replace(two, links=(Link(0, 1, nvlinks=40),)))


# --- processes and utilization ------------------------------------------------------------------


def test_processes_change_over_time():
    fake = opened(A100)
    assert [p.pid for p in fake.processes(3)] == [5001, 5002]
    assert fake.memory_used_mib(3) == 2048 + 30720
    fake.set_processes(3, [GpuProcess(900, 100), GpuProcess(12, 50, sm_util=30.0)])
    assert fake.processes(3) == (GpuProcess(12, 50, sm_util=30.0), GpuProcess(900, 100))
    assert fake.memory_used_mib(3) == 150
    fake.set_processes(3, [])
    assert fake.processes(3) == () and fake.memory_used_mib(3) == 0
    with pytest.raises(MachineDescriptionError):
        fake.set_processes(9, [])


def test_utilization():
    fake = opened(H100_MIG)
    assert fake.utilization(0) == Utilization(0, 0)
    fake.set_utilization(0, 87, 40)
    assert fake.utilization(0) == Utilization(87, 40)
    with pytest.raises(NvmlError) as err:
        fake.utilization(2)  # NVML has no utilization for a MIG-enabled GPU
    assert err.value.code == NVML_ERROR_NOT_SUPPORTED
    with pytest.raises(MachineDescriptionError):
        fake.set_utilization(0, 101)


def test_compute_mode_starts_default_and_keeps_what_was_set():
    fake = opened(A100)
    assert [fake.compute_mode(i) for i in range(4)] == ["DEFAULT"] * 4
    fake.set_compute_mode(1, "EXCLUSIVE_PROCESS")
    fake.set_compute_mode(2, "PROHIBITED")
    assert [fake.compute_mode(i) for i in range(4)] == ["DEFAULT", "EXCLUSIVE_PROCESS", "PROHIBITED", "DEFAULT"]
    fake.set_compute_mode(1, "DEFAULT")
    assert fake.compute_mode(1) == "DEFAULT"


@pytest.mark.parametrize("mode", ["EXCLUSIVE_THREAD", "exclusive_process", "E. Process", ""])
def test_unknown_compute_mode_is_refused_and_changes_nothing(mode):
    fake = opened(A100)
    with pytest.raises(NvmlError) as err:
        fake.set_compute_mode(0, mode)
    assert err.value.code == NVML_ERROR_INVALID_ARGUMENT
    assert err.value.source == f"nvmlDeviceSetComputeMode(gpu 0, mode {mode})"
    assert "DEFAULT, EXCLUSIVE_PROCESS, PROHIBITED" in str(err.value)
    assert fake.compute_mode(0) == "DEFAULT"


def test_compute_mode_needs_init_and_a_gpu():
    fake = FakeNvml(load(A100))
    with pytest.raises(NvmlError) as err:
        fake.compute_mode(0)
    assert err.value.code == NVML_ERROR_UNINITIALIZED
    fake.init()
    with pytest.raises(NvmlError, match=r"nvmlDeviceGetHandleByIndex\(gpu 7\)"):
        fake.set_compute_mode(7, "DEFAULT")


# --- failure injection ----------------------------------------------------------------------------


def test_injected_failure_names_the_nvml_call():
    fake = opened(A100, fail={"nvmlDeviceGetUUID": NVML_ERROR_GPU_IS_LOST})
    for _ in range(2):  # a plain code fails every call
        with pytest.raises(NvmlError) as err:
            fake.uuid(1)
        assert err.value.code == NVML_ERROR_GPU_IS_LOST
        assert str(err.value).startswith("nvmlDeviceGetUUID(gpu 1): GPU is lost [NVML_ERROR_GPU_IS_LOST]")
    assert fake.name(1) == "NVIDIA A100 80GB PCIe"


def test_injected_failure_counts_and_callables():
    fake = opened(A100, fail={"nvmlDeviceGetName": (NVML_ERROR_UNKNOWN, 1),
                              "nvmlDeviceGetUUID": lambda gpu: NVML_ERROR_GPU_IS_LOST if gpu == 2 else None})
    with pytest.raises(NvmlError, match=r"nvmlDeviceGetName\(gpu 0\): unknown error"):
        fake.name(0)
    assert fake.name(0) == "NVIDIA A100 80GB PCIe"
    assert fake.uuid(1).startswith("GPU-")
    with pytest.raises(NvmlError, match=r"nvmlDeviceGetUUID\(gpu 2\)"):
        fake.uuid(2)


def test_fail_next():
    fake = opened(A100)
    fake.fail_next("nvmlDeviceGetTopologyCommonAncestor", code=NVML_ERROR_UNKNOWN)
    with pytest.raises(NvmlError) as err:
        fake.topology_common_ancestor(0, 1)
    assert "nvmlDeviceGetTopologyCommonAncestor(gpu 0, gpu 1)" in str(err.value)
    assert err.value.code == NVML_ERROR_UNKNOWN
    assert fake.topology_common_ancestor(0, 1) == "NODE"

    fake.fail_next("nvmlDeviceGetHandleByIndex", NVML_ERROR_GPU_IS_LOST, gpu=3, times=2)
    assert fake.name(2)
    for _ in range(2):
        with pytest.raises(NvmlError, match=r"nvmlDeviceGetHandleByIndex\(gpu 3\): GPU is lost"):
            fake.memory_total_mib(3)
    assert fake.memory_total_mib(3) == 81920


def test_injected_absent_link_is_skipped_like_the_real_port_does():
    fake = opened(A100)
    fake.fail_next("nvmlDeviceGetNvLinkState", NVML_ERROR_NOT_SUPPORTED, gpu=0)
    assert [p.link for p in fake.nvlink_peers(0)] == list(range(1, 12))
    fake.fail_next("nvmlDeviceGetNvLinkRemotePciInfo", NVML_ERROR_UNKNOWN)
    with pytest.raises(NvmlError, match=r"nvmlDeviceGetNvLinkRemotePciInfo\(gpu 0, link 0\)"):
        fake.nvlink_peers(0)


def test_injected_compute_mode_failures():
    fake = opened(A100, fail={"nvmlDeviceSetComputeMode": lambda gpu: NVML_ERROR_NO_PERMISSION if gpu == 1 else None})
    with pytest.raises(NvmlError) as err:
        fake.set_compute_mode(1, "EXCLUSIVE_PROCESS")
    assert err.value.code == NVML_ERROR_NO_PERMISSION
    assert str(err.value).startswith(
        "nvmlDeviceSetComputeMode(gpu 1, mode EXCLUSIVE_PROCESS): insufficient permissions")
    assert fake.compute_mode(1) == "DEFAULT"  # a failed set changes nothing
    fake.set_compute_mode(0, "EXCLUSIVE_PROCESS")
    fake.fail_next("nvmlDeviceGetComputeMode", NVML_ERROR_GPU_IS_LOST, gpu=0)
    with pytest.raises(NvmlError, match=r"nvmlDeviceGetComputeMode\(gpu 0\): GPU is lost"):
        fake.compute_mode(0)
    assert fake.compute_mode(0) == "EXCLUSIVE_PROCESS"


def test_init_failure_carries_the_no_driver_hint():
    fake = FakeNvml(load(A100), fail={"nvmlInit": NVML_ERROR_LIBRARY_NOT_FOUND})
    with pytest.raises(NvmlError) as err:
        fake.init()
    assert err.value.source == "nvmlInit()"
    assert "--from-topo FILE" in str(err.value)


def test_failed_compute_instance_leaves_no_gpu_instance():
    fake = FakeNvml(h100_empty_mig())
    with fake:
        fake.fail_next("nvmlGpuInstanceCreateComputeInstance", NVML_ERROR_UNKNOWN)
        with pytest.raises(NvmlError, match=r"nvmlGpuInstanceCreateComputeInstance\(gpu 2, gi 1\)"):
            fake.create_gpu_instance(2, 0)
        assert fake.gpu_instances(2) == ()
        assert fake.create_gpu_instance(2, 0).gi_id == 1


def test_unknown_function_cannot_be_injected():
    with pytest.raises(InputError, match="nvmlDeviceGetUuid"):
        FakeNvml(load(A100), fail={"nvmlDeviceGetUuid": 3})
    with pytest.raises(InputError):
        FakeNvml(load(A100)).fail_next("nvmlFoo")


# --- determinism ----------------------------------------------------------------------------------


def _answers(fake: FakeNvml) -> list:
    out = [fake.driver_version(), fake.device_count()]
    n = fake.device_count()
    for i in range(n):
        out += [fake.name(i), fake.uuid(i), fake.pci_bus_id(i), fake.cpu_affinity(i), fake.nvlink_peers(i),
                fake.gpu_instance_profiles(i), fake.gpu_instances(i), fake.processes(i)]
        out += [(fake.topology_common_ancestor(i, j), fake.p2p_status(i, j)) for j in range(n) if j != i]
    return out


@pytest.mark.parametrize("description", [load(A100), load(H100_MIG), load(DGX), sparse(4), h100_empty_mig()])
def test_two_fakes_from_one_description_answer_identically(description):
    one, two = FakeNvml(description), FakeNvml(description)
    with one, two:
        assert _answers(one) == _answers(two)
        if description.gpus[-1].mig_enabled:
            last = len(description.gpus) - 1
            for fake in (one, two):
                while True:
                    try:
                        fake.create_gpu_instance(last, 19)
                    except MigPlacementError:
                        break
            assert one.gpu_instances(last) == two.gpu_instances(last)
        assert _answers(one) == _answers(two)


# --- per-cgroup memory limits (nvmlDeviceSetMemoryLimits_v1) ------------------------------------------------


def test_cgroup_memory_limits_are_kept_beside_the_description_for_every_process_until_the_cgroup_goes(tmp_path):
    import json as _json
    import os as _os

    from slurm_gpushare.hardware.port import MemoryLimits

    machine = replace(load(A100), driver_version="615.20")  # the branch that has the call
    path = tmp_path / "node.json"
    path.write_text(machine.to_json())
    cgroup, other_job = tmp_path / "cg" / "job_9", tmp_path / "cg" / "job_10"
    cgroup.mkdir(parents=True)
    other_job.mkdir()
    with FakeNvml(machine, path=path) as one:
        one.set_memory_limits(1, str(cgroup), 4096, 8192)
    assert _os.stat(one.limits_path()).st_mode & 0o777 == 0o644  # root writes it, every job's process reads it
    with FakeNvml(Machine.load(path), path=path) as other:  # another process of the node
        assert other.memory_limits(1, str(cgroup)) == MemoryLimits(4096, 8192, 0)
        assert other.memory_limits(0, str(cgroup)) == MemoryLimits(0, None, 0)  # per GPU
        cgroup.rmdir()  # NVIDIA: removing the cgroup clears its limits
        with pytest.raises(NvmlError) as err:
            other.memory_limits(1, str(cgroup))
        assert err.value.code == NVML_ERROR_INVALID_ARGUMENT
        other.set_memory_limits(1, str(other_job), 1024, 1024)
    assert _json.loads(one.limits_path().read_text()) == {"1": {str(other_job): [1024, 1024]}}


def test_cgroup_memory_limits_need_driver_615_and_a_gpu_without_mig(tmp_path):
    from slurm_gpushare.hardware.port import NVML_ERROR_FUNCTION_NOT_FOUND

    old = replace(load(A100), driver_version="580.95.05")
    with FakeNvml(old) as nvml:
        with pytest.raises(NvmlError) as err:
            nvml.set_memory_limits(0, str(tmp_path), 1024, 1024)
    assert err.value.code == NVML_ERROR_FUNCTION_NOT_FOUND and "R615" in str(err.value)
    with FakeNvml(replace(old, driver_version="615.20")) as nvml:
        nvml.set_memory_limits(0, str(tmp_path), 1024, 1024)
        assert nvml.memory_limits(0, str(tmp_path)).hard_mib == 1024
    mig = replace(load(H100_MIG), driver_version="")  # a description without a driver: the fake has the call
    index = next(g.index for g in mig.gpus if g.mig_enabled)
    with FakeNvml(mig) as nvml:
        with pytest.raises(NvmlError) as err:
            nvml.set_memory_limits(index, str(tmp_path), 1024, 1024)
    assert err.value.code == NVML_ERROR_NOT_SUPPORTED
