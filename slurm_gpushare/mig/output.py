"""What a MIG plan writes: a mig-parted config, the layout file, the planned machines and their gres.conf.

- **mig-parted config** (:func:`mig_parted_config`): NVIDIA's MIG Partition Editor schema (``version: v1``,
  ``mig-configs: {NAME: [{devices: [...], mig-enabled: BOOL, mig-devices: {PROFILE: COUNT}}]}``; the
  ``mig-devices`` key only where MIG is enabled), one config ``gpushare-<node>`` per node, GPUs with the
  same geometry in one entry. ``nvidia-mig-parted apply -f FILE -c gpushare-<node>`` applies it; it
  chooses placements itself.
- **layout file** (:func:`layout_document`, JSON): per node and GPU, MIG on or off and the GPU instances
  in creation order with profile id and placement start: what ``nvmlDeviceCreateGpuInstanceWithPlacement``
  is called with, in that order (the fake NVML accepts exactly this; MIG apply, not built yet, is to
  read it).
- **planned machines** (:func:`planned_machine`): each node's description with the planned MIG mode
  and instances, GPU instance ids 1, 2, .. in creation order (as the fake NVML numbers them; a real
  driver chooses its own, so gres.conf is to be regenerated from NVML after the change) and
  ``nvidia-caps`` minors from those ids (:func:`~slurm_gpushare.hardware.machine.mig_cap_minors`);
  gres.conf and the slurm.conf lines are rendered from them by :mod:`slurm_gpushare.gresconf.render`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace

from slurm_gpushare.gresconf.render import generate_node_gres, render_gres_conf, render_slurm_conf
from slurm_gpushare.hardware.machine import Machine, MigInstance, mig_cap_minors
from slurm_gpushare.memsize import format_mib
from slurm_gpushare.mig.plan import Plan, Score
from slurm_gpushare.mig.wait import Wait, Waits, format_wait
from slurm_gpushare.slurm.nodegres import GresOptions

#: The layout file's format version.
LAYOUT_VERSION = 1


def config_name(node: str) -> str:
    """The mig-parted config name of a node's plan."""
    return f"gpushare-{node}"


def planned_machine(machine: Machine, plan: Plan) -> Machine:
    """``machine`` with the plan's MIG mode, profiles and instances on each of its GPUs."""
    by_index = {p.gpu.index: p for p in plan.gpus if p.node == machine.hostname}
    gpus = []
    for g in machine.gpus:
        p = by_index.get(g.index)
        if p is None:
            gpus.append(g)
            continue
        geometry = p.choice.geometry
        if geometry is None:
            gpus.append(replace(g, mig_enabled=False, mig_instances=(), processes=(),
                                mig_profiles=p.gpu.mig_profiles))
            continue
        instances = []
        for k, placed in enumerate(geometry.instances, start=1):
            instances.append(MigInstance(profile=placed.profile.name, gi_id=k, ci_id=0, start=placed.start,
                                         uuid="", caps=mig_cap_minors(g.minor, k, 0)))
        gpus.append(replace(g, mig_enabled=True, mig_profiles=p.gpu.mig_profiles, mig_instances=tuple(instances),
                            processes=()))
    return replace(machine, gpus=tuple(gpus), source=f"mig plan of {machine.source or 'machine description'}")


def mig_parted_config(plan: Plan) -> dict:
    """The plan as a mig-parted config (see the module docstring)."""
    configs: dict[str, list[dict]] = {}
    for p in plan.gpus:
        entries = configs.setdefault(config_name(p.node), [])
        geometry = p.choice.geometry
        enabled = geometry is not None
        devices = geometry.counts if geometry is not None else None
        same = next((e for e in entries if e["mig-enabled"] == enabled and e.get("mig-devices") == devices), None)
        if same is not None:
            same["devices"].append(p.gpu.index)
            continue
        entry: dict = {"devices": [p.gpu.index], "mig-enabled": enabled}
        if devices is not None:
            entry["mig-devices"] = devices
        entries.append(entry)
    return {"version": "v1", "mig-configs": configs}


def mig_parted_yaml(plan: Plan, *, header: str = "") -> str:
    """:func:`mig_parted_config` as YAML text (PyYAML), keys in schema order."""
    import yaml

    lines = [f"# {h}" if h else "#" for h in header.splitlines()]
    return "\n".join(lines + [yaml.safe_dump(mig_parted_config(plan), sort_keys=False, default_flow_style=None)])


def layout_document(plan: Plan) -> dict:
    """The layout file's content (see the module docstring)."""
    nodes: dict[str, dict] = {}
    for p in plan.gpus:
        node = nodes.setdefault(p.node, {"gpus": []})
        geometry = p.choice.geometry
        node["gpus"].append({
            "index": p.gpu.index, "name": p.gpu.name, "mig_enabled": geometry is not None,
            "instances": [{"profile": i.profile.name, "profile_id": i.profile.profile_id, "start": i.start}
                          for i in (geometry.instances if geometry is not None else ())],
        })
    return {"version": LAYOUT_VERSION, "nodes": nodes}


def layout_json(plan: Plan) -> str:
    """:func:`layout_document` as JSON text."""
    return json.dumps(layout_document(plan), indent=2) + "\n"


def gres_texts(machines: Sequence[Machine], options: GresOptions) -> tuple[str, str]:
    """gres.conf and the slurm.conf lines of the planned machines.

    Raises:
        MachineDescriptionError, InputError: as :func:`~slurm_gpushare.gresconf.render.generate_node_gres`.
    """
    nodes = [generate_node_gres(m, m.hostname, options) for m in machines]
    header = ("gres.conf of the MIG layout planned by slurm-gpushare mig plan; regenerate it from NVML\n"
              "('slurm-gpushare gres-conf') once the layout is applied: the driver numbers GPU instances itself")
    return render_gres_conf(nodes, header=header), render_slurm_conf(nodes)


def score_lines(name: str, s: Score, wait: Wait | None = None) -> list[str]:
    """One block of numbers for a layout, for the summary (with its queue wait when given)."""
    share = s.served / s.asked * 100 if s.asked else 100.0
    lines = [
        f"{name}:",
        f"  served            {s.served:.2f} of {s.asked:.2f} requests at once ({share:.1f} %)",
        f"  stranded memory   {format_mib(round(s.stranded_mem_mib))} ({s.stranded_mem_mib:.0f} MiB)",
        f"  stranded compute  {s.stranded_slices:.2f} compute slices",
        f"  unserved          {format_mib(round(s.unserved_mem_mib))} of memory requests, "
        f"{s.unserved_whole:.2f} whole GPUs",
        f"  objective         {s.objective:.4f}",
    ]
    if wait is not None:
        lines.append(f"  queue wait        {wait_text(wait)}")
    return lines


def wait_text(w: Wait) -> str:
    """``mean 42 s, p95 3.5 min over 1200 jobs`` and what ran not at all or queues without end."""
    text = f"mean {format_wait(w.mean_s)}, p95 {format_wait(w.p95_s)} over {w.jobs} jobs"
    if w.never:
        text += f"; {w.never} jobs no slot holds never start"
    if w.overloaded:
        text += f"; overloaded ({', '.join(w.overloaded)} asked at least as often at once as slots hold them: " \
                "the queue grows over the whole replay)"
    return text


def summary(plan: Plan, waits: Waits | None = None) -> str:
    """The plan in words and numbers: demand, per GPU today and planned, both layouts' scores, and with
    ``waits`` (:func:`~slurm_gpushare.mig.wait.expected_waits`) both layouts' expected queue wait."""
    lines = ["demand (requests at once): " + ", ".join(f"{r.label()} x{r.weight:.2f}" for r in plan.demand)]
    lines += [f"geometries: {k}: {n} (placed sets {p})" for k, (n, p) in plan.geometries.items()]
    lines += [f"note: {n}" for n in plan.notes]
    if waits is not None:
        lines.append(f"queue wait: FIFO replay with backfill of {waits.trace.note}")
    lines.append("")
    width = max([len(p.today.label) for p in plan.gpus] + [5])
    lines.append(f"{'node':<12} {'gpu':>3}  {'today':<{width}}  plan")
    for p in plan.gpus:
        lines.append(f"{p.node:<12} {p.gpu.index:>3}  {p.today.label:<{width}}  {p.choice.label}")
    lines.append("")
    lines += score_lines("today", plan.today, waits.today if waits else None)
    lines += score_lines("plan", plan.planned, waits.planned if waits else None)
    d_mem = plan.today.stranded_mem_mib - plan.planned.stranded_mem_mib
    change = (f"change: stranded memory {'-' if d_mem >= 0 else '+'}{format_mib(round(abs(d_mem)))}, "
              f"stranded compute {plan.planned.stranded_slices - plan.today.stranded_slices:+.2f} slices, "
              f"served {plan.planned.served - plan.today.served:+.2f}, "
              f"objective {plan.planned.objective - plan.today.objective:+.4f}")
    if waits is not None:
        d_wait = waits.planned.mean_s - waits.today.mean_s
        change += f", mean queue wait {'-' if d_wait < 0 else '+'}{format_wait(abs(d_wait))}"
    lines.append(change)
    return "\n".join(lines) + "\n"


def summary_document(plan: Plan, waits: Waits | None = None) -> dict:
    """:func:`summary` as data (``mig plan --format json``): ``demand`` (each ``request`` and ``weight``, requests
    at once), ``notes`` (:attr:`~slurm_gpushare.mig.plan.Plan.notes`), ``gpus`` (each ``node``, ``gpu``,
    ``today`` and ``plan`` as the labels the text prints), ``today``
    and ``plan`` (:class:`~slurm_gpushare.mig.plan.Score`'s fields; memory in MiB; with ``waits`` a
    ``queue_wait`` of :class:`~slurm_gpushare.mig.wait.Wait`'s fields, seconds), ``queue_wait_trace`` (what was
    replayed, or null) and ``layout`` (:func:`layout_document`, what ``layout.json`` holds)."""
    from dataclasses import asdict

    def score(s: Score, wait: Wait | None) -> dict:
        out: dict = asdict(s)
        if wait is not None:
            out["queue_wait"] = {**asdict(wait), "overloaded": list(wait.overloaded)}
        return out

    return {
        "demand": [{"request": r.label(), "weight": r.weight} for r in plan.demand],
        "notes": list(plan.notes),
        "gpus": [{"node": p.node, "gpu": p.gpu.index, "today": p.today.label, "plan": p.choice.label}
                 for p in plan.gpus],
        "today": score(plan.today, waits.today if waits else None),
        "plan": score(plan.planned, waits.planned if waits else None),
        "queue_wait_trace": ({"source": waits.trace.source, "jobs": len(waits.trace.jobs),
                              "lower_bound": waits.trace.lower_bound, "note": waits.trace.note}
                             if waits is not None else None),
        "layout": layout_document(plan),
    }
