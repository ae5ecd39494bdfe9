"""The submit-side decision (slurm_gpushare.submit.policy.decide) on the dev cluster's four packaged machines."""

from __future__ import annotations

import re
from dataclasses import replace
from importlib import resources
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurm_gpushare.hardware.machine import Machine, MigInstance, MigProfile
from slurm_gpushare.slurm.admincomment import extract, format_segment, merge
from slurm_gpushare.slurm.nodegres import node_gres
from slurm_gpushare.submit import policy as policy_module
from slurm_gpushare.submit import request as request_module
from slurm_gpushare.submit.inventory import ClusterInventory, NodeInventory
from slurm_gpushare.submit.policy import ESLURM_INVALID_GRES, Decision, decide, nominal_gpu_mib, nominal_profile_mib
from slurm_gpushare.submit.policyfile import SitePolicy
from slurm_gpushare.submit.request import unescape_knobs

ROOT = Path(__file__).resolve().parent.parent
FILES = {
    "h100-nvs": "dgx-h100-8gpu-nv18.json",
    "a100-nvb": "8x-a100-nv12-bridge.json",
    "rtx4090-pcie": "8x-rtx4090-pcie.json",
    "h100-mig": "4x-h100-mig-mixed.json",
}
PARTITIONS = {"gpu": tuple(FILES), "pcie": ("rtx4090-pcie",), "mig": ("h100-mig",)}
#: ``tres_per_node`` of a rewrite: gres items only, strict form, prefix ``gres:`` or ``gres/``.
_ITEM = r"gres[:/][A-Za-z0-9_.-]+(:[A-Za-z0-9_.-]+)?:\d+"
STRICT_TRES = re.compile(rf"^{_ITEM}(,{_ITEM})*$")


def machine(filename: str) -> Machine:
    ref = resources.files("slurm_gpushare") / "data" / "machines" / filename
    return Machine.from_json(ref.read_text(), source=filename)


MACHINES = {name: machine(f) for name, f in FILES.items()}


def node(name: str, m: Machine | None, partitions: dict[str, tuple[str, ...]], *, problem: str | None = None,
         gres: dict[tuple[str, str], int] | None = None) -> NodeInventory:
    parts = tuple(p for p, names in partitions.items() if name in names)
    counts = gres if gres is not None else (node_gres(m, name).counts if m is not None else {})
    return NodeInventory(name, parts, "idle", counts, m, problem)


def inventory(extra: dict[str, tuple[Machine | None, dict | None, str | None]] | None = None,
              partitions: dict[str, tuple[str, ...]] | None = None, default: str | None = "gpu") -> ClusterInventory:
    """The dev cluster (partitions gpu = all four, pcie = rtx4090-pcie, mig = h100-mig), plus ``extra`` nodes
    ``name -> (machine, gres or None for node_gres, problem)``."""
    parts = dict(partitions or PARTITIONS)
    nodes = {n: node(n, m, parts) for n, m in MACHINES.items()}
    for name, (m, gres, problem) in (extra or {}).items():
        nodes[name] = node(name, m, parts, problem=problem, gres=gres)
    return ClusterInventory(nodes, parts, default)


INV = inventory()
DEFAULT = SitePolicy()


def run(tpn: str | None, partition: str | None = "gpu", *, tpj: str | None = None, inv: ClusterInventory = INV,
        policy: SitePolicy = DEFAULT) -> Decision:
    parts = tuple(partition.split(",")) if partition else None
    return decide(tpn, tpj, partitions=parts, inventory=inv, policy=policy)


def granted(tpn: str, partition: str | None = "gpu", **kw) -> str:
    d = run(tpn, partition, **kw)
    assert d.action == "rewrite", d.message
    assert d.errno == 0
    assert STRICT_TRES.match(d.tres_per_node), d.tres_per_node
    return d.tres_per_node


def refused(tpn: str, partition: str | None = "gpu", **kw) -> str:
    d = run(tpn, partition, **kw)
    assert d.action == "reject", d
    assert d.errno == ESLURM_INVALID_GRES == 2072
    assert d.message.startswith("gpushare: ")
    assert "\n" not in d.message
    assert d.tres_per_node == tpn
    return d.message


# --- the brief's cases on the dev cluster -------------------------------------------------------------


def test_mem_10g_gets_a_1g_10gb_mig_slice():
    d = run("gres:gpushare:mem=10G")
    assert d.tres_per_node == "gres:gpu:h100_1g.10gb:1"
    assert d.audit["kind"] == "mig"
    assert (d.audit["mem_asked_mib"], d.audit["mem_granted_mib"]) == (10240, 9984)
    assert "9.75 GiB" in d.message and d.message.startswith("gpushare: ")


def test_mem_10g_in_the_pcie_partition_gets_ten_shards():
    assert granted("gres:gpushare:mem=10G", "pcie") == "gres:shard:10"


def test_mode_mps_gets_shards():
    d = run("gres:gpushare:mem=10G+mode=mps")
    assert d.tres_per_node == "gres:shard:10"
    assert d.audit["kind"] == "mps"
    assert d.audit["model"] == "a100,h100,rtx4090"


def test_small_request_gets_mps_because_a_mig_slice_would_be_mostly_unused():
    d = run("gres:gpushare:mem=3G")
    assert d.tres_per_node == "gres:shard:3"
    assert "mig:h100_1g.10gb would leave 70% unused" in d.audit["reason"]


def test_mem_30g_gets_the_4g_40gb_slice():
    d = run("gres:gpushare:mem=30G")
    assert d.tres_per_node == "gres:gpu:h100_4g.40gb:1"
    assert (d.audit["mem_asked_mib"], d.audit["mem_granted_mib"]) == (30720, 40448)


def test_half_unused_is_still_within_the_default_limit():
    assert granted("gres:gpushare:mem=20G") == "gres:gpu:h100_4g.40gb:1"


def test_mem_80g_on_h100_is_one_whole_gpu_by_the_nominal_rule():
    # 80 GiB = 81920 MiB > 81559 MiB that an H100 80GB reports; nominally it is an 80 GiB GPU
    d = run("gres:gpushare:mem=80G", "mig")
    assert d.tres_per_node == "gres:gpu:h100:1"
    assert (d.audit["kind"], d.audit["model"]) == ("gpu", "h100")
    assert (d.audit["mem_asked_mib"], d.audit["mem_granted_mib"]) == (81920, 81559)


def test_a_request_between_usable_and_nominal_size_still_gets_the_gpu():
    assert granted("gres:gpushare:mem=79.9G", "mig") == "gres:gpu:h100:1"


def test_exact_rule_refuses_80g_on_an_h100():
    msg = refused("gres:gpushare:mem=80G", "mig", policy=SitePolicy(gpu_fit="exact"))
    assert msg == ("gpushare: mem=80G is more than the largest GPU in partition mig (79.65 GiB on h100); "
                   "ask for mem=81559M or for whole GPUs with gpushare:mode=gpu:2")


def test_mem_200g_names_the_largest_gpu():
    assert refused("gres:gpushare:mem=200G") == (
        "gpushare: mem=200G is more than the largest GPU in partition gpu (80 GiB on a100, h100); "
        "ask for mem=80G or for whole GPUs with gpushare:mode=gpu:3")


@pytest.mark.parametrize("tpn, start", [
    ("gres:gpushare:mem=abc", "gpushare: mem=abc: 'abc' is not a memory size; write mem=10G"),
    ("gres:gpushare:mem=0", "gpushare: mem=0: less than 1 MiB of GPU memory; write mem=10G"),
    ("gres:gpushare:mem=10G+gpus=2", "gpushare: unknown knob 'gpus' in 'gpus=2'; known knobs: mem, sm, mode"),
    ("gres:gpushare:mem=10G+sm=150", "gpushare: sm=150: '150' is not a percentage from 1 to 100; write sm=25"),
    ("gres:gpushare:mem=10G:0", "gpushare: the count in 'gpushare:mem=10G:0' is 0; ask for at least 1"),
    ("gres:gpushare:mem=10G:x", "gpushare: the count 'x' in 'gpushare:mem=10G:x' is not a whole number"),
    ("gres:gpushare:mem=10G:9", "gpushare: the count 9 is more than this site allows (8 per job); ask for at most 8"),
])
def test_bad_requests_are_refused_with_invalid_gres(tpn, start):
    assert refused(tpn).startswith(start)


def test_a_partition_too_small_says_what_fits_there():
    assert refused("gres:gpushare:mem=40G", "pcie") == (
        "gpushare: mem=40G is more than the largest GPU in partition pcie (24 GiB on rtx4090); "
        "ask for mem=24G or for whole GPUs with gpushare:mode=gpu:2")


def test_prefix_gres_slash_is_kept():
    assert granted("gres/gpushare:mem=10G") == "gres/gpu:h100_1g.10gb:1"
    assert granted("gres/gpushare:mem=10G,gres/nic:1", "pcie") == "gres/shard:10,gres/nic:1"


def test_other_items_are_kept_in_order():
    assert granted("gres:nic:2,gres:gpushare:mem=10G,gres:license_x") == \
        "gres:nic:2,gres:gpu:h100_1g.10gb:1,gres:license_x:1"


def test_repeated_gpushare_tokens_become_one_item():
    d = run("gres:gpushare:mem=10G,gres:nic:1,gres:gpushare:sm=25")
    assert d.tres_per_node == "gres:shard:10,gres:nic:1"
    assert d.audit["sm_percent"] == 25
    assert d.audit["request"] == "mem=10G,sm=25"


def test_gpushare_with_gpu_gres_is_refused():
    assert refused("gres:gpushare:mem=10G,gres:gpu:1").startswith(
        "gpushare: gpushare cannot be combined with 'gpu:1' in one job; for whole GPUs write gpushare:mode=gpu:N")
    assert refused("gres:gpushare:mem=10G", tpj="gres:gpu:a100:2").startswith(
        "gpushare: gpushare cannot be combined with --gpus ('gpu:a100:2')")


def test_gpushare_with_shard_or_mps_is_refused():
    assert "cannot be combined with 'shard:2'" in refused("gres:gpushare:mem=10G,gres:shard:2")
    assert "cannot be combined with 'mps:20'" in refused("gres:gpushare:mem=10G,gres:mps:20")
    assert refused("gres:shard:2,gres:mps:20").startswith("gpushare: shard and mps cannot be combined")


def test_share_requests_per_job_are_refused():
    assert refused("gres:nic:1", tpj="gres:shard:2").startswith(
        "gpushare: 'gres:shard:2' must be asked for per node with --gres")


def test_direct_shard_request_is_kept_and_audited():
    d = run("gres:shard:10")
    assert (d.action, d.tres_per_node, d.errno) == ("rewrite", "gres:shard:10", 0)
    assert d.audit["kind"] == "shard-direct"
    assert format_segment(d.audit_fields()) == ("[gpushare:v1 req=shard:10 grant=gres:shard:10 kind=shard-direct "
                                                "model=a100,h100,rtx4090 mem=10240/10240MiB part=gpu]")


def test_direct_shard_request_larger_than_one_gpu_is_refused():
    assert refused("gres:shard:500") == (
        "gpushare: shard:500 is more than one GPU holds in partition gpu (80 shards on a100); a shard job "
        "must fit one GPU: ask for shard:80 at most, or for whole GPUs with gpushare:mode=gpu:N")
    assert "(23 shards on rtx4090)" in refused("gres:shard:24", "pcie")
    assert granted("gres:shard:23", "pcie") == "gres:shard:23"
    assert refused("gres:shard:0").startswith("gpushare: 'shard:0' asks for no shard")
    assert refused("gres:shard:1,gres:shard:2").startswith("gpushare: 'shard' is asked for twice")


def test_a_typed_direct_shard_is_judged_against_that_type_only():
    # an RTX 4090 has 23 shards: shard:rtx4090:50 pended forever (Reason=Resources) in partition gpu,
    # where an A100 holds 80; shards of a MIG type do not exist (Slurm shows shard:h100_1g.10gb:0)
    assert refused("gres:shard:rtx4090:50") == (
        "gpushare: shard:50 is more than one GPU holds in partition gpu (23 shards on rtx4090); a shard job "
        "must fit one GPU: ask for shard:23 at most, or for whole GPUs with gpushare:mode=gpu:N")
    assert granted("gres:shard:rtx4090:23") == "gres:shard:rtx4090:23"
    d = run("gres:shard:h100:70")
    assert d.action == "rewrite" and d.audit["model"] == "h100", d.audit
    assert refused("gres:shard:h100_1g.10gb:10") == (
        "gpushare: shard:h100_1g.10gb:10: no GPU of type h100_1g.10gb in partition gpu has shards "
        "(shards are on a100, h100, rtx4090); ask for shard:N of one of those types, or for shard:N without a type")
    assert refused("gres:shard:a100:1", "pcie").startswith(
        "gpushare: shard:a100:1: no GPU of type a100 in partition pcie has shards (shards are on rtx4090)")


def test_direct_mps_request_without_mps_gres_is_refused():
    assert refused("gres:mps:50") == (
        "gpushare: mps:50: partition gpu has no mps GRES configured; "
        "use gpushare:mem=10G (memory) or shard:N (N GiB of one GPU)")


def test_direct_mps_request_with_mps_gres_is_capped_at_one_gpu():
    gres = dict(node_gres(MACHINES["a100-nvb"], "a100-mps").counts)
    gres[("mps", "")] = 800
    inv = inventory({"a100-mps": (MACHINES["a100-nvb"], gres, None)},
                    partitions={**PARTITIONS, "mps": ("a100-mps",)})
    d = run("gres:mps:50", "mps", inv=inv)
    assert (d.action, d.tres_per_node, d.audit["kind"], d.audit["sm_percent"]) == (
        "rewrite", "gres:mps:50", "mps-direct", 50)
    assert refused("gres:mps:150", "mps", inv=inv).startswith("gpushare: mps:150 is more than one GPU (mps:100)")


def test_direct_requests_pass_untouched_when_not_policed():
    off = SitePolicy(police_direct=False)
    for tpn in ("gres:shard:500", "gres:mps:50", "gres:shard:2,gres:mps:3"):
        d = run(tpn, policy=off)
        assert (d.action, d.tres_per_node, d.errno, d.audit) == ("pass", tpn, 0, {})
    assert run("gres:gpushare:mem=10G", policy=off).action == "rewrite"


def test_jobs_without_share_requests_pass_untouched():
    for tpn in (None, "", "gres:gpu:h100:1", "gres:gpu:2,gres:nic:1", "garbage:::", "gres:gpushared:1"):
        d = run(tpn, "nope")
        assert (d.action, d.tres_per_node, d.errno, d.message) == ("pass", tpn, 0, "")
        assert d.audit_fields() == {}


# --- nodes, partitions and heterogeneous choices ------------------------------------------------------


H200 = replace(MACHINES["a100-nvb"], hostname="h200-new", gpus=tuple(
    replace(g, name="NVIDIA H200", memory_mib=143771) for g in MACHINES["a100-nvb"].gpus))


def test_unusable_node_is_ignored():
    stale = inventory({"h200-new": (H200, None, "node h200-new: stale description")},
                      partitions={**PARTITIONS, "gpu": (*PARTITIONS["gpu"], "h200-new")})
    assert "(80 GiB on a100, h100)" in refused("gres:gpushare:mem=120G", inv=stale)
    fresh = inventory({"h200-new": (H200, None, None)},
                      partitions={**PARTITIONS, "gpu": (*PARTITIONS["gpu"], "h200-new")})
    assert granted("gres:gpushare:mem=120G", inv=fresh) == "gres:shard:120"
    assert granted("gres:gpushare:mem=140G", inv=fresh) == "gres:gpu:h200:1"


def _a100_mig() -> Machine:
    """An A100 80GB node with two GPUs in MIG mode: seven 1g.10gb on GPU 0, three 2g.20gb on GPU 1."""
    a100 = MACHINES["a100-nvb"]
    profiles = (MigProfile("1g.10gb", 19, 1, 9728, 7), MigProfile("2g.20gb", 14, 2, 19968, 3))
    layout = {0: ("1g.10gb", 7), 1: ("2g.20gb", 3)}
    gpus = list(a100.gpus)
    for index, (profile, n) in layout.items():
        gpus[index] = replace(gpus[index], mig_enabled=True, mig_profiles=profiles, mig_instances=tuple(
            MigInstance(profile, gi, 0, gi, f"MIG-{index}-{gi}", (3 + gi * 9, 4 + gi * 9)) for gi in range(n)))
    return replace(a100, hostname="a100-mig", gpus=tuple(gpus))


def test_heterogeneous_mig_choice_is_recorded():
    parts = {**PARTITIONS, "mixed": ("h100-mig", "a100-mig")}
    inv = inventory({"a100-mig": (_a100_mig(), None, None)}, partitions=parts)
    assert inv.nodes["a100-mig"].gres[("gpu", "a100_1g.10gb")] == 7
    d = run("gres:gpushare:mem=10G", "mixed", inv=inv)
    # same kind, same nominal size: no preference -> model name
    assert d.tres_per_node == "gres:gpu:a100_1g.10gb:1"
    assert d.audit["candidates"][:2] == ["mig:gpu:a100_1g.10gb:1", "mig:gpu:h100_1g.10gb:1"]
    assert "alt=mig:gpu:h100_1g.10gb:1," in format_segment(d.audit_fields())
    assert d.audit["models_considered"] == ["a100", "h100"]
    preferred = run("gres:gpushare:mem=10G", "mixed", inv=inv, policy=SitePolicy(model_preference=("h100",)))
    assert preferred.tres_per_node == "gres:gpu:h100_1g.10gb:1"
    assert "mig:gpu:a100_1g.10gb:1" in preferred.audit["candidates"]
    # least unused memory beats the preference: 2g.20gb (a100) leaves 5 GiB of mem=15G, 4g.40gb (h100) 25 GiB
    d = run("gres:gpushare:mem=15G+mode=mig", "mixed", inv=inv, policy=SitePolicy(model_preference=("h100",)))
    assert d.tres_per_node == "gres:gpu:a100_2g.20gb:1"
    assert d.audit["candidates"] == ["mig:gpu:a100_2g.20gb:1", "mig:gpu:h100_4g.40gb:1"]


def test_default_partition_is_used_when_none_is_given():
    assert granted("gres:gpushare:mem=10G", None) == "gres:gpu:h100_1g.10gb:1"
    d = run("gres:gpushare:mem=10G", None)
    assert d.audit["partitions"] == ["gpu"]


def test_unknown_partition_and_no_default():
    assert refused("gres:gpushare:mem=10G", "nope") == (
        "gpushare: partition 'nope' does not exist; partitions: gpu, mig, pcie")
    assert refused("gres:gpushare:mem=10G", None, inv=inventory(default=None)).startswith(
        "gpushare: no partition given and the cluster has no default partition; submit with -p PARTITION")


def test_partition_without_usable_gpu_nodes_names_the_others():
    inv = inventory({"cpu1": (None, {}, None)}, partitions={**PARTITIONS, "cpu": ("cpu1",)})
    assert refused("gres:gpushare:mem=10G", "cpu", inv=inv) == (
        "gpushare: partition cpu has no usable GPU nodes; try partitions gpu, mig, pcie")
    assert refused("gres:shard:2", "cpu", inv=inv).startswith("gpushare: partition cpu has no shards configured")


def test_several_partitions_pool_their_nodes():
    assert granted("gres:gpushare:mem=10G", "pcie,mig") == "gres:gpu:h100_1g.10gb:1"
    assert run("gres:gpushare:mem=10G", "pcie,mig").audit["partitions"] == ["pcie", "mig"]


# --- site policy ------------------------------------------------------------------------------------


def test_partition_override_restricts_kinds():
    p = SitePolicy(partitions={"pcie": ("mps",), "mig": ("mig",)})
    assert granted("gres:gpushare:mem=10G", "pcie", policy=p) == "gres:shard:10"
    assert refused("gres:gpushare:mem=24G", "pcie", policy=p) == (
        "gpushare: mem=24G is more than the largest MPS share in partition pcie (23 GiB on rtx4090); "
        "ask for mem=23G")
    assert refused("gres:gpushare:mode=gpu", "pcie", policy=p) == (
        "gpushare: mode=gpu is not allowed in partition pcie; allowed there: mode=mps")
    # a job in both partitions may use only what both allow: nothing
    assert refused("gres:gpushare:mem=10G", "pcie,mig", policy=p).startswith(
        "gpushare: no kind of GPU share is allowed in partitions pcie, mig")


def test_mig_only_partition_refuses_wasteful_slices_unless_asked():
    p = SitePolicy(partitions={"mig": ("mig",)})
    assert refused("gres:gpushare:mem=3G", "mig", policy=p) == (
        "gpushare: mem=3G would leave 70% of the smallest MIG slice that holds it unused (h100_1g.10gb, "
        "10 GiB); this site allows at most 50%; ask for mode=mig to take the slice anyway")
    assert granted("gres:gpushare:mem=3G+mode=mig", "mig", policy=p) == "gres:gpu:h100_1g.10gb:1"


def test_mig_switched_off():
    p = SitePolicy(mig_enabled=False)
    assert granted("gres:gpushare:mem=10G", policy=p) == "gres:shard:10"
    assert refused("gres:gpushare:mem=10G+mode=mig", policy=p) == (
        "gpushare: mode=mig: MIG slices are switched off on this cluster; use mode=mps or mode=gpu")


def test_exact_mig_fit_skips_the_nominal_slice():
    p = SitePolicy(mig_fit="exact")
    assert granted("gres:gpushare:mem=10G", "mig", policy=p) == "gres:shard:10"
    assert granted("gres:gpushare:mem=9984M", "mig", policy=p) == "gres:gpu:h100_1g.10gb:1"


def test_whole_gpu_threshold_beats_the_order():
    assert granted("gres:gpushare:mem=64G") == "gres:shard:64"
    assert granted("gres:gpushare:mem=64G", policy=SitePolicy(whole_gpu_threshold=0.75)) == "gres:gpu:a100:1"
    assert granted("gres:gpushare:mem=24G") == "gres:gpu:rtx4090:1"


def test_mode_order_and_model_preference():
    assert granted("gres:gpushare:mem=10G", policy=SitePolicy(mode_order=("mps", "mig", "gpu"))) == "gres:shard:10"
    assert granted("gres:gpushare:mem=80G", policy=SitePolicy(model_preference=("h100",))) == "gres:gpu:h100:1"
    assert granted("gres:gpushare:mem=80G") == "gres:gpu:a100:1"
    # gpu first: whole GPUs even for small requests, the smallest that holds it
    assert granted("gres:gpushare:mem=10G", policy=SitePolicy(mode_order=("gpu", "mig"))) == "gres:gpu:rtx4090:1"


# --- modes, counts, sm -----------------------------------------------------------------------------


def test_counts_are_slices_or_gpus_on_one_node():
    assert granted("gres:gpushare:mem=10G:2") == "gres:gpu:h100_1g.10gb:2"
    assert granted("gres:gpushare:mem=40G+mode=mig:2", "mig") == "gres:gpu:h100_4g.40gb:2"
    assert granted("gres:gpushare:mem=40G:4") == "gres:gpu:a100:4"
    assert refused("gres:gpushare:mem=10G:8", "mig") == (
        "gpushare: no node in partition mig has 8 MIG slices or whole GPUs for gpushare:mem=10G:8; "
        "at most 6 on one node: ask for gpushare:mem=10G:6")
    assert refused("gres:gpushare:mode=gpu:3", "mig").startswith(
        "gpushare: no node in partition mig has 3 whole GPUs for gpushare:mode=gpu:3; at most 2 on one node")


def test_mode_gpu_without_memory_takes_the_smallest_gpu():
    d = run("gres:gpushare:mode=gpu:3")
    assert d.tres_per_node == "gres:gpu:rtx4090:3"
    assert "mem=-/24564MiB" in format_segment(d.audit_fields())


def test_mps_share_is_one_gpu():
    assert refused("gres:gpushare:mem=10G+sm=25+mode=mps:2") == (
        "gpushare: an MPS share is part of one GPU, but gpushare:mem=10G+sm=25+mode=mps:2 asks for 2; "
        "use mode=mig or mode=gpu for 2 slices or GPUs, or drop the count")
    assert refused("gres:gpushare:mem=10G+sm=25:2").startswith("gpushare: sm=25 asks for an MPS share, which is")


def test_sm_asks_for_an_mps_share_and_is_audited():
    d = run("gres:gpushare:mem=10G+sm=25")
    assert d.tres_per_node == "gres:shard:10"
    assert d.audit["sm_percent"] == 25
    assert " sm=25 " in format_segment(d.audit_fields())
    assert "25% of its compute" in d.message
    assert refused("gres:gpushare:mem=10G+sm=25+mode=mig").startswith(
        "gpushare: sm=25 sets an MPS compute share, which mode=mig does not have")
    assert refused("gres:gpushare:mem=10G+sm=25", "pcie", policy=SitePolicy(partitions={"pcie": ("gpu",)})) \
        .startswith("gpushare: sm=25 asks for an MPS share, which partition pcie does not allow")


def test_mode_mig_where_there_is_none():
    assert refused("gres:gpushare:mem=10G+mode=mig", "pcie") == (
        "gpushare: partition pcie has no MIG slices; use mode=mps or mode=gpu")
    assert refused("gres:gpushare:mem=50G+mode=mig").startswith(
        "gpushare: mem=50G is more than the largest MIG slice in partition gpu (40 GiB on h100_4g.40gb); "
        "ask for mem=40G")


# --- audit record -------------------------------------------------------------------------------------


def test_audit_is_one_tagged_segment():
    d = run("gres:gpushare:mem=10G")
    assert format_segment(d.audit_fields()).startswith(
        "[gpushare:v1 req=mem=10G grant=gres:gpu:h100_1g.10gb:1 kind=mig model=h100 mem=10240/9984MiB part=gpu "
        "alt=mps:shard:10,")
    assert d.audit["version"] == 1
    assert d.audit["original"] == "gres:gpushare:mem=10G"
    assert extract(merge("ticket 42", format_segment(d.audit_fields())))["grant"] == "gres:gpu:h100_1g.10gb:1"


def test_reject_audit():
    d = run("gres:gpushare:mem=200G")
    assert format_segment(d.audit_fields()) == "[gpushare:v1 req=mem=200G action=reject]"
    assert d.audit["action"] == "reject"
    assert d.audit["reason"] == d.message[len("gpushare: "):]


def test_nominal_sizes():
    assert nominal_gpu_mib(81559) == 81920
    assert nominal_gpu_mib(24564) == 24576
    assert nominal_gpu_mib(81920) == 81920
    assert nominal_gpu_mib(300) == 300
    assert nominal_profile_mib(MigProfile("1g.10gb", 19, 1, 9984, 7)) == 10240
    assert nominal_profile_mib(MigProfile("1g.10gb+me", 20, 1, 9984, 1)) == 10240
    assert nominal_profile_mib(MigProfile("odd", 1, 1, 5000, 1)) == 5000


# --- the documentation lists exactly the code's messages -----------------------------------------------


def test_documented_messages_match_the_code():
    text = (ROOT / "docs" / "request-syntax.md").read_text()
    block = text.split("<!-- messages:begin -->", 1)[1].split("<!-- messages:end -->", 1)[0]
    documented = {}
    for line in block.splitlines():
        m = re.fullmatch(r"\| `([a-z-]+)` \| `(.*)` \| `(.*)` \|", line.strip())
        if m:
            assert m.group(1) not in documented, m.group(1)
            documented[m.group(1)] = (m.group(2), m.group(3))
    assert not set(request_module.MESSAGES) & set(policy_module.MESSAGES)
    code = {**request_module.MESSAGES, **policy_module.MESSAGES}
    assert documented == code


def test_every_policy_message_has_a_hint():
    for key, (message, hint) in policy_module.MESSAGES.items():
        assert message and hint, key


# --- property: decide never raises, and its answers are well-formed ----------------------------------

_prefixes = st.sampled_from(["gres:", "gres/", ""])
_values = st.one_of(
    st.sampled_from(["10G", "10.5G", "3G", "30G", "80G", "200G", "0", "abc", "1T", "512K", "40G", "24G", "1",
                     "25", "150", "auto", "mig", "mps", "gpu", "GPU", ""]),
    st.text(max_size=8),
)
_knob = st.one_of(
    st.tuples(st.sampled_from(["mem", "sm", "mode", "MEM", "foo", ""]), _values).map(lambda kv: f"{kv[0]}={kv[1]}"),
    st.text(max_size=6),
)
_count = st.one_of(st.none(), st.integers(0, 12).map(str), st.sampled_from(["x", "", "1k", "00"]), st.text(max_size=3))


@st.composite
def _item(draw) -> str:
    name = draw(st.one_of(st.sampled_from(["gpushare", "gpushare", "shard", "mps", "gpu", "nic"]), st.text(max_size=5)))
    if name == "gpushare":
        typ = "+".join(draw(st.lists(_knob, min_size=0, max_size=4)))
    else:
        typ = draw(st.one_of(st.just(""), st.sampled_from(["h100", "a100", "h100_1g.10gb"]), st.text(max_size=5)))
    count = draw(_count)
    parts = [name] + ([typ] if typ or draw(st.booleans()) else []) + ([count] if count is not None else [])
    return draw(_prefixes) + ":".join(parts)


_tres = st.one_of(st.none(), st.text(), st.lists(_item(), min_size=1, max_size=4).map(",".join))
_partitions = st.sampled_from([None, ("gpu",), ("pcie",), ("mig",), ("nope",), ("gpu", "pcie"), ("pcie", "mig"),
                               ("",)])
_policies = st.sampled_from([
    DEFAULT,
    SitePolicy(mig_fit="exact", gpu_fit="exact"),
    SitePolicy(mig_enabled=False, mode_order=("mps", "gpu")),
    SitePolicy(partitions={"pcie": ("mps",), "mig": ("mig",)}, whole_gpu_threshold=0.5),
    SitePolicy(mode_order=("gpu",), model_preference=("h100",), max_count=2, police_direct=False),
    SitePolicy(mig_max_waste=0.0, mode_order=("mig",)),
])


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tpn=_tres, tpj=st.one_of(st.none(), st.just("gres:gpu:2"), _tres), partitions=_partitions, policy=_policies)
def test_decide_never_raises_and_answers_are_well_formed(tpn, tpj, partitions, policy):
    d = decide(tpn, tpj, partitions=partitions, inventory=INV, policy=policy)
    assert d.action in ("pass", "rewrite", "reject")
    if d.action == "pass":
        assert d.tres_per_node == tpn
        assert d.errno == 0
    elif d.action == "rewrite":
        assert STRICT_TRES.match(d.tres_per_node), d.tres_per_node
        assert "gpushare" not in d.tres_per_node
        assert d.errno == 0
        text = format_segment(d.audit_fields())  # raises on spaces or brackets
        assert text.startswith("[gpushare:v1 req=") and "\n" not in text
    else:
        assert d.message.startswith("gpushare: ")
        assert "\n" not in d.message
        assert d.errno == 2072
    if d.message:
        assert d.message.startswith("gpushare: ")


@settings(max_examples=200, deadline=None)
@given(mem=st.integers(1, 300 * 1024), count=st.integers(1, 9), mode=st.sampled_from(["auto", "mig", "mps", "gpu"]),
       partition=st.sampled_from(["gpu", "pcie", "mig"]))
def test_granted_memory_holds_the_request_nominally(mem, count, mode, partition):
    d = run(f"gres:gpushare:mem={mem}M+mode={mode}:{count}", partition)
    if d.action == "rewrite":
        a = d.audit
        assert a["count"] == count
        if a["kind"] == "mps":
            assert a["mem_granted_mib"] >= mem and count == 1
        elif a["kind"] == "mig":
            profile = MigProfile(a["gres_type"].split("_", 1)[1], 0, 1, a["mem_granted_mib"], 1)
            assert nominal_profile_mib(profile) >= mem
        else:
            assert nominal_gpu_mib(a["mem_granted_mib"]) >= mem
        if mode != "auto":
            assert a["kind"] == mode


def test_gpu_fixture_matches_the_dev_cluster_table():
    assert INV.nodes["h100-mig"].gres == {("gpu", "h100"): 2, ("gpu", "h100_4g.40gb"): 2,
                                          ("gpu", "h100_1g.10gb"): 6, ("shard", ""): 158}
    assert all(n.usable for n in INV.nodes.values())


# --- node count (-N / --nodes, --ntasks-per-node): the granted GRES must exist on that many nodes ----


def test_two_nodes_never_get_a_mig_slice_only_one_node_has():
    """Issue #12 item 6: ``-N 2 --gres=gpushare:mem=10G`` was decided as if for one node (h100-mig only)."""
    assert granted("gres:gpushare:mem=10G") == "gres:gpu:h100_1g.10gb:1"
    d = decide("gres:gpushare:mem=10G", None, partitions=("gpu",), inventory=INV, policy=DEFAULT, nodes=2)
    assert d.action == "rewrite", d.message
    assert d.tres_per_node == "gres:shard:10"  # shards exist on the three nodes with whole GPUs
    assert d.audit_fields()["nodes"] == "2"
    assert "nodes" not in run("gres:gpushare:mem=10G").audit_fields()


def test_a_decision_for_several_nodes_says_that_the_grant_is_per_node():
    """``--gres`` counts are per node: ``-N2 --gres=gpushare:mem=10G`` gets a share on each of two nodes, and the
    decision line said only "an MPS share of one GPU" (issue 31 item 3)."""
    d = decide("gres:gpushare:mem=10G", None, partitions=("gpu",), inventory=INV, policy=DEFAULT, nodes=2)
    assert d.message.startswith("gpushare: gpushare:mem=10G -> an MPS share of one ") and \
        d.message.endswith(" GPU on each of the 2 nodes, shard:10 (10 GiB)"), d.message
    d = decide("gres:gpushare:mem=60G", None, partitions=("gpu",), inventory=INV, policy=DEFAULT, nodes=2)
    assert " on each of the 2 nodes" in d.message, d.message
    assert "on each of" not in run("gres:gpushare:mem=10G").message


def test_more_nodes_than_hold_the_grant_are_refused_with_the_count_that_works():
    d = decide("gres:gpushare:mem=10G", None, partitions=("mig",), inventory=INV, policy=DEFAULT, nodes=2)
    assert d.action == "reject" and d.errno == ESLURM_INVALID_GRES
    assert "2 nodes asked for, but only 1 node(s) of partition mig" in d.message and "-N 1" in d.message
    d = decide("gres:shard:10", None, partitions=("pcie",), inventory=INV, policy=DEFAULT, nodes=2)
    assert d.action == "reject" and "only 1 node(s) of partition pcie" in d.message
    assert decide("gres:shard:10", None, partitions=("gpu",), inventory=INV, policy=DEFAULT,
                  nodes=4).action == "rewrite"  # h100-mig is mixed: its whole GPUs have shards too
    assert decide("gres:shard:10", None, partitions=("gpu",), inventory=INV, policy=DEFAULT,
                  nodes=5).action == "reject"


def test_nodes_needed_reads_job_desc_numbers_and_sentinels():
    from slurm_gpushare.submit.policy import nodes_needed
    assert nodes_needed(2) == 2 and nodes_needed(2.0) == 2 and nodes_needed("3") == 3
    assert nodes_needed(4294967294) == 1 and nodes_needed(None) == 1 and nodes_needed(0) == 1
    assert nodes_needed(None, 8, 2) == 4 and nodes_needed(1, 9, 4) == 3 and nodes_needed(5, 8, 2) == 5
    assert nodes_needed(1, 8, 65534) == 1 and nodes_needed("x", [], {}) == 1 and nodes_needed(float("inf")) == 1


# --- requests as cli_filter.lua writes them for clients that refuse "=" in a GRES type (23.11+) ----------


@pytest.mark.parametrize("escaped, plain", [
    ("gres/gpushare:mem%3D10G", "gres/gpushare:mem=10G"),
    ("gres/gpushare:mem%3D10G+mode%3Dmig", "gres/gpushare:mem=10G+mode=mig"),
    ("gres/gpushare:mem%3d10.5G:2,gres/nic:1", "gres/gpushare:mem=10.5G:2,gres/nic:1"),
    ("gres/gpushare:mem%3Dabc", "gres/gpushare:mem=abc"),
])
def test_escaped_knobs_decide_as_the_plain_request(escaped, plain):
    got = decide(escaped, None, partitions=None, inventory=INV, policy=DEFAULT)
    want = decide(plain, None, partitions=None, inventory=INV, policy=DEFAULT)
    assert (got.action, got.tres_per_node, got.message, got.audit_fields()) == (
        want.action, want.tres_per_node, want.message, want.audit_fields())
    assert "%3" not in got.message and "%3" not in str(got.audit_fields())


def test_only_gpushare_items_are_unescaped():
    assert unescape_knobs("gres/nic:a%3Db:1,gres/gpushare:mem%3D10G") == "gres/nic:a%3Db:1,gres/gpushare:mem=10G"
    assert unescape_knobs(None) is None and unescape_knobs("") == ""


def test_a_direct_shard_or_mps_request_is_refused_where_the_partition_allows_no_mps_share():
    # [partitions.pcie] modes = ["gpu"]: whole GPUs only; a direct shard:N is the same GRES an MPS share
    # is granted as (gres:shard:N on one GPU), so it must not slip in beside the policy
    whole_only = SitePolicy(partitions={"pcie": ("gpu",)})
    assert refused("gres:shard:10", "pcie", policy=whole_only) == (
        "gpushare: shard:10 shares a GPU, which partition pcie does not allow (allowed there: mode=gpu); "
        "ask for whole GPUs with gpushare:mode=gpu:N, or submit to another partition")
    assert granted("gres:shard:10", "pcie", policy=SitePolicy(partitions={"pcie": ("mps", "gpu")})) == "gres:shard:10"
    assert granted("gres:shard:10", "gpu", policy=whole_only) == "gres:shard:10"


def test_a_decision_without_a_pool_index_keeps_no_inventory_alive():
    """Pools built for a decision without a :class:`PoolIndex` (the CLI's ``policy check``, tests) belong to
    that inventory: they go with it. A module-global cache keyed by ``id()`` held the last 256 inventories
    (each a whole cluster's snapshot) and their policies alive for the life of the process."""
    import gc
    import weakref

    inv = inventory()
    policy = SitePolicy()
    first = run("gres:gpushare:mem=10G", inv=inv, policy=policy)
    assert run("gres:gpushare:mem=10G", inv=inv, policy=policy) == first  # the second decision reuses the pools
    assert inv.pool_memo and replace(inv, problems=("x",)).pool_memo == {}  # a changed copy builds its own
    gone_inv, gone_policy = weakref.ref(inv), weakref.ref(policy)
    del inv, policy
    gc.collect()
    assert gone_inv() is None and gone_policy() is None
