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


def _lua_pattern_as_regex(pattern: str) -> str:
    """A Lua pattern of the kinds job_submit.lua uses (``%s %d %[ %] [^...]``, ``* +``) as a Python regex."""
    out, i = [], 0
    while i < len(pattern):
        c = pattern[i]
        if c == "%":
            nxt = pattern[i + 1]
            out.append({"s": r"\s", "d": r"\d", "S": r"\S"}.get(nxt, "\\" + nxt))
            i += 2
        else:
            out.append(c)
            i += 1
    return "".join(out)


def test_job_submit_lua_finds_and_removes_the_audit_by_the_tag_this_module_owns():
    """job_submit.lua writes no segment but finds the audit (is the held GRES a gpushare grant?) and removes
    it when an update drops the share; its literals and pattern must be this module's, and leave the running
    and final usage segments alone."""
    import re
    from importlib import resources

    from slurm_gpushare.accounting.record import summary_segment
    from slurm_gpushare.accounting.sacct import final_segment
    from slurm_gpushare.slurm.admincomment import AUDIT, AUDIT_NONE, SEGMENTS
    from tests.accounting.test_record import record

    lua = resources.files("slurm_gpushare.data.site").joinpath("job_submit.lua").read_text()
    assert f'"[{AUDIT.tag}"' in lua and f'"{AUDIT_NONE}"' in lua
    (pattern,) = re.findall(r'string\.gsub\(ac, "([^"]+)", ""\)', lua)
    regex = re.compile(_lua_pattern_as_regex(pattern))
    audit = format_segment({"req": "mem=10G", "grant": "gres:shard:10"})
    running, final = summary_segment([record()]), final_segment([record()])
    text = f"ticket-17 {audit} {running} {final}"
    assert regex.sub("", text) == AUDIT.pattern.sub("", text) == f"ticket-17 {running} {final}"
    assert len({s.tag for s in SEGMENTS}) == len(SEGMENTS) and all(
        s.pattern.search(text) for s in SEGMENTS)
