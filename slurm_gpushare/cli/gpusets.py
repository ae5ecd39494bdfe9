"""GPU sets of one node as the placement commands read and print them (``place``, ``topology --score``).

GPUs are NVML indices as ``nvidia-smi`` numbers them; the placement engine works on hop-matrix positions, and
these functions map between the two. No command is defined here: ``cli/placement.py`` (``place``) and
``cli/hardware.py`` (``topology --score``) both use it, and neither imports the other.
"""

from __future__ import annotations

import json

from slurm_gpushare.errors import InputError, ParseError
from slurm_gpushare.hardware.machine import Machine
from slurm_gpushare.rangelist import parse_range_list


def parse_gpu_list(text: str, option: str) -> list[int]:
    """``0,2,4`` or ``0-3,6`` -> GPU indices, in the order given, each once.

    Raises:
        InputError: an empty list, a part that is neither an index nor an ascending range, or an
            index given twice.
    """
    try:
        out = parse_range_list(text, what="GPU index", example="0,2,4 or 0-3, as nvidia-smi numbers GPUs")
    except ParseError as e:
        raise InputError(f"{option}: {e.message}", hint=e.hint) from None
    if len(set(out)) != len(out):
        raise InputError(f"{option} {text!r} names a GPU twice")
    return out


def positions_of(gpus: list[int], labels: tuple[int, ...], option: str) -> list[int]:
    """NVML indices ``gpus`` -> their positions in the hop matrix whose GPUs are ``labels``.

    Raises:
        InputError: a GPU the node does not have (``option`` names where it was given).
    """
    index_of = {g: i for i, g in enumerate(labels)}
    unknown = [g for g in gpus if g not in index_of]
    if unknown:
        raise InputError(f"{option}: GPU(s) {unknown} do not exist on this node",
                         hint=f"GPUs are {','.join(str(g) for g in labels)}")
    return [index_of[g] for g in gpus]


def labels_of(positions, labels: tuple[int, ...]) -> list[int]:
    """Hop-matrix positions -> the NVML indices of those GPUs."""
    return [labels[int(p)] for p in positions]


def csv_of(values) -> str:
    """``[0, 2, 4]`` -> ``0,2,4``."""
    return ",".join(str(v) for v in values)


def score_report(machine: Machine, gpus_text: str, *, as_json: bool, free_text: str | None = None) -> str:
    """The text (or JSON) of ``place --score GPUS`` / ``topology --score GPUS``.

    Raises:
        InputError: a malformed GPU list, a GPU the node does not have.
    """
    from slurm_gpushare.topology.hops import Topology
    from slurm_gpushare.topology.placement import score

    topo = Topology.from_machine(machine)
    labels = topo.gpus
    sel = positions_of(parse_gpu_list(gpus_text, "--score"), labels, "--score")
    free = None if free_text is None else positions_of(parse_gpu_list(free_text, "--free"), labels, "--free")
    s = score(topo.hop_array, sel, list(topo.numa_nodes), free)
    for key in ("gpus", "ring", "best_gpus"):
        s[key] = labels_of(s[key], labels)
    s["hostname"] = machine.hostname
    if as_json:
        return json.dumps(s, indent=2)
    k = len(s["gpus"])
    pool = "every GPU" if free is None else "free GPUs " + csv_of(labels_of(sorted(free), labels))
    lines = [
        f"GPUs {csv_of(s['gpus'])} on {machine.hostname}: cost {s['cost']:.2f} "
        f"(pairs {s['pair_cost']:.2f} + ring {k} x {s['ring_bottleneck']:.2f})",
        f"  ring order {csv_of(s['ring'])}: bottleneck hop {s['ring_bottleneck']:.2f}, sum {s['ring_sum']:.2f}; "
        f"worst pair {s['worst_pair']:.2f}; pairs across NUMA nodes {s['numa_split']}",
        f"  best {k} of {pool}: {csv_of(s['best_gpus'])}, cost {s['best_cost']:.2f} ({s['best_search']} search); "
        f"excess {s['excess']:.2f} ({100 * s['excess_ratio']:.1f}%)",
    ]
    return "\n".join(lines)
