"""The filter service at cluster scale: refreshes read again only what changed, build off the request path,
and keep the decisions they cannot have changed (counted here; benchmarks/filterd_scale holds the times)."""

from __future__ import annotations

import io
import json
import os
import threading

import pytest

from slurm_gpushare.hardware import machine as machine_mod
from slurm_gpushare.slurm.nodegres import GresOptions, node_gres
from slurm_gpushare.submit import cache as cache_mod
from slurm_gpushare.submit import policy as policy_mod
from slurm_gpushare.submit.cache import InventoryCache
from slurm_gpushare.submit.inventory import build_inventory
from slurm_gpushare.submit.log import Log
from slurm_gpushare.submit.policy import PoolIndex, decide
from slurm_gpushare.submit.policyfile import SitePolicy
from slurm_gpushare.submit.service import FilterService
from slurm_gpushare_dev import synthetic
from slurm_gpushare_dev.cluster import DEFAULT_NODES, packaged_machine
from tests.conftest import DEADLINE
from tests.test_filterd import PARTS, fake_slurm

NODES = {n: packaged_machine(f) for n, f in DEFAULT_NODES.items()}


@pytest.fixture
def machines_dir(tmp_path):
    """The dev cluster's four machine descriptions, one ``<node>.json`` each."""
    synthetic.write_machines(NODES, tmp_path / "machines")
    return tmp_path / "machines"


class Source:
    """``fake_slurm`` text whose states and stale nodes a test changes between refreshes."""

    def __init__(self):
        self.state: dict[str, str] = {}
        self.stale: set[str] = set()
        self.calls = 0

    def __call__(self):
        self.calls += 1
        sinfo, parts = fake_slurm(NODES, PARTS)()
        data = json.loads(sinfo)
        for n in data["nodes"]:
            n["state"] = self.state.get(n["name"], "idle")
            if n["name"] in self.stale:
                n["gres"] = "gpu:h100:4,shard:h100:316"
        return json.dumps(data), parts


@pytest.fixture
def counted(monkeypatch):
    """Counts of Machine.load, node_gres (the expected GRES of a node) and pool builds."""
    counts = {"load": 0, "node_gres": 0, "pool": 0}
    load, gres, build = machine_mod.Machine.load.__func__, cache_mod.node_gres, policy_mod._build_pool

    def counting_load(cls, *a, **kw):
        counts["load"] += 1
        return load(cls, *a, **kw)

    def counting_gres(*a, **kw):
        counts["node_gres"] += 1
        return gres(*a, **kw)

    def counting_build(*a, **kw):
        counts["pool"] += 1
        return build(*a, **kw)

    monkeypatch.setattr(machine_mod.Machine, "load", classmethod(counting_load))
    monkeypatch.setattr(cache_mod, "node_gres", counting_gres)
    monkeypatch.setattr(policy_mod, "_build_pool", counting_build)
    return counts


def _cache(machines_dir, source):
    cache = InventoryCache(machines_dir, slurm_source=source, log=Log(io.StringIO()))
    assert cache.refresh("start")
    return cache


def test_a_refresh_reads_again_only_the_descriptions_and_nodes_that_changed(machines_dir, counted):
    source = Source()
    cache = _cache(machines_dir, source)
    first = cache.current()
    assert (counted["load"], counted["node_gres"]) == (4, 4)
    assert cache.refresh("periodic")
    same = cache.current()
    assert (counted["load"], counted["node_gres"]) == (4, 4)  # nothing parsed or computed again
    assert all(same.nodes[n] is first.nodes[n] for n in first.nodes)
    assert cache.state().pools.single["gpu"] is not None and counted["pool"] == 2  # gpu and pcie, once

    # one description rewritten with other content, one node's state changed in sinfo
    p = machines_dir / "rtx4090-pcie.json"
    p.write_text(packaged_machine(DEFAULT_NODES["rtx4090-pcie"]).to_json().replace('"driver_version": ""',
                                                                                    '"driver_version": "999.1"'))
    os.utime(p, ns=(p.stat().st_atime_ns, p.stat().st_mtime_ns + 10**9))
    source.state["h100-nvs"] = "mixed"
    assert cache.changed()
    assert cache.refresh("machines changed")
    new = cache.current()
    assert counted["load"] == 5 and counted["node_gres"] == 6  # one file parsed, two nodes built again
    assert new.nodes["rtx4090-pcie"].machine.driver_version == "999.1"  # the change is picked up
    assert new.nodes["h100-nvs"].state == "mixed" and new.nodes["h100-nvs"] is not first.nodes["h100-nvs"]
    assert new.nodes["a100-nvb"] is first.nodes["a100-nvb"] and new.nodes["h100-mig"] is first.nodes["h100-mig"]
    assert not cache.changed()


def test_a_request_during_a_slow_refresh_is_answered_from_the_old_snapshot(machines_dir):
    source = Source()
    cache = _cache(machines_dir, source)
    svc = FilterService(cache, Log(io.StringIO()))
    ask = {"op": "submit", "tres_per_node": "gres:gpushare:mem=10G", "partition": "gpu"}
    assert svc.handle(dict(ask))["tres_per_node"] == "gres:gpu:h100_1g.10gb:1"
    started, release = threading.Event(), threading.Event()

    def slow():
        started.set()
        assert release.wait(DEADLINE)
        source.stale = {"h100-mig"}  # the new snapshot has no MIG node left
        return source()

    cache.slurm_source = slow
    t = threading.Thread(target=cache.refresh, args=("periodic",))
    t.start()
    try:
        assert started.wait(DEADLINE)
        answers = [svc.handle(dict(ask)) for _ in range(20)]
        assert cache.lock.locked() and t.is_alive()  # the refresh is still building, holding its lock
    finally:
        release.set()
        t.join(DEADLINE)
    assert {a["tres_per_node"] for a in answers} == {"gres:gpu:h100_1g.10gb:1"}
    assert svc.handle(dict(ask))["tres_per_node"] == "gres:shard:10"  # the new one is in force after


def test_the_decision_cache_survives_a_refresh_that_changed_nothing_it_read(machines_dir):
    source = Source()
    cache = _cache(machines_dir, source)
    svc = FilterService(cache, Log(io.StringIO()))
    pcie = {"op": "submit", "tres_per_node": "gres:gpushare:mem=10G", "partition": "pcie"}
    gpu = {"op": "submit", "tres_per_node": "gres:gpushare:mem=10G", "partition": "gpu"}
    direct = {"op": "submit", "tres_per_node": "gres:shard:8", "partition": ""}
    first = [svc.handle(dict(r)) for r in (pcie, gpu, direct)]
    assert svc.decided == 3
    assert [svc.handle(dict(r)) for r in (pcie, gpu, direct)] == first and svc.decided == 3

    source.state["h100-nvs"] = "mixed"  # a state: no pool changes
    assert cache.refresh("periodic")
    assert [svc.handle(dict(r)) for r in (pcie, gpu, direct)] == first and svc.decided == 3

    source.stale = {"h100-mig"}  # the gpu partition's pool changes, pcie's does not
    assert cache.refresh("periodic")
    again = [svc.handle(dict(r)) for r in (pcie, gpu, direct)]
    assert svc.decided == 5  # gpu and the direct shard request (default partition gpu) decided again
    assert again[0] == first[0] and again[1]["tres_per_node"] == "gres:shard:10" != first[1]["tres_per_node"]


def test_direct_shard_requests_never_build_a_pool(machines_dir, counted):
    cache = _cache(machines_dir, Source())
    svc = FilterService(cache, Log(io.StringIO()))
    built = counted["pool"]
    for n in range(1, 40):
        a = svc.handle({"op": "submit", "tres_per_node": f"gres:shard:{n}", "partition": "pcie"})
        assert a["action"] == ("rewrite" if n <= 23 else "reject"), (n, a)
    assert counted["pool"] == built


def test_the_decision_log_line_is_written_after_the_answer_is_sent(machines_dir):
    """The socket loop queues the decision record and writes it once the answer went out."""
    log = io.StringIO()
    svc = FilterService(_cache(machines_dir, Source()), Log(log))
    logs: list = []
    a = svc.handle_line(json.dumps({"op": "submit", "tres_per_node": "gres:shard:2"}), peer_uid=0, logs=logs)
    assert a["action"] == "rewrite" and '"decision"' not in log.getvalue()
    assert [r["event"] for r in logs] == ["decision"]
    svc.log.write(logs)
    assert json.loads(log.getvalue().splitlines()[-1])["tres_per_node"] == "gres:shard:2"


N = 10_000


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    """10,000 synthetic nodes with 20 GPU types (one GPU each: small files) and Slurm's view of them."""
    d = tmp_path_factory.mktemp("big") / "machines"
    nodes = synthetic.machines(N, gpus=1)
    synthetic.write_machines(nodes, d)
    return d, synthetic.SlurmView(nodes)


def test_at_10000_nodes_every_request_during_a_refresh_is_answered_without_waiting_for_it(big, monkeypatch):
    d, view = big
    text = [view.text()]
    cache = InventoryCache(d, slurm_source=lambda: text[0], log=Log(io.StringIO()))
    assert cache.refresh("start")
    old = cache.state()
    assert len(old.inventory.nodes) == N and len(old.pools.single["gpu"].whole) == 15  # + 5 MIG models' slices
    svc = FilterService(cache, Log(io.StringIO()))
    reqs = [{"op": "submit", "tres_per_node": tpn, "partition": part}
            for tpn in ("gres:gpushare:mem=10G", "gres:gpushare:mem=20G:1", "gres:gpushare:mode=gpu",
                        "gres:shard:8", "gres:gpushare:mem=5G+sm=25", "gres:gpushare:mem=900G")
            for part in ("", "t0", "t1", "t2", "t3")]
    before = [svc.handle(dict(r)) for r in reqs]
    assert {a["action"] for a in before} == {"rewrite", "reject"}

    # the refresh changes every partition's pool (5 nodes stale), and 1% of the states
    names = list(view.nodes)
    view.stale = {names[k] for k in (0, 1, 2, 3, 4)}
    for k in range(0, N, 100):
        view.state[names[k]] = "mixed"
    text[0] = view.text()

    # the refresh stops in the middle of its pool builds until 200 requests have been answered
    answered, midway = [0], threading.Event()
    on_request_thread = {"builds": 0, "parses": 0}
    build, load = policy_mod._build_pool, machine_mod.Machine.load.__func__
    main = threading.current_thread()

    def gated_build(*a, **kw):
        if threading.current_thread() is main:
            on_request_thread["builds"] += 1
        else:
            midway.set()
            while answered[0] < 200 and not release.is_set():
                release.wait(0.001)
        return build(*a, **kw)

    def counted_load(cls, *a, **kw):
        if threading.current_thread() is main:
            on_request_thread["parses"] += 1
        return load(cls, *a, **kw)

    release = threading.Event()
    monkeypatch.setattr(policy_mod, "_build_pool", gated_build)
    monkeypatch.setattr(machine_mod.Machine, "load", classmethod(counted_load))
    svc_cold = FilterService(cache, Log(io.StringIO()))  # nothing remembered: every request decided
    t = threading.Thread(target=cache.refresh, args=("periodic",))
    t.start()
    during = []
    try:
        assert midway.wait(DEADLINE)
        i = 0
        while t.is_alive():
            r = reqs[i % len(reqs)]
            during.append((i % len(reqs), svc.handle(dict(r)), svc_cold.handle(dict(r))))
            answered[0] += 1
            i += 1
    finally:
        release.set()
        t.join(DEADLINE)
    assert cache.state() is not old and not t.is_alive()
    # every request answered while the refresh ran, from the snapshot in force: the old one
    assert answered[0] >= 200
    assert all(a == before[k] and b == before[k] for k, a, b in during[:200])
    assert on_request_thread == {"builds": 0, "parses": 0}  # no request built a pool or read a file
    assert svc_cold.decided >= len(reqs)


def test_a_partition_list_is_decided_from_its_partitions_pools_as_from_its_nodes(counted):
    """``-p t0,t2``: the pool merged from the partitions' pools gives the decisions a pool built from every
    node of the partitions gives, and is made without a walk over the nodes."""
    nodes = synthetic.machines(40, gpus=2)
    view = synthetic.SlurmView(nodes)
    view.stale = {"n00001"}
    opts = GresOptions(shard_unit_mib=SitePolicy().shard_unit_mib)
    inv = build_inventory(nodes, *view.text(), expected_gres=lambda m, n: node_gres(m, n, opts).counts)
    policy = SitePolicy()
    index = PoolIndex(inv, policy)
    built = counted["pool"]
    for parts in (("t0", "t1"), ("t0", "t2"), ("t1", "t2", "t3"), ("t3", "gpu"), ("t2", "t2")):
        for tpn in ("gres:gpushare:mem=3G", "gres:gpushare:mem=10G", "gres:gpushare:mem=30G:2",
                    "gres:gpushare:mode=gpu:8", "gres:gpushare:mem=70G", "gres:shard:20", "gres:shard:70",
                    "gres:gpushare:mem=10G+sm=25", "gres:gpushare:mem=500G"):
            for n in (1, 3, 30):
                merged = decide(tpn, None, partitions=parts, inventory=inv, policy=policy, nodes=n, pools=index)
                walked = decide(tpn, None, partitions=parts, inventory=inv, policy=policy, nodes=n)
                assert merged == walked and merged.audit == walked.audit, (parts, tpn, n)
    assert counted["pool"] - built == 5  # the walked pools (once per list), none for the merged ones


def test_refreshes_with_frozen_collection_leave_no_cyclic_garbage_behind(tmp_path):
    """With ``freeze_gc`` every object alive after a refresh goes to the collector's permanent generation, where
    cyclic garbage would never be collected: refreshes that change node states, descriptions and the decisions
    made between them must keep the frozen count flat, not growing with each refresh."""
    import gc

    nodes = synthetic.machines(60)
    synthetic.write_machines(nodes, tmp_path / "machines")
    view = synthetic.SlurmView(nodes)
    cache = InventoryCache(tmp_path / "machines", slurm_source=view.text, log=Log(io.StringIO()), freeze_gc=True)
    svc = FilterService(cache, Log(io.StringIO()))
    names = list(nodes)
    counts = []
    try:
        for i in range(12):
            view.state[names[i % len(names)]] = "mixed" if i % 2 else "idle"
            if i % 3 == 0:  # a description rewritten: parsed again
                p = tmp_path / "machines" / f"{names[i]}.json"
                p.write_text(nodes[names[i]].to_json() + "\n" * (i + 1))
            assert cache.refresh("periodic")
            for mem in ("4G", "10G", "30G"):
                svc.handle({"op": "submit", "tres_per_node": f"gres:gpushare:mem={mem}", "partition": "gpu"})
            counts.append(gc.get_freeze_count())
    finally:
        gc.unfreeze()
    # after the first refreshes (caches filling) the frozen count stays within a small band
    settled = counts[4:]
    assert max(settled) - min(settled) < 0.02 * max(settled) + 500, counts


def test_a_state_change_keeps_the_pools_and_a_refresh_frees_the_old_sources_entry_by_entry(machines_dir, counted):
    """Issue 29 item 5: a partition's pool key is made of the nodes' own ``pool_key`` tuples (no state in them),
    so a node that only changed state keeps every pool, and the key shares the unchanged nodes' tuples with the
    key before it; the inventory before the last build has its ``sources`` emptied (only a build reads them),
    the current one keeps them."""
    source = Source()
    cache = _cache(machines_dir, source)
    pools, inv = cache.state().pools, cache.current()
    assert counted["pool"] == 2
    source.state["h100-nvs"] = "mixed"
    assert cache.refresh("periodic")
    now = cache.state().pools
    assert counted["pool"] == 2 and now.single["gpu"] is pools.single["gpu"]  # no pool built again
    assert cache.current().nodes["h100-nvs"] is not inv.nodes["h100-nvs"]  # the node was built again
    assert inv.sources == {} and cache.current().sources  # the old build's table emptied, the new one's kept
    # a description rewritten: its partitions' pools are built again, and their keys share the other nodes'
    # tuples with the keys before (freeing the old key frees one node's tuple, not every node's)
    p = machines_dir / "rtx4090-pcie.json"
    p.write_text(packaged_machine(DEFAULT_NODES["rtx4090-pcie"]).to_json().replace('"driver_version": ""',
                                                                                    '"driver_version": "999.1"'))
    os.utime(p, ns=(p.stat().st_atime_ns, p.stat().st_mtime_ns + 10**9))
    assert cache.refresh("machines changed")
    after = cache.state().pools
    assert counted["pool"] > 2 and after.single["gpu"] is not now.single["gpu"]
    fresh = sorted(a[0] for a, b in zip(after._keys["gpu"], now._keys["gpu"], strict=True) if a is not b)
    # the rewritten node, and the one whose state changed (its node was built again; the key it was in had
    # been kept whole, being equal)
    assert fresh == ["h100-nvs", "rtx4090-pcie"] and len(now._keys["gpu"]) == 4
