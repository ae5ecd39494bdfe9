"""TRES strings and gpushare knobs (slurm_gpushare.submit.request)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slurm_gpushare.errors import InputError
from slurm_gpushare.slurm.gres import GresItem, item_name
from slurm_gpushare.submit.request import (
    MESSAGES,
    GpushareRequest,
    mentions_share,
    parse_gpushare,
    parse_tres,
)


def req(text: str) -> GpushareRequest:
    return parse_gpushare(parse_tres(text))


def refusal(text: str) -> InputError:
    with pytest.raises(InputError) as e:
        req(text)
    return e.value


# --- TRES items ------------------------------------------------------------------------------------


def test_items_keep_prefix_name_type_and_count():
    items = parse_tres("gres:gpushare:mem=10G+sm=25:2,gres/gpu:h100:1,gres:gpu:2,gres:nic,shard:3")
    assert items == (
        GresItem("gpushare", "mem=10G+sm=25", 2, prefix="gres:"),
        GresItem("gpu", "h100", 1, prefix="gres/"),
        GresItem("gpu", "", 2, prefix="gres:"),
        GresItem("nic", prefix="gres:"),
        GresItem("shard", "", 3),
    )
    assert [it.text for it in items] == ["gres:gpushare:mem=10G+sm=25:2", "gres/gpu:h100:1", "gres:gpu:2",
                                         "gres:nic", "shard:3"]


def test_two_part_item_is_type_unless_digits():
    assert parse_tres("gres:gpushare:mem=10G")[0].type == "mem=10G"
    assert parse_tres("gres:gpushare:mem=10G")[0].count is None
    assert parse_tres("gres:gpu:a100")[0] == GresItem("gpu", "a100", prefix="gres:")
    assert parse_tres("gres:gpushare:10")[0].count == 10


def test_empty_items_are_skipped_and_empty_string_has_none():
    assert [i.name for i in parse_tres("gres:gpu:1,,gres:nic:1,")] == ["gpu", "nic"]
    assert parse_tres("") == ()


def test_render_is_strict_with_count_and_prefix():
    assert parse_tres("gres:nic")[0].strict() == "gres:nic:1"
    assert parse_tres("gres/gpu:h100:02")[0].strict() == "gres/gpu:h100:2"
    assert parse_tres("shard:3")[0].strict("gres/") == "gres/shard:3"
    assert parse_tres("shard:3")[0].strict() == "gres:shard:3"


@pytest.mark.parametrize("text, message", [
    ("gres:gpushare:mem=10G:x", "the count 'x' in 'gpushare:mem=10G:x' is not a whole number"),
    ("gres:gpu:a:b:c", "cannot read the GRES item 'gres:gpu:a:b:c'"),
    ("gres::1", "cannot read the GRES item 'gres::1'"),
    ("gres:gpu::2", "cannot read the GRES item 'gres:gpu::2'"),
    ("gres:gpu:", "cannot read the GRES item 'gres:gpu:'"),
    ("gres:gpu:a=b:1", "cannot read the GRES item 'gres:gpu:a=b:1'"),
    ("gres:g pu:1", "cannot read the GRES item 'gres:g pu:1'"),
    ("gres:gpu:1:\u0661", "the count '\u0661' in 'gpu:1:\u0661' is not a whole number"),
])
def test_unreadable_items(text, message):
    with pytest.raises(InputError) as e:
        parse_tres(text)
    assert e.value.message == message
    assert e.value.hint


def test_mentions_share_and_item_name():
    assert mentions_share("gres:gpushare:mem=10G")
    assert mentions_share("gres:gpu:1,gres/shard:2")
    assert mentions_share("mps:50")
    assert not mentions_share("gres:gpu:h100:1,gres:nic:1")
    assert not mentions_share("gres:gpushared:1")
    assert not mentions_share(None)
    assert not mentions_share("")
    assert item_name("gres/gpushare:mem=1G:2") == "gpushare"


@given(st.text())
def test_mentions_share_never_raises(text):
    assert mentions_share(text) in (True, False)


# --- gpushare knobs -----------------------------------------------------------------------------------


@pytest.mark.parametrize("text, mib", [
    ("gres:gpushare:mem=10G", 10240),
    ("gres:gpushare:mem=10.5G", 10752),
    ("gres:gpushare:mem=512M", 512),
    ("gres:gpushare:mem=1T", 1024 * 1024),
    ("gres:gpushare:mem=2048K", 2),
    ("gres:gpushare:mem=10GiB", 10240),
    ("gres:gpushare:mem=10g", 10240),
    ("gres:gpushare:MEM=10G", 10240),
])
def test_memory_sizes_are_base_1024(text, mib):
    assert req(text).mem_mib == mib


def test_all_knobs_and_count():
    r = req("gres:gpushare:mem=10G+sm=25+mode=mps:2")
    assert r == GpushareRequest(mem_mib=10240, mem_text="10G", sm_percent=25, mode="mps", count=2,
                                text="mem=10G+sm=25+mode=mps:2")


def test_defaults():
    r = req("gres:gpushare:mem=10G")
    assert (r.sm_percent, r.mode, r.count, r.text) == (None, "auto", 1, "mem=10G")


def test_repeated_tokens_merge():
    r = req("gres:gpushare:mem=10G,gres:gpushare:sm=25")
    assert (r.mem_mib, r.sm_percent, r.count, r.text) == (10240, 25, 1, "mem=10G,sm=25")
    assert req("gres:gpushare:mem=10G:2,gres:gpushare:sm=25").count == 2
    assert req("gres:gpushare:mem=10G:2,gres:gpushare:sm=25:2").count == 2


def test_other_items_are_ignored_by_the_request():
    assert req("gres:nic:1,gres:gpushare:mem=1G").mem_mib == 1024


def test_mode_gpu_needs_no_memory():
    r = req("gres:gpushare:mode=gpu:3")
    assert (r.mem_mib, r.mode, r.count) == (None, "gpu", 3)
    assert req("gres:gpushare:mode=GPU").mode == "gpu"


def test_spec_rebuilds_requests_for_hints():
    r = req("gres:gpushare:mem=10G+sm=25:2")
    assert r.spec() == "gpushare:mem=10G+sm=25:2"
    assert r.spec(count=1) == "gpushare:mem=10G+sm=25"
    assert r.spec(mem_mib=81559, sm=False) == "gpushare:mem=81559M:2"
    assert req("gres:gpushare:mode=gpu:3").spec() == "gpushare:mode=gpu:3"


@pytest.mark.parametrize("text, message, hint", [
    ("gres:gpushare:mem=abc", "mem=abc: 'abc' is not a memory size", "write mem=10G"),
    ("gres:gpushare:mem=0", "mem=0: less than 1 MiB of GPU memory", "write mem=10G"),
    ("gres:gpushare:mem=0G", "mem=0G: less than 1 MiB of GPU memory", "write mem=10G"),
    ("gres:gpushare:mem=512K", "mem=512K: less than 1 MiB of GPU memory", "write mem=10G"),
    ("gres:gpushare:mem=10", "mem=10: '10' has no unit", "e.g. mem=10G"),
    ("gres:gpushare:mem=10X", "mem=10X: '10X' is not a memory size", "write mem=10G"),
    ("gres:gpushare:mem=-1G", "mem=-1G: '-1G' is not a memory size", "write mem=10G"),
    ("gres:gpushare:mem=", "mem=: '' is not a memory size", "write mem=10G"),
    ("gres:gpushare:mem=1e3G", "mem=1e3G: '1e3G' is not a memory size", "write mem=10G"),
    ("gres:gpushare:mem=10G+sm=150", "sm=150: '150' is not a percentage from 1 to 100", "write sm=25"),
    ("gres:gpushare:mem=10G+sm=0", "sm=0: '0' is not a percentage from 1 to 100", "write sm=25"),
    ("gres:gpushare:mem=10G+sm=25%", "sm=25%: '25%' is not a percentage from 1 to 100", "write sm=25"),
    ("gres:gpushare:mem=10G+mode=fast", "mode=fast: unknown mode", "mode=auto, mode=mig, mode=mps or mode=gpu"),
    ("gres:gpushare:mem=10G+color=red", "unknown knob 'color' in 'color=red'", "known knobs: mem, sm, mode"),
    ("gres:gpushare:mem=10G+sm", "'sm' is not a knob", "key=value"),
    ("gres:gpushare:mem=10G++sm=5", "'' is not a knob", "key=value"),
    ("gres:gpushare:=10G", "'=10G' is not a knob", "key=value"),
    ("gres:gpushare:mem=10G,gres:gpushare:mem=20G", "mem= is given twice (mem=10G and mem=20G)",
     "give each knob once"),
    ("gres:gpushare:mem=10G+MEM=20G", "mem= is given twice (mem=10G and MEM=20G)", "give each knob once"),
    ("gres:gpushare:mem=10G:0", "the count in 'gpushare:mem=10G:0' is 0", "ask for at least 1"),
    ("gres:gpushare:mem=10G:2,gres:gpushare:sm=5:3", "the count is given twice (2 and 3)", "give the count once"),
    ("gres:gpushare:sm=25", "gpushare:sm=25 asks for no GPU memory", "gpushare:mode=gpu:N"),
    ("gres:gpushare:2", "gpushare:2 asks for no GPU memory", "write gpushare:mem=10G"),
    ("gres:gpushare:mode=mps", "gpushare:mode=mps asks for no GPU memory", "write gpushare:mem=10G"),
])
def test_bad_requests_say_what_was_wrong_and_what_works(text, message, hint):
    e = refusal(text)
    assert e.message == message
    assert hint in e.hint


def test_user_text_in_messages_is_one_short_line():
    e = refusal("gres:gpushare:mem=\x1b[31m" + "9" * 200)
    assert "\x1b" not in e.message and "\n" not in e.message
    assert len(e.message) < 200


def test_every_message_has_a_hint():
    for key, (message, hint) in MESSAGES.items():
        assert message and hint, key
