"""The MIG layout ``mig apply`` is given, read and checked: a ``layout.json`` (``mig plan``'s) or a mig-parted
config (:func:`read_layout`), the GPU instances a GPU holds now (:func:`current_layout`), the target placed
with the GPU's profiles (:func:`resolve`) and what changes (:func:`changes`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from slurm_gpushare.errors import InputError, MigPlacementError, NvmlError
from slurm_gpushare.hardware.machine import Machine, MigInstance, MigProfile
from slurm_gpushare.hardware.port import NvmlPort, plan_gpu_instance
from slurm_gpushare.mig.geometry import enumerate_geometries
from slurm_gpushare.mig.output import LAYOUT_VERSION
from slurm_gpushare.textdoc import kind, parse_json, parse_yaml


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
