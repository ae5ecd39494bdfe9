"""``place``: the best k-GPU set of a node, or the score of a given set (also ``topology --score``).

The machine comes from the same sources as ``topology`` (a description file, ``--from-topo`` or NVML;
see :mod:`slurm_gpushare.cli.hardware`); GPU names and memory are not needed. GPUs are NVML indices
throughout; the placement engine works on hop-matrix positions and this module maps between them.
"""

from __future__ import annotations

import json
import re

import click

from slurm_gpushare.cli import main
from slurm_gpushare.cli.hardware import with_machine
from slurm_gpushare.errors import InputError
from slurm_gpushare.hardware.machine import Machine

#: Random allocations drawn for the ``random`` comparison line.
DEFAULT_DRAWS = 100
#: Schema version of ``place --json``.
PLACE_JSON_VERSION = 1

_RANGE = re.compile(r"(\d+)(?:-(\d+))?")


def parse_gpu_list(text: str, option: str) -> list[int]:
    """``0,2,4`` or ``0-3,6`` -> GPU indices, in the order given, each once.

    Raises:
        InputError: an empty list, a part that is neither an index nor an ascending range, or an
            index given twice.
    """
    out: list[int] = []
    for part in text.split(","):
        m = _RANGE.fullmatch(part.strip())
        if m is None or (m.group(2) is not None and int(m.group(2)) < int(m.group(1))):
            raise InputError(f"{option} {text!r}: {part.strip()!r} is not a GPU index or a range lo-hi",
                             hint="write GPU indices as nvidia-smi numbers them, e.g. 0,2,4 or 0-3")
        hi = int(m.group(2)) if m.group(2) is not None else int(m.group(1))
        out.extend(range(int(m.group(1)), hi + 1))
    if len(set(out)) != len(out):
        raise InputError(f"{option} {text!r} names a GPU twice")
    return out


def _positions(gpus: list[int], labels: tuple[int, ...], option: str) -> list[int]:
    index_of = {g: i for i, g in enumerate(labels)}
    unknown = [g for g in gpus if g not in index_of]
    if unknown:
        raise InputError(f"{option}: GPU(s) {unknown} do not exist on this node",
                         hint=f"GPUs are {','.join(str(g) for g in labels)}")
    return [index_of[g] for g in gpus]


def _labels(positions, labels: tuple[int, ...]) -> list[int]:
    return [labels[int(p)] for p in positions]


def _csv(values) -> str:
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
    sel = _positions(parse_gpu_list(gpus_text, "--score"), labels, "--score")
    free = None if free_text is None else _positions(parse_gpu_list(free_text, "--free"), labels, "--free")
    s = score(topo.hop_array, sel, list(topo.numa_nodes), free)
    for key in ("gpus", "ring", "best_gpus"):
        s[key] = _labels(s[key], labels)
    s["hostname"] = machine.hostname
    if as_json:
        return json.dumps(s, indent=2)
    k = len(s["gpus"])
    pool = "every GPU" if free is None else "free GPUs " + _csv(_labels(sorted(free), labels))
    lines = [
        f"GPUs {_csv(s['gpus'])} on {machine.hostname}: cost {s['cost']:.2f} "
        f"(pairs {s['pair_cost']:.2f} + ring {k} x {s['ring_bottleneck']:.2f})",
        f"  ring order {_csv(s['ring'])}: bottleneck hop {s['ring_bottleneck']:.2f}, sum {s['ring_sum']:.2f}; "
        f"worst pair {s['worst_pair']:.2f}; pairs across NUMA nodes {s['numa_split']}",
        f"  best {k} of {pool}: {_csv(s['best_gpus'])}, cost {s['best_cost']:.2f} ({s['best_search']} search); "
        f"excess {s['excess']:.2f} ({100 * s['excess_ratio']:.1f}%)",
    ]
    return "\n".join(lines)


@main.command()
@with_machine(placeholders=True)
@click.option("-k", "--count", "count", type=int, help="GPUs wanted (the size of the set)")
@click.option("--free", "free_text", metavar="GPUS",
              help="GPUs that may be used, e.g. 0,1,5 or 0-3 (default: all)")
@click.option("--score", "score_text", metavar="GPUS",
              help="instead of searching, score this set (e.g. 0,2,4) against the best of --free")
@click.option("--seed", default=0, show_default=True, help="seed of the random comparison")
@click.option("--draws", default=DEFAULT_DRAWS, show_default=True, help="random allocations to compare with")
@click.option("--json", "as_json", is_flag=True, help="print JSON")
def place(machine: Machine, count: int | None, free_text: str | None, score_text: str | None, seed: int,
          draws: int, as_json: bool) -> None:
    """Pick the best set of K GPUs of a node, compared with first fit and random picks.

    Cost of a set: the sum of the hops between every pair, plus K times the worst hop along the best
    ring through it (the bottleneck of a ring all-reduce); equal costs prefer fewer pairs across NUMA
    nodes (cross-NUMA), then lower indices. Exact search up to 16 free GPUs, a heuristic beyond
    (docs/placement.md).
    """
    if score_text is not None:
        if count is not None:
            raise InputError("give either -k K (search) or --score GPUS (score a set), not both")
        click.echo(score_report(machine, score_text, as_json=as_json, free_text=free_text))
        return
    if count is None:
        raise InputError("place needs -k K, the number of GPUs wanted", hint="or --score GPUS to score a set")
    if draws < 0:
        raise InputError(f"--draws {draws} must not be negative")
    import numpy as np

    from slurm_gpushare.topology.hops import Topology
    from slurm_gpushare.topology.placement import (
        PAIR_WEIGHT,
        RING_WEIGHT,
        best_placement,
        evaluate,
        first_fit,
        random_fit,
    )

    topo = Topology.from_machine(machine)
    labels = topo.gpus
    hop, numa = topo.hop_array, list(topo.numa_nodes)
    free = list(range(len(labels))) if free_text is None else \
        sorted(_positions(parse_gpu_list(free_text, "--free"), labels, "--free"))
    best = best_placement(hop, count, free, numa)
    ff = evaluate(hop, first_fit(free, count), numa)
    rng = np.random.default_rng(seed)
    rand = [evaluate(hop, random_fit(free, count, rng), numa).cost for _ in range(draws)]

    def ratio(cost: float) -> float:
        return cost / best.cost if best.cost > 0 else 1.0

    if as_json:
        def mapped(p):
            d = p.to_dict()
            d["gpus"], d["ring"] = _labels(d["gpus"], labels), _labels(d["ring"], labels)
            return d
        out = {
            "version": PLACE_JSON_VERSION,
            "hostname": machine.hostname,
            "k": count,
            "free": _labels(free, labels),
            "cost_model": {"pair_weight": PAIR_WEIGHT, "ring_weight": RING_WEIGHT},
            "best": mapped(best),
            "first_fit": dict(mapped(ff), ratio=round(ratio(ff.cost), 6)),
            "random": {"draws": draws, "seed": seed,
                       "mean_cost": round(float(np.mean(rand)), 6) if rand else None,
                       "mean_ratio": round(ratio(float(np.mean(rand))), 6) if rand else None,
                       "worst_cost": round(float(max(rand)), 6) if rand else None},
        }
        click.echo(json.dumps(out, indent=2))
        return
    click.echo(f"best {count} of {len(free)} free GPUs on {machine.hostname} ({best.search} search; "
               f"cost = pairs + {count} x ring bottleneck)")
    rows = [("best", best, 1.0), ("first fit", ff, ratio(ff.cost))]
    width = max([len(_csv(_labels(p.gpus, labels))) for _, p, _ in rows] + [len(f'mean of {draws}')]) + 2
    click.echo(f"  {'':<10}{'GPUs':<{width}}{'cost':>8}{'vs best':>9}{'pairs':>8}{'ring max':>10}"
               f"{'cross-NUMA':>12}  ring order")
    for name, p, r in rows:
        click.echo(f"  {name:<10}{_csv(_labels(p.gpus, labels)):<{width}}{p.cost:>8.2f}{r:>9.2f}"
                   f"{p.pair_cost:>8.2f}{p.ring_bottleneck:>10.2f}{p.numa_split:>12}  {_csv(_labels(p.ring, labels))}")
    if rand:
        mean = float(np.mean(rand))
        click.echo(f"  {'random':<10}{f'mean of {draws}':<{width}}{mean:>8.2f}{ratio(mean):>9.2f}"
                   f"   (worst {max(rand):.2f}, seed {seed})")
