"""MIG profile tables by GPU model, for GPUs whose profiles NVML does not report yet.

NVML reports a GPU's GPU instance profiles and their placements only while MIG mode is on
(``nvmlDeviceGetGpuInstanceProfileInfo``, ``nvmlDeviceGetGpuInstancePossiblePlacements``): a node whose
GPUs run with MIG off cannot say what it could be split into. These tables say it, as package data
(``slurm_gpushare/data/mig/profiles.json``) in the same :class:`~slurm_gpushare.hardware.machine.MigProfile`
objects the NVML port serves, so that a MIG planner reads one kind of fact whatever its source, and the
fake NVML serves a table as a real GPU's profiles (a machine description built with
:func:`with_table_profiles`).

Facts and their sources (NVIDIA Multi-Instance GPU User Guide):

- profile names, compute slices, number of instances: "Supported MIG Profiles" (the A30, A100, H100,
  H100 94GB, H200 and B200 tables); GB200's names are those of NVIDIA's MIG Manager (mig-parted)
  default configuration, on the B200's slice layout;
- profile ids and placements: "Getting Started with MIG", the ``nvidia-smi mig -lgip`` and ``-lgipp``
  examples; GPUs with 7 compute slices and 8 memory slices share them
  (:data:`~slurm_gpushare.hardware.nvidia_smi.SEVEN_SLICE_PLACEMENTS`, by profile id); the A30 (4
  memory and 4 compute slices) has its own, in the table;
- memory: recorded ``nvidia-smi mig -lgip`` output (the GiB column times 1024) where a whole one is known
  (A100 40GB, H100 80GB, H200); partial where NVIDIA published some rows (H100 NVL 94GB, B200, GB200): a
  row without a published size takes the size of a recorded row with as many memory slices (the 4g and
  3g profiles share 4 of 8), or is estimated (:func:`estimated_mib`); else nominal, the size in the
  profile name (``1g.12gb``: 12288 MiB; NVML's ``memorySizeMB`` is up to 11 % less). Each model's
  ``memory`` entry says which, and its ``recorded`` list which rows.

A GPU is matched to a table by :func:`~slurm_gpushare.hardware.machine.gpu_model` of its NVML name and
its memory (the table whose ``memory_gib`` is nearest its nominal memory), so ``NVIDIA A100-SXM4-80GB``
and ``NVIDIA A100 80GB PCIe`` both take ``a100-80gb``.
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass, replace
from importlib import resources

from slurm_gpushare.errors import InputError
from slurm_gpushare.hardware.machine import Gpu, MigProfile, gpu_model, nominal_gpu_mib, nominal_profile_mib
from slurm_gpushare.hardware.nvidia_smi import SEVEN_SLICE_PLACEMENTS


@dataclass(frozen=True)
class MigTable:
    """The MIG profiles of one GPU model.

    Attributes:
        key: the table's name, e.g. ``a100-80gb``, ``h200-141gb``.
        model: the GPU model it applies to (:func:`~slurm_gpushare.hardware.machine.gpu_model`).
        memory_source: where the profiles' memory comes from: ``recorded``, ``partial`` or ``nominal``, then
            the source in words.
        memory_gib: the GPU's nominal memory, GiB (matches a GPU of that model by nearest memory).
        profiles: the profiles with placements, in NVML profile order.
        estimated: names of the profiles whose memory is an estimate (:func:`estimated_mib`; only in a
            ``partial`` table).
    """

    key: str
    model: str
    memory_source: str
    memory_gib: int
    profiles: tuple[MigProfile, ...]
    estimated: tuple[str, ...] = ()

    @property
    def memory_slices(self) -> int:
        """Memory slices of the GPU: the end of the furthest placement (8, or 4 on the A30)."""
        return max(s + n for p in self.profiles for s, n in p.placements)

    @property
    def compute_slices(self) -> int:
        """Compute slices of the GPU: those of its largest profile (7, or 4 on the A30)."""
        return max(p.slices for p in self.profiles)


def _memory_slices(p: MigProfile) -> int:
    return p.placements[0][1] if p.placements else 0


def recorded_fraction(profiles: tuple[MigProfile, ...]) -> float:
    """The smallest share of its name's size that any of ``profiles`` holds (``1g.18gb`` holding 16 GiB:
    0.889); 1.0 for none."""
    return min((p.memory_mib / nominal_profile_mib(p) for p in profiles), default=1.0)


def estimated_mib(profile: MigProfile, recorded: tuple[MigProfile, ...]) -> int:
    """A size for a profile no ``-lgip`` output has published, never above what it holds: the size in its
    name times the smallest share of their names' sizes that the same GPU's ``recorded`` profiles hold
    (MiB, rounded down). The real slice holds more (recorded GPUs lose less on larger slices: an H100's
    7g.80gb holds 99 % of 80 GiB, its 1g.10gb 97.5 % of 10)."""
    return math.floor(nominal_profile_mib(profile) * recorded_fraction(recorded))


def _fill_partial(key: str, profiles: list[MigProfile], recorded: set[str]) -> tuple[list[MigProfile], tuple[str, ...]]:
    known = tuple(p for p in profiles if p.name in recorded)
    unknown = sorted(recorded - {p.name for p in profiles})
    if unknown or not known:
        raise InputError(f"MIG table {key}: 'recorded' names {', '.join(unknown) or 'no profile'}, which it has no "
                         "profile of", source="slurm_gpushare/data/mig/profiles.json",
                         hint="name the table's profiles whose sizes were published")
    by_slices = {_memory_slices(p): p.memory_mib for p in known}
    out, estimated = [], []
    for p in profiles:
        if p.name in recorded:
            out.append(p)
        elif _memory_slices(p) in by_slices:
            out.append(replace(p, memory_mib=by_slices[_memory_slices(p)]))
        else:
            out.append(replace(p, memory_mib=estimated_mib(p, known)))
            estimated.append(p.name)
    return out, tuple(estimated)


@functools.cache
def mig_tables() -> dict[str, MigTable]:
    """Every packaged table, by key (read once from ``data/mig/profiles.json``; the rows of a partial table
    without a published size filled as the module says)."""
    data = json.loads((resources.files("slurm_gpushare") / "data" / "mig" / "profiles.json").read_text("utf-8"))
    out = {}
    for key, entry in data["models"].items():
        profiles = []
        for row in entry["profiles"]:
            name, profile_id, slices, memory_mib, max_instances, sm_count = row[:6]
            if len(row) > 6:
                placements = tuple((int(s), int(n)) for s, n in row[6])
            else:
                want, placements = SEVEN_SLICE_PLACEMENTS[profile_id]
                assert want == slices, f"{key} {name}: profile {profile_id} has {want} slices in the placement table"
            profiles.append(MigProfile(name=name, profile_id=profile_id, slices=slices, memory_mib=memory_mib,
                                       max_instances=max_instances, sm_count=sm_count, placements=placements))
        estimated: tuple[str, ...] = ()
        if entry["memory"].startswith("partial"):
            profiles, estimated = _fill_partial(key, profiles, set(entry["recorded"]))
        out[key] = MigTable(key=key, model=entry["model"], memory_gib=entry["memory_gib"],
                            memory_source=entry["memory"], profiles=tuple(profiles), estimated=estimated)
    return out


def mig_table(key: str) -> MigTable:
    """The table named ``key``.

    Raises:
        InputError: no such table; the hint lists the known ones.
    """
    tables = mig_tables()
    if key not in tables:
        raise InputError(f"no MIG profile table for GPU model {key!r}",
                         hint=f"known models: {', '.join(tables)}")
    return tables[key]


def table_for_gpu(gpu: Gpu) -> MigTable | None:
    """The table of a GPU's model (by NVML name and nearest memory), or None when MIG is unknown for it."""
    model = gpu_model(gpu.name)
    candidates = [t for t in mig_tables().values() if t.model == model]
    if not candidates:
        return None
    gib = nominal_gpu_mib(gpu.memory_mib) / 1024
    return min(candidates, key=lambda t: abs(t.memory_gib - gib))


def with_table_profiles(gpu: Gpu) -> Gpu:
    """The GPU with its table's profiles where it lists none (a GPU with profiles, or without a table,
    is returned as it is)."""
    if gpu.mig_profiles:
        return gpu
    table = table_for_gpu(gpu)
    return replace(gpu, mig_profiles=table.profiles) if table is not None else gpu
