"""RealNvml without a GPU: lazy import, error mapping, and NVML decoding through an injected pynvml-like module.

``PynvmlShim`` answers in pynvml's shapes (ctypes placement arrays, ``busId`` bytes, byte counts,
bitmask words, topology level numbers, MIG device handles) from a FakeNvml, so that
``probe_machine(RealNvml(lib=PynvmlShim(FakeNvml(m))))`` exercises every decoding step of the real port.
"""

from __future__ import annotations

import ctypes
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from slurm_gpushare.errors import HardwareError, MigPlacementError, NvmlError
from slurm_gpushare.hardware import fake as fake_module
from slurm_gpushare.hardware import port
from slurm_gpushare.hardware.fake import FakeNvml
from slurm_gpushare.hardware.machine import Machine
from slurm_gpushare.hardware.nvml import RealNvml
from slurm_gpushare.hardware.port import (
    NVML_ERROR_FUNCTION_NOT_FOUND,
    NVML_ERROR_GPU_IS_LOST,
    NVML_ERROR_INVALID_ARGUMENT,
    NVML_ERROR_LIBRARY_NOT_FOUND,
    NVML_ERROR_NOT_FOUND,
    NVML_ERROR_NOT_SUPPORTED,
    NVML_ERROR_UNKNOWN,
    MigMode,
    NvmlPort,
    P2pStatus,
    Utilization,
)
from slurm_gpushare.hardware.probe import probe_machine

MACHINES = Path(__file__).parent.parent / "data" / "machines"
FIXTURES = sorted(p.name for p in MACHINES.glob("*.json"))
MIB = 1 << 20
NVML_SOURCE = Path(__file__).parents[2] / "slurm_gpushare" / "hardware" / "nvml.py"


def load(name: str) -> Machine:
    return Machine.load(MACHINES / name)


# --- importing does nothing ---------------------------------------------------------------------


def test_importing_the_hardware_layer_does_not_import_pynvml():
    code = ("import sys\n"
            "import slurm_gpushare.hardware, slurm_gpushare.hardware.nvml, slurm_gpushare.hardware.fake\n"
            "import slurm_gpushare.hardware.probe, slurm_gpushare.hardware.port\n"
            "assert 'pynvml' not in sys.modules, 'pynvml imported at import time'\n")
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)


def test_constructing_the_real_port_imports_pynvml_but_does_not_init():
    pytest.importorskip("pynvml")
    code = ("import sys\n"
            "from slurm_gpushare.hardware.nvml import RealNvml\n"
            "RealNvml()\n"
            "assert 'pynvml' in sys.modules\n"
            "import pynvml\n"
            "assert pynvml.nvmlLib is None, 'nvmlInit ran'\n")
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)


# --- our constants and names are nvidia-ml-py's ---------------------------------------------------


def test_constants_match_pynvml():
    pynvml = pytest.importorskip("pynvml")
    for name in dir(port):
        if re.fullmatch(r"NVML_(ERROR|TOPOLOGY|NVLINK_DEVICE_TYPE)_\w+|NVML_SUCCESS|NVML_NVLINK_MAX_LINKS", name):
            assert getattr(port, name) == getattr(pynvml, name), name
    assert port.NVML_P2P_CAPS_INDEX_NVLINK == pynvml.NVML_P2P_CAPS_INDEX_NVLINK
    read = pynvml.NVML_P2P_CAPS_INDEX_READ  # "= 0," in pynvml.py: a tuple by a stray comma
    assert port.NVML_P2P_CAPS_INDEX_READ == (read[0] if isinstance(read, tuple) else read)
    for code, status in port.NVML_P2P_STATUS.items():
        assert getattr(pynvml, f"NVML_P2P_STATUS_{status}") == code
    for code in (NVML_ERROR_GPU_IS_LOST, NVML_ERROR_NOT_SUPPORTED, 8, 11, 14, 17, 20, 21, 27, 28, 29):
        assert getattr(pynvml, port.error_name(code)) == code
    for code, mode in port.COMPUTE_MODES.items():
        assert getattr(pynvml, f"NVML_COMPUTEMODE_{mode}") == code == getattr(port, f"NVML_COMPUTEMODE_{mode}")
    assert len(port.COMPUTE_MODES) == pynvml.NVML_COMPUTEMODE_COUNT
    assert port.NVML_DEVICE_MEMORY_LIMIT_MAX == pynvml.NVML_DEVICE_MEMORY_LIMIT_MAX


def test_every_nvml_function_we_name_exists_in_pynvml():
    pynvml = pytest.importorskip("pynvml")
    named = set(re.findall(r'"(nvml[A-Z]\w+)"', NVML_SOURCE.read_text())) | fake_module.NVML_FUNCTIONS
    missing = sorted(f for f in named if not callable(getattr(pynvml, f, None)))
    assert not missing


# --- a pynvml-shaped module over the fake -----------------------------------------------------------


class ShimNVMLError(Exception):
    def __init__(self, value):
        super().__init__(value)
        self.value = value


class _Placement(ctypes.Structure):
    _fields_ = [("start", ctypes.c_uint), ("size", ctypes.c_uint)]


_LEVEL = {"PIX": 10, "PXB": 20, "PHB": 30, "NODE": 40, "SYS": 50}
_REMOTE = {"GPU": 0, "IBMNPU": 1, "SWITCH": 2, "UNKNOWN": 0xFF}
_P2P = {v: k for k, v in port.NVML_P2P_STATUS.items()}
_CI_SLICES = [1, 2, 3, 4, 7, 8, 6, 1, 7]  # by NVML_COMPUTE_INSTANCE_PROFILE_* index
_LINKS_PER_GPU = 18


class PynvmlShim:
    """What pynvml would hand back on the machine a FakeNvml describes.

    Handles are tuples; GPU instance profiles sit at even NVML profile indices (odd ones answer
    NOT_SUPPORTED, as profiles a GPU lacks do); MIG devices fill the slots in reverse order.
    """

    NVMLError = ShimNVMLError
    c_nvmlGpuInstancePlacement_t = _Placement

    def __init__(self, fake: FakeNvml):
        self.fake = fake

    def _port(self, method, *args):
        try:
            return getattr(self.fake, method)(*args)
        except NvmlError as e:
            raise ShimNVMLError(e.code) from None

    def nvmlInit(self):
        self._port("init")

    def nvmlShutdown(self):
        self._port("shutdown")

    def nvmlSystemGetDriverVersion(self):
        return self._port("driver_version")

    def nvmlDeviceGetCount(self):
        return self._port("device_count")

    def nvmlDeviceGetHandleByIndex(self, i):
        if not 0 <= i < self._port("device_count"):
            raise ShimNVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return ("gpu", i)

    def nvmlDeviceGetName(self, h):
        return self._port("name", h[1])

    def nvmlDeviceGetUUID(self, h):
        return h[2].uuid if h[0] == "mig" else self._port("uuid", h[1])

    def nvmlDeviceGetMinorNumber(self, h):
        return self._port("minor_number", h[1])

    def nvmlDeviceGetPciInfo(self, h):
        return SimpleNamespace(busId=self._port("pci_bus_id", h[1]).encode())

    def nvmlDeviceGetMemoryInfo(self, h):
        total, used = self._port("memory_total_mib", h[1]) * MIB, self._port("memory_used_mib", h[1]) * MIB
        return SimpleNamespace(total=total + MIB // 2, used=used, free=total - used)

    @staticmethod
    def _mask(ids, words):
        out = [0] * words
        for c in ids:
            out[c // 64] |= 1 << (c % 64)
        return (ctypes.c_ulonglong * words)(*out)

    def nvmlDeviceGetCpuAffinity(self, h, words):
        return self._mask(self._port("cpu_affinity", h[1]), words)

    def nvmlDeviceGetMemoryAffinity(self, h, words, scope):
        node = self._port("numa_node", h[1])
        return self._mask(() if node is None else (node,), words)

    def nvmlDeviceGetTopologyCommonAncestor(self, h1, h2):
        return _LEVEL[self._port("topology_common_ancestor", h1[1], h2[1])]

    def _peers(self, h):
        return self._port("nvlink_peers", h[1])

    def nvmlDeviceGetNvLinkState(self, h, link):
        peers = self._peers(h)
        if not peers:
            raise ShimNVMLError(NVML_ERROR_NOT_SUPPORTED)
        if link >= _LINKS_PER_GPU:
            raise ShimNVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return int(any(p.link == link for p in peers))

    def _peer(self, h, link):
        return next(p for p in self._peers(h) if p.link == link)

    def nvmlDeviceGetNvLinkRemotePciInfo(self, h, link):
        return SimpleNamespace(busId=self._peer(h, link).remote_bus_id.encode())

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, h, link):
        return _REMOTE[self._peer(h, link).remote_type]

    def nvmlDeviceGetP2PStatus(self, h1, h2, index):
        status = self._port("p2p_status", h1[1], h2[1])
        return _P2P[status.read if index == port.NVML_P2P_CAPS_INDEX_READ else status.nvlink]

    def nvmlDeviceGetMigMode(self, h):
        mode = self._port("mig_mode", h[1])
        return [int(mode.current), int(mode.pending)]

    def _profiles(self, h):
        return self._port("gpu_instance_profiles", h[1])

    def nvmlDeviceGetGpuInstanceProfileInfo(self, h, index):
        profiles = self._profiles(h)
        if index % 2 or index // 2 >= len(profiles):
            raise ShimNVMLError(NVML_ERROR_NOT_SUPPORTED)
        p = profiles[index // 2]
        return SimpleNamespace(id=p.profile_id, sliceCount=p.slices, instanceCount=p.max_instances,
                               multiprocessorCount=p.sm_count, memorySizeMB=p.memory_mib,
                               name=f"MIG {p.name}".encode())

    def nvmlDeviceGetGpuInstancePossiblePlacements(self, h, profile_id, array, count_ref):
        placements = next(p for p in self._profiles(h) if p.profile_id == profile_id).placements
        count_ref._obj.value = len(placements)
        if array is not None:
            for k, (start, size) in enumerate(placements):
                array[k].start, array[k].size = start, size
        return 0

    def nvmlDeviceGetMaxMigDeviceCount(self, h):
        try:
            self._port("mig_mode", h[1])
        except ShimNVMLError:
            raise ShimNVMLError(NVML_ERROR_NOT_SUPPORTED) from None
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h, k):
        insts = self._port("gpu_instances", h[1])[::-1]
        if k >= len(insts):
            raise ShimNVMLError(NVML_ERROR_NOT_FOUND)
        return ("mig", h[1], insts[k])

    def nvmlDeviceGetGpuInstanceId(self, mh):
        return mh[2].gi_id

    def nvmlDeviceGetComputeInstanceId(self, mh):
        return mh[2].ci_id

    def nvmlDeviceGetGpuInstanceById(self, h, gi_id):
        if not any(inst.gi_id == gi_id for inst in self._port("gpu_instances", h[1])):
            raise ShimNVMLError(NVML_ERROR_NOT_FOUND)
        return ("gi", h[1], gi_id)

    def nvmlGpuInstanceGetInfo(self, gh):
        inst = next(inst for inst in self._port("gpu_instances", gh[1]) if inst.gi_id == gh[2])
        pid = next(p.profile_id for p in self._profiles(gh) if p.name == inst.profile)
        return SimpleNamespace(id=inst.gi_id, profileId=pid, placement=SimpleNamespace(start=inst.start))

    # the fake creates the compute instance with the GPU instance; the CI calls only check shapes
    def nvmlDeviceCreateGpuInstance(self, h, profile_id):
        return ("gi", h[1], self._port("create_gpu_instance", h[1], profile_id).gi_id)

    def nvmlDeviceCreateGpuInstanceWithPlacement(self, h, profile_id, placement_ref):
        placement = placement_ref._obj
        assert isinstance(placement, _Placement)
        return ("gi", h[1], self._port("create_gpu_instance", h[1], profile_id, placement.start).gi_id)

    def nvmlGpuInstanceGetComputeInstanceProfileInfo(self, gh, index, engine):
        assert engine == 0
        return SimpleNamespace(id=index, sliceCount=_CI_SLICES[index])

    def nvmlGpuInstanceCreateComputeInstance(self, gh, ci_profile_id):
        return ("ci", gh[1], gh[2], 0)

    def nvmlGpuInstanceGetComputeInstanceById(self, gh, ci_id):
        if not any(i.gi_id == gh[2] and i.ci_id == ci_id for i in self._port("gpu_instances", gh[1])):
            raise ShimNVMLError(NVML_ERROR_NOT_FOUND)
        return ("ci", gh[1], gh[2], ci_id)

    def nvmlComputeInstanceDestroy(self, ch):
        return 0

    def nvmlGpuInstanceDestroy(self, gh):
        self._port("destroy_gpu_instance", gh[1], gh[2])

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        # nvml.h: "In MIG mode, if device handle is provided, the API returns aggregate information, only
        # if the caller has appropriate privileges. Per-instance information can be queried by using
        # specific MIG device handles." The shim is an unprivileged caller: the parent handle of a GPU
        # with MIG devices answers nothing, each MIG handle its own processes.
        procs = self._port("processes", h[1])[::-1]
        if h[0] == "mig":
            procs = [p for p in procs if p.gi_id == h[2].gi_id]
        elif self._port("gpu_instances", h[1]):
            procs = []
        return [SimpleNamespace(pid=p.pid, usedGpuMemory=p.used_memory_mib * MIB,
                                gpuInstanceId=0xFFFFFFFF if p.gi_id is None else p.gi_id,
                                computeInstanceId=0xFFFFFFFF if p.gi_id is None else 0)
                for p in procs]

    def nvmlDeviceGetProcessUtilization(self, h, last_seen):
        # NVML keeps a buffer of samples per process; an older sample of a pid comes first
        samples = [SimpleNamespace(pid=p.pid, timeStamp=ts, smUtil=int(sm), memUtil=0, encUtil=0, decUtil=0)
                   for p in self._port("processes", h[1]) if p.sm_util is not None
                   for ts, sm in ((1, 0), (2, p.sm_util))]
        if not samples:
            raise ShimNVMLError(NVML_ERROR_NOT_FOUND)
        return samples

    def nvmlDeviceGetUtilizationRates(self, h):
        u = self._port("utilization", h[1])
        return SimpleNamespace(gpu=u.gpu_percent, memory=u.memory_percent)

    def nvmlDeviceGetComputeMode(self, h):
        return {name: value for value, name in port.COMPUTE_MODES.items()}[self._port("compute_mode", h[1])]

    def nvmlDeviceSetComputeMode(self, h, mode):
        self._port("set_compute_mode", h[1], port.COMPUTE_MODES[mode])


class _Limits:
    """``nvmlSetMemoryLimits_v1_t`` / ``nvmlGetMemoryLimits_v1_t`` as pynvml builds them (fields by name)."""

    def __init__(self):
        self.nameSpace, self.softLimit, self.hardLimit, self.currentUsed = b"", 0, 0, 0


class LimitsShim(PynvmlShim):
    """The shim of an nvidia-ml-py of 13.615 or later (per-cgroup memory limits)."""

    c_nvmlSetMemoryLimits_v1_t = _Limits
    c_nvmlGetMemoryLimits_v1_t = _Limits

    def nvmlDeviceSetMemoryLimits_v1(self, h, limits):
        self._port("set_memory_limits", h[1], limits.nameSpace.decode(), limits.softLimit // MIB,
                   limits.hardLimit // MIB)

    def nvmlDeviceGetMemoryLimits_v1(self, h, limits):
        got = self._port("memory_limits", h[1], limits.nameSpace.decode())
        limits.softLimit = got.soft_mib * MIB
        limits.hardLimit = port.NVML_DEVICE_MEMORY_LIMIT_MAX if got.hard_mib is None else got.hard_mib * MIB
        limits.currentUsed = got.used_mib * MIB


def mig_minors(m: Machine, path: Path) -> Path:
    """A ``/proc/driver/nvidia-caps/mig-minors`` for every GPU instance id the driver allows."""
    lines = ["config 1", "monitor 2"]
    for g in m.gpus:
        for gi in range(15):
            lines.append(f"gpu{g.minor}/gi{gi}/access {fake_module.mig_caps(g.minor, gi, 0)[0]}")
            lines += [f"gpu{g.minor}/gi{gi}/ci{ci}/access {fake_module.mig_caps(g.minor, gi, ci)[1]}"
                      for ci in range(8)]
    path.write_text("\n".join(lines) + "\n")
    return path


def real_over_fake(m: Machine, tmp_path: Path, **fake_kwargs) -> tuple[RealNvml, FakeNvml]:
    fake = FakeNvml(m, **fake_kwargs)
    return RealNvml(lib=PynvmlShim(fake), mig_minors_path=mig_minors(m, tmp_path / "mig-minors")), fake


# --- the real port's decoding -----------------------------------------------------------------------


def test_real_port_is_an_nvml_port():
    assert isinstance(RealNvml(lib=SimpleNamespace()), NvmlPort)


@pytest.mark.parametrize("name", FIXTURES)
def test_probe_through_the_real_port_round_trips(name, tmp_path):
    m = load(name)
    real, _ = real_over_fake(m, tmp_path)
    with real:
        assert probe_machine(real, hostname=m.hostname, cpus=m.cpus) == m


def test_real_port_answers_in_plain_types(tmp_path):
    m = load("h100-sxm5-4gpu-mig-mixed.json")
    real, fake = real_over_fake(m, tmp_path)
    with real:
        assert real.memory_total_mib(0) == 81559  # bytes rounded down to MiB
        assert real.memory_used_mib(0) == 70000
        assert real.pci_bus_id(1) == "00000000:2A:00.0"
        assert real.numa_node(3) == 1
        assert real.p2p_status(0, 1) == P2pStatus("OK", "OK")
        assert real.mig_mode(2) == MigMode(True, True)
        assert real.utilization(0) == Utilization(0, 0)
        with pytest.raises(NvmlError) as err:
            real.mig_mode(0)
        assert err.value.code == NVML_ERROR_NOT_SUPPORTED
        assert real.gpu_instances(0) == ()


def test_real_port_reads_processes_with_sm_and_mig_instance(tmp_path):
    from slurm_gpushare.hardware.fake import ScheduledProcess
    m = load("h100-sxm5-4gpu-mig-mixed.json")
    real, fake = real_over_fake(m, tmp_path)
    with fake:
        gi = fake.gpu_instances(2)[0].gi_id
    fake.add_process(ScheduledProcess(5001, 1, start=0.0, steps=((0, 1234, 37),)))
    fake.add_process(ScheduledProcess(5002, 2, start=0.0, steps=((0, 4321, None),), gi_id=gi))
    with real, fake:
        assert real.processes(1) == fake.processes(1)
        assert [(p.pid, p.sm_util, p.gi_id) for p in real.processes(1)] == [(5001, 37.0, None)]
        assert [(p.pid, p.sm_util, p.gi_id) for p in real.processes(2)] == [(5002, None, gi)]


def test_real_port_creates_and_destroys_through_nvml(tmp_path):
    m = load("h100-sxm5-4gpu-mig-mixed.json")
    real, fake = real_over_fake(m, tmp_path)
    with real:
        with pytest.raises(MigPlacementError, match="overlaps"):
            real.create_gpu_instance(2, 19, start=5)
        with pytest.raises(MigPlacementError, match="GPU 0: MIG mode is not enabled"):
            real.create_gpu_instance(0, 19)
        real.destroy_gpu_instance(2, 9)   # the 1g.10gb at slice 6 (GPU instances 2, 7, 8, 9 on GPU 2)
        created = real.create_gpu_instance(2, 15, start=6)
        # the fake gives the lowest free id (1); its minors are the table's gpu2/gi1: 3 + 270 + 9
        assert (created.profile, created.gi_id, created.start, created.caps) == ("1g.20gb", 1, 6, (282, 283))
        assert fake.gpu_instances(2) == real.gpu_instances(2)
        real.destroy_gpu_instance(2, 1)
        assert real.create_gpu_instance(2, 19).start == 6


def test_real_port_reads_and_sets_the_compute_mode(tmp_path):
    real, fake = real_over_fake(load("a100-pcie-4gpu-nvlink-pairs.json"), tmp_path)
    with real:
        assert real.compute_mode(0) == "DEFAULT"
        real.set_compute_mode(0, "EXCLUSIVE_PROCESS")
        assert fake.compute_mode(0) == real.compute_mode(0) == "EXCLUSIVE_PROCESS"
        real.set_compute_mode(0, "PROHIBITED")
        assert real.compute_mode(0) == "PROHIBITED"


def test_real_port_passes_nvml_compute_mode_values():
    calls = []
    lib = SimpleNamespace(NVMLError=ShimNVMLError, nvmlDeviceGetHandleByIndex=lambda i: ("gpu", i),
                          nvmlDeviceSetComputeMode=lambda h, mode: calls.append((h, mode)),
                          nvmlDeviceGetComputeMode=lambda h: 1)
    real = RealNvml(lib=lib)
    for mode in ("DEFAULT", "PROHIBITED", "EXCLUSIVE_PROCESS"):
        real.set_compute_mode(2, mode)
    assert calls == [(("gpu", 2), 0), (("gpu", 2), 2), (("gpu", 2), 3)]
    assert real.compute_mode(2) == "EXCLUSIVE_THREAD"  # an old driver's deprecated mode is reported by name
    with pytest.raises(NvmlError) as err:
        real.set_compute_mode(2, "EXCLUSIVE_THREAD")  # refused before NVML is called
    assert err.value.code == NVML_ERROR_INVALID_ARGUMENT
    assert len(calls) == 3
    lib.nvmlDeviceGetComputeMode = lambda h: 7
    with pytest.raises(NvmlError, match=r"nvmlDeviceGetComputeMode\(gpu 2\): unknown compute mode 7"):
        real.compute_mode(2)


def test_missing_mig_minors_file_is_a_hardware_error(tmp_path):
    m = load("h100-sxm5-4gpu-mig-mixed.json")
    real = RealNvml(lib=PynvmlShim(FakeNvml(m)), mig_minors_path=tmp_path / "absent")
    with real:
        with pytest.raises(HardwareError, match="cannot read the MIG capability minors"):
            real.gpu_instances(2)


def test_real_port_takes_the_minors_from_the_drivers_table(tmp_path):
    # the table is the source on a node (as for Slurm's gpu_nvml.c and NVIDIA's nvcaps): a number the
    # formula would not give is taken as written
    m = load("h100-sxm5-4gpu-mig-mixed.json")
    path = mig_minors(m, tmp_path / "mig-minors")
    path.write_text(path.read_text().replace("gpu2/gi2/access 291", "gpu2/gi2/access 4000")
                    .replace("gpu2/gi2/ci0/access 292", "gpu2/gi2/ci0/access 4001"))
    real = RealNvml(lib=PynvmlShim(FakeNvml(m)), mig_minors_path=path)
    with real:
        caps = {i.gi_id: i.caps for i in real.gpu_instances(2)}
    assert caps == {2: (4000, 4001), 7: (336, 337), 8: (345, 346), 9: (354, 355)}


# --- error mapping ------------------------------------------------------------------------------------


def test_nvml_error_becomes_nvml_error_naming_the_call():
    class Lib:
        NVMLError = ShimNVMLError

        def nvmlDeviceGetHandleByIndex(self, i):
            return ("gpu", i)

        def nvmlDeviceGetUUID(self, h):
            raise ShimNVMLError(NVML_ERROR_GPU_IS_LOST)

    with pytest.raises(NvmlError) as err:
        RealNvml(lib=Lib()).uuid(3)
    assert err.value.source == "nvmlDeviceGetUUID(gpu 3)"
    assert err.value.code == NVML_ERROR_GPU_IS_LOST
    assert str(err.value).startswith("nvmlDeviceGetUUID(gpu 3): GPU is lost [NVML_ERROR_GPU_IS_LOST]")
    assert isinstance(err.value.__cause__, ShimNVMLError)


def test_missing_library_says_what_to_do():
    def nvml_init():
        raise ShimNVMLError(NVML_ERROR_LIBRARY_NOT_FOUND)

    lib = SimpleNamespace(NVMLError=ShimNVMLError, nvmlInit=nvml_init)
    with pytest.raises(NvmlError) as err:
        with RealNvml(lib=lib):
            pass
    assert err.value.code == NVML_ERROR_LIBRARY_NOT_FOUND
    assert err.value.source == "nvmlInit()"
    assert "no NVIDIA driver on this host; use --from-topo FILE or a machine description" in str(err.value)


def test_function_missing_from_the_binding():
    lib = SimpleNamespace(NVMLError=ShimNVMLError)
    with pytest.raises(NvmlError) as err:
        RealNvml(lib=lib).driver_version()
    assert err.value.code == NVML_ERROR_FUNCTION_NOT_FOUND
    assert "nvmlSystemGetDriverVersion" in str(err.value)


def test_unknown_topology_level_is_an_error():
    lib = SimpleNamespace(NVMLError=ShimNVMLError, nvmlDeviceGetHandleByIndex=lambda i: i,
                          nvmlDeviceGetTopologyCommonAncestor=lambda a, b: 60)
    with pytest.raises(NvmlError, match=r"nvmlDeviceGetTopologyCommonAncestor\(gpu 0, gpu 1\): unknown topology"):
        RealNvml(lib=lib).topology_common_ancestor(0, 1)
    lib.nvmlDeviceGetTopologyCommonAncestor = lambda a, b: 0  # NVML_TOPOLOGY_INTERNAL: two GPUs on one board
    assert RealNvml(lib=lib).topology_common_ancestor(0, 1) == "PIX"


def test_process_without_memory_figure_is_an_error():
    lib = SimpleNamespace(NVMLError=ShimNVMLError, nvmlDeviceGetHandleByIndex=lambda i: i,
                          nvmlDeviceGetComputeRunningProcesses=lambda h: [SimpleNamespace(pid=7, usedGpuMemory=None)])
    with pytest.raises(NvmlError, match="no used-memory figure for pid 7"):
        RealNvml(lib=lib).processes(0)


def test_mps_clients_are_the_pids_of_nvmls_mps_list_and_a_refusal_is_an_error():
    def mps(handle):
        assert handle == 2
        return [SimpleNamespace(pid=41, usedGpuMemory=None), SimpleNamespace(pid=43, usedGpuMemory=1 << 30)]

    lib = SimpleNamespace(NVMLError=ShimNVMLError, nvmlDeviceGetHandleByIndex=lambda i: i,
                          nvmlDeviceGetMPSComputeRunningProcesses=mps)
    assert RealNvml(lib=lib).mps_client_pids(2) == {41, 43}

    def refuse(handle):
        raise ShimNVMLError(NVML_ERROR_NOT_SUPPORTED)

    lib.nvmlDeviceGetMPSComputeRunningProcesses = refuse
    with pytest.raises(NvmlError, match=r"nvmlDeviceGetMPSComputeRunningProcesses\(gpu 1\)"):
        RealNvml(lib=lib).mps_client_pids(1)


@pytest.mark.parametrize("function, call", [
    ("nvmlDeviceGetUUID", lambda p: p.uuid(1)),
    ("nvmlDeviceGetTopologyCommonAncestor", lambda p: p.topology_common_ancestor(1, 2)),
    ("nvmlDeviceGetMemoryInfo", lambda p: p.memory_total_mib(2)),
    ("nvmlSystemGetDriverVersion", lambda p: p.driver_version()),
    ("nvmlDeviceGetMigMode", lambda p: p.mig_mode(3)),
    ("nvmlDeviceGetComputeMode", lambda p: p.compute_mode(1)),
    ("nvmlDeviceSetComputeMode", lambda p: p.set_compute_mode(1, "EXCLUSIVE_PROCESS")),
    ("nvmlDeviceSetComputeMode", lambda p: p.set_compute_mode(1, "BOGUS")),
])
def test_fake_and_real_port_raise_the_same_error(function, call, tmp_path):
    m = load("h100-sxm5-4gpu-mig-mixed.json")
    fake = FakeNvml(m, fail={function: NVML_ERROR_UNKNOWN})
    real, _ = real_over_fake(m, tmp_path, fail={function: NVML_ERROR_UNKNOWN})
    errors = []
    for p in (fake, real):
        with p, pytest.raises(NvmlError) as err:
            call(p)
        errors.append((str(err.value), err.value.code))
    assert errors[0] == errors[1]
    assert errors[0][0].startswith(function + "(")


# --- a real GPU -----------------------------------------------------------------------------------------


@pytest.fixture
def real_nvml():
    try:
        nvml = RealNvml()
        nvml.init()
    except (NvmlError, HardwareError) as e:
        pytest.skip(f"no usable NVML here: {e}")
    yield nvml
    nvml.shutdown()


@pytest.mark.gpu
def test_probe_a_real_node(real_nvml):
    m = probe_machine(real_nvml, hostname="this-node")
    assert len(m.gpus) == real_nvml.device_count() > 0
    assert all(g.uuid.startswith("GPU-") and g.memory_mib > 0 for g in m.gpus)
    assert len(m.links) == len(m.gpus) * (len(m.gpus) - 1) // 2
    again = probe_machine(real_nvml, hostname="this-node")
    assert [replace(g, processes=()) for g in again.gpus] == [replace(g, processes=()) for g in m.gpus]
    # the fake serves what the real node reported
    with FakeNvml(m) as fake:
        assert probe_machine(fake, hostname="this-node") == m


def test_real_port_sets_and_reads_a_cgroup_s_memory_limits_in_bytes(tmp_path):
    """nvmlDeviceSetMemoryLimits_v1 / nvmlDeviceGetMemoryLimits_v1 (driver R615+): the cgroup's directory as
    nameSpace, limits in bytes both ways; no limit reads as None (NVML_DEVICE_MEMORY_LIMIT_MAX)."""
    fake = FakeNvml(replace(load("a100-pcie-4gpu-nvlink-pairs.json"), driver_version="615.20"))
    real = RealNvml(lib=LimitsShim(fake))
    cgroup = tmp_path / "job_7"
    cgroup.mkdir()
    with real:
        assert real.memory_limits(2, str(cgroup)) == port.MemoryLimits(0, None, 0)
        real.set_memory_limits(2, str(cgroup), 10240, 10240)
        assert real.memory_limits(2, str(cgroup)) == port.MemoryLimits(10240, 10240, 0)
        assert real.memory_limits(3, str(cgroup)).hard_mib is None  # per GPU
        with pytest.raises(NvmlError) as err:
            real.set_memory_limits(2, str(tmp_path / "gone"), 1, 1)
        assert err.value.code == port.NVML_ERROR_INVALID_ARGUMENT
        assert "nvmlDeviceSetMemoryLimits_v1(gpu 2, cgroup " in err.value.source


def test_an_nvidia_ml_py_without_the_call_is_function_not_found(tmp_path):
    real, _ = real_over_fake(load("a100-pcie-4gpu-nvlink-pairs.json"), tmp_path)
    with real:
        with pytest.raises(NvmlError) as err:
            real.set_memory_limits(0, str(tmp_path), 1024, 1024)
    assert err.value.code == port.NVML_ERROR_FUNCTION_NOT_FOUND
    assert "13.615 or later" in str(err.value)
