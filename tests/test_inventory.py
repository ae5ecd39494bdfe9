"""The controller's inventory from each release's real ``sinfo --json`` and ``scontrol -o show partition``,
and the policy's decisions on it: the same cluster gives the same inventory and the same decisions on
every release (tests/data/slurm/<release>/: the default dev cluster, captured on 22.05.8, 24.11.5, 26.05.5).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from slurm_gpushare.errors import SlurmError
from slurm_gpushare.slurm.gres import parse
from slurm_gpushare.slurm.nodegres import node_gres
from slurm_gpushare.submit.inventory import build_inventory
from slurm_gpushare.submit.policy import decide
from slurm_gpushare.submit.policyfile import SitePolicy
from slurm_gpushare_dev.cluster import DEFAULT_NODES, packaged_machine

DATA = Path(__file__).resolve().parent / "data" / "slurm"
RELEASES = ("22.05", "24.11", "26.05")
MACHINES = {n: packaged_machine(f) for n, f in DEFAULT_NODES.items()}
#: the TRES prefix job_submit.lua sees on each release (measured: job_desc.tres_per_node)
PREFIX = {"22.05": "gres:", "24.11": "gres/", "26.05": "gres/"}


def inventory(release: str):
    d = DATA / release
    return build_inventory(MACHINES, (d / "sinfo.json").read_text(), (d / "partitions.txt").read_text(),
                           expected_gres=lambda m, n: node_gres(m, n).counts)


def without_state(inv):
    return {n: replace(node, state="") for n, node in inv.nodes.items()}


@pytest.mark.parametrize("release", RELEASES[1:])
def test_every_release_gives_the_inventory_of_22_05(release):
    old, new = inventory("22.05"), inventory(release)
    assert without_state(new) == without_state(old)
    assert (new.partitions, new.default_partition, new.problems) == (old.partitions, old.default_partition, ())
    assert old.default_partition == "gpu" and old.partitions["pcie"] == ("rtx4090-pcie",)
    assert all(node.usable for node in new.nodes.values())


REQUESTS = [
    ("gpushare:mem=10G", None, None),
    ("gpushare:mem=10G", None, "nomig"),
    ("gpushare:mem=10G+sm=25", None, "nomig"),
    ("gpushare:mem=40G", None, "pcie"),
    ("gpushare:mem=200G", None, None),
    ("gpushare:mode=gpu", None, None),
    ("gpushare:mem=10G:2", None, "nomig"),
    ("gpushare:mem=10G,nic:1", None, None),
    ("shard:8", None, "pcie"),
    ("shard:30", None, "pcie"),
    ("gpu:1", None, None),
    (None, "gpushare:mem=10G", None),
]


def _with_prefix(text, prefix):
    return ",".join(prefix + it for it in text.split(",")) if text else text


@pytest.mark.parametrize("release", RELEASES[1:])
@pytest.mark.parametrize("tpn, tpj, part", REQUESTS)
def test_the_same_request_gets_the_same_decision_on_every_release(release, tpn, tpj, part):
    parts = (part,) if part else None
    old = decide(_with_prefix(tpn, "gres:"), _with_prefix(tpj, "gres:"), partitions=parts,
                 inventory=inventory("22.05"), policy=SitePolicy())
    # the same text on the newer release's inventory: the very same decision
    same = decide(_with_prefix(tpn, "gres:"), _with_prefix(tpj, "gres:"), partitions=parts,
                  inventory=inventory(release), policy=SitePolicy())
    assert same == old and same.audit == old.audit
    # the text as the newer release writes it (gres/): the same decision, in that release's prefix
    new = decide(_with_prefix(tpn, PREFIX[release]), _with_prefix(tpj, PREFIX[release]), partitions=parts,
                 inventory=inventory(release), policy=SitePolicy())
    assert (new.action, new.message.replace("gres/", "gres:"), new.errno) == (old.action, old.message, old.errno)
    if old.tres_per_node is not None:
        assert [it.body for it in parse(new.tres_per_node)] == [it.body for it in parse(old.tres_per_node)]
        assert {it.prefix for it in parse(new.tres_per_node)} <= {PREFIX[release]}
    assert {k: v.replace("gres/", "gres:") for k, v in new.audit_fields().items()} == old.audit_fields()


def test_a_document_of_another_shape_than_its_release_is_refused():
    text = (DATA / "26.05" / "sinfo.json").read_text().replace('"major": "26"', '"major": "22"', 1)
    with pytest.raises(SlurmError, match=r"Slurm 22\.05 has no top-level 'nodes' list"):
        build_inventory(MACHINES, text, "")
