"""``mig apply``: change one node's MIG layout without losing a job, and survive being killed at any step.

The steps (:data:`STEPS`), each recorded in a state file before it starts and once it is done:

1. ``drain``: ``scontrol update nodename=NODE state=drain reason="gpushare mig apply: ..."`` (the reason
   names the layout and the state file). A node already drained with another reason stays drained
   by its owner: apply never resumes it.
2. ``wait-jobs``: until no job holds GPU GRES (``gpu``, ``shard``) on the node as slurmctld allocated them
   (:meth:`CommandSlurm.gpu_jobs`: any request form, ``--gpus`` too), at most ``deadline`` seconds from the
   step's first start; past it the drain is undone (recorded, then resume when the reason is still ours,
   then the state file moved away: :meth:`Apply._undo`), the layout is left as it was and
   :class:`ApplyError` says which jobs still run.
3. ``stop-mps``: the node's MPS control daemons, per job (found by process) and shared, are stopped
   (:func:`slurm_gpushare.node.daemons.stop_all`, which knows where the node keeps them).
4. ``mig``: on each GPU of the layout, the GPU instances that are not in the target are destroyed
   (``nvmlGpuInstanceDestroy``) and the missing ones created at their placements
   (``nvmlDeviceCreateGpuInstanceWithPlacement``), through the NVML port. The target was checked with
   :func:`~slurm_gpushare.hardware.port.plan_gpu_instance` before the drain. When NVML refuses, the old
   layout is restored the same way and apply goes on with it (files, Slurm, resume), then fails.
5. ``files``: the node's machine description gets the instances NVML reports, gres.conf gets the
   node's lines rendered from it (:func:`~slurm_gpushare.gresconf.render.generate_node_gres`, the
   ``gres-conf`` generator), slurm.conf the node's ``Gres=``; each file replaced whole (through a symbolic
   link: the file it points to). What could stop this step is checked before the drain
   (:meth:`Apply.check_files`).
6. ``slurm``: the node's slurmd is stopped, slurmctld restarted (``scontrol reconfigure`` from 23.11 on, which
   restarts it; 22.05 needs a real restart: its reconfigure refuses a changed count of ``File=`` GRES, see
   :data:`~slurm_gpushare.slurm.release.RECONFIGURE_RESTARTS`), slurmd started, then apply waits until
   slurmctld shows the node's new ``Gres=`` from a slurmd started after the change. slurmd is stopped first
   so that no slurmd with the old GRES registers with a slurmctld holding the new slurm.conf (which drains
   the node with Slurm's own reason, replacing apply's).
7. ``resume``: ``scontrol update nodename=NODE state=resume`` only when the node's drain reason is still
   the one apply set.

A rerun with a state file continues at the recorded step (a step is written to be done twice: each
reads NVML and Slurm afresh), so a kill at any point ends in the target layout or, when that cannot be
made, the old one; the node is drained only while a state file says why. A rerun that continues past
``wait-jobs`` drains the node again when it was resumed meanwhile and waits for its GPU jobs before
touching the GPUs (:meth:`Apply._recheck`). One apply of a node runs at a time (:meth:`Apply.locked`). The state file is
``<run_dir>/mig-apply.json`` (node.toml ``run_dir``) unless given; once done it becomes
``mig-apply.last.json``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Protocol

from slurm_gpushare.atomicfile import locked, read_own_file, write_atomic
from slurm_gpushare.errors import GpushareError, InputError, MigPlacementError, NvmlError, SlurmError
from slurm_gpushare.gresconf.render import generate_node_gres
from slurm_gpushare.hardware.machine import Machine, MigInstance, MigProfile
from slurm_gpushare.hardware.port import NvmlPort, plan_gpu_instance
from slurm_gpushare.mig.geometry import enumerate_geometries
from slurm_gpushare.mig.output import LAYOUT_VERSION
from slurm_gpushare.slurm import commands
from slurm_gpushare.slurm.conf import replace_gres_lines, replace_slurm_gres
from slurm_gpushare.slurm.node import NodeState, gres_matches, parse_node, responding
from slurm_gpushare.slurm.nodegres import GresOptions
from slurm_gpushare.textdoc import kind, parse_json, parse_yaml

#: The steps in order (see the module docstring).
STEPS = ("drain", "wait-jobs", "stop-mps", "mig", "files", "slurm", "resume")
#: Every drain reason apply sets starts with this.
REASON_PREFIX = "gpushare mig apply:"
#: Test hook: ``STEP`` SIGKILLs apply once that step is recorded done, ``mig-change:N`` after the N-th
#: instance destroyed or created. For the kill tests only (tests/test_mig_apply_slurm.py).
KILL_ENV = "GPUSHARE_MIG_APPLY_KILL_AFTER"
STATE_VERSION = 1
STATE_NAME = "mig-apply.json"
LAST_NAME = "mig-apply.last.json"
#: The lock file beside the state file: ``flock(2)`` held by the apply that runs, its pid inside.
LOCK_NAME = "mig-apply.lock"
#: GRES names that make a job a GPU job for ``wait-jobs``.
_GPU_GRES = ("gpu", "shard")


class ApplyError(GpushareError):
    """``mig apply`` stopped: jobs past the deadline, NVML refused (old layout restored), Slurm did not
    take the change, or the node was drained by someone else meanwhile."""

    exit_code = 5


# --- the layout ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Slice:
    """One GPU instance of a target: profile, placement start (None: any, from a mig-parted config) and the profile
    id the layout file records (None: not recorded; else it must be the GPU's id of that profile)."""

    profile: str
    start: int | None = None
    profile_id: int | None = None


@dataclass(frozen=True)
class GpuTarget:
    """What one GPU is to hold.

    Attributes:
        index: NVML index.
        name: the GPU's model name as the layout file records it (None: not recorded).
        mig_enabled: MIG on or off.
        slices: the GPU instances in creation order.
    """

    index: int
    name: str | None
    mig_enabled: bool
    slices: tuple[Slice, ...]


def read_layout(path: str | Path, node: str) -> dict[int, GpuTarget]:
    """The node's GPUs in a layout file of ``mig plan``: ``layout.json`` (placements) or ``mig-parted.yaml``
    (config ``gpushare-NODE``: counts per profile, placements chosen at apply time).

    The file is JSON when its name ends in ``.json``, YAML when in ``.yaml`` or ``.yml``, else JSON when its first
    non-blank character is ``{`` and YAML otherwise (:func:`~slurm_gpushare.textdoc.kind`).

    Raises:
        InputError: unreadable file, not valid JSON or YAML (line and column named, one line; nested deeper than
            the parser goes), not one of the two formats or not their version (layout 1, mig-parted ``v1``),
            the node not in it, no GPU for the node.
    """
    p = Path(path)
    try:
        text = p.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"--layout {p}: cannot read it: {e}") from None
    source = f"--layout {p}"
    if kind(p, text) == "JSON":
        data = parse_json(text, source=source, error=InputError)
    else:
        data = parse_yaml(text, source=source, error=InputError)
    if isinstance(data, dict) and "nodes" in data:
        return _from_layout_json(data, p, node)
    if isinstance(data, dict) and "mig-configs" in data:
        return _from_mig_parted(data, p, node)
    raise InputError(f"--layout {p}: neither a layout.json nor a mig-parted config",
                     hint="give the layout.json or mig-parted.yaml that 'mig plan --output-dir' writes")


#: The most GPU instances a layout file may give one GPU, and the highest GPU index it may name: no MIG GPU
#: holds more than 7 instances (7 compute slices), no node more than a few dozen GPUs; the bounds keep a typo
#: (``count: 7000000``) from building a huge target before the placement rules would refuse it.
MAX_INSTANCES_PER_GPU = 16
MAX_GPU_INDEX = 255
#: The highest profile id a layout file may record (NVML's GPU instance profile ids are small enums, below 64).
MAX_PROFILE_ID = 1 << 16


def _int(value: object, what: str, lo: int, hi: int) -> int:
    """A whole number in ``lo..hi`` (a bool, a float or a string is not one)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{what} {value!r} is not a whole number")
    if not lo <= value <= hi:
        raise ValueError(f"{what} {value} is out of range {lo}..{hi}")
    return value


def _bool(value: object, what: str) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{what} {value!r} is not true or false")
    return value


def _from_layout_json(data: dict, p: Path, node: str) -> dict[int, GpuTarget]:
    version = data.get("version")
    if isinstance(version, bool) or version != LAYOUT_VERSION:
        raise InputError(f"--layout {p}: version {version!r} is not a layout version this slurm-gpushare reads "
                         f"(it reads {LAYOUT_VERSION})", hint="give the layout.json that 'mig plan --output-dir' "
                         "of this slurm-gpushare writes")
    nodes = data.get("nodes") or {}
    if not isinstance(nodes, dict):
        raise InputError(f"--layout {p}: 'nodes' is not a mapping of node names",
                         hint="give the layout.json that 'mig plan --output-dir' writes")
    if node not in nodes:
        raise InputError(f"--layout {p} has no node {node}", hint=f"it has: {', '.join(nodes) or 'none'}")
    out: dict[int, GpuTarget] = {}
    try:
        entry = nodes[node]
        gpus = entry.get("gpus") if isinstance(entry, dict) else None
        if not isinstance(gpus, list):
            raise ValueError("'gpus' is not a list")
        if not gpus:
            raise ValueError("'gpus' is empty: the layout changes no GPU")
        for k, g in enumerate(gpus):
            if not isinstance(g, dict):
                raise ValueError(f"GPU entry {k} is not a mapping")
            index = _int(g.get("index"), f"GPU entry {k}: index", 0, MAX_GPU_INDEX)
            if index in out:
                raise ValueError(f"GPU {index} is listed twice")
            insts = g.get("instances", [])
            if not isinstance(insts, list) or not all(isinstance(i, dict) for i in insts):
                raise ValueError(f"GPU {index}: 'instances' is not a list of {{profile, start}}")
            if len(insts) > MAX_INSTANCES_PER_GPU:
                raise ValueError(f"GPU {index}: {len(insts)} instances, more than any GPU holds "
                                 f"(at most {MAX_INSTANCES_PER_GPU})")
            slices = tuple(Slice(_profile(i.get("profile"), f"GPU {index}"),
                                 _int(i.get("start"), f"GPU {index}: start", 0, MAX_INSTANCES_PER_GPU),
                                 None if i.get("profile_id") is None else
                                 _int(i.get("profile_id"), f"GPU {index}: profile_id", 0, MAX_PROFILE_ID))
                           for i in insts)
            name = g.get("name")
            if name is not None and not isinstance(name, str):
                raise ValueError(f"GPU {index}: name {name!r} is not text")
            out[index] = GpuTarget(index, name, _bool(g.get("mig_enabled"), f"GPU {index}: mig_enabled"), slices)
    except ValueError as e:
        raise InputError(f"--layout {p}: node {node}: {e}",
                         hint="each GPU needs index, mig_enabled (true/false) and instances [{profile, start}], "
                              "as 'mig plan --output-dir' writes them") from None
    return out


def _profile(value: object, where: str) -> str:
    if not isinstance(value, str) or not value.strip() or len(value) > 64:
        raise ValueError(f"{where}: profile {value!r} is not a MIG profile name (like 1g.10gb)")
    return value


def _from_mig_parted(data: dict, p: Path, node: str) -> dict[int, GpuTarget]:
    if data.get("version") != "v1":
        raise InputError(f"--layout {p}: version {data.get('version')!r} is not a mig-parted config version this "
                         "slurm-gpushare reads (it reads v1)",
                         hint="give the mig-parted.yaml that 'mig plan --output-dir' writes")
    configs = data.get("mig-configs") or {}
    if not isinstance(configs, dict):
        raise InputError(f"--layout {p}: 'mig-configs' is not a mapping of config names",
                         hint="give the mig-parted.yaml that 'mig plan --output-dir' writes")
    name = f"gpushare-{node}"
    if name not in configs:
        raise InputError(f"--layout {p} has no mig-parted config {name}",
                         hint=f"it has: {', '.join(configs) or 'none'}")
    out: dict[int, GpuTarget] = {}
    try:
        entries = configs[name]
        if not isinstance(entries, list):
            raise ValueError("the config is not a list of entries")
        if not entries:
            raise ValueError("the config is empty: the layout changes no GPU")
        for k, entry in enumerate(entries):
            if not isinstance(entry, dict):
                raise ValueError(f"entry {k} is not a mapping")
            devices = entry.get("devices")
            if devices == "all":
                raise InputError(f"--layout {p}: {name}: 'devices: all' names no GPU",
                                 hint="list the GPU indices, as 'mig plan' writes them")
            if not isinstance(devices, list) or not devices:
                raise ValueError(f"entry {k}: devices {devices!r} is not a list of GPU indices")
            enabled = _bool(entry.get("mig-enabled"), f"entry {k}: mig-enabled")
            counts = entry.get("mig-devices") or {}
            if not isinstance(counts, dict):
                raise ValueError(f"entry {k}: mig-devices is not a mapping of profile: count")
            slices: list[Slice] = []
            for prof, n in counts.items():
                n = _int(n, f"entry {k}: count of {prof}", 0, MAX_INSTANCES_PER_GPU)
                slices += [Slice(_profile(prof, f"entry {k}"))] * n
            if len(slices) > MAX_INSTANCES_PER_GPU:
                raise ValueError(f"entry {k}: {len(slices)} instances per GPU, more than any GPU holds "
                                 f"(at most {MAX_INSTANCES_PER_GPU})")
            for d in devices:
                d = _int(d, f"entry {k}: device", 0, MAX_GPU_INDEX)
                if d in out:
                    raise ValueError(f"GPU {d} is in two entries")
                out[d] = GpuTarget(d, None, enabled, tuple(slices))
    except ValueError as e:
        raise InputError(f"--layout {p}: {name}: {e}",
                         hint="entries are {devices: [..], mig-enabled: true/false, mig-devices: {profile: count}}, "
                              "as 'mig plan --output-dir' writes them") from None
    return out


@dataclass(frozen=True)
class Planned:
    """A GPU instance with its profile id and placement (a resolved target, or a live instance)."""

    profile: str
    profile_id: int
    start: int

    def to_dict(self) -> dict:
        """As the state file holds it."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping) -> Planned:
        """From :meth:`to_dict`'s form."""
        return cls(str(d["profile"]), int(d["profile_id"]), int(d["start"]))


def current_layout(port: NvmlPort, indices: Sequence[int]) -> dict[int, list[Planned]]:
    """The live GPU instances of these GPUs (``NvmlPort.gpu_instances``), one per GPU instance, by start."""
    out: dict[int, list[Planned]] = {}
    for i in indices:
        profiles = {p.name: p for p in port.gpu_instance_profiles(i)}
        seen: dict[int, Planned] = {}
        for inst in port.gpu_instances(i):
            if inst.gi_id not in seen:
                prof = profiles.get(inst.profile)
                seen[inst.gi_id] = Planned(inst.profile, prof.profile_id if prof else -1, inst.start)
        out[i] = sorted(seen.values(), key=lambda s: s.start)
    return out


def resolve(port: NvmlPort, machine: Machine, targets: Mapping[int, GpuTarget],
            layout: str) -> dict[int, list[Planned]]:
    """Check the targets against this node's GPUs and the placement rules; their placed instances.

    Every GPU of the layout must exist with the same model and MIG mode (apply changes instances, not
    the MIG mode: that needs a GPU reset); every profile must be one the GPU offers; the instances,
    created from an empty GPU in ascending start, must each pass
    :func:`~slurm_gpushare.hardware.port.plan_gpu_instance`. A mig-parted target (no starts) gets the
    first placed set of :func:`~slurm_gpushare.mig.geometry.enumerate_geometries` with its profiles.

    Raises:
        InputError: another GPU model, a MIG mode change, an unknown profile or an invalid geometry.
    """
    n = port.device_count()
    out: dict[int, list[Planned]] = {}
    for i, t in sorted(targets.items()):
        if not 0 <= i < n:
            raise InputError(f"--layout {layout}: GPU {i} does not exist on {machine.hostname} ({n} GPUs)")
        name = port.name(i)
        if t.name is not None and t.name != name:
            raise InputError(f"--layout {layout}: GPU {i} is a {t.name} in the layout, but a {name} on "
                             f"{machine.hostname}", hint="plan with this node's machine description "
                             "('mig plan /etc/slurm/gpushare/machines/NODE.json ...')")
        try:
            enabled = port.mig_mode(i).current
        except NvmlError:  # NOT_SUPPORTED: a GPU without MIG
            enabled = False
        if t.mig_enabled != enabled:
            raise InputError(
                f"--layout {layout}: GPU {i} has MIG {'on' if enabled else 'off'}; the layout wants it "
                f"{'on' if t.mig_enabled else 'off'}",
                hint=f"changing the MIG mode needs a GPU reset, which mig apply does not do: on the drained "
                     f"node run 'nvidia-smi -i {i} -mig {1 if t.mig_enabled else 0}' (and reset the GPU), "
                     "then mig apply; or plan with that GPU's mode kept")
        if not t.mig_enabled:
            out[i] = []
            continue
        profiles = port.gpu_instance_profiles(i)
        out[i] = _place(i, profiles, t, layout, name)
    return out


def _place(i: int, profiles: tuple[MigProfile, ...], t: GpuTarget, layout: str, name: str) -> list[Planned]:
    by_name = {p.name: p for p in profiles}
    for s in t.slices:
        if s.profile not in by_name:
            raise InputError(f"--layout {layout}: GPU {i} offers no MIG profile {s.profile}",
                             hint=f"its profiles: {', '.join(by_name) or 'none'} (a layout for another GPU model?)")
        if s.profile_id is not None and s.profile_id != by_name[s.profile].profile_id:
            raise InputError(f"--layout {layout}: GPU {i}: profile_id {s.profile_id} is not the id of {s.profile} "
                             f"({by_name[s.profile].profile_id} on {name})",
                             hint="the layout file was edited or is of another GPU: plan it again with 'mig plan'")
    if t.slices and all(s.start is None for s in t.slices):
        want = sorted(s.profile for s in t.slices)
        for g in enumerate_geometries(profiles, gpu=i).geometries:
            if sorted(p.profile.name for p in g.instances) == want:
                return [Planned(p.profile.name, p.profile.profile_id, p.start) for p in g.instances]
        raise InputError(f"--layout {layout}: GPU {i}: {', '.join(want)} do not fit one GPU together",
                         hint="no placement of these profiles passes the MIG placement rules")
    if any(s.start is None for s in t.slices):
        raise InputError(f"--layout {layout}: GPU {i}: some instances have a start, others not")
    placed: list[Planned] = []
    live: list[MigInstance] = []
    for s in sorted(t.slices, key=lambda s: s.start or 0):
        prof = by_name[s.profile]
        try:
            plan_gpu_instance(i, mig_enabled=True, profiles=profiles, instances=live, profile_id=prof.profile_id,
                              start=s.start)
        except MigPlacementError as e:
            raise InputError(f"--layout {layout}: invalid geometry: {e.message}", hint=e.hint) from None
        live.append(MigInstance(profile=prof.name, gi_id=len(live) + 1, ci_id=0, start=s.start or 0, uuid=""))
        placed.append(Planned(prof.name, prof.profile_id, s.start or 0))
    return placed


def same_profiles(a: Mapping[str, list], b: Mapping[str, list], *, placements: bool = False) -> bool:
    """Whether two layouts of the state file (GPU -> placed instances as dicts) hold the same profiles on
    the same GPUs (and, with ``placements``, at the same starts)."""
    def key(layout: Mapping[str, list]) -> dict:
        return {i: sorted((d["profile"], d["start"] if placements else 0) for d in v) for i, v in layout.items()}

    return key(a) == key(b)


def label(instances: Sequence[Planned]) -> str:
    """``1g.10gb@0 1g.10gb@1 ...`` or ``none``."""
    return " ".join(f"{p.profile}@{p.start}" for p in instances) or "none"


def changes(current: Sequence[Planned], target: Sequence[Planned]) -> tuple[list[Planned], list[Planned]]:
    """What turns ``current`` into ``target``: the instances to destroy, then those to create (by start)."""
    keep = list(target)
    destroy = []
    for c in current:
        match = next((t for t in keep if t.profile == c.profile and t.start == c.start), None)
        if match is None:
            destroy.append(c)
        else:
            keep.remove(match)
    return destroy, sorted(keep, key=lambda p: p.start)


# --- Slurm --------------------------------------------------------------------------------------


class SlurmOps(Protocol):
    """The Slurm calls apply makes (the real ones: :class:`CommandSlurm`; tests record them)."""

    def node(self, node: str) -> NodeState:
        """``scontrol show node NODE``; InputError for an unknown node."""

    def drain(self, node: str, reason: str) -> None:
        """Drain with ``reason``."""

    def resume(self, node: str) -> None:
        """Resume."""

    def gpu_jobs(self, node: str) -> list[str]:
        """Job ids with GPU GRES running on the node."""

    def stop_slurmd(self, node: str) -> None:
        """Stop the node's slurmd (nothing when it is stopped)."""

    def start_slurmd(self, node: str) -> None:
        """Start the node's slurmd."""

    def restart_slurmctld(self) -> None:
        """Make slurmctld read slurm.conf and gres.conf anew (a restart, or ``scontrol reconfigure``)."""


@dataclass
class CommandSlurm:
    """:class:`SlurmOps` through the Slurm clients (:mod:`slurm_gpushare.slurm.commands`) and the site's
    commands that stop and start the node's slurmd and restart slurmctld (``{node}`` is replaced by the
    node name). ``restart_slurmctld`` None: ``scontrol reconfigure``, which restarts slurmctld from 23.11 on."""

    stop_command: str = "systemctl stop slurmd"
    start_command: str = "systemctl start slurmd"
    restart_slurmctld_command: str | None = None

    def node(self, node: str) -> NodeState:
        """``scontrol show node NODE`` (commands.show_node).

        Raises:
            InputError: Slurm knows no such node.
            SlurmError: scontrol failed otherwise.
        """
        try:
            return parse_node(commands.show_node(node))
        except SlurmError as e:
            if "not found" in e.message.lower() or "invalid node name" in e.message.lower():
                said = e.message.split(": ", 1)[-1]
                raise InputError(f"node {node} is not in Slurm (scontrol show node: {said}): give a node name "
                                 "from sinfo") from None
            raise

    def drain(self, node: str, reason: str) -> None:
        """commands.drain_node."""
        commands.drain_node(node, reason)

    def resume(self, node: str) -> None:
        """commands.resume_node."""
        commands.resume_node(node)

    def gpu_jobs(self, node: str) -> list[str]:
        """The jobs that hold GPU GRES (``gpu``, ``shard``) on the node as slurmctld allocated them, whatever
        form they asked them in (``--gres``, ``--gpus``, ``--gpus-per-node``, ``--gpus-per-task``, a
        gpushare request): each job with an allocation there (commands.running_jobs, COMPLETING included)
        whose allocated GRES on the node (``gres_detail`` of commands.job_record) has one; a job whose record
        cannot be read counts. When no job does but the node's ``GresUsed=`` (commands.show_node) still
        shows GPU GRES in use, that (``GresUsed=...``) is returned instead: the node is not idle yet.

        Raises:
            SlurmError: squeue or scontrol failed.
        """
        from slurm_gpushare.slurm.job import parse_gres_detail, parse_job_json
        from slurm_gpushare.slurm.release import SCONTROL_JSON

        jobs = commands.running_jobs(node)
        release = commands.local_release()
        # before 23.02 the record is the whole job table (squeue --json): read it once
        table = commands.job_record(jobs[0], release=release) if jobs and release < SCONTROL_JSON else None
        found = []
        for job in jobs:
            try:
                info = parse_job_json(table if table is not None else commands.job_record(job, release=release), job)
            except GpushareError:
                found.append(job)  # ended meanwhile, or unreadable: not known to be idle
                continue
            if any(it.name in _GPU_GRES and (it.count or 0) > 0 for it in info.gres_on(node)):
                found.append(job)
        if found:
            return sorted(found, key=lambda j: (len(j), j))
        gres_used = parse_node(commands.show_node(node)).gres_used
        try:
            used = [it for it in parse_gres_detail(gres_used) if it.name in _GPU_GRES and (it.count or 0) > 0] \
                if gres_used else []
        except InputError:
            used = []
        return [f"(GresUsed={gres_used})"] if used else []

    def stop_slurmd(self, node: str) -> None:
        """Run the stop command (``--stop-slurmd``).

        Raises:
            SlurmError: it failed or took more than 120 s.
        """
        commands.site_command(self.stop_command, node, "--stop-slurmd")

    def start_slurmd(self, node: str) -> None:
        """Run the start command (``--start-slurmd``).

        Raises:
            SlurmError: it failed or took more than 120 s.
        """
        commands.site_command(self.start_command, node, "--start-slurmd")

    def restart_slurmctld(self) -> None:
        """Run ``--restart-slurmctld``, or ``scontrol reconfigure`` without one.

        Raises:
            SlurmError: it failed.
        """
        if self.restart_slurmctld_command is None:
            commands.reconfigure()
        else:
            commands.site_command(self.restart_slurmctld_command, "", "--restart-slurmctld")


#: How many polls in a row (``poll_s`` apart) slurmctld must show the node responding before apply goes on.
STEADY_POLLS = 3


# --- files --------------------------------------------------------------------------------------


def with_instances(machine: Machine, port: NvmlPort) -> Machine:
    """``machine`` with each MIG GPU's instances as NVML reports them now (``NvmlPort.gpu_instances``)."""
    gpus = []
    for g in machine.gpus:
        if g.mig_enabled:
            g = replace(g, mig_instances=tuple(port.gpu_instances(g.index)))
        gpus.append(g)
    return replace(machine, gpus=tuple(gpus))


def _write_keeping_mode(path: Path, text: str) -> bool:
    """Replace ``path`` whole with ``text`` (not when it holds it already), keeping its mode; a symbolic link
    stays one: the file it points to is replaced, atomically, in that file's directory."""
    target = Path(os.path.realpath(path))
    try:
        if target.read_text() == text:
            return False
        mode: int | None = target.stat().st_mode & 0o7777
    except FileNotFoundError:
        mode = None
    write_atomic(target, text, mode=mode)
    return True


#: Where slurmd keeps the files it fetched from slurmctld on a configless node (slurm.conf(5)
#: ``SlurmctldParameters=enable_configless``; slurmd writes them under ``<SlurmdSpoolDir>/conf-cache``, and links
#: ``/run/slurm/conf`` to it): rewriting them changes nothing slurmctld reads, and slurmd replaces them.
CONFIGLESS_DIRS = ("conf-cache", "/run/slurm/conf")


def check_config_file(path: Path, what: str, option: str) -> str:
    """The text of a file apply rewrites, checked before anything changes.

    Raises:
        InputError: missing (a configless node has none of its own), a copy slurmd fetched on a configless
            node, not a regular file, or its directory not writable.
    """
    real = os.path.realpath(path)
    if "conf-cache" in Path(real).parts or real.startswith(CONFIGLESS_DIRS[1] + "/") or \
            str(path).startswith(CONFIGLESS_DIRS[1] + "/"):
        raise InputError(f"{what} {path} is slurmd's copy from slurmctld (configless): rewriting it changes "
                         "nothing slurmctld reads", hint=f"give the file slurmctld reads with {option} (run mig "
                         "apply where it can write it, e.g. a shared /etc/slurm)")
    try:
        text = Path(real).read_text()
    except FileNotFoundError:
        raise InputError(f"{what} {path} does not exist (a configless node has none: slurmd fetches it from "
                         "slurmctld)", hint=f"give the {what} slurmctld reads with {option}, or write one "
                         "first (slurm-gpushare gres-conf)") from None
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"{what} {path} cannot be read: {e}", hint=f"give a readable {what} with {option}") from None
    if not os.access(os.path.dirname(real), os.W_OK):
        raise InputError(f"{what} {path}: its directory {os.path.dirname(real)} is not writable here",
                         hint="run mig apply as root, on a host that can write it")
    return text


# --- the state machine --------------------------------------------------------------------------


@dataclass
class Apply:
    """One ``mig apply`` of one node (see the module docstring).

    Attributes:
        node: Slurm node name.
        layout: the layout file (for messages and the drain reason).
        targets: the node's GPUs as the layout wants them (:func:`read_layout`).
        machine_path: the node's machine description (node.toml ``machine``).
        state_path: the state file.
        gres_conf, slurm_conf: the files to rewrite.
        gres_options: how gres.conf is rendered (device dir, shard unit, release).
        run_dir: the node's run directory (MPS daemons).
        slurm: the Slurm calls.
        mps_control: the site's MPS control program (node.toml ``mps_control``): the stop-mps step sends
            ``quit`` with it, never with a program a found process names.
        open_port: a new NVML port (not initialised).
        deadline_s: longest wait for the node's GPU jobs.
        slurm_timeout_s: longest wait for slurmctld to show the new GRES.
        poll_s: seconds between polls.
        out: progress lines.
        sleep, clock: waiting and the time (seconds), injected by tests.
        kill: what the test hook :data:`KILL_ENV` calls (SIGKILL of this process).
    """

    node: str
    layout: str
    targets: dict[int, GpuTarget]
    machine_path: Path
    state_path: Path
    gres_conf: Path
    slurm_conf: Path
    gres_options: GresOptions
    run_dir: Path
    slurm: SlurmOps
    open_port: Callable[[], NvmlPort]
    mps_control: str = "/usr/bin/nvidia-cuda-mps-control"
    deadline_s: float = 3600.0
    slurm_timeout_s: float = 120.0
    poll_s: float = 2.0
    out: Callable[[str], None] = field(default=lambda line: print(line, file=sys.stderr))
    sleep: Callable[[float], None] = time.sleep
    clock: Callable[[], float] = time.time
    kill: Callable[[], None] = field(default=lambda: os.kill(os.getpid(), signal.SIGKILL))
    _changes: int = field(default=0, init=False)

    # --- state file ---

    def read_state(self) -> dict | None:
        """The saved state, or None when no apply of the node is in progress.

        Raises:
            InputError: unreadable, or of another node.
        """
        try:
            data = json.loads(self.state_path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:
            raise InputError(f"state file {self.state_path} cannot be read: {e}",
                             hint="look at it; it records an apply that was interrupted") from None
        if data.get("version") != STATE_VERSION or data.get("node") != self.node:
            raise InputError(f"state file {self.state_path} is not an apply of {self.node}",
                             hint="give --state-dir of this node's apply")
        return data

    def _save(self, state: dict) -> None:
        state["updated"] = self.clock()
        self.state_path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(self.state_path, json.dumps(state, indent=2) + "\n", mode=0o644)

    def _mark(self, state: dict, step: str, status: str) -> None:
        state["step"], state["status"] = step, status
        self._save(state)
        if status == "done" and os.environ.get(KILL_ENV) == step:
            self.kill()

    @contextlib.contextmanager
    def locked(self) -> Iterator[Path]:
        """Hold the node's apply lock while the block runs: ``flock(2)`` ``LOCK_EX`` on :data:`LOCK_NAME` beside
        the state file, which then holds this process's pid (a killed apply's lock goes with its process).

        Raises:
            InputError: another apply of the node holds it (its pid is named).
        """
        path = self.state_path.with_name(LOCK_NAME)
        path.parent.mkdir(parents=True, exist_ok=True)
        with locked(path, wait=False, mode=0o644, nofollow=True) as fd:
            if fd is None:
                try:
                    holder = read_own_file(path, max_bytes=32).decode(errors="replace").strip() or "unknown"
                except OSError:
                    holder = "unknown"
                raise InputError(f"another mig apply of {self.node} is running (pid {holder}, lock {path})",
                                 hint="wait for it to end; if it was interrupted, rerun the same command")
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
            yield path

    def _changed(self) -> None:
        self._changes += 1
        if os.environ.get(KILL_ENV) == f"mig-change:{self._changes}":
            self.kill()

    # --- plan ---

    def _machine(self) -> Machine:
        return Machine.load(self.machine_path)

    def prepare(self) -> dict:
        """A new state (not saved): node checked, target resolved, old layout read.

        Raises:
            InputError: unknown node, layout for another model, invalid geometry, MIG mode change, a
                gres.conf or slurm.conf the files step could not rewrite (:meth:`check_files`).
        """
        node_state = self.slurm.node(self.node)
        machine = self._machine()
        with self.open_port() as port:
            self._check_host(port, machine)
            target = resolve(port, machine, self.targets, self.layout)
            old = current_layout(port, sorted(target))
            self.check_files(with_instances(machine, port))
        prior = node_state.reason if node_state.drained and not (node_state.reason or "").startswith(REASON_PREFIX) \
            else None
        return {
            "version": STATE_VERSION, "node": self.node, "layout": self.layout, "started": self.clock(),
            "reason": f"{REASON_PREFIX} to {Path(self.layout).name}, state {self.state_path}",
            "drained_by_other": prior,
            "old": {str(i): [p.to_dict() for p in v] for i, v in old.items()},
            "target": {str(i): [p.to_dict() for p in v] for i, v in target.items()},
            "step": None, "status": None, "goal": "target",
        }

    def check_files(self, machine: Machine) -> None:
        """Whether the files step can rewrite gres.conf and slurm.conf for the node, found before the drain:
        both files there, not slurmd's configless copies, writable, the node's lines its own (no hostlist
        line naming it with others, no ``Include`` that may hold them, no ``Name=gpu`` line for every node).
        The lines rendered from ``machine`` (today's layout) define the GRES names the new ones will.

        Raises:
            InputError: what is wrong, and what to do.
        """
        gres_text = check_config_file(self.gres_conf, "gres.conf", "--gres-conf")
        slurm_text = check_config_file(self.slurm_conf, "slurm.conf", "--slurm-conf")
        block, gres_value = self._gres_block(machine)
        replace_gres_lines(gres_text, self.node, block, source=str(self.gres_conf))
        replace_slurm_gres(slurm_text, self.node, gres_value, source=str(self.slurm_conf))

    def _gres_block(self, machine: Machine) -> tuple[list[str], str]:
        node = generate_node_gres(machine, self.node, self.gres_options)
        origin = machine.source or "machine description"
        block = [f"# {self.node}: {len(machine.gpus)} GPU(s), from {origin}; MIG layout by slurm-gpushare mig apply",
                 *[f"# {note}" for note in node.notes], *[r.render(self.node) for r in node.records]]
        return block, node.gres_value

    def _check_host(self, port: NvmlPort, machine: Machine) -> None:
        if port.device_count() != len(machine.gpus):
            raise InputError(f"NVML sees {port.device_count()} GPUs here, {self.machine_path} describes "
                             f"{len(machine.gpus)}", hint=f"run mig apply on {self.node} itself")
        for g in machine.gpus:
            if g.uuid and port.uuid(g.index) != g.uuid:
                raise InputError(f"GPU {g.index} here is {port.uuid(g.index)}, {self.machine_path} says {g.uuid}",
                                 hint=f"run mig apply on {self.node} itself, or refresh its description "
                                      "(slurm-gpushare inventory)")

    @staticmethod
    def _layout(state: dict, key: str) -> dict[int, list[Planned]]:
        return {int(i): [Planned.from_dict(d) for d in v] for i, v in state[key].items()}

    def describe(self, state: dict) -> list[str]:
        """The steps a run from ``state`` would take, in words (``--dry-run``)."""
        target, old = self._layout(state, "target"), self._layout(state, "old")
        lines = []
        if state.get("drained_by_other"):
            lines.append(f"drain: {self.node} is drained already ({state['drained_by_other']}): left to its owner")
        else:
            lines.append(f"drain: scontrol update nodename={self.node} state=drain reason=\"{state['reason']}\"")
        lines.append(f"wait-jobs: until no GPU job runs on {self.node} (at most {self.deadline_s:g} s; then resume, "
                     "layout unchanged)")
        lines.append(f"stop-mps: the MPS daemons under {self.run_dir}")
        for i in sorted(target):
            destroy, create = changes(old[i], target[i])
            lines.append(f"mig: GPU {i}: {label(old[i])} -> {label(target[i])} (destroy {label(destroy)}; "
                         f"create {label(create)})")
        lines.append(f"files: {self.machine_path}, {self.gres_conf} ({self.node}'s lines), {self.slurm_conf} "
                     f"(NodeName={self.node} Gres=)")
        lines.append(f"slurm: stop slurmd of {self.node}, restart slurmctld (or scontrol reconfigure), start slurmd, "
                     f"wait for its new Gres= (at most {self.slurm_timeout_s:g} s)")
        lines.append(f"resume: scontrol update nodename={self.node} state=resume (only while the reason is ours)")
        return lines

    # --- run ---

    def run(self, state: dict) -> dict:
        """Run from ``state`` (a new one from :meth:`prepare`, or the saved one) to the end.

        Returns:
            The final state (``goal`` ``target``, or ``old`` when the target could not be made).

        Raises:
            ApplyError: jobs past the deadline (drain undone), the target refused by NVML (old layout
                restored, node resumed), Slurm not taking the change (node left drained, state kept).
        """
        if state.get("goal") == "undone":  # killed while giving up at the deadline: finish that
            self._undo(state)
            raise ApplyError(f"the apply recorded in {self.state_path} had given up waiting for {self.node}'s GPU "
                             "jobs: drain undone, layout unchanged", hint="rerun mig apply to try again")
        start = 0 if state["step"] is None else STEPS.index(state["step"]) + (state["status"] == "done")
        if state["step"] is not None and STEPS.index("wait-jobs") < start < STEPS.index("resume"):
            self._recheck(state)
        for step in STEPS[start:]:
            self._mark(state, step, "doing")
            self.out(f"mig apply {self.node}: {step}")
            getattr(self, "_" + step.replace("-", "_"))(state)
            self._mark(state, step, "done")
        self._finish(state)
        if state.get("goal") == "old":
            raise ApplyError(f"{state.get('error')}: the old layout was restored and {self.node} resumed",
                             hint="plan a layout this GPU accepts (mig plan), then apply it")
        return state

    def _finish(self, state: dict) -> None:
        last = self.state_path.with_name(LAST_NAME)
        write_atomic(last, json.dumps(state, indent=2) + "\n", mode=0o644)
        self.state_path.unlink(missing_ok=True)

    def _drain(self, state: dict) -> None:
        if state.get("drained_by_other"):
            return
        now = self.slurm.node(self.node)
        if now.drained and now.reason == state["reason"]:
            return
        self.slurm.drain(self.node, state["reason"])

    def _wait_jobs(self, state: dict) -> None:
        since = state.setdefault("wait_since", self.clock())
        self._save(state)
        while True:
            jobs = self._gpu_jobs(state)
            if not jobs:
                return
            if self.clock() - since >= self.deadline_s:
                self._undo(state)
                raise ApplyError(
                    f"{self.node} still runs GPU job(s) {', '.join(jobs)} after {self.deadline_s:g} s: layout "
                    f"unchanged, {'drain undone' if not state.get('drained_by_other') else 'node left drained'}",
                    hint="rerun with a longer --deadline, or when those jobs have ended")
            self.sleep(self.poll_s)

    def _gpu_jobs(self, state: dict) -> list[str]:
        """The node's GPU jobs now; the state file records them (``waiting_for``) when they change."""
        jobs = self.slurm.gpu_jobs(self.node)
        if jobs != state.get("waiting_for", []):
            state["waiting_for"] = jobs
            self._save(state)
            if jobs:
                self.out(f"mig apply {self.node}: waiting for GPU job(s) {', '.join(jobs)}")
        return jobs

    def _undo(self, state: dict) -> None:
        """Deadline passed: the layout is untouched; resume the node when the drain is ours, forget the state.

        In this order, each step safe to be killed after: ``goal`` ``undone`` recorded (a rerun finishes the
        undo, never goes on to the GPUs), the resume, the state file moved to ``mig-apply.last.json``. The
        other order would leave a resumed node whose state file says apply is still waiting to change it.
        """
        state["goal"] = "undone"
        self._save(state)
        if os.environ.get(KILL_ENV) == "undo":
            self.kill()
        now = self.slurm.node(self.node)
        if not state.get("drained_by_other") and now.drained and now.reason == state["reason"]:
            self.slurm.resume(self.node)
        self._finish(state)

    def _recheck(self, state: dict) -> None:
        """A rerun that continues past ``wait-jobs``: before the GPUs are touched (again), the node is drained
        (again, with apply's reason, when someone resumed it meanwhile: apply then owns the drain) and no
        GPU job runs there (waited for at most ``deadline`` seconds from now).

        Raises:
            ApplyError: GPU jobs still run after the deadline (the node stays drained, the state kept).
        """
        now = self.slurm.node(self.node)
        if not now.drained:
            self.out(f"mig apply {self.node}: the node was resumed meanwhile ({now.state}): draining it again")
            state["drained_by_other"] = None
            self._save(state)
            self.slurm.drain(self.node, state["reason"])
        since = self.clock()
        while jobs := self._gpu_jobs(state):
            if self.clock() - since >= self.deadline_s:
                raise ApplyError(f"{self.node} runs GPU job(s) {', '.join(jobs)} again (it was resumed during the "
                                 f"apply): nothing more changed, the node stays drained",
                                 hint=f"rerun when they have ended; {self.state_path} records the apply")
            self.sleep(self.poll_s)

    def _stop_mps(self, state: dict) -> None:
        from slurm_gpushare.node.daemons import stop_all

        problems = stop_all(self.run_dir, control_binary=self.mps_control)
        if problems:
            raise ApplyError("; ".join(problems), hint="stop them by hand, then rerun mig apply (the node stays "
                                                       "drained, the state file says why)")

    def _mig(self, state: dict) -> None:
        goal = state.get("goal", "target")
        with self.open_port() as port:
            try:
                self._make(port, self._layout(state, "target" if goal == "target" else "old"))
                return
            except (MigPlacementError, NvmlError) as e:
                if goal != "target":
                    raise ApplyError(f"restoring the old layout failed too: {e.message}",
                                     hint="the node stays drained; fix the GPU, then rerun") from None
                state["goal"], state["error"] = "old", f"the target layout was refused: {e.message}"
                self._save(state)
                self.out(f"mig apply {self.node}: {state['error']}; restoring the old layout")
            try:
                self._make(port, self._layout(state, "old"))
            except (MigPlacementError, NvmlError) as e:
                raise ApplyError(f"{state['error']}, and restoring the old layout failed: {e.message}",
                                 hint="the node stays drained; fix the GPU, then rerun") from None

    def _make(self, port: NvmlPort, want: dict[int, list[Planned]]) -> None:
        for i in sorted(want):
            current = current_layout(port, [i])[i]
            destroy, create = changes(current, want[i])
            gis = {inst.start: inst.gi_id for inst in port.gpu_instances(i)}
            for p in destroy:
                port.destroy_gpu_instance(i, gis[p.start])
                self.out(f"  GPU {i}: destroyed {p.profile} at {p.start}")
                self._changed()
            for p in create:
                port.create_gpu_instance(i, p.profile_id, p.start)
                self.out(f"  GPU {i}: created {p.profile} at {p.start}")
                self._changed()

    def _files(self, state: dict) -> None:
        machine = self._machine()
        with self.open_port() as port:
            machine = with_instances(machine, port)
        block, gres_value = self._gres_block(machine)
        gres_text = replace_gres_lines(check_config_file(self.gres_conf, "gres.conf", "--gres-conf"), self.node,
                                       block, source=str(self.gres_conf))
        slurm_text = replace_slurm_gres(check_config_file(self.slurm_conf, "slurm.conf", "--slurm-conf"), self.node,
                                        gres_value, source=str(self.slurm_conf))
        _write_keeping_mode(self.machine_path, machine.to_json())
        state["gres"] = gres_value
        self._save(state)
        for path, text in ((self.gres_conf, gres_text), (self.slurm_conf, slurm_text)):
            if _write_keeping_mode(path, text):
                self.out(f"  wrote {path}")

    def _slurm(self, state: dict) -> None:
        before = state.setdefault("slurmd_start_before", self.slurm.node(self.node).slurmd_start)
        self._save(state)
        # slurmd stopped first: the old one cannot register its old GRES with a slurmctld that reads the new
        # slurm.conf (which drains the node with Slurm's reason, "gres/gpu count reported lower than configured")
        self.slurm.stop_slurmd(self.node)
        self.slurm.restart_slurmctld()
        self._wait(lambda: self.slurm.node(self.node), "slurmctld answering after its restart",
                   lambda: "scontrol show node fails")
        self.slurm.start_slurmd(self.node)

        def taken() -> bool:
            now = self.slurm.node(self.node)
            return gres_matches(now.gres, state["gres"]) and now.slurmd_start != before and responding(now.state)

        def seen() -> str:
            try:
                now = self.slurm.node(self.node)
            except GpushareError as e:
                return str(e)
            return f"it shows Gres={now.gres}, State={now.state}, Reason={now.reason}"

        self._wait(taken, f"slurmctld showing {self.node} with Gres={state['gres']} from a restarted slurmd", seen)
        self._wait_responding(seen)

    def _wait_responding(self, seen: Callable[[], str]) -> None:
        """Wait (``slurm_timeout_s``) until slurmctld shows the node responding on :data:`STEADY_POLLS` polls in a
        row: after a slurmctld restart a node that had registered may show ``NOT_RESPONDING`` for a few seconds."""
        steady = 0

        def steadily() -> bool:
            nonlocal steady
            steady = steady + 1 if responding(self.slurm.node(self.node).state) else 0
            return steady >= STEADY_POLLS

        self._wait(steadily, f"{self.node} responding on {STEADY_POLLS} polls in a row (State= without "
                   "NOT_RESPONDING)", seen)

    def _wait(self, cond: Callable[[], object], what: str, seen: Callable[[], str]) -> None:
        since = self.clock()
        while True:
            try:
                if cond():
                    return
            except SlurmError:
                pass  # slurmctld restarting
            if self.clock() - since >= self.slurm_timeout_s:
                raise ApplyError(f"no {what} after {self.slurm_timeout_s:g} s ({seen()})",
                                 hint=f"look at the slurmd and slurmctld logs; {self.node} stays drained and the "
                                      f"state file {self.state_path} says why; rerun mig apply to try again")
            self.sleep(self.poll_s)

    def _resume(self, state: dict) -> None:
        if state.get("drained_by_other"):
            self.out(f"mig apply {self.node}: drained by someone else before ({state['drained_by_other']}): "
                     "left drained")
            return
        now = self.slurm.node(self.node)
        if not now.drained:
            return
        if now.reason != state["reason"]:
            state["left_drained"] = now.reason
            self.out(f"mig apply {self.node}: the drain reason is now {now.reason!r}, not ours: left drained")
            return
        self.slurm.resume(self.node)

