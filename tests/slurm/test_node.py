"""The one reader of ``scontrol [-d] show node`` (slurm_gpushare/slurm/node.py)."""

from __future__ import annotations

import pytest

from slurm_gpushare.slurm.node import gres_matches, parse_node, responding

#: ``scontrol -d show node`` of a drained MIG node as 24.11 prints it (abridged: the fields read here)
SHOWN = ("NodeName=h100-mig Arch=x86_64 CoresPerSocket=32\n   Gres=gpu:h100:2(S:0),gpu:h100_1g.10gb:6(S:1),"
         "shard:h100_1g.10gb:0,shard:158(S:0)\n   GresDrain=N/A\n   GresUsed=gpu:h100:1(IDX:0),"
         "gpu:h100_1g.10gb:0(IDX:N/A),shard:h100:10(10/79,0/79)\n   State=IDLE+DRAIN ThreadsPerCore=2\n"
         "   SlurmdStartTime=2026-12-02T01:00:00\n"
         "   Reason=gpushare mig apply: to layout.json, state /run/x [root@2026-12-02T01:02:03]\n")


def test_parse_node_reads_state_reason_gres_gres_used_and_slurmd_start():
    n = parse_node(SHOWN)
    assert n.drained and n.state == "IDLE+DRAIN"
    assert n.reason == "gpushare mig apply: to layout.json, state /run/x"
    assert n.gres == "gpu:h100:2(S:0),gpu:h100_1g.10gb:6(S:1),shard:h100_1g.10gb:0,shard:158(S:0)"
    assert n.gres_used == "gpu:h100:1(IDX:0),gpu:h100_1g.10gb:0(IDX:N/A),shard:h100:10(10/79,0/79)"
    assert n.slurmd_start == "2026-12-02T01:00:00"
    bare = parse_node("NodeName=a State=IDLE\n")
    assert bare.reason is None and bare.gres == bare.gres_used == "" and not bare.drained


@pytest.mark.parametrize("shown, want, ok", [
    ("gpu:h100:2(S:0),gpu:h100_1g.10gb:14(S:1),shard:h100:158(S:0),shard:h100_1g.10gb:0(S:1)",
     "gpu:h100:2,gpu:h100_1g.10gb:14,shard:158", True),
    ("gpu:h100:2(S:0),gpu:h100_4g.40gb:2(S:1),gpu:h100_1g.10gb:6(S:1),shard:h100:158(S:0)",
     "gpu:h100:2,gpu:h100_1g.10gb:14,shard:158", False),
    ("gpu:h100:2(S:0),gpu:h100_4g.40gb:1(S:1),gpu:h100_1g.10gb:14(S:1),shard:h100:158(S:0)",
     "gpu:h100:2,gpu:h100_1g.10gb:14,shard:158", False),
    ("gpu:h100:2,gpu:h100_1g.10gb:14,shard:h100:150", "gpu:h100:2,gpu:h100_1g.10gb:14,shard:158", False),
    # what slurmctld shows before a node registers, or text no GRES grammar reads: matches nothing written
    ("(null)", "gpu:h100:2", False), ("gpu:h100:2(S:0", "gpu:h100:2", False), ("(null)", "(null)", True),
    # an unreadable written value matches nothing either (it matched anything: no item to check)
    ("gpu:h100:1", "gpu:h100:2,x:y:z:w", False),
])
def test_gres_matches(shown, want, ok):
    assert gres_matches(shown, want) is ok


@pytest.mark.parametrize(("state", "ok"), [
    ("IDLE", True), ("IDLE+DRAIN", True), ("MIXED+DRAIN", True), ("IDLE+DRAIN+NOT_RESPONDING", False),
    ("IDLE*+DRAIN", False), ("IDLE*", False), ("DOWN+DRAIN", False), ("DOWN*", False),
])
def test_responding_reads_both_forms_of_state(state, ok):
    assert responding(state) is ok
