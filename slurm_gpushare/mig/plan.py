"""Choosing a MIG geometry (or MIG off) for every GPU from a demand: the objective and the search.

The model (docs/mig.md, "The objective"). A layout turns each GPU into slots: every GPU instance of
its geometry is one slot (its profile's memory, as the site policy's ``mig.fit`` counts it, and its
compute slices); a GPU with MIG off is one whole-GPU slot. The demand (:mod:`slurm_gpushare.mig.demand`)
is the mean number of requests of each size running at once. Requests are assigned to slots largest
first, each to the smallest free slot that holds it (memory, and the compute slices its ``sm=`` asks,
rounded up to whole slices); whole-GPU requests take MIG-off GPUs first. Then, in MiB and compute
slices:

- **stranded memory**: what assigned requests leave unused inside their slots, plus the memory slices
  of MIG GPUs that no instance covers (7x ``1g.10gb`` leaves 1 of 8); idle slots strand nothing, they
  wait for the next request;
- **stranded compute**: the compute slices no instance covers (4x ``1g.20gb`` leaves 3 of 7), plus
  those a request with ``sm=`` did not ask for;
- **unserved**: requests no slot holds, each counted as the share of a GPU it needs, the larger of its
  memory over ``M`` and its compute slices over ``C`` (at least one slice: a 1G request left out counts
  1/7 of a GPU, not 1/80), and whole-GPU requests without a MIG-off GPU.

The objective, minimised: ``w_memory * stranded_mib / M + w_compute * stranded_slices / C + w_unserved *
unserved_gpus + w_whole * unserved_whole_gpus``, where ``M`` and ``C`` are the memory and compute slices
of the layout's largest GPU (so each term is in GPUs) and the weights are the site's (:class:`Weights`).

The search. Per GPU, every geometry of its profiles (:func:`~slurm_gpushare.mig.geometry.enumerate_geometries`,
the placement rules of the NVML port) and MIG off are candidates; candidates that make the same slots
are one (the first without a ``+me`` profile). Across GPUs, coordinate descent: in passes over the
GPUs, each GPU takes the candidate that lowers the objective most with the others fixed, until a
pass changes nothing; it runs from two starts, every GPU MIG off and today's layout, and keeps the
better end. For one GPU this is the exact optimum; for several it is a local one (no single GPU can
improve it), never worse than today's layout.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from slurm_gpushare.errors import InputError
from slurm_gpushare.hardware.machine import Gpu, Machine, MigInstance, MigProfile, nominal_gpu_mib, nominal_profile_mib
from slurm_gpushare.hardware.migtables import (
    MigTable,
    mig_tables,
    recorded_fraction,
    table_for_gpu,
    with_table_profiles,
)
from slurm_gpushare.hardware.port import instance_span
from slurm_gpushare.memsize import format_mib
from slurm_gpushare.mig.demand import Request
from slurm_gpushare.mig.geometry import Geometry, Placed, enumerate_geometries

#: How memory that fits a request is counted, as the site policy's ``mig.fit`` / ``whole_gpu.fit``.
FITS = ("nominal", "exact")
#: Passes of coordinate descent at most (it stops earlier when a pass changes nothing).
MAX_PASSES = 20


@dataclass(frozen=True)
class Weights:
    """The site's weights of the objective's terms (all >= 0).

    Attributes:
        memory: per GPU of stranded memory.
        compute: per GPU of stranded compute slices.
        unserved: per GPU share asked by requests no slot holds (memory or compute slices, the larger).
        whole: per whole-GPU request without a MIG-off GPU.
    """

    memory: float = 1.0
    compute: float = 1.0
    unserved: float = 4.0
    whole: float = 4.0

    def check(self) -> None:
        """Raises InputError when a weight is negative or not finite."""
        for name in ("memory", "compute", "unserved", "whole"):
            v = getattr(self, name)
            if not math.isfinite(v) or v < 0:
                raise InputError(f"--weight-{name} {v} must be a number >= 0",
                                 hint="weights say how much each term counts; 0 leaves it out")


@dataclass(frozen=True)
class Slot:
    """What one GPU instance (or a MIG-off GPU) offers a request.

    Attributes:
        mem_mib: memory that holds a request (as the fit counts it).
        slices: compute slices.
        gpu_slices: compute slices of the whole GPU (to round ``sm=`` to slices).
        whole: a MIG-off GPU.
    """

    mem_mib: int
    slices: int
    gpu_slices: int
    whole: bool = False

    def slices_for(self, sm_percent: int | None) -> int:
        """Compute slices a request asking ``sm_percent`` of a GPU needs here (0 when it asks none)."""
        return math.ceil(sm_percent * self.gpu_slices / 100) if sm_percent is not None else 0


@dataclass(frozen=True)
class Score:
    """A layout judged against a demand (weights in :class:`Weights`; quantities are mean concurrency).

    Attributes:
        asked: requests asked at once (sum of the weights).
        served: of them, those a slot holds.
        stranded_mem_mib: stranded memory, MiB.
        stranded_slices: stranded compute slices.
        unserved_mem_mib: memory of the memory requests no slot holds, MiB.
        unserved_whole: whole-GPU requests without a MIG-off GPU.
        objective: the weighted sum (lower is better).
    """

    asked: float
    served: float
    stranded_mem_mib: float
    stranded_slices: float
    unserved_mem_mib: float
    unserved_whole: float
    objective: float


@dataclass(frozen=True)
class Candidate:
    """One choice for one GPU: a geometry, or None for MIG off, with what it makes.

    Attributes:
        geometry: the GPU instances, or None (MIG off).
        slots: its slots.
        uncovered_mib: memory of the memory slices no instance covers, MiB.
        uncovered_slices: compute slices no instance holds.
    """

    geometry: Geometry | None
    slots: tuple[Slot, ...]
    uncovered_mib: float
    uncovered_slices: int

    @property
    def label(self) -> str:
        """``MIG off`` or the geometry's label."""
        return "MIG off" if self.geometry is None else self.geometry.label()

    @property
    def media(self) -> int:
        """How many ``+me`` (or other suffixed) profiles it uses (ties prefer fewer)."""
        return 0 if self.geometry is None else sum("+" in p.profile.name for p in self.geometry.instances)


@dataclass(frozen=True)
class GpuPlan:
    """The plan of one GPU.

    Attributes:
        node: the node name.
        gpu: the GPU as described, with the profiles the plan used.
        today: its layout now.
        choice: the planned one.
    """

    node: str
    gpu: Gpu
    today: Candidate
    choice: Candidate


@dataclass(frozen=True)
class Plan:
    """A plan for every GPU of the given machines.

    Attributes:
        gpus: per GPU, in node and index order.
        today: today's layout judged against the demand.
        planned: the planned layout judged against the demand.
        demand: the demand planned for.
        geometries: per GPU model table (or GPU name), ``(geometries, placed sets)`` enumerated.
        passes: coordinate-descent passes run (both starts together).
        notes: what the reader of an exact plan must know: profiles planned with an estimated size.
    """

    gpus: tuple[GpuPlan, ...]
    today: Score
    planned: Score
    demand: tuple[Request, ...]
    geometries: dict[str, tuple[int, int]] = field(default_factory=dict)
    passes: int = 0
    notes: tuple[str, ...] = ()


def _capacity(profile: MigProfile, fit: str) -> int:
    return nominal_profile_mib(profile) if fit == "nominal" else profile.memory_mib


def _gpu_capacity(gpu: Gpu, fit: str) -> int:
    return nominal_gpu_mib(gpu.memory_mib) if fit == "nominal" else gpu.memory_mib


def _shape(profiles: Sequence[MigProfile]) -> tuple[int, int]:
    """(memory slices, compute slices) of a GPU with these profiles."""
    return (max(s + n for p in profiles for s, n in p.placements), max(p.slices for p in profiles))


def candidate(gpu: Gpu, geometry: Geometry | None, fit: str) -> Candidate:
    """The slots and uncovered slices of ``geometry`` (None: MIG off) on ``gpu``."""
    if geometry is None:
        slices = _shape(gpu.mig_profiles)[1] if gpu.mig_profiles else 7
        return Candidate(None, (Slot(_gpu_capacity(gpu, fit), slices, slices, whole=True),), 0.0, 0)
    mem_slices, compute_slices = _shape(gpu.mig_profiles)
    slots = tuple(Slot(_capacity(p.profile, fit), p.profile.slices, compute_slices) for p in geometry.instances)
    uncovered = mem_slices - geometry.memory_slices_used
    return Candidate(geometry, slots, uncovered * _gpu_capacity(gpu, fit) / mem_slices,
                     compute_slices - geometry.compute_slices_used)


def today_geometry(gpu: Gpu) -> Geometry | None:
    """A GPU's live MIG devices as a geometry (one per GPU instance), or None when MIG is off.

    Raises:
        MigPlacementError: an instance whose profile or start the GPU's profiles do not know.
    """
    if not gpu.mig_enabled:
        return None
    by_gi: dict[int, MigInstance] = {}
    for inst in gpu.mig_instances:
        by_gi.setdefault(inst.gi_id, inst)
    placed = []
    for inst in sorted(by_gi.values(), key=lambda i: i.start):
        start, size = instance_span(gpu.index, gpu.mig_profiles, inst)
        profile = next(p for p in gpu.mig_profiles if p.name == inst.profile)
        placed.append(Placed(profile=profile, start=start, size=size))
    return Geometry(instances=tuple(placed))


def evaluate(candidates: Sequence[Candidate], demand: Sequence[Request], weights: Weights,
             ref_mib: float, ref_slices: int) -> Score:
    """Judge a layout (one candidate per GPU) against a demand; see the module docstring.

    Args:
        candidates: the layout.
        demand: the requests (merged, any order).
        weights: the objective's weights.
        ref_mib, ref_slices: memory and compute slices of the largest GPU (the unit of the terms).
    """
    free: Counter[Slot] = Counter()
    uncovered_mib = 0.0
    uncovered_slices = 0
    for c in candidates:
        free.update(c.slots)
        uncovered_mib += c.uncovered_mib
        uncovered_slices += c.uncovered_slices
    free_f: dict[Slot, float] = {s: float(n) for s, n in free.items()}
    asked = served = stranded_mib = stranded_slices = unserved_mib = unserved_gpus = unserved_whole = 0.0
    whole_slots = sorted((s for s in free_f if s.whole), key=lambda s: (s.mem_mib, s.slices))
    for r in (r for r in demand if r.whole):
        asked += r.weight
        left = r.weight
        for s in whole_slots:
            take = min(left, free_f[s])
            free_f[s] -= take
            left -= take
        served += r.weight - left
        unserved_whole += left
    order = sorted(free_f, key=lambda s: (s.mem_mib, s.slices, s.whole))
    for r in sorted((r for r in demand if not r.whole), key=lambda r: (-r.mem_mib, -(r.sm_percent or 0))):
        asked += r.weight
        left = r.weight
        for s in order:
            if left <= 0:
                break
            if free_f[s] <= 0 or s.mem_mib < r.mem_mib:
                continue
            need = s.slices_for(r.sm_percent)
            if s.slices < need:
                continue
            take = min(left, free_f[s])
            free_f[s] -= take
            left -= take
            stranded_mib += take * (s.mem_mib - r.mem_mib)
            if r.sm_percent is not None:
                stranded_slices += take * (s.slices - need)
        served += r.weight - left
        unserved_mib += left * r.mem_mib
        need_slices = max(1, math.ceil((r.sm_percent or 0) * ref_slices / 100))
        unserved_gpus += left * max(r.mem_mib / ref_mib, need_slices / ref_slices)
    stranded_mib += uncovered_mib
    stranded_slices += uncovered_slices
    objective = (weights.memory * stranded_mib / ref_mib + weights.compute * stranded_slices / ref_slices
                 + weights.unserved * unserved_gpus + weights.whole * unserved_whole)
    return Score(asked=asked, served=served, stranded_mem_mib=stranded_mib, stranded_slices=stranded_slices,
                 unserved_mem_mib=unserved_mib, unserved_whole=unserved_whole, objective=objective)


def plannable_gpu(gpu: Gpu) -> Gpu:
    """The GPU with MIG profiles to plan with: its own (NVML's, through the port, or its description's),
    else its model's table (:func:`~slurm_gpushare.hardware.migtables.with_table_profiles`)."""
    return with_table_profiles(gpu)


def _table_of(gpu: Gpu) -> MigTable | None:
    """The packaged table a GPU's profiles come from: its model's, when the GPU lists no profiles of its own or
    exactly the table's (``mig plan --model``); None for a GPU whose profiles NVML or its description gave."""
    table = table_for_gpu(gpu)
    return table if table is not None and (not gpu.mig_profiles or gpu.mig_profiles == table.profiles) else None


def _refuse_nominal_tables(machines: Sequence[Machine]) -> None:
    """``fit=exact`` counts what each slice really holds: a GPU whose profiles come from its model's table
    (:func:`_table_of`) cannot be planned that way when the table has only nominal sizes (the size in the profile
    name, more than the slice holds).

    Raises:
        InputError: naming the first such GPU, its table, and how much less the recorded tables' slices hold.
    """
    for m in machines:
        for g in sorted(m.gpus, key=lambda g: g.index):
            table = _table_of(g)
            if table is None or not table.memory_source.startswith("nominal"):
                continue
            known = [(t.key, p) for t in mig_tables().values() if not t.memory_source.startswith("nominal")
                     for p in t.profiles if p.name not in t.estimated]
            key, worst = min(known, key=lambda kp: kp[1].memory_mib / nominal_profile_mib(kp[1]))
            raise InputError(
                f"fit exact: GPU {g.index} of {m.hostname} ({g.name}) has only the nominal MIG table {table.key}: its "
                "slices' sizes are the sizes in the profile names, and a real slice holds less (up to "
                f"{1 - worst.memory_mib / nominal_profile_mib(worst):.1%} less in this package's recorded rows: "
                f"{key}'s {worst.name} holds {worst.memory_mib / 1024:.2f} GiB), so an exact plan could put a request "
                "on a slice that cannot hold it",
                hint="plan from the node with MIG on (slurm-gpushare inventory reads NVML's sizes), or give "
                     "inventory/gres-conf --mig-table with the GPU's 'nvidia-smi mig -lgip', or use --fit nominal")


def _estimate_notes(machines: Sequence[Machine]) -> tuple[str, ...]:
    """One line per partial table an exact plan takes sizes from, naming its estimated profiles."""
    tables = {t.key: t for m in machines for g in m.gpus for t in [_table_of(g)] if t is not None and t.estimated}
    return tuple(f"{t.key}: no published size for {', '.join(t.estimated)}: planned at "
                 f"{recorded_fraction(tuple(p for p in t.profiles if p.name not in t.estimated)):.1%} of the size in "
                 "the name (the smallest share a published row of this GPU holds; the real slice holds more)"
                 for t in tables.values())


def plan_layout(machines: Sequence[Machine], demand: Sequence[Request], *, weights: Weights | None = None,
                fit: str = "nominal", keep_mig_mode: bool = False) -> Plan:
    """Choose a geometry or MIG off for every GPU of ``machines`` to serve ``demand``.

    GPUs without MIG profiles (no MIG, or a model without a table) stay as they are: MIG off, a
    whole-GPU slot. With ``keep_mig_mode`` every GPU keeps its MIG mode (a GPU with MIG on gets a
    geometry, one with MIG off stays off): the layouts ``mig apply`` can make without a GPU reset.

    Raises:
        InputError: no demand, an unknown fit, bad weights, no MIG-capable GPU among the machines
            (the hint names the models that have tables), or no request that fits any of the GPUs.
    """
    weights = weights or Weights()
    weights.check()
    if fit not in FITS:
        raise InputError(f"unknown fit {fit!r}", hint=f"use one of {', '.join(FITS)}")
    if not demand:
        raise InputError("the demand is empty", hint="give --demand FILE or a store with records (--store DB)")
    if fit == "exact":
        _refuse_nominal_tables(machines)
    notes = _estimate_notes(machines) if fit == "exact" else ()
    entries: list[tuple[str, Gpu]] = [(m.hostname, plannable_gpu(g)) for m in machines
                                      for g in sorted(m.gpus, key=lambda g: g.index)]
    if not any(g.mig_profiles for _n, g in entries):
        names = sorted({g.name for _n, g in entries}) or ["no GPU"]
        raise InputError(f"no MIG-capable GPU to plan: {', '.join(names)}",
                         hint=f"MIG profile tables exist for {', '.join(mig_tables())}; a GPU of another "
                              "model needs its profiles in its machine description (inventory with MIG on)")
    choices: list[list[Candidate]] = []
    enumerated: dict[tuple[MigProfile, ...], tuple[Geometry, ...]] = {}
    counts: dict[str, tuple[int, int]] = {}
    for _node, g in entries:
        options = [candidate(g, None, fit)]
        if g.mig_profiles:
            if g.mig_profiles not in enumerated:
                e = enumerate_geometries(g.mig_profiles, gpu=g.index)
                enumerated[g.mig_profiles] = e.geometries
                counts[_table_name(g)] = (len(e.geometries), e.placed_sets)
            seen = set()
            for geometry in sorted(enumerated[g.mig_profiles],
                                   key=lambda x: sum("+" in p.profile.name for p in x.instances)):
                c = candidate(g, geometry, fit)
                key = (tuple(sorted(c.slots, key=repr)), c.uncovered_mib, c.uncovered_slices)
                if key not in seen:
                    seen.add(key)
                    options.append(c)
        if keep_mig_mode:
            options = [c for c in options if (c.geometry is not None) == g.mig_enabled] or options[:1]
        choices.append(options)
    ref_mib = max(_gpu_capacity(g, fit) for _n, g in entries)
    if not any(r.whole or r.mem_mib <= ref_mib for r in demand):
        smallest = min(r.mem_mib for r in demand)
        raise InputError(f"nothing in the demand fits a GPU here: the smallest request asks {format_mib(smallest)}, "
                         f"the largest GPU holds {format_mib(ref_mib)}",
                         hint="plan for the partition whose GPUs serve these requests, or check the demand's units "
                              "(a bare number is MiB)")
    ref_slices = max(c.slots[0].gpu_slices for options in choices for c in options)
    today = [candidate(g, today_geometry(g), fit) for _n, g in entries]
    today_score = evaluate(today, demand, weights, ref_mib, ref_slices)

    def descend(start: list[Candidate]) -> tuple[list[Candidate], Score, int]:
        layout = list(start)
        best = evaluate(layout, demand, weights, ref_mib, ref_slices)
        passes = 0
        for passes in range(1, MAX_PASSES + 1):  # noqa: B007
            changed = False
            for i, options in enumerate(choices):
                current = layout[i]
                pick, pick_score = current, best
                for c in options:
                    if c is current:
                        continue
                    layout[i] = c
                    s = evaluate(layout, demand, weights, ref_mib, ref_slices)
                    if s.objective < pick_score.objective - 1e-9 or (
                            abs(s.objective - pick_score.objective) <= 1e-9 and c.media < pick.media):
                        pick, pick_score = c, s
                layout[i] = pick
                if pick is not current:
                    changed, best = True, pick_score
            if not changed:
                break
        return layout, best, passes

    off = [options[0] for options in choices]
    a, a_score, a_passes = descend(off)
    b, b_score, b_passes = descend(today)
    layout, score = (a, a_score) if a_score.objective <= b_score.objective + 1e-9 else (b, b_score)
    gpus = tuple(GpuPlan(node=n, gpu=g, today=t, choice=c) for (n, g), t, c in zip(entries, today, layout, strict=True))
    return Plan(gpus=gpus, today=today_score, planned=score, demand=tuple(demand), geometries=counts, notes=notes,
                passes=a_passes + b_passes)


def _table_name(gpu: Gpu) -> str:
    table = _table_of(gpu)
    return table.key if table is not None else f"{gpu.name} ({gpu.memory_mib} MiB)"
