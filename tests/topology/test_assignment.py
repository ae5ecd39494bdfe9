"""The plain-Python linear sum assignment the Prolog binds with (slurm_gpushare.topology.assignment) chooses what
scipy.optimize.linear_sum_assignment chooses, ties included, and the binding no longer imports SciPy."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import linear_sum_assignment

from slurm_gpushare.topology.assignment import PYTHON_CELLS, _crouse, assign


def _scipy_cols(cost: list[list[float]]) -> list[int]:
    rows, cols = linear_sum_assignment(np.array(cost, dtype=np.float64).reshape(len(cost), -1))
    out = [0] * len(cost)
    for i, j in zip(rows.tolist(), cols.tolist(), strict=True):
        out[i] = j
    return out


@st.composite
def matrices(draw, most: int = 12, values: int = 4):
    """rows <= columns, small integer costs: many ties, where an implementation's order shows."""
    nc = draw(st.integers(1, most))
    nr = draw(st.integers(1, nc))
    return [[draw(st.integers(0, values)) for _ in range(nc)] for _ in range(nr)]


@settings(max_examples=600, deadline=None)
@given(matrices())
def test_the_same_columns_as_scipy_ties_included(cost):
    assert _crouse([[float(c) for c in r] for r in cost], len(cost), len(cost[0])) == _scipy_cols(cost)


@settings(max_examples=150, deadline=None)
@given(matrices(most=30, values=1000))
def test_the_same_columns_as_scipy_with_spread_costs(cost):
    assert assign(cost) == _scipy_cols(cost)


def test_the_binding_s_cost_shape_as_the_prolog_builds_it():
    """Far cores weigh more than any preference for low core ids (binding._assign_cores): 4 tasks x 4 slots
    over 24 cores, two tasks near the first 12."""
    pool = list(range(24))
    wanted = [set(range(12)), set(range(12)), set(range(12, 24)), set()]
    slots = [t for t in range(4) for _ in range(4)]
    weight = len(slots) * len(pool) + 1
    cost = [[(0 if (not wanted[t] or c in wanted[t]) else 1) * weight + c for c in pool] for t in slots]
    assert assign(cost) == _scipy_cols(cost)


def test_large_matrices_go_to_scipy_with_the_same_answer():
    rng = np.random.default_rng(7)
    cost = rng.integers(0, 5, size=(40, 120)).tolist()
    assert 40 * 120 > PYTHON_CELLS
    assert assign(cost) == _scipy_cols(cost)


@pytest.mark.parametrize(("cost", "message"), [([[1, 2], [3]], "differ in length"),
                                               ([[1], [2]], "2 rows for 1 columns"),
                                               ([[float("nan"), 1]], "finite")])
def test_bad_matrices_are_refused(cost, message):
    with pytest.raises(ValueError, match=message):
        assign(cost)


def test_binding_a_job_imports_neither_scipy_nor_networkx():
    """Issue 29 item 3: the Prolog's binding of a 4-GPU job with its cores (what _prepare_topology runs) loads
    no scipy.optimize (0.4-0.5 s to import) and no networkx (0.1-0.16 s)."""
    code = ("import sys\n"
            "from slurm_gpushare_dev.cluster import packaged_machine\n"
            "from slurm_gpushare.topology.binding import bind\n"
            "from slurm_gpushare.topology.hops import hop_matrix\n"
            "from slurm_gpushare.topology.placement import audit\n"
            "m = packaged_machine('8x-a100-nv12-bridge.json')\n"
            "hop = hop_matrix(m)\n"
            "audit(hop, [0, 1, 2, 3], list(range(8)), [g.numa_node for g in m.gpus])\n"
            "for n in (1, 2, 4):\n"
            "    bind(m, [0, 1, 2, 3], ntasks=n, cores=range(16))\n"
            "print(sorted(k for k in sys.modules if k.split('.')[0] in ('scipy', 'networkx')))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
