"""The AdminComment segment: replace ours, keep everything else."""

import pytest

from slurm_gpushare.errors import InputError
from slurm_gpushare.slurm.admincomment import extract, format_segment, merge


def test_merge_keeps_other_content_and_replaces_our_segment():
    seg1 = format_segment({"req": "mem=10G", "grant": "gres:shard:10"})
    assert seg1 == "[gpushare:v1 req=mem=10G grant=gres:shard:10]"
    ac = merge('{"jobstats": 1}', seg1)
    assert ac == '{"jobstats": 1} [gpushare:v1 req=mem=10G grant=gres:shard:10]'
    seg2 = format_segment({"req": "mem=20G", "grant": "gres:shard:20"})
    ac2 = merge(ac, seg2)
    assert ac2 == '{"jobstats": 1} [gpushare:v1 req=mem=20G grant=gres:shard:20]'
    assert extract(ac2) == {"req": "mem=20G", "grant": "gres:shard:20"}
    assert merge(None, seg1) == seg1 and merge("", seg1) == seg1


def test_extract_none_and_newer_versions():
    assert extract("something else") is None and extract(None) is None
    with pytest.raises(InputError, match="version 2"):
        extract("[gpushare:v2 a=b]")


@pytest.mark.parametrize("fields", [{"a": "x y"}, {"a": "x]"}, {"a b": "x"}, {"a=b": "x"}])
def test_unsafe_values_are_refused(fields):
    with pytest.raises(InputError):
        format_segment(fields)


def test_none_marker_is_no_audit_and_is_replaced_by_a_new_segment():
    assert extract("[gpushare:none]") is None
    seg = format_segment({"req": "mem=10G"})
    assert merge("x [gpushare:none]", seg) == f"x {seg}"
