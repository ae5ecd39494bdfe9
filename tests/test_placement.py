"""Tests of slurm_gpushare.topology.placement: the cost model, exactness, the heuristic, the audit, and ``place``.

Machines are the recorded ``nvidia-smi topo -m`` outputs in tests/data/topo (parsed with
``parse_topo_matrix``) plus synthetic hop matrices with known structure. The reference for exactness
is a brute force written here (every subset, every ring, plain Python), independent of the module's
bounds and vectorized search.
"""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from slurm_gpushare.cli import main
from slurm_gpushare.errors import InputError
from slurm_gpushare.hardware.nvidia_smi import parse_topo_matrix
from slurm_gpushare.topology import placement as P
from slurm_gpushare.topology.hops import HOP_NVSWITCH, HOP_SYS, Topology, nvlink_hop

TOPO = Path(__file__).parent / "data" / "topo"
FILES = sorted(p.name for p in TOPO.glob("*.txt"))
A100_FILE = "8x-a100-nv12-bridge-nonadjacent-pairs-tabs.txt"
RTX4090_FILE = "8x-rtx4090-pcie-all-sys-2nic-tabs.txt"
DGX1_FILE = "dgx1-v100-sxm2-8gpu-1nic.txt"
P100_FILE = "8x-p100-pcie-pix-phb-single-numa-tabs.txt"

NV1, NV2, NV12 = nvlink_hop(1), nvlink_hop(2), nvlink_hop(12)


def topology(fname: str) -> Topology:
    return Topology.from_machine(parse_topo_matrix((TOPO / fname).read_text(), source=fname, memory_mib=1))


def hop_and_numa(fname: str) -> tuple[np.ndarray, list[int | None]]:
    t = topology(fname)
    return t.hop_array, list(t.numa_nodes)


# --- an independent brute force -------------------------------------------------------------------


def brute_ring(h, gpus) -> tuple[float, float]:
    """(bottleneck, ring sum) of the best ring: every cycle, bottleneck first."""
    k = len(gpus)
    if k == 1:
        return 0.0, 0.0
    if k == 2:
        return float(h[gpus[0], gpus[1]]), 2.0 * float(h[gpus[0], gpus[1]])
    best = None
    for rest in itertools.permutations(gpus[1:]):
        cyc = (gpus[0], *rest)
        edges = [float(h[cyc[i], cyc[(i + 1) % k]]) for i in range(k)]
        key = (max(edges), sum(edges))
        if best is None or key[0] < best[0] - 1e-9 or (abs(key[0] - best[0]) <= 1e-9 and key[1] < best[1]):
            best = key
    return best


def brute_cost(h, gpus) -> float:
    pair = sum(float(h[a, b]) for a, b in itertools.combinations(gpus, 2))
    return pair + len(gpus) * brute_ring(h, gpus)[0]


def brute_best(h, k, free, numa) -> tuple[tuple[int, ...], float]:
    best = None
    for s in itertools.combinations(sorted(free), k):
        cost = brute_cost(h, s)
        split = sum(1 for a, b in itertools.combinations(s, 2)
                    if numa[a] is not None and numa[b] is not None and numa[a] != numa[b])
        if best is None or cost < best[0] - 1e-9 or (abs(cost - best[0]) <= 1e-9 and (split, s) < best[1:]):
            best = (cost, split, s)
    return best[2], best[0]


def random_free(rng, n, k) -> list[int]:
    count = int(rng.integers(k, n + 1))
    return sorted(int(g) for g in rng.choice(n, count, replace=False))


# --- cost model ------------------------------------------------------------------------------------


def test_cost_of_one_and_two_gpus():
    h, _ = hop_and_numa(A100_FILE)
    assert P.evaluate(h, [3]).cost == 0.0
    p = P.evaluate(h, [0, 2])
    # one NV12 pair: the pair's hop plus a two-link ring at that hop
    assert p.cost == pytest.approx(3 * NV12)
    assert p.pair_cost == pytest.approx(NV12) and p.ring_bottleneck == pytest.approx(NV12)
    assert p.ring == (0, 2) and p.ring_sum == pytest.approx(2 * NV12)
    assert P.placement_cost(h, [0, 1]) == pytest.approx(3 * HOP_SYS)


def test_cost_is_pairs_plus_k_times_the_ring_bottleneck():
    h, _ = hop_and_numa(DGX1_FILE)
    p = P.evaluate(h, [0, 1, 4, 5])
    pairs = NV1 + NV2 + HOP_SYS + HOP_SYS + NV2 + NV1  # 0-1 0-4 0-5 1-4 1-5 4-5
    assert p.pair_cost == pytest.approx(pairs)
    # the ring 0-1-5-4 runs over NVLink only (NV1, NV2, NV1, NV2); index order 0-1-4-5 would cross SYS
    assert p.ring == (0, 1, 5, 4)
    assert p.ring_bottleneck == pytest.approx(NV1)
    assert p.ring_sum == pytest.approx(2 * NV1 + 2 * NV2)
    assert p.cost == pytest.approx(P.PAIR_WEIGHT * pairs + P.RING_WEIGHT * 4 * NV1)
    assert P.ring_order(h, [5, 4, 1, 0]) == (0, 1, 5, 4)


def test_ring_term_prefers_a_set_with_an_nvlink_ring_over_equal_pair_cost():
    # two 4-sets with the same pair cost: a 4-cycle of near links vs a triangle plus a far GPU
    n, near, far = 8, 1.5, 3.8
    h = np.full((n, n), 2.5)
    for a, b in [(0, 1), (1, 2), (2, 3), (3, 0)]:  # set A = 0..3: a near 4-cycle, diagonals 3.8
        h[a, b] = h[b, a] = near
    h[0, 2] = h[2, 0] = h[1, 3] = h[3, 1] = far
    for a, b in [(4, 5), (5, 6), (4, 6)]:  # set B = 4..7: near triangle, 7 far from all but one
        h[a, b] = h[b, a] = near
    h[7, 4] = h[4, 7] = near
    h[7, 5] = h[5, 7] = h[7, 6] = h[6, 7] = (4 * near + 2 * far - 4 * near) / 2
    np.fill_diagonal(h, 0)
    a, b = P.evaluate(h, [0, 1, 2, 3]), P.evaluate(h, [4, 5, 6, 7])
    assert a.pair_cost == pytest.approx(b.pair_cost)
    assert a.ring_bottleneck < b.ring_bottleneck
    assert P.best_placement(h, 4).gpus == (0, 1, 2, 3)


def test_ties_prefer_one_numa_node_then_low_indices():
    h = np.full((4, 4), 3.0)
    np.fill_diagonal(h, 0)
    assert P.best_placement(h, 2).gpus == (0, 1)
    assert P.best_placement(h, 2, numa=[0, 1, 2, 2]).gpus == (2, 3)
    assert P.best_placement(h, 2, numa=[0, 1, 2, 2]).numa_split == 0


@pytest.mark.parametrize("k", [3, 4, 5, 6, 7, 8])
def test_ring_matches_brute_force_on_random_matrices(k):
    rng = np.random.default_rng(k)
    for _ in range(20):
        values = rng.choice([1.05, 1.33, 1.5, 2.0, 3.0, 3.6, 3.8], size=(k, k))
        h = np.triu(values, 1)
        h = h + h.T
        p = P.evaluate(h, range(k))
        bottleneck, ring_sum = brute_ring(h, list(range(k)))
        assert p.ring_bottleneck == pytest.approx(bottleneck)
        assert p.ring_sum == pytest.approx(ring_sum)
        edges = [h[p.ring[i], p.ring[(i + 1) % k]] for i in range(k)]
        assert max(edges) == pytest.approx(p.ring_bottleneck) and sorted(p.ring) == list(range(k))


def _graph_hop(k, edges, near=1.0, far=2.0):
    h = np.full((k, k), far)
    for a, b in edges:
        h[a, b] = h[b, a] = near
    np.fill_diagonal(h, 0)
    return h


def test_ring_bottleneck_of_larger_sets_is_exact():
    # 10..16 GPUs: a Hamiltonian-cycle search at each hop level. A 12-cycle of near links (min
    # degree 2, far below Dirac's k/2) is found; the Petersen graph (3-regular, 10 vertices) has no
    # Hamiltonian cycle, so its ring needs a far link although every GPU has three near neighbours.
    cycle = _graph_hop(12, [(i, (i + 5) % 12) for i in range(12)])
    p = P.evaluate(cycle, range(12))
    assert p.ring_bottleneck == 1.0 and p.ring_sum == 12.0
    petersen = [(i, (i + 1) % 5) for i in range(5)] + [(5 + i, 5 + (i + 2) % 5) for i in range(5)] + \
        [(i, i + 5) for i in range(5)]
    assert P.evaluate(_graph_hop(10, petersen), range(10)).ring_bottleneck == 2.0
    two_boards = np.full((16, 16), HOP_SYS)
    two_boards[:8, :8] = two_boards[8:, 8:] = HOP_NVSWITCH
    np.fill_diagonal(two_boards, 0)
    p = P.evaluate(two_boards, range(16))
    assert p.ring_bottleneck == HOP_SYS and p.ring_sum == pytest.approx(14 * HOP_NVSWITCH + 2 * HOP_SYS)


def test_ring_of_more_than_16_gpus_is_a_valid_ring():
    k = 20
    h = _graph_hop(k, [(i, j) for i in range(k) for j in range(i + 1, k) if (i < 10) == (j < 10)])
    p = P.evaluate(h, range(k))
    assert sorted(p.ring) == list(range(k))
    edges = [h[p.ring[i], p.ring[(i + 1) % k]] for i in range(k)]
    assert max(edges) == p.ring_bottleneck == 2.0 and sum(edges) == pytest.approx(p.ring_sum)
    assert sum(1 for e in edges if e == 2.0) == 2  # two islands: the ring crosses between them twice


# --- exactness --------------------------------------------------------------------------------------


@pytest.mark.parametrize("fname", FILES)
def test_best_placement_is_the_exhaustive_optimum_on_recorded_topologies(fname):
    h, numa = hop_and_numa(fname)
    n = h.shape[0]
    rng = np.random.default_rng(7)
    for k in range(1, min(8, n) + 1):
        for _ in range(6):
            free = random_free(rng, n, k)
            gpus, cost = brute_best(h, k, free, numa)
            best = P.best_placement(h, k, free, numa)
            assert (best.gpus, best.search) == (gpus, "exact"), (k, free)
            assert best.cost == pytest.approx(cost)
            assert P.exhaustive(h, k, free, numa).gpus == gpus
            assert P.cost_lower_bound(h, k, free) <= cost + 1e-9


def test_exact_on_random_matrices_with_numa():
    rng = np.random.default_rng(3)
    for trial in range(60):
        n = int(rng.integers(3, 11))
        values = rng.random((n, n)) if trial % 2 else rng.choice([1.05, 1.5, 2.0, 3.6, 3.8], size=(n, n))
        h = np.triu(values, 1)
        h = h + h.T
        numa = [None if v < 0 else int(v) for v in rng.integers(-1, 2, n)]
        k = int(rng.integers(1, min(n, 6) + 1))
        free = random_free(rng, n, k)
        assert P.best_placement(h, k, free, numa).gpus == brute_best(h, k, free, numa)[0]


def _boards(boards: int, size: int) -> np.ndarray:
    n = boards * size
    h = np.full((n, n), HOP_SYS)
    for b in range(boards):
        h[b * size:(b + 1) * size, b * size:(b + 1) * size] = HOP_NVSWITCH
    np.fill_diagonal(h, 0)
    return h


def test_exact_search_at_its_16_gpu_limit():
    h = _boards(2, 8)
    numa = [i // 8 for i in range(16)]
    rng = np.random.default_rng(1)
    for k in (2, 4, 6, 8):
        for _ in range(3):
            free = random_free(rng, 16, k)
            best = P.best_placement(h, k, free, numa)
            assert best.search == "exact"
            assert best.gpus == P.exhaustive(h, k, free, numa).gpus
    assert P.best_placement(h, 8, list(range(16)), numa).gpus == tuple(range(8))
    # 5 free on one board, 6 on the other: 8 GPUs must span both; the ring crosses twice
    p = P.best_placement(h, 8, [0, 1, 2, 3, 4, 8, 9, 10, 11, 12, 13], numa)
    assert sum(1 for g in p.gpus if g >= 8) == 6 and p.ring_bottleneck == HOP_SYS


def _domain72() -> tuple[np.ndarray, list[int]]:
    """4 trays x 18 GPUs: direct NV18 pairs, NVSwitch within a tray, PCIe NODE/SYS between trays."""
    n = 72
    h = np.empty((n, n))
    for i in range(n):
        for j in range(n):
            ti, tj = i // 18, j // 18
            if i == j:
                h[i, j] = 0.0
            elif ti == tj:
                h[i, j] = nvlink_hop(18) if i // 2 == j // 2 else HOP_NVSWITCH
            else:
                h[i, j] = 3.6 if ti // 2 == tj // 2 else HOP_SYS
    return h, [i // 36 for i in range(n)]


def test_heuristic_beyond_16_free_gpus():
    h, numa = _domain72()
    best = P.best_placement(h, 4, None, numa)
    assert best.search == "heuristic"
    assert best.gpus == (0, 1, 2, 3)  # two NV18 pairs of one tray
    assert best.cost == pytest.approx(P.cost_lower_bound(h, 4))
    rng = np.random.default_rng(5)
    for _ in range(8):
        k = int(rng.integers(2, 6))
        free = sorted(int(g) for g in rng.choice(72, int(rng.integers(17, 24)), replace=False))
        got = P.best_placement(h, k, free, numa)
        assert got.search == "heuristic" and set(got.gpus) <= set(free)
        assert got.cost == pytest.approx(P.exhaustive(h, k, free, numa).cost)


# --- acceptance: the recorded nodes ---------------------------------------------------------------


def test_a100_two_gpus_never_get_a_sys_pair_while_an_nv12_pair_is_free():
    h, numa = hop_and_numa(A100_FILE)
    pairs = [(0, 2), (1, 3), (4, 5), (6, 7)]
    for r in range(2, 9):
        for free in itertools.combinations(range(8), r):
            got = P.best_placement(h, 2, free, numa).gpus
            if any(a in free and b in free for a, b in pairs):
                assert got in pairs, (free, got)
                assert h[got] == pytest.approx(NV12)


def test_rtx4090_two_gpus_stay_on_one_numa_node_while_possible():
    h, numa = hop_and_numa(RTX4090_FILE)
    assert set(numa) == {0, 1}
    for r in range(2, 9):
        for free in itertools.combinations(range(8), r):
            got = P.best_placement(h, 2, free, numa).gpus
            possible = any(sum(1 for g in free if numa[g] == node) >= 2 for node in (0, 1))
            assert (numa[got[0]] == numa[got[1]]) == possible, (free, got)


def test_p100_four_gpus_stay_behind_one_pcie_switch():
    h, numa = hop_and_numa(P100_FILE)
    assert P.best_placement(h, 4, numa=numa).gpus == (0, 1, 2, 3)
    assert P.best_placement(h, 4, [0, 1, 4, 5, 6, 7], numa).gpus == (4, 5, 6, 7)


# --- audit, score, baselines -----------------------------------------------------------------------


def test_audit_zero_excess_for_the_best_set_positive_for_a_worse_one():
    h, numa = hop_and_numa(A100_FILE)
    good = P.audit(h, [1, 3], free_before=[0, 1, 3, 4], numa=numa)
    assert good.excess == 0.0 and good.excess_ratio == 0.0 and good.cost_given == good.cost_best
    bad = P.audit(h, [0, 1], free_before=[0, 1, 3, 4], numa=numa)
    assert bad.best.gpus == (1, 3)
    assert bad.excess == pytest.approx(3 * HOP_SYS - 3 * NV12) and bad.excess > 0
    assert bad.excess_ratio == pytest.approx(bad.excess / bad.cost_best)
    # the allocated GPUs count as free before the allocation, listed or not
    assert P.audit(h, [0, 1], free_before=[3, 4], numa=numa).best.gpus == (1, 3)
    d = bad.to_dict()
    assert d["version"] == 1 and d["allocated"] == [0, 1] and d["best_gpus"] == [1, 3]
    assert set(d) == {"version", "allocated", "cost_given", "cost_best", "excess", "excess_ratio",
                      "best_gpus", "best_search"}


def test_audit_with_the_heuristic_never_reports_negative_excess():
    h, numa = _domain72()
    a = P.audit(h, [0, 1, 2, 3], free_before=range(72), numa=numa)
    assert a.excess == 0.0
    worse = P.audit(h, [0, 20, 40, 60], free_before=range(72), numa=numa)
    assert worse.excess > 0 and worse.best.search == "heuristic"


def test_score_reports_the_set_and_the_best():
    h, numa = hop_and_numa(DGX1_FILE)
    s = P.score(h, [0, 1, 4, 5], numa)
    assert s["ring"] == [0, 1, 5, 4] and s["worst_pair"] == pytest.approx(HOP_SYS)
    assert s["best_gpus"] == [0, 1, 2, 3] and s["excess"] > 0 and s["numa_split"] == 4
    assert P.score(h, [0, 1, 2, 3], numa)["excess"] == 0.0
    # on a busy node where 2 and 3 are taken, the same set is the best there was
    busy = P.score(h, [0, 1, 4, 5], numa, free=[0, 1, 4, 5, 6])
    assert busy["best_gpus"] == [0, 1, 4, 5] and busy["excess"] == 0.0
    assert set(s) == {"version", "gpus", "cost", "ring", "pair_cost", "ring_bottleneck", "ring_sum", "numa_split",
                      "worst_pair", "best_gpus", "best_cost", "best_search", "excess", "excess_ratio"}


def test_first_fit_and_random_fit():
    assert P.first_fit([5, 1, 3, 0], 2) == (0, 1)
    a = P.random_fit(range(8), 3, np.random.default_rng(4))
    assert a == P.random_fit(range(8), 3, np.random.default_rng(4))
    assert len(a) == 3 and list(a) == sorted(a)
    with pytest.raises(InputError, match="3 GPUs wanted, only 2 free"):
        P.first_fit([0, 1], 3)


def test_placement_to_dict():
    h, numa = hop_and_numa(DGX1_FILE)
    d = P.best_placement(h, 2, numa=numa).to_dict()
    assert d["version"] == 1 and d["search"] == "exact" and len(d["gpus"]) == 2 and len(d["ring"]) == 2


@pytest.mark.parametrize("call, message", [
    (lambda h: P.best_placement(h, 0), "at least 1 GPU"),
    (lambda h: P.best_placement(h, 9), "9 GPUs wanted, only 8 free"),
    (lambda h: P.best_placement(h, 2, [0, 8]), "outside the 8x8 hop matrix"),
    (lambda h: P.best_placement(h, 2, [0, 0, 1]), "names a GPU twice"),
    (lambda h: P.best_placement(h, 2, numa=[0]), "numa has 1 entries for 8 GPUs"),
    (lambda h: P.best_placement(h[:3], 2), "must be square"),
    (lambda h: P.best_placement(h + np.triu(np.ones((8, 8)), 1), 2), "symmetric"),
    (lambda h: P.evaluate(h, []), "at least 1 GPU"),
    (lambda h: P.exhaustive(h, 4, max_sets=10), "70 subsets of 8 free GPUs, more than max_sets=10"),
])
def test_bad_input_is_named(call, message):
    h, _ = hop_and_numa(DGX1_FILE)
    with pytest.raises(InputError, match=message):
        call(h)


def test_importing_placement_is_cheap_and_pure():
    # the search tables are built on first use, not at import
    assert P._combinations.cache_info().maxsize == 256
    assert math.comb(16, 8) == len(P._combinations(16, 8))


# --- command line -----------------------------------------------------------------------------------


def run(*args: str):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def test_place_picks_the_nvlink_pair_and_compares():
    r = run("place", "--from-topo", str(TOPO / A100_FILE), "--hostname", "a100", "-k", "2", "--free", "0,1,3,4,6")
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert lines[0] == "best 2 of 5 free GPUs on a100 (exact search; cost = pairs + 2 x ring bottleneck)"
    assert lines[2].split()[:4] == ["best", "1,3", "3.23", "1.00"]
    assert lines[3].split()[:5] == ["first", "fit", "0,1", "11.40", "3.53"]
    assert lines[4].split()[:4] == ["random", "mean", "of", "100"]


def test_place_json():
    r = run("place", "--from-topo", str(TOPO / DGX1_FILE), "-k", "4", "--json", "--draws", "10", "--seed", "3")
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert d["version"] == 1 and d["k"] == 4 and d["free"] == list(range(8))
    assert d["best"]["gpus"] == [0, 1, 2, 3] and d["first_fit"]["ratio"] == 1.0
    assert d["random"]["draws"] == 10 and d["random"]["seed"] == 3 and d["random"]["mean_ratio"] >= 1.0
    assert d["cost_model"] == {"pair_weight": 1.0, "ring_weight": 1.0}


def test_place_score():
    r = run("place", "--from-topo", str(TOPO / DGX1_FILE), "--hostname", "dgx1", "--score", "0,1,4-5")
    assert r.exit_code == 0, r.output
    assert r.output.splitlines()[0] == "GPUs 0,1,4,5 on dgx1: cost 19.27 (pairs 13.27 + ring 4 x 1.50)"
    assert "ring order 0,1,5,4" in r.output and "best 4 of every GPU: 0,1,2,3" in r.output
    d = json.loads(run("place", "--from-topo", str(TOPO / DGX1_FILE), "--score", "0,1", "--free", "0-3",
                       "--json").output)
    assert d["gpus"] == [0, 1] and d["best_gpus"] == [0, 3] and d["excess"] > 0


@pytest.mark.parametrize("args, message", [
    ([], "place needs -k K"),
    (["-k", "2", "--score", "0,1"], "not both"),
    (["-k", "2", "--free", "0,x"], "'x' in '0,x' is not a GPU index"),
    (["-k", "2", "--free", "0,9"], "GPU(s) [9] do not exist"),
    (["-k", "2", "--free", "3-1"], "is not a GPU index or an ascending range a-b"),
    (["-k", "2", "--free", "0,0"], "names a GPU twice"),
    (["-k", "9"], "9 GPUs wanted, only 8 free"),
    (["--score", "0,12"], "GPU(s) [12] do not exist"),
])
def test_place_bad_input_is_one_line(args, message):
    r = CliRunner().invoke(main, ["place", "--from-topo", str(TOPO / DGX1_FILE), *args])
    assert r.exit_code == 2, r.output
    assert r.output.count("\n") == 1 and message in r.output
