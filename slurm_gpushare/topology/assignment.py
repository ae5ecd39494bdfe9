"""The linear sum assignment of a node's binding, without importing SciPy in the Prolog.

:mod:`slurm_gpushare.topology.binding` deals a job's cores and NICs to its tasks by a minimum-cost
assignment. ``scipy.optimize.linear_sum_assignment`` solves it, but importing ``scipy.optimize`` costs
the Prolog of every multi-GPU gpushare job about 0.4-0.5 s (``python -X importtime``: 420-500 ms on the
2-core CI VM), for matrices of at most a few hundred cells. :func:`assign` answers small matrices with
the same algorithm SciPy runs, in plain Python, so that it chooses the very same columns, ties included
(``tests/topology/test_assignment.py`` compares both on random matrices with many ties), and hands large
ones to SciPy.

The algorithm: the shortest augmenting path method for rectangular problems of D. F. Crouse, "On
implementing 2D rectangular assignment algorithms", IEEE Transactions on Aerospace and Electronic
Systems 52(4), 2016, as SciPy implements it (``scipy/optimize/rectangular_lsap``): one augmenting path
per row, a Dijkstra-like search over the columns still to scan, taken in the order SciPy takes them, a
column without a row preferred among equally cheap ones.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

#: The most cells (rows x columns) :func:`assign` solves in Python; larger matrices go to SciPy, whose
#: compiled solver outruns the import it costs (the Python loop is O(rows x columns x path length)).
PYTHON_CELLS = 4096


def assign(cost: Sequence[Sequence[float]]) -> list[int]:
    """The column assigned to each row of ``cost`` in a minimum-cost assignment, as
    ``scipy.optimize.linear_sum_assignment`` would assign it.

    Args:
        cost: ``rows x columns`` finite costs, ``rows <= columns`` (every row gets a distinct column).

    Returns:
        ``rows`` column indices.

    Raises:
        ValueError: more rows than columns, rows of different lengths, or a cost that is not finite.
    """
    rows = [[float(c) for c in r] for r in cost]
    nr = len(rows)
    nc = len(rows[0]) if rows else 0
    if any(len(r) != nc for r in rows):
        raise ValueError("cost rows differ in length")
    if nr > nc:
        raise ValueError(f"{nr} rows for {nc} columns: every row needs its own column")
    if any(not math.isfinite(c) for r in rows for c in r):
        raise ValueError("costs must be finite")
    if nr == 0:
        return []
    if nr * nc > PYTHON_CELLS:
        return _scipy(rows)
    return _crouse(rows, nr, nc)


def _scipy(rows: list[list[float]]) -> list[int]:
    from scipy.optimize import linear_sum_assignment

    r, c = linear_sum_assignment(rows)
    out = [0] * len(rows)
    for i, j in zip(r.tolist(), c.tolist(), strict=True):
        out[i] = j
    return out


def _crouse(cost: list[list[float]], nr: int, nc: int) -> list[int]:
    inf = math.inf
    u = [0.0] * nr
    v = [0.0] * nc
    col4row = [-1] * nr
    row4col = [-1] * nc
    path = [-1] * nc
    for cur in range(nr):
        # shortest augmenting path from row ``cur`` to a column without a row
        shortest = [inf] * nc
        remaining = [nc - it - 1 for it in range(nc)]
        num_remaining = nc
        scanned_rows: set[int] = set()
        scanned_cols: list[int] = []
        min_val = 0.0
        i = cur
        sink = -1
        while sink == -1:
            scanned_rows.add(i)
            index, lowest = -1, inf
            row, ui = cost[i], u[i]
            for it in range(num_remaining):
                j = remaining[it]
                r = min_val + row[j] - ui - v[j]
                if r < shortest[j]:
                    path[j] = i
                    shortest[j] = r
                # among equally cheap columns, one without a row ends the search
                if shortest[j] < lowest or (shortest[j] == lowest and row4col[j] == -1):
                    lowest = shortest[j]
                    index = it
            min_val = lowest
            if min_val == inf:  # cannot happen with finite costs and rows <= columns
                raise ValueError("cost matrix is infeasible")
            j = remaining[index]
            if row4col[j] == -1:
                sink = j
            else:
                i = row4col[j]
            scanned_cols.append(j)
            num_remaining -= 1
            remaining[index] = remaining[num_remaining]
        # dual variables
        u[cur] += min_val
        for r_ in scanned_rows:
            if r_ != cur:
                u[r_] += min_val - shortest[col4row[r_]]
        for j in scanned_cols:
            v[j] -= min_val - shortest[j]
        # augment along the path
        j = sink
        while True:
            i = path[j]
            row4col[j] = i
            col4row[i], j = j, col4row[i]
            if i == cur:
                break
    return col4row
