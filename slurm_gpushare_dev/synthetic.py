"""A synthetic cluster of any size for the filter service's scale tests and ``benchmarks/filterd_scale``.

Node ``k`` (named ``n00000``, ``n00001``, ...) is the shipped machine description ``k % 4`` of
:data:`~slurm_gpushare_dev.cluster.DEFAULT_NODES` with its GPU model renamed by ``k`` (``NVIDIA H100 80GB
HBM3`` -> ``NVIDIA H100V7 80GB HBM3``: model ``h100v7``), five names per description: 20 GPU types.
Slurm's view is printed as Slurm 22.05 prints it: each node's entry is a copy of a real ``sinfo --json``
entry of the dev cluster (tests/data/slurm/22.05, about 1 KB), so that the text is as long as a real
cluster's, with the GRES the description calls for (:func:`~slurm_gpushare.slurm.nodegres.node_gres`).
Partitions: ``gpu`` (every node, the default) and ``t0``..``t3`` (the nodes of one description each).
"""

from __future__ import annotations

import copy
import json
from dataclasses import replace
from pathlib import Path

from slurm_gpushare.hardware.machine import Machine
from slurm_gpushare.slurm.nodegres import GresOptions, node_gres
from slurm_gpushare_dev.cluster import DEFAULT_NODES, packaged_machine

TEMPLATES = tuple(DEFAULT_NODES.values())
#: GPU model names per shipped description (4 descriptions: 20 GPU types)
VARIANTS = 5
#: one node entry of a real ``sinfo --json`` (Slurm 22.05.8, the dev cluster), the template of every node's
SINFO_22_05 = Path(__file__).resolve().parent.parent / "tests" / "data" / "slurm" / "22.05" / "sinfo.json"


def node_name(k: int) -> str:
    """The name of synthetic node ``k`` (``n00042``)."""
    return f"n{k:05d}"


def renamed(name: str, variant: int) -> str:
    """``NVIDIA H100 80GB HBM3``, 7 -> ``NVIDIA H100V7 80GB HBM3``: the first word with a digit gets ``V<variant>``."""
    words = name.split()
    for i, w in enumerate(words):
        if any(c.isdigit() for c in w) and not w.upper().endswith("GB"):
            words[i] = f"{w.split('-')[0]}V{variant}"
            return " ".join(words)
    return f"{name} V{variant}"


def machines(n: int, *, gpus: int | None = None) -> dict[str, Machine]:
    """Node name -> machine description of ``n`` synthetic nodes (``gpus``: keep only that many GPUs of each,
    for tests that want small files; None: all of them)."""
    base = [packaged_machine(f) for f in TEMPLATES]
    if gpus is not None:
        base = [replace(m, gpus=m.gpus[:gpus], links=tuple(x for x in m.links if x.a < gpus and x.b < gpus))
                for m in base]
    out = {}
    for k in range(n):
        t = k % len(base)
        m = base[t]
        variant = t * VARIANTS + (k // len(base)) % VARIANTS
        out[node_name(k)] = replace(m, hostname=node_name(k),
                                    gpus=tuple(replace(g, name=renamed(g.name, variant)) for g in m.gpus))
    return out


def gres_text(machine: Machine, name: str, shard_unit_mib: int | None = None) -> str:
    """The node's GRES as ``sinfo`` prints them (``gpu:h100v7:8,shard:h100v7:640``)."""
    opts = GresOptions(shard_unit_mib=shard_unit_mib) if shard_unit_mib else None
    counts = node_gres(machine, name, opts).counts
    return ",".join(f"{g}:{t}:{c}" if t else f"{g}:{c}" for (g, t), c in counts.items())


class SlurmView:
    """``sinfo --json`` (Slurm 22.05) and ``scontrol -o show partition`` text for synthetic nodes.

    Attributes:
        state: node name -> state (``idle``); stale: nodes whose GRES Slurm reports as ``gpu:x:1`` (a
            description that no longer matches: not usable).
    """

    def __init__(self, nodes: dict[str, Machine]):
        self.nodes = nodes
        self.gres = {name: gres_text(m, name) for name, m in nodes.items()}
        self.state = dict.fromkeys(nodes, "idle")
        self.stale: set[str] = set()
        self.template = json.loads(SINFO_22_05.read_text())

    def text(self) -> tuple[str, str]:
        """(``sinfo --json``, ``scontrol -o show partition``) as they would print now."""
        doc = {key: v for key, v in self.template.items() if key != "nodes"}
        proto = self.template["nodes"][0]
        entries = []
        for k, name in enumerate(self.nodes):
            e = copy.copy(proto)
            e["name"] = e["hostname"] = e["address"] = name
            e["gres"] = "gpu:x:1" if name in self.stale else self.gres[name]
            e["state"] = self.state[name]
            e["partitions"] = ["gpu", f"t{k % len(TEMPLATES)}"]
            entries.append(e)
        doc["nodes"] = entries
        lines = [f"PartitionName=gpu Default=YES Nodes={','.join(self.nodes)}"]
        for t in range(len(TEMPLATES)):
            lines.append(f"PartitionName=t{t} Default=NO Nodes="
                         + ",".join(n for k, n in enumerate(self.nodes) if k % len(TEMPLATES) == t))
        return json.dumps(doc, indent=2), "\n".join(lines)


def write_machines(nodes: dict[str, Machine], directory: Path) -> None:
    """One ``<node>.json`` per node in ``directory`` (made when missing)."""
    directory.mkdir(parents=True, exist_ok=True)
    for name, m in nodes.items():
        (directory / f"{name}.json").write_text(m.to_json())
