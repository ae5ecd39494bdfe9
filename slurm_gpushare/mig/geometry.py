"""MIG geometries: every set of GPU instances one GPU can hold at once, with concrete placements.

A geometry is a multiset of GPU instance profiles with one placement each, such that creating them in
the listed order (ascending start) is accepted by the MIG placement rules: those of
:func:`slurm_gpushare.hardware.port.plan_gpu_instance`, which both NVML ports apply before calling
``nvmlDeviceCreateGpuInstanceWithPlacement`` (the profile is offered, fewer than ``max_instances`` of it
exist, the placement is one of ``nvmlDeviceGetGpuInstancePossiblePlacements`` and overlaps no live
instance's memory slices). Enumeration calls that function for every step, so there is one set of rules.

Two placed sets with the same multiset of profiles serve the same requests, so a geometry is one
multiset, with the first placed set found for it (starts as low as possible, in profile order); the
number of placed sets is kept too (:class:`Enumeration`). The empty set is not a geometry: a GPU with
nothing to run is "MIG off" in a plan.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from slurm_gpushare.errors import MigPlacementError
from slurm_gpushare.hardware.machine import MigInstance, MigProfile
from slurm_gpushare.hardware.port import plan_gpu_instance


@dataclass(frozen=True)
class Placed:
    """One GPU instance of a geometry.

    Attributes:
        profile: its profile (as the NVML port serves it).
        start: first memory slice.
        size: memory slices.
    """

    profile: MigProfile
    start: int
    size: int


@dataclass(frozen=True)
class Geometry:
    """GPU instances that fit one GPU together, in creation order (ascending start).

    Attributes:
        instances: the placed instances.
    """

    instances: tuple[Placed, ...]

    @property
    def counts(self) -> dict[str, int]:
        """Profile name -> instances of it, in creation order (the ``mig-devices`` of mig-parted)."""
        return dict(Counter(p.profile.name for p in self.instances))

    @property
    def memory_slices_used(self) -> int:
        """Memory slices the instances cover."""
        return sum(p.size for p in self.instances)

    @property
    def compute_slices_used(self) -> int:
        """Compute slices the instances hold."""
        return sum(p.profile.slices for p in self.instances)

    def label(self) -> str:
        """``3g.40gb + 2x 1g.10gb`` style text, largest first."""
        counts = Counter(p.profile.name for p in self.instances)
        order = sorted(counts, key=lambda n: (-_slices_of(self, n), n))
        return " + ".join(f"{counts[n]}x {n}" if counts[n] > 1 else n for n in order)


def _slices_of(g: Geometry, name: str) -> int:
    return next(p.profile.slices for p in g.instances if p.profile.name == name)


@dataclass(frozen=True)
class Enumeration:
    """The geometries of one GPU's profiles.

    Attributes:
        geometries: one per distinct multiset of profiles.
        placed_sets: how many distinct placed sets (profile and start per instance) the rules accept.
    """

    geometries: tuple[Geometry, ...]
    placed_sets: int


def enumerate_geometries(profiles: tuple[MigProfile, ...] | list[MigProfile], *, gpu: int = 0) -> Enumeration:
    """Every non-empty geometry the placement rules accept for a GPU with these profiles.

    Depth first over ``(profile, placement)`` steps with non-decreasing start (every placed set is
    reached once, in ascending start), each step checked by
    :func:`~slurm_gpushare.hardware.port.plan_gpu_instance` against the instances placed before it.

    Args:
        profiles: the GPU's profiles with placements (``NvmlPort.gpu_instance_profiles`` or a table of
            :mod:`slurm_gpushare.hardware.migtables`).
        gpu: NVML index, for messages only.

    Returns:
        The geometries, in the order found, and the number of placed sets.

    Raises:
        MigPlacementError: a profile without placements (the rules cannot be applied).
    """
    for p in profiles:
        if not p.placements:
            raise MigPlacementError(f"GPU {gpu}: MIG profile {p.name} has no placements",
                                    hint="NVML reports them with MIG on ('nvidia-smi mig -lgipp'); a machine "
                                         "description must list them")
    steps = sorted(((pl[0], k, p, pl) for k, p in enumerate(profiles) for pl in p.placements),
                   key=lambda s: (s[0], s[1]))
    seen: dict[tuple[str, ...], Geometry] = {}
    placed_sets = 0
    live: list[MigInstance] = []
    chosen: list[Placed] = []

    def walk(first: int) -> None:
        nonlocal placed_sets
        for i in range(first, len(steps)):
            start, _k, profile, placement = steps[i]
            try:
                plan_gpu_instance(gpu, mig_enabled=True, profiles=profiles, instances=live,
                                  profile_id=profile.profile_id, start=start)
            except MigPlacementError:
                continue
            live.append(MigInstance(profile=profile.name, gi_id=len(live) + 1, ci_id=0, start=start, uuid=""))
            chosen.append(Placed(profile=profile, start=start, size=placement[1]))
            placed_sets += 1
            key = tuple(sorted(p.profile.name for p in chosen))
            if key not in seen:
                seen[key] = Geometry(instances=tuple(chosen))
            walk(i + 1)
            live.pop()
            chosen.pop()

    walk(0)
    return Enumeration(geometries=tuple(seen.values()), placed_sets=placed_sets)
