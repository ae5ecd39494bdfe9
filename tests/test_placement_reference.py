"""The placement benchmark's independent reference (benchmarks/placement) against the documented examples of
docs/placement.md's cost model: it must reproduce them on its own, or it checks nothing."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
from pathlib import Path

import pytest

from slurm_gpushare.hardware.nvidia_smi import parse_topo_matrix
from slurm_gpushare.topology import placement as P
from slurm_gpushare.topology.hops import Topology

ROOT = Path(__file__).resolve().parent.parent


def _bench():
    loader = importlib.machinery.SourceFileLoader("placement_bench", str(ROOT / "benchmarks" / "placement"))
    spec = importlib.util.spec_from_loader("placement_bench", loader)
    module = importlib.util.module_from_spec(spec)
    sys.modules["placement_bench"] = module  # its dataclasses look their module up there
    loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def dgx1():
    m = parse_topo_matrix((ROOT / "tests/data/topo/dgx1-v100-sxm2-8gpu-1nic.txt").read_text(), hostname="n",
                          gpu_name="Tesla V100-SXM2-16GB", memory_mib=16160)
    return [[float(x) for x in row] for row in Topology.from_machine(m).hop_array]


def test_the_reference_reproduces_the_documented_dgx1_costs(dgx1):
    b = _bench()
    # docs/placement.md: GPUs 0,1,4,5 cost 19.27 (their ring runs over NVLink only), the quad 0,1,2,3 14.50
    assert b.reference_set_cost(dgx1, (0, 1, 4, 5)) == pytest.approx(19.27, abs=0.01)
    assert b.reference_set_cost(dgx1, (0, 1, 2, 3)) == pytest.approx(14.50, abs=0.01)
    assert b.reference_set_cost(dgx1, (3,)) == 0.0


def test_the_reference_and_the_engine_agree_and_would_catch_a_wrong_cost(dgx1):
    import numpy as np
    b = _bench()
    hop = np.array(dgx1)
    for k in (2, 3, 4, 5):
        ours = P.best_placement(hop, k, None, None)
        assert b.reference_set_cost(dgx1, tuple(ours.gpus)) == pytest.approx(ours.cost, abs=1e-9)
        assert b.reference_optimum(dgx1, k, list(range(8))) == pytest.approx(ours.cost, abs=1e-9)
    # a ring cost that the engine would get wrong (the pair sum alone) is not what the reference says
    pairs_only = sum(dgx1[a][c] for i, a in enumerate((0, 1, 4, 5)) for c in (0, 1, 4, 5)[i + 1:])
    assert b.reference_set_cost(dgx1, (0, 1, 4, 5)) != pytest.approx(pairs_only)
