"""Compare what slurmd detected (``slurmd -G``) with the gres.conf records of a node (pure).

When a node drains with "gres/gpu count reported lower than configured" or a GRES type mismatch, the
administrator has the node's ``sudo slurmd -G`` print (:mod:`slurm_gpushare.slurm.slurmd`) and the
gres.conf the product generates from the machine description. :func:`compare_detected` matches
them device by device and says, per device, whether they agree.

A device is named by what both sides print:

- a whole GPU by its ``/dev/nvidiaN`` (N = the minor number);
- a MIG device by its GPU instance's ``/dev/nvidia-caps/nvidia-capM`` (M = the ``gpu<G>/gi<I>/access``
  minor of ``/proc/driver/nvidia-caps/mig-minors``), which every Slurm release lists: the only file of
  a pre-23.11 ``File=`` and of the recorded real print, the second of a ``MultipleFiles=`` list
  (parent, GPU instance, compute instance; gpu_nvml.c builds that list on 22.05 to 26.05). Where both
  sides list a compute instance minor or a parent ``/dev/nvidiaN``, those must agree too.

Types are compared as equivalent, not as text: AutoDetect=nvml names a GPU
``nvidia_h100_80gb_hbm3`` (the NVML product name in lower case with ``_`` for spaces) and a MIG
device ``nvidia_h100_80gb_hbm3_1g.10gb``, where the product writes ``h100`` and ``h100_1g.10gb``
(:func:`~slurm_gpushare.hardware.machine.gpu_model`, :func:`~slurm_gpushare.slurm.nodegres.mig_type`):
two types agree when their MIG profile (the ``<n>g.<m>gb`` tail, ``<k>c.`` included) is the same
and their GPU models (:func:`~slurm_gpushare.hardware.machine.gpu_model` of the rest) are the same.
Note that gres.conf ``Type=`` must then be what slurm.conf asks for: with ``AutoDetect=off`` (what
the product writes) slurmd reports the gres.conf types, so a print taken with ``AutoDetect=nvml``
shows the detected names instead.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from slurm_gpushare.hardware.machine import PROFILE_NAME, gpu_model, mig_cap_owner
from slurm_gpushare.slurm.nodegres import NodeGres
from slurm_gpushare.slurm.slurmd import DetectedGres

_CAP = re.compile(r"/nvidia-cap(\d+)$")
_GPU = re.compile(r"/nvidia(\d+)$")
_PROFILE = re.compile(r"(?:^|_)(" + PROFILE_NAME + r")$")


@dataclass(frozen=True)
class DeviceReport:
    """The verdict on one device.

    Attributes:
        device: what the device is, e.g. ``/dev/nvidia0`` or ``nvidia-cap291 (GPU minor 2, GPU
            instance 2)``.
        ok: both sides have it, with equivalent types and the same device files.
        detail: one line: the two sides, or what is missing or different.
    """

    device: str
    ok: bool
    detail: str


@dataclass(frozen=True)
class _Device:
    key: tuple[str, int]
    name: str
    type: str
    parent: int | None
    ci_cap: int | None
    files: tuple[str, ...]


def _device(name: str, type_: str, files: Sequence[str]) -> _Device | None:
    caps = [int(m.group(1)) for f in files if (m := _CAP.search(f))]
    gpus = [int(m.group(1)) for f in files if (m := _GPU.search(f))]
    if caps:
        gi_cap = caps[0]
        ci_cap = caps[1] if len(caps) > 1 else None
        return _Device(("mig", gi_cap), name, type_, gpus[0] if gpus else None, ci_cap, tuple(files))
    if gpus:
        return _Device(("gpu", gpus[0]), name, type_, gpus[0], None, tuple(files))
    return None


def split_type(gres_type: str) -> tuple[str, str]:
    """``(gpu model, MIG profile)`` of a GRES type, the profile ``""`` for a whole GPU.

    ``nvidia_h100_80gb_hbm3_1g.10gb`` -> ``("h100", "1g.10gb")``; ``h100_4g.40gb`` -> ``("h100",
    "4g.40gb")``; ``nvidia_a100-sxm4-80gb`` -> ``("a100", "")``; ``""`` -> ``("", "")``.
    """
    m = _PROFILE.search(gres_type)
    profile = m.group(1) if m else ""
    base = gres_type[:m.start()] if m else gres_type
    return (gpu_model(base) if base.strip("_") else ""), profile


def types_agree(detected: str, written: str) -> bool:
    """Whether a detected GRES type and a gres.conf type name the same kind of device (see module doc)."""
    if detected.lower() == written.lower():
        return True
    return split_type(detected.lower()) == split_type(written.lower())


def _label(d: _Device) -> str:
    kind, number = d.key
    if kind == "gpu":
        return f"/dev/nvidia{number}"
    owner = mig_cap_owner(number)
    if owner is None:
        return f"nvidia-cap{number}"
    gpu, gi, ci = owner
    what = f"GPU minor {gpu}, GPU instance {gi}" + (f", compute instance {ci}" if ci is not None else "")
    return f"nvidia-cap{number} ({what})"


def compare_detected(detected: Sequence[DetectedGres], node: NodeGres, *,
                     detected_source: str = "slurmd -G") -> tuple[list[DeviceReport], list[str]]:
    """Match the ``gpu`` records of a ``slurmd -G`` print with the node's generated gres.conf records.

    Args:
        detected: the parsed print (:func:`~slurm_gpushare.slurm.slurmd.parse_slurmd_g`).
        node: the node's records (:func:`~slurm_gpushare.gresconf.render.generate_node_gres`).
        detected_source: name of the print in messages.

    Returns:
        ``(devices, problems)``: one :class:`DeviceReport` per device of either side, whole GPUs
        first (by minor), then MIG devices (by capability minor); and the problems as lines, one
        per device that does not agree, plus one per GRES type whose count differs (the
        "count reported lower than configured" of a drained node), one per device printed twice,
        and one when the print's ``slurmd-<host>:`` prefix names another node than ``node``.
    """
    seen: dict[tuple[str, int], _Device] = {}
    problems: list[str] = []
    hosts = sorted({r.host for r in detected if r.host})
    if len(hosts) > 1:
        problems.append(f"{detected_source} holds the prints of several nodes ({', '.join(hosts)}): give one node's")
    elif hosts and hosts[0] != node.node_name:
        problems.append(f"{detected_source} was printed on {hosts[0]} (its 'slurmd-{hosts[0]}:' prefix), not on "
                        f"{node.node_name}")
    for r in detected:
        if r.name != "gpu":
            continue
        d = _device(r.name, r.type, r.files)
        if d is not None:
            if d.key in seen:
                problems.append(f"{detected_source}:{r.line}: {_label(d)} is printed twice: a print holds each "
                                "device once; record 'slurmd -G' again")
            seen[d.key] = d
    want: dict[tuple[str, int], _Device] = {}
    for rec in node.records:
        if rec.name != "gpu":
            continue
        d = _device(rec.name, rec.type, rec.files)
        if d is not None:
            want[d.key] = d
    reports: list[DeviceReport] = []
    for key in sorted(set(seen) | set(want), key=lambda k: (k[0] != "gpu", k[1])):
        got, exp = seen.get(key), want.get(key)
        label = _label(got or exp)  # type: ignore[arg-type]
        if got is None:
            assert exp is not None
            detail = (f"in gres.conf (Type={exp.type} File={','.join(exp.files)}) but not detected by slurmd: "
                      "the device is gone or was recreated with another GPU instance id (MIG layout changed)")
        elif exp is None:
            detail = (f"detected by slurmd (Type={got.type} File={','.join(got.files)}) but not in gres.conf: "
                      "regenerate gres.conf from this node")
        else:
            differences = []
            if not types_agree(got.type, exp.type):
                differences.append(f"type {got.type} (slurmd) vs {exp.type} (gres.conf)")
            if got.ci_cap is not None and exp.ci_cap is not None and got.ci_cap != exp.ci_cap:
                differences.append(f"compute instance minor {got.ci_cap} (slurmd) vs {exp.ci_cap} (gres.conf)")
            if got.parent is not None and exp.parent is not None and got.parent != exp.parent:
                differences.append(f"parent /dev/nvidia{got.parent} (slurmd) vs /dev/nvidia{exp.parent} (gres.conf)")
            detail = "; ".join(differences) if differences else f"{got.type} = {exp.type}"
            reports.append(DeviceReport(label, not differences, detail))
            if differences:
                problems.append(f"{label}: {detail}")
            continue
        reports.append(DeviceReport(label, False, detail))
        problems.append(f"{label}: {detail}")
    detected_counts: Counter[tuple[str, str]] = Counter(split_type(d.type.lower()) for d in seen.values())
    written_counts: Counter[tuple[str, str]] = Counter(split_type(d.type.lower()) for d in want.values())
    for kind in sorted(set(detected_counts) | set(written_counts)):
        a, b = detected_counts[kind], written_counts[kind]
        if a != b:
            model, profile = kind
            problems.append(f"gpu {model}{'_' + profile if profile else ''}: {detected_source} shows {a}, "
                            f"gres.conf has {b} (a node reporting fewer than slurm.conf configures is drained)")
    return reports, problems
