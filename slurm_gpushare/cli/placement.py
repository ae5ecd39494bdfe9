"""``place``: the best k-GPU set of a node, or the score of a given set (also ``topology --score``).

The machine comes from the same sources as ``topology`` (a description file, ``--from-topo`` or NVML;
see :mod:`slurm_gpushare.cli.hardware`); GPU names and memory are not needed. GPUs are NVML indices
throughout; the placement engine works on hop-matrix positions and this module maps between them.
"""

from __future__ import annotations

import json

import click

from slurm_gpushare.cli import main
from slurm_gpushare.cli.gpusets import csv_of, labels_of, parse_gpu_list, positions_of, score_report
from slurm_gpushare.cli.hardware import with_machine
from slurm_gpushare.errors import InputError
from slurm_gpushare.hardware.machine import Machine

#: Random allocations drawn for the ``random`` comparison line.
DEFAULT_DRAWS = 100
#: Schema version of ``place --json``.
PLACE_JSON_VERSION = 1

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
        sorted(positions_of(parse_gpu_list(free_text, "--free"), labels, "--free"))
    best = best_placement(hop, count, free, numa)
    ff = evaluate(hop, first_fit(free, count), numa)
    rng = np.random.default_rng(seed)
    rand = [evaluate(hop, random_fit(free, count, rng), numa).cost for _ in range(draws)]

    def ratio(cost: float) -> float:
        return cost / best.cost if best.cost > 0 else 1.0

    if as_json:
        def mapped(p):
            d = p.to_dict()
            d["gpus"], d["ring"] = labels_of(d["gpus"], labels), labels_of(d["ring"], labels)
            return d
        out = {
            "version": PLACE_JSON_VERSION,
            "hostname": machine.hostname,
            "k": count,
            "free": labels_of(free, labels),
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
    width = max([len(csv_of(labels_of(p.gpus, labels))) for _, p, _ in rows] + [len(f'mean of {draws}')]) + 2
    click.echo(f"  {'':<10}{'GPUs':<{width}}{'cost':>8}{'vs best':>9}{'pairs':>8}{'ring max':>10}"
               f"{'cross-NUMA':>12}  ring order")
    for name, p, r in rows:
        ring = csv_of(labels_of(p.ring, labels))
        click.echo(f"  {name:<10}{csv_of(labels_of(p.gpus, labels)):<{width}}{p.cost:>8.2f}{r:>9.2f}"
                   f"{p.pair_cost:>8.2f}{p.ring_bottleneck:>10.2f}{p.numa_split:>12}  {ring}")
    if rand:
        mean = float(np.mean(rand))
        click.echo(f"  {'random':<10}{f'mean of {draws}':<{width}}{mean:>8.2f}{ratio(mean):>9.2f}"
                   f"   (worst {max(rand):.2f}, seed {seed})")
