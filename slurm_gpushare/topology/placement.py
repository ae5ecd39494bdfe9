"""Placement engine: the best k-GPU set of a node's free GPUs, and how far an allocation was from it.

A decisions-layer module: pure functions of a hop matrix (:func:`slurm_gpushare.topology.hops.hop_matrix`),
no I/O. Positions are matrix positions (row ``i`` is the ``i``-th smallest GPU index, see
:mod:`slurm_gpushare.topology.hops`); on a node whose GPUs are numbered ``0..n-1`` they are GPU indices.
Callers that hold a :class:`~slurm_gpushare.topology.hops.Topology` map with ``Topology.gpus``.

The cost model (docs/placement.md)
    For a set ``S`` of ``k`` GPUs on a node with hop matrix ``H``::

        cost(S) = PAIR_WEIGHT * pair_cost(S) + RING_WEIGHT * k * ring_bottleneck(S)

    - ``pair_cost(S)`` is the sum of ``H[a, b]`` over the ``k(k-1)/2`` pairs of ``S``
      (:attr:`Placement.pair_cost`): all-to-all traffic, tree collectives and
      pipeline neighbours cross every pair's path, so every slow pair counts.
    - ``ring_bottleneck(S)`` is the hop of the slowest link of the best ring through ``S``: the order
      of the GPUs, as a cycle, that minimizes the largest hop between neighbours (ties: the smallest
      sum of hops around the ring). A ring all-reduce (NCCL's default for large messages) moves
      ``2(k-1)/k`` of the buffer over every ring link in lock-step, so its time is set by the
      slowest link. ``k * ring_bottleneck`` is the ring's total hop as if every one of its ``k``
      links ran at the bottleneck's speed (which, in lock-step, they do); it is on the same scale as
      the pair sum, so both weights are 1.
    - One GPU costs 0; two GPUs ``a, b`` cost ``H[a,b] + 2 H[a,b]`` (the ring is ``a -> b -> a``).

    Sets of equal cost (within ``1e-9``) are ordered by fewest pairs split across known NUMA nodes
    (the tasks' CPUs and host memory stay on one socket), then by their positions, smallest first.

Search (:func:`best_placement`)
    - At most :data:`EXACT_MAX_FREE` (16) free GPUs: exact. Every ``k``-subset is bounded at once
      (numpy): the pair cost exactly, the ring bottleneck between a lower bound (the largest, over
      the set's GPUs, of each GPU's second-nearest neighbour in the set, since a ring gives every
      GPU two neighbours; raised to the first hop level at which the set is connected) and an upper
      bound (the smallest hop level at which every GPU of the set has at least ``k/2`` neighbours:
      by Dirac's theorem that graph has a Hamiltonian cycle). Where the bounds meet the cost is
      exact; the other sets are solved exactly, cheapest lower bound first, until no remaining
      lower bound can beat the best cost found. 8 of 16 GPUs takes 1-5 ms.
    - More free GPUs (a 72-GPU NVLink domain): a heuristic. Greedy growth from every free GPU as a
      seed (add the GPU with the smallest summed hop to the set so far; ties: the candidate whose
      own nearest free GPU outside the set is nearest, then NUMA split, then index), every grown
      set costed exactly, then the :data:`HEURISTIC_STARTS` best improved by
      best-improvement swap search (replace one member by one outsider while the cost key strictly
      drops). ``Placement.search`` says which ran. ``benchmarks/placement`` measures both against
      :func:`exhaustive` and :func:`cost_lower_bound`.

The ring itself (:func:`ring_order`)
    Exact for up to :data:`RING_EXACT_MAX` GPUs: up to 9 by enumerating every cycle (numpy), 10 to
    16 by finding the bottleneck with a Hamiltonian-cycle search over bitmasks at each hop level
    (the sum around that ring is then a 2-opt local optimum). Above 16 GPUs the ring is built at the
    Dirac level (Palmer's algorithm) and improved by 2-opt: the bottleneck is an upper bound there,
    exact whenever the two bounds above meet (always on an all-NVSwitch domain).
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from slurm_gpushare.errors import InputError

#: Weight of the pair cost (sum of hops over every pair of the set).
PAIR_WEIGHT = 1.0
#: Weight of the ring term (``k`` times the ring's bottleneck hop).
RING_WEIGHT = 1.0
#: :func:`best_placement` enumerates every subset when at most this many GPUs are free.
EXACT_MAX_FREE = 16
#: Rings of up to this many GPUs are solved by enumerating every cycle (``(k-1)!/2`` of them).
RING_ENUMERATE_MAX = 9
#: Rings of up to this many GPUs have an exact bottleneck; larger ones a heuristic (module docstring).
RING_EXACT_MAX = 16
#: How many of the greedy sets the heuristic improves by swap search.
HEURISTIC_STARTS = 8
#: Most swap rounds per start (each strictly lowers the cost key; real searches stop after a few).
HEURISTIC_MAX_ROUNDS = 64
#: Schema version of :meth:`Placement.to_dict` and :meth:`PlacementAudit.to_dict`.
PLACEMENT_JSON_VERSION = 1

# Costs are sums of a few float constants: equal within this tolerance is a tie.
_TOL = 1e-9
# Elements per numpy block when enumerating rings of many sets at once.
_BLOCK = 1 << 21


@dataclass(frozen=True)
class Placement:
    """A GPU set with its cost under the cost model (module docstring).

    Attributes:
        gpus: ascending matrix positions (GPU indices on a node numbered ``0..n-1``).
        cost: ``PAIR_WEIGHT * pair_cost + RING_WEIGHT * k * ring_bottleneck``, dimensionless (hops).
        ring: the GPUs in ring order (rank order for a ring all-reduce), starting at the smallest,
            towards the smaller of its two ring neighbours.
        pair_cost: sum of the hops over every pair.
        ring_bottleneck: the largest hop between ring neighbours.
        ring_sum: the sum of the hops between ring neighbours (``k`` links; 2 for two GPUs).
        numa_split: pairs whose GPUs sit on different known NUMA nodes.
        search: ``exact`` (every subset was considered), ``heuristic`` (greedy + swaps, more than
            :data:`EXACT_MAX_FREE` free GPUs) or ``given`` (a set that was costed, not searched).
    """

    gpus: tuple[int, ...]
    cost: float
    ring: tuple[int, ...] = field(default=())
    pair_cost: float = 0.0
    ring_bottleneck: float = 0.0
    ring_sum: float = 0.0
    numa_split: int = 0
    search: str = "given"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict: every attribute, costs rounded to 6 decimals, and ``version``."""
        return {
            "version": PLACEMENT_JSON_VERSION,
            "gpus": list(self.gpus),
            "cost": round(self.cost, 6),
            "ring": list(self.ring),
            "pair_cost": round(self.pair_cost, 6),
            "ring_bottleneck": round(self.ring_bottleneck, 6),
            "ring_sum": round(self.ring_sum, 6),
            "numa_split": self.numa_split,
            "search": self.search,
        }


@dataclass(frozen=True)
class PlacementAudit:
    """How far an allocation was from the best set that was free when it was made.

    Attributes:
        allocated: the positions the job was given, ascending.
        cost_given: cost of ``allocated``.
        cost_best: cost of ``best``, never above ``cost_given``.
        excess: ``cost_given - cost_best`` (0 for a best set), hops.
        best: the best set of the same size among the GPUs free before the allocation.
        given: the allocated set, costed (its ring, bottleneck, NUMA split).
    """

    allocated: tuple[int, ...]
    cost_given: float
    cost_best: float
    excess: float
    best: Placement
    given: Placement

    @property
    def excess_ratio(self) -> float:
        """``excess / cost_best`` (0 when the best cost is 0: one GPU)."""
        return self.excess / self.cost_best if self.cost_best > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict for the job's record: ``version``, ``allocated``, the costs, ``best_gpus``,
        ``excess`` and ``excess_ratio`` (6 decimals)."""
        return {
            "version": PLACEMENT_JSON_VERSION,
            "allocated": list(self.allocated),
            "cost_given": round(self.cost_given, 6),
            "cost_best": round(self.cost_best, 6),
            "excess": round(self.excess, 6),
            "excess_ratio": round(self.excess_ratio, 6),
            "best_gpus": list(self.best.gpus),
            "best_search": self.best.search,
        }


# --- public API -----------------------------------------------------------------------------------


def best_placement(hop: Any, k: int, free: Iterable[int] | None = None,
                   numa: Sequence[int | None] | None = None) -> Placement:
    """The best ``k``-GPU set among the free GPUs (module docstring: cost model and search).

    Args:
        hop: the hop matrix, ``(n, n)`` (:func:`slurm_gpushare.topology.hops.hop_matrix`).
        k: GPUs wanted, at least 1.
        free: positions that may be used (default: all).
        numa: NUMA node per position (None = unknown), the tie-breaker; default: all unknown.

    Returns:
        The set, with ``search`` ``exact`` (at most :data:`EXACT_MAX_FREE` free) or ``heuristic``.

    Raises:
        InputError: a malformed matrix, ``k`` below 1 or above the number of free GPUs, a free
            position outside the matrix or given twice, a ``numa`` of the wrong length.
    """
    h = _check_hop(hop)
    cand = _free_positions(free, h.shape[0])
    _check_k(k, len(cand))
    nm = _numa_array(numa, h.shape[0])
    sub, sub_numa = h[np.ix_(cand, cand)], nm[cand]
    if len(cand) <= EXACT_MAX_FREE:
        local = _search_subsets(sub, k, sub_numa, _combinations(len(cand), k), prune=True)
        search = "exact"
    else:
        local = _heuristic(sub, k, sub_numa)
        search = "heuristic"
    return _placement(h, tuple(int(cand[i]) for i in local), nm, search)


def exhaustive(hop: Any, k: int, free: Iterable[int] | None = None,
               numa: Sequence[int | None] | None = None, *, max_sets: int | None = None) -> Placement:
    """The optimum by costing every ``k``-subset of the free GPUs exactly (no pruning): the reference.

    Memory stays bounded (subsets are costed in blocks); time grows with ``C(free, k)``.

    Args:
        hop, k, free, numa: as for :func:`best_placement`.
        max_sets: refuse to enumerate more subsets than this (default: no limit).

    Raises:
        InputError: as for :func:`best_placement`; more than ``max_sets`` subsets; ``k`` above
            :data:`RING_EXACT_MAX` (the ring bottleneck would not be exact).
    """
    h = _check_hop(hop)
    cand = _free_positions(free, h.shape[0])
    _check_k(k, len(cand))
    if k > RING_EXACT_MAX:
        raise InputError(f"exhaustive search is exact only up to {RING_EXACT_MAX} GPUs per set, got k={k}")
    count = math.comb(len(cand), k)
    if max_sets is not None and count > max_sets:
        raise InputError(f"{count} subsets of {len(cand)} free GPUs, more than max_sets={max_sets}")
    nm = _numa_array(numa, h.shape[0])
    sub, sub_numa = h[np.ix_(cand, cand)], nm[cand]
    best: tuple[float, int, tuple[int, ...]] | None = None
    block = max(1, _BLOCK // (k * k))
    for sets in _combination_blocks(len(cand), k, block):
        local = _search_subsets(sub, k, sub_numa, sets, prune=False)
        key = _key(sub, sub_numa, local)
        if best is None or _better(key, best):
            best = key
    assert best is not None
    return _placement(h, tuple(int(cand[i]) for i in best[2]), nm, "exact")


def evaluate(hop: Any, gpus: Iterable[int], numa: Sequence[int | None] | None = None) -> Placement:
    """Cost a given GPU set (``search="given"``): its pair cost, best ring and NUMA split.

    Raises:
        InputError: a malformed matrix, an empty set, a position outside the matrix or given twice.
    """
    h = _check_hop(hop)
    sel = _free_positions(gpus, h.shape[0])
    if len(sel) == 0:
        raise InputError("a GPU set needs at least 1 GPU")
    return _placement(h, tuple(int(g) for g in sel), _numa_array(numa, h.shape[0]), "given")


def placement_cost(hop: Any, gpus: Iterable[int]) -> float:
    """The cost of a GPU set under the cost model (module docstring), dimensionless.

    Raises:
        InputError: as for :func:`evaluate`.
    """
    return evaluate(hop, gpus).cost


def ring_order(hop: Any, gpus: Iterable[int]) -> tuple[int, ...]:
    """The GPUs in ring order: smallest bottleneck hop between neighbours, then smallest sum.

    The ring starts at the smallest position and goes towards the smaller of its two neighbours;
    among equal rings the lexicographically smallest order wins.

    Raises:
        InputError: as for :func:`evaluate`.
    """
    return evaluate(hop, gpus).ring


def first_fit(free: Iterable[int], k: int) -> tuple[int, ...]:
    """The ``k`` lowest free positions: a first-fit-by-index allocator (the comparison baseline).

    Raises:
        InputError: ``k`` below 1 or above the number of free GPUs.
    """
    cand = sorted({int(g) for g in free})
    _check_k(k, len(cand))
    return tuple(cand[:k])


def random_fit(free: Iterable[int], k: int, rng: np.random.Generator) -> tuple[int, ...]:
    """``k`` free positions drawn uniformly without replacement (the comparison baseline), ascending.

    Args:
        rng: a numpy random generator (``numpy.random.default_rng(seed)``).

    Raises:
        InputError: ``k`` below 1 or above the number of free GPUs.
    """
    cand = sorted({int(g) for g in free})
    _check_k(k, len(cand))
    return tuple(sorted(int(g) for g in rng.choice(cand, size=k, replace=False)))


def audit(hop: Any, allocated: Iterable[int], free_before: Iterable[int],
          numa: Sequence[int | None] | None = None) -> PlacementAudit:
    """Compare an allocation with the best set of the same size that was free when it was made.

    Args:
        hop: the hop matrix, ``(n, n)``.
        allocated: the positions the job was given (Slurm's ``SLURM_JOB_GPUS`` on a node numbered
            ``0..n-1``).
        free_before: the positions free just before the allocation; the allocated ones are counted
            as free whether listed or not (a Prolog sees the node after the allocation).
        numa: NUMA node per position (tie-breaker).

    Returns:
        The audit; ``excess`` is 0 when the allocation was a best set. Where the heuristic runs
        (more than :data:`EXACT_MAX_FREE` free) and finds nothing better, the given set is the best.

    Raises:
        InputError: as for :func:`evaluate` and :func:`best_placement`.
    """
    h = _check_hop(hop)
    given = evaluate(h, allocated, numa)
    pool = set(_free_positions(free_before, h.shape[0]).tolist()) | set(given.gpus)
    best = best_placement(h, len(given.gpus), sorted(pool), numa)
    if _better(_placement_key(given), _placement_key(best)):
        best = given
    excess = max(0.0, given.cost - best.cost)
    if excess <= _TOL:
        excess = 0.0
    return PlacementAudit(given.gpus, given.cost, min(best.cost, given.cost), excess, best, given)


def score(hop: Any, gpus: Iterable[int], numa: Sequence[int | None] | None = None,
          free: Iterable[int] | None = None) -> dict[str, Any]:
    """Everything ``place --score`` and ``topology --score`` print about one GPU set.

    Args:
        hop: the hop matrix.
        gpus: the set to score (positions).
        numa: NUMA node per position.
        free: the GPUs the set is compared with (default: every GPU, an idle node).

    Returns:
        ``version``, ``gpus``, ``cost``, ``pair_cost``, ``ring``, ``ring_bottleneck``, ``ring_sum``,
        ``worst_pair`` (largest hop of any pair), ``numa_split``, and the comparison: ``best_gpus``,
        ``best_cost``, ``best_search``, ``excess``, ``excess_ratio``.

    Raises:
        InputError: as for :func:`audit`.
    """
    h = _check_hop(hop)
    pool = range(h.shape[0]) if free is None else free
    a = audit(h, gpus, pool, numa)
    g = a.given
    sel = list(g.gpus)
    worst = float(h[np.ix_(sel, sel)].max()) if len(sel) > 1 else 0.0
    out = g.to_dict()
    del out["search"]
    out["worst_pair"] = round(worst, 6)
    out.update(best_gpus=list(a.best.gpus), best_cost=round(a.cost_best, 6), best_search=a.best.search,
               excess=round(a.excess, 6), excess_ratio=round(a.excess_ratio, 6))
    return out


def cost_lower_bound(hop: Any, k: int, free: Iterable[int] | None = None) -> float:
    """A lower bound on the cost of every ``k``-subset of the free GPUs (no enumeration).

    Pair cost: each GPU of a set contributes at least the sum of its ``k-1`` smallest hops to free
    GPUs, so the pair cost is at least half the sum of the ``k`` smallest such sums. Ring: each GPU
    has two ring neighbours (one for ``k = 2``), so the bottleneck is at least the ``k``-th smallest
    second-nearest (nearest) free neighbour hop. The bound is the weighted sum of the two; on
    structured nodes it is often tight (``benchmarks/placement`` reports how often).

    Raises:
        InputError: as for :func:`best_placement`.
    """
    h = _check_hop(hop)
    cand = _free_positions(free, h.shape[0])
    _check_k(k, len(cand))
    if k == 1:
        return 0.0
    sub = h[np.ix_(cand, cand)].copy()
    np.fill_diagonal(sub, np.inf)
    rows = np.sort(sub, axis=1)[:, : k - 1]
    pair_lb = 0.5 * float(np.sort(rows.sum(axis=1))[:k].sum())
    near = rows[:, 0] if k == 2 else rows[:, 1]
    ring_lb = float(np.sort(near)[k - 1])
    return PAIR_WEIGHT * pair_lb + RING_WEIGHT * k * ring_lb


# --- checks ---------------------------------------------------------------------------------------


def _check_hop(hop: Any) -> np.ndarray:
    h = np.asarray(hop, dtype=np.float64)
    if h.ndim != 2 or h.shape[0] != h.shape[1]:
        raise InputError(f"a hop matrix must be square, got shape {h.shape}")
    if h.size == 0:
        raise InputError("a hop matrix needs at least one GPU")
    if not np.isfinite(h).all() or h.min() < 0:
        raise InputError("a hop matrix holds finite, non-negative hops")
    if np.abs(np.diagonal(h)).max() > _TOL or np.abs(h - h.T).max() > _TOL:
        raise InputError("a hop matrix must be symmetric and 0 on the diagonal",
                         hint="build it with slurm_gpushare.topology.hops.hop_matrix")
    return h


def _free_positions(free: Iterable[int] | None, n: int) -> np.ndarray:
    if free is None:
        return np.arange(n)
    sel = [int(g) for g in free]
    bad = [g for g in sel if not 0 <= g < n]
    if bad:
        raise InputError(f"GPU position(s) {bad} outside the {n}x{n} hop matrix")
    if len(set(sel)) != len(sel):
        raise InputError(f"GPU set {sel} names a GPU twice")
    return np.array(sorted(sel), dtype=np.intp)


def _check_k(k: int, available: int) -> None:
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise InputError(f"a placement needs at least 1 GPU, got k={k!r}")
    if k > available:
        raise InputError(f"{k} GPUs wanted, only {available} free")


def _numa_array(numa: Sequence[int | None] | None, n: int) -> np.ndarray:
    if numa is None:
        return np.full(n, -1, dtype=np.int64)
    if len(numa) != n:
        raise InputError(f"numa has {len(numa)} entries for {n} GPUs")
    return np.array([-1 if v is None else int(v) for v in numa], dtype=np.int64)


# --- costing one set ------------------------------------------------------------------------------


def _placement(h: np.ndarray, gpus: tuple[int, ...], numa: np.ndarray, search: str) -> Placement:
    sel = np.array(gpus, dtype=np.intp)
    sub = h[np.ix_(sel, sel)]
    k = len(gpus)
    pair = float(sum(sub[a, b] for a, b in itertools.combinations(range(k), 2)))
    order, bottleneck, ring_sum = _best_ring(sub)
    cost = PAIR_WEIGHT * pair + RING_WEIGHT * k * bottleneck
    split = int(_numa_split(np.arange(k)[None, :], numa[sel])[0])
    return Placement(gpus=gpus, cost=cost, ring=tuple(gpus[i] for i in order), pair_cost=pair,
                     ring_bottleneck=bottleneck, ring_sum=ring_sum, numa_split=split, search=search)


def _placement_key(p: Placement) -> tuple[float, int, tuple[int, ...]]:
    return (p.cost, p.numa_split, p.gpus)


def _better(a: tuple[float, int, tuple[int, ...]], b: tuple[float, int, tuple[int, ...]]) -> bool:
    """Cost key ``a`` strictly before ``b``: lower cost (beyond the tolerance), then NUMA split, then positions."""
    if a[0] < b[0] - _TOL:
        return True
    if a[0] > b[0] + _TOL:
        return False
    return (a[1], a[2]) < (b[1], b[2])


def _key(sub: np.ndarray, numa: np.ndarray, local: tuple[int, ...]) -> tuple[float, int, tuple[int, ...]]:
    p = _placement(sub, local, numa, "given")
    return (p.cost, p.numa_split, p.gpus)


# --- rings ------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def _ring_table(k: int) -> tuple[np.ndarray, np.ndarray]:
    """Every cycle through ``0..k-1`` once (starts at 0, second element below the last), in
    lexicographic order, as two read-only ``(k, cycles)`` arrays: each cycle's GPUs (column ``c`` is
    cycle ``c``) and each one's ring successor. Column-major so that reductions over a cycle's ``k``
    links run along contiguous rows (20x faster than along columns)."""
    rows = [(0, *p) for p in itertools.permutations(range(1, k)) if p[0] < p[-1]]
    table = np.array(rows, dtype=np.intp).reshape(len(rows), k)
    here = np.ascontiguousarray(table.T)
    succ = np.ascontiguousarray(np.roll(table, -1, axis=1).T)
    here.setflags(write=False)
    succ.setflags(write=False)
    return here, succ


def _best_ring(sub: np.ndarray) -> tuple[tuple[int, ...], float, float]:
    """Best ring of a small matrix ``sub``: (order of its positions, bottleneck, ring sum)."""
    k = sub.shape[0]
    if k == 1:
        return (0,), 0.0, 0.0
    if k == 2:
        return (0, 1), float(sub[0, 1]), 2.0 * float(sub[0, 1])
    if k <= RING_ENUMERATE_MAX:
        here, succ = _ring_table(k)
        edges = np.ascontiguousarray(sub).ravel()[here * k + succ]  # (k, cycles)
        mx, sm = edges.max(axis=0), edges.sum(axis=0)
        sm = np.where(mx <= mx.min() + _TOL, sm, np.inf)
        best = int(np.flatnonzero(sm <= sm.min() + _TOL)[0])
        return tuple(int(v) for v in here[:, best]), float(mx[best]), float(sm[best])
    levels = np.unique(sub[~np.eye(k, dtype=bool)])
    lo, hi = _ring_bounds_one(sub, levels)
    cycle: list[int] | None = None
    if k <= RING_EXACT_MAX:
        for level in levels[(levels >= lo - _TOL) & (levels < hi - _TOL)]:
            cycle = _hamiltonian_cycle(sub <= level + _TOL)
            if cycle is not None:
                break
    if cycle is None:
        cycle = _palmer_cycle(sub <= hi + _TOL)
    cycle = _two_opt(sub, cycle)
    return _canonical_ring(sub, cycle)


def _ring_bounds_one(sub: np.ndarray, levels: np.ndarray) -> tuple[float, float]:
    """(lower bound, Dirac level) of the ring bottleneck of one set; see the module docstring."""
    k = sub.shape[0]
    off = np.where(np.eye(k, dtype=bool), np.inf, sub)
    lo = float(np.sort(off, axis=1)[:, 1].max())
    need = math.ceil(k / 2)
    for level in levels:
        if ((off <= level + _TOL).sum(axis=1) >= need).all():
            return lo, float(level)
    return lo, float(levels[-1])


def _hamiltonian_cycle(adj: np.ndarray) -> list[int] | None:
    """A Hamiltonian cycle of the graph ``adj`` (bool ``k x k``) through 0, or None (bitmask DP)."""
    k = adj.shape[0]
    bits = [sum(1 << j for j in range(k) if adj[i, j] and i != j) for i in range(k)]
    full = (1 << k) - 1
    dp = [0] * (1 << k)  # dp[mask]: bitset of the ends of paths from 0 that visit exactly mask
    dp[1] = 1
    for mask in range(1, full + 1, 2):
        ends = dp[mask]
        if not ends:
            continue
        reach = 0
        while ends:
            low = ends & -ends
            ends ^= low
            reach |= bits[low.bit_length() - 1]
        nxt = reach & ~mask
        while nxt:
            low = nxt & -nxt
            nxt ^= low
            dp[mask | low] |= low
    close = dp[full] & bits[0]
    if not close:
        return None
    j = (close & -close).bit_length() - 1
    mask, path = full, [j]
    while mask != 1:
        prev = mask ^ (1 << j)
        options = dp[prev] & bits[j]
        j = (options & -options).bit_length() - 1
        mask = prev
        path.append(j)
    return path[::-1]


def _palmer_cycle(adj: np.ndarray) -> list[int]:
    """A Hamiltonian cycle of a graph that meets Ore's condition (Palmer 1997: close the gaps)."""
    k = adj.shape[0]
    cyc = list(range(k))
    for _ in range(k * k):
        gap = next((i for i in range(k) if not adj[cyc[i], cyc[(i + 1) % k]]), None)
        if gap is None:
            return cyc
        cyc = cyc[gap + 1:] + cyc[: gap + 1]  # the gap now closes the sequence: cyc[-1] / cyc[0]
        a, b = cyc[-1], cyc[0]
        for j in range(k - 2):
            if adj[a, cyc[j]] and adj[b, cyc[j + 1]]:
                cyc = cyc[: j + 1][::-1] + cyc[j + 1:]
                break
        else:
            return cyc  # Ore's condition does not hold; no better cycle is known
    return cyc


def _two_opt(sub: np.ndarray, cycle: list[int]) -> list[int]:
    """Lower the ring's sum by 2-opt moves that keep its bottleneck (first improvement)."""
    k = len(cycle)
    cyc = list(cycle)
    limit = max(sub[cyc[i], cyc[(i + 1) % k]] for i in range(k)) + _TOL
    improved = True
    while improved:
        improved = False
        for i in range(k - 1):
            for j in range(i + 2, k if i else k - 1):
                a, b, c, d = cyc[i], cyc[i + 1], cyc[j], cyc[(j + 1) % k]
                if sub[a, c] <= limit and sub[b, d] <= limit and \
                        sub[a, c] + sub[b, d] < sub[a, b] + sub[c, d] - _TOL:
                    cyc[i + 1: j + 1] = cyc[i + 1: j + 1][::-1]
                    improved = True
    return cyc


def _canonical_ring(sub: np.ndarray, cycle: list[int]) -> tuple[tuple[int, ...], float, float]:
    k = len(cycle)
    start = cycle.index(0)
    cyc = cycle[start:] + cycle[:start]
    if cyc[1] > cyc[-1]:
        cyc = [cyc[0]] + cyc[1:][::-1]
    edges = [float(sub[cyc[i], cyc[(i + 1) % k]]) for i in range(k)]
    return tuple(cyc), max(edges), sum(edges)


# --- costing many sets at once --------------------------------------------------------------------


@functools.lru_cache(maxsize=256)
def _combinations(n: int, k: int) -> np.ndarray:
    """Every ``k``-subset of ``0..n-1`` in lexicographic order, ``(C(n,k), k)``, read-only."""
    table = np.fromiter(itertools.chain.from_iterable(itertools.combinations(range(n), k)),
                        dtype=np.intp, count=math.comb(n, k) * k).reshape(-1, k)
    table.setflags(write=False)
    return table


def _combination_blocks(n: int, k: int, block: int) -> Iterable[np.ndarray]:
    it = itertools.combinations(range(n), k)
    while True:
        chunk = list(itertools.islice(it, block))
        if not chunk:
            return
        yield np.array(chunk, dtype=np.intp).reshape(len(chunk), k)


def _hop_values(sub: np.ndarray) -> np.ndarray:
    """The distinct hops between different GPUs of ``sub``, ascending (rounded to 9 decimals)."""
    n = sub.shape[0]
    return np.unique(np.round(sub[~np.eye(n, dtype=bool)], 9)) if n > 1 else np.zeros(0)


def _bounds(sub: np.ndarray, sets: np.ndarray, values: np.ndarray,
            ceiling: float | None = np.inf) -> tuple[np.ndarray, ...]:
    """Per set (rows of positions of ``sub``): the pair cost, a lower and an upper bound of the ring
    bottleneck, and whether the two meet (then the bottleneck is exact).

    ``ceiling``: the connectivity refinement is spent only on sets whose lower cost bound is at most
    this and at most the smallest upper cost bound of all the sets (the others cannot be best);
    ``None`` refines every set.

    Lower: every GPU has two ring neighbours, so the bottleneck is at least each GPU's second-nearest
    hop within the set; and the GPUs must be connected through hops no larger than the bottleneck
    (checked level by level, :func:`_connected_bound`). Upper: Dirac's theorem, a graph on ``k >= 3``
    vertices whose every vertex has at least ``k/2`` neighbours has a Hamiltonian cycle: the largest,
    over the set's GPUs, of each GPU's ``ceil(k/2)``-th nearest hop within the set.
    """
    m, k = sets.shape
    n = sub.shape[0]
    block = np.ascontiguousarray(sub).ravel()[sets[:, :, None] * n + sets[:, None, :]]  # (m, k, k)
    pair = block.sum(axis=(1, 2)) / 2
    if k == 1:
        z = np.zeros(m)
        return pair, z, z, np.ones(m, dtype=bool)
    if k == 2:
        b = block[:, 0, 1]
        return pair, b, b, np.ones(m, dtype=bool)
    nearest = np.sort(block, axis=2)  # column 0 is the GPU itself (hop 0)
    lo = nearest[:, :, 2].max(axis=1)
    hi = nearest[:, :, (k + 1) // 2].max(axis=1)
    open_ = lo < hi - _TOL
    if ceiling is not None:
        wk = RING_WEIGHT * k
        limit = min(ceiling, float((PAIR_WEIGHT * pair + wk * hi).min()))
        open_ &= PAIR_WEIGHT * pair + wk * lo <= limit + _TOL
    open_ = np.flatnonzero(open_)
    if len(open_):
        lo[open_] = np.maximum(lo[open_], _connected_bound(block[open_], values, lo[open_], hi[open_]))
    return pair, lo, hi, lo >= hi - _TOL


def _connected_bound(block: np.ndarray, values: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Per set (its ``k x k`` hop block), the smallest hop value from ``lo`` on at which the set is
    connected through hops no larger than it (``hi`` at most: the Dirac level is Hamiltonian).

    A bottleneck is itself one of the hop values, so a set that is not connected at a value has its
    bottleneck at the next value or above. Skipped (``lo`` returned) for matrices with more than 64
    distinct hops, where it would cost more than it saves.
    """
    out = hi.copy()
    if len(values) > 64:
        return lo
    m, k = block.shape[:2]
    pending = np.arange(m)
    squarings = max(1, math.ceil(math.log2(k)))
    for v in values[(values >= lo.min() - _TOL) & (values < hi.max() - _TOL)]:
        pending = pending[v < hi[pending] - _TOL]
        if not len(pending):
            break
        test = pending[lo[pending] <= v + _TOL]
        if not len(test):
            continue
        reach = (block[test] <= v + _TOL).astype(np.float64)  # the diagonal (hop 0) is a self-loop
        for _ in range(squarings):
            reach = np.minimum(reach @ reach, 1.0)
        done = test[reach[:, 0, :].all(axis=1)]
        out[done] = v
        pending = np.setdiff1d(pending, done, assume_unique=True)
    return out


def _exact_bottlenecks(sub: np.ndarray, sets: np.ndarray) -> np.ndarray:
    """The exact ring bottleneck of each set (``k <= RING_EXACT_MAX``)."""
    m, k = sets.shape
    if k > RING_ENUMERATE_MAX:
        return np.array([_best_ring(sub[np.ix_(s, s)])[1] for s in sets])
    here, succ = _ring_table(k)
    flat = np.ascontiguousarray(sub).ravel()
    n = sub.shape[0]
    out = np.empty(m)
    step = max(1, _BLOCK // here.size)
    for start in range(0, m, step):
        s = sets[start:start + step]
        edges = flat[s[:, here] * n + s[:, succ]]  # (sets, k, cycles)
        out[start:start + step] = edges.max(axis=1).min(axis=1)
    return out


def _numa_split(sets: np.ndarray, numa: np.ndarray) -> np.ndarray:
    """Per set, the pairs whose GPUs sit on different known NUMA nodes."""
    groups = np.unique(numa[numa >= 0])
    if len(groups) < 2:
        return np.zeros(sets.shape[0], dtype=np.int64)
    nodes = numa[sets]
    counts = np.stack([(nodes == g).sum(axis=1) for g in groups], axis=1)
    known = counts.sum(axis=1)
    return ((known * known - (counts * counts).sum(axis=1)) // 2).astype(np.int64)


def _search_subsets(sub: np.ndarray, k: int, numa: np.ndarray, sets: np.ndarray,
                    *, prune: bool) -> tuple[int, ...]:
    """The best of ``sets`` (rows of positions of ``sub``) under the cost key.

    With ``prune``, sets whose lower bound cannot beat the best cost are never solved exactly;
    without it every set is costed exactly (the :func:`exhaustive` reference).
    """
    if len(sets) == 1:  # every free GPU is wanted: nothing to choose
        return tuple(int(v) for v in sets[0])
    pair, lo, hi, exact = _bounds(sub, sets, _hop_values(sub), np.inf if prune else None)
    wk = RING_WEIGHT * k
    lower = PAIR_WEIGHT * pair + wk * lo
    cost = np.where(exact, PAIR_WEIGHT * pair + wk * hi, np.inf)
    todo = np.flatnonzero(~exact)
    if prune:
        best = float(min(np.min(cost), np.min(PAIR_WEIGHT * pair + wk * hi)))
        todo = todo[lower[todo] <= best + _TOL]
        todo = todo[np.argsort(lower[todo], kind="stable")]
        step = 64
        for start in range(0, len(todo), step):
            part = todo[start:start + step]
            if lower[part[0]] > cost.min() + _TOL:
                break
            cost[part] = PAIR_WEIGHT * pair[part] + wk * _exact_bottlenecks(sub, sets[part])
    elif len(todo):
        cost[todo] = PAIR_WEIGHT * pair[todo] + wk * _exact_bottlenecks(sub, sets[todo])
    tied = np.flatnonzero(cost <= cost.min() + _TOL)
    split = _numa_split(sets[tied], numa)
    tied = tied[split == split.min()]
    # rows are in lexicographic order where they come from itertools; sort anyway for other callers
    rows = sets[tied]
    pick = np.lexsort(rows.T[::-1])[0]
    return tuple(int(v) for v in rows[pick])


# --- heuristic (more than EXACT_MAX_FREE free GPUs) --------------------------------------------------


def _greedy(sub: np.ndarray, k: int, numa: np.ndarray) -> np.ndarray:
    """From every GPU as a seed, grow a set by the smallest summed hop to the set so far (ties: the
    candidate's own nearest GPU outside the set, then NUMA split, then index); distinct sets, sorted."""
    n = sub.shape[0]
    seeds = np.arange(n)
    chosen = np.zeros((n, n), dtype=bool)
    chosen[seeds, seeds] = True
    sets = np.empty((n, k), dtype=np.intp)
    sets[:, 0] = seeds
    dist = sub.copy()  # dist[s, j]: summed hop from j to the set grown from seed s
    groups = np.unique(numa[numa >= 0])
    onehot = (numa[:, None] == groups[None, :]).astype(np.int64)  # (n, G)
    counts = onehot[seeds].copy()  # (seeds, G): members per NUMA node
    # lookahead tie-break: a candidate whose own nearest free GPU is near leaves a good next step
    off = np.where(np.eye(n, dtype=bool), np.inf, sub)
    near_idx = np.argsort(off, axis=1, kind="stable")[:, : k + 1]  # (n, k+1)
    near_val = np.take_along_axis(off, near_idx, axis=1)
    for t in range(1, k):
        d = np.where(chosen, np.inf, np.round(dist, 9))
        cand = d <= d.min(axis=1, keepdims=True) + _TOL
        taken = chosen[:, near_idx]  # (seeds, n, k+1): is j's i-th nearest GPU already in the set
        ahead = np.where(taken, np.inf, near_val[None, :, :]).min(axis=2)
        ahead = np.where(cand, ahead, np.inf)
        cand &= ahead <= ahead.min(axis=1, keepdims=True) + _TOL
        known = counts.sum(axis=1, keepdims=True)
        same = counts @ onehot.T  # members on j's NUMA node
        inc = np.where(numa[None, :] >= 0, known - same, 0)
        inc = np.where(cand, inc, np.iinfo(np.int64).max)
        cand &= inc == inc.min(axis=1, keepdims=True)
        pick = np.argmax(cand, axis=1)
        sets[:, t] = pick
        chosen[seeds, pick] = True
        dist += sub[pick]
        counts += onehot[pick]
    return np.unique(np.sort(sets, axis=1), axis=0)


def _costs(sub: np.ndarray, sets: np.ndarray, values: np.ndarray, ceiling: float = np.inf) -> np.ndarray:
    """Exact cost per set; sets whose lower bound is above ``ceiling`` get ``inf`` instead."""
    k = sets.shape[1]
    pair, lo, hi, exact = _bounds(sub, sets, values, ceiling)
    wk = RING_WEIGHT * k
    cost = np.where(exact, PAIR_WEIGHT * pair + wk * hi, np.inf)
    todo = np.flatnonzero(~exact & (PAIR_WEIGHT * pair + wk * lo <= ceiling + _TOL))
    if len(todo):
        if k <= RING_EXACT_MAX:
            cost[todo] = PAIR_WEIGHT * pair[todo] + wk * _exact_bottlenecks(sub, sets[todo])
        else:
            cost[todo] = PAIR_WEIGHT * pair[todo] + wk * hi[todo]
    return cost


def _heuristic(sub: np.ndarray, k: int, numa: np.ndarray) -> tuple[int, ...]:
    values = _hop_values(sub)
    n = sub.shape[0]
    grown = _greedy(sub, k, numa)
    cost = _costs(sub, grown, values)
    order = np.lexsort((_numa_split(grown, numa), np.round(cost, 9)))
    best: tuple[float, int, tuple[int, ...]] | None = None
    for row in order[:HEURISTIC_STARTS]:
        cur = grown[row].copy()
        cur_key = (float(cost[row]), int(_numa_split(cur[None, :], numa)[0]), tuple(int(v) for v in cur))
        for _ in range(HEURISTIC_MAX_ROUNDS):
            outside = np.setdiff1d(np.arange(n), cur, assume_unique=True)
            if len(outside) == 0:
                break
            nb = np.repeat(cur[None, :], k * len(outside), axis=0)
            nb[np.arange(len(nb)), np.repeat(np.arange(k), len(outside))] = np.tile(outside, k)
            nb.sort(axis=1)
            c = _costs(sub, nb, values, ceiling=cur_key[0])
            tied = np.flatnonzero(c <= c.min() + _TOL)
            split = _numa_split(nb[tied], numa)
            tied = tied[split == split.min()]
            rows = nb[tied]
            pick = np.lexsort(rows.T[::-1])[0]
            key = (float(c[tied[pick]]), int(split.min()), tuple(int(v) for v in rows[pick]))
            if not _better(key, cur_key):
                break
            cur, cur_key = rows[pick].copy(), key
        if best is None or _better(cur_key, best):
            best = cur_key
    assert best is not None
    return best[2]
