"""Hostlists and id lists on ClusterShell (slurm_gpushare.slurm.hostlist), in Slurm's text forms."""

from __future__ import annotations

import pytest

from slurm_gpushare.errors import ParseError
from slurm_gpushare.slurm.hostlist import compress_hostlist, expand_hostlist, format_ranges, parse_id_list


def test_slurm_forms_read_and_written():
    assert expand_hostlist("node[01-04],big") == ("node01", "node02", "node03", "node04", "big")
    assert compress_hostlist(["node01", "node02", "node03", "node04"]) == "node[01-04]"
    assert format_ranges([5, 0, 1, 2, 3, 3]) == "0-3,5"
    assert parse_id_list("0-3,5") == (0, 1, 2, 3, 5)


def test_items_keep_written_order_and_duplicates():
    assert expand_hostlist("lx[15,18],gpu1,lx15") == ("lx15", "lx18", "gpu1", "lx15")


@pytest.mark.parametrize("expr", [
    "tux[3,1]",  # Slurm reads File=/dev/nvidia[1,0] in written order, ClusterShell would sort it
    "tux[1-2,2]", "@rack1", "a!b", "a&b", "a^b", "tux 1", "tux[008-10]",
])
def test_what_would_read_differently_is_refused(expr):
    with pytest.raises(ParseError):
        expand_hostlist(expr)


def test_node_groups_are_never_resolved():
    """RESOLVER_NOGROUP: no groups.conf is read, whatever the host has."""
    assert compress_hostlist(["a", "b"]) == "a,b"
