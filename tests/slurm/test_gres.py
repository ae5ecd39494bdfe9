"""The one GRES/TRES grammar (slurm_gpushare.slurm.gres): real Slurm texts, round trips, refusals."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slurm_gpushare.errors import InputError, ParseError
from slurm_gpushare.slurm.gres import (
    GresItem,
    GresSyntaxError,
    item_name,
    parse,
    parse_item,
    prefix_of,
    render,
    render_counts,
)

# --- real texts -------------------------------------------------------------------------------------


def test_sinfo_gres_used_with_indices_and_na():
    """``sinfo --json`` ``gres_used`` of a dev-cluster node (measured on 22.05.8)."""
    text = "gpu:a100:2(IDX:0-1),mps:a100:0(IDX:N/A),gpushare:0"
    items = parse(text)
    assert items == (GresItem("gpu", "a100", 2, "IDX:0-1"), GresItem("mps", "a100", 0, "IDX:N/A"),
                     GresItem("gpushare", "", 0))
    assert [it.indices for it in items] == [(0, 1), (), ()]
    assert render(items) == text


def test_node_gres_with_socket_binding():
    """``scontrol show node`` ``Gres=`` of slurmd 22.05 (measured on the dev cluster)."""
    text = "gpu:a100:4(S:0),mps:a100:400(S:0),shard:a100:16(S:0),gpushare:160"
    items = parse(text)
    assert [(it.key, it.count, it.detail) for it in items] == [
        (("gpu", "a100"), 4, "S:0"), (("mps", "a100"), 400, "S:0"), (("shard", "a100"), 16, "S:0"),
        (("gpushare", ""), 160, "")]
    assert render(items) == text


def test_commas_inside_parentheses_do_not_split():
    text = "gpu:a100:2(IDX:0,2),shard:10(2/80,0/80)"
    items = parse(text)
    assert items[0].indices == (0, 2) and items[1].detail == "2/80,0/80" and items[1].indices == (0,)
    assert render(items) == text


@pytest.mark.parametrize("text, prefix", [("gres/gpu:1", "gres/"), ("gres:shard:10", "gres:"), ("gpu:1", "")])
def test_tres_per_node_keeps_its_prefix(text, prefix):
    """``TresPerNode=gres/gpu:1`` (Slurm 24.11+) and ``gres:shard:10`` (22.05)."""
    (it,) = parse(text)
    assert it.prefix == prefix and it.body == text[len(prefix):] and it.text == text
    assert prefix_of(text) == prefix


def test_scontrol_job_detail_of_a_mig_device():
    (it,) = parse("gpu:h100_1g.10gb:1(IDX:4-6)")
    assert (it.name, it.type, it.count, it.indices) == ("gpu", "h100_1g.10gb", 1, (4, 5, 6))


def test_two_fields_are_a_count_when_digits_else_a_type():
    assert parse_item("gres:gpushare:mem=10G+sm=25") == GresItem("gpushare", "mem=10G+sm=25", prefix="gres:")
    assert parse_item("gpushare:10") == GresItem("gpushare", count=10)
    assert parse_item("gpu") == GresItem("gpu")


def test_slurm_conf_units_and_no_consume():
    assert parse("bandwidth:lustre:no_consume:4G", units=True) == (
        GresItem("bandwidth", "lustre", 4 * 1024**3, no_consume=True),)
    assert parse_item("mps:4K", units=True).count == 4096
    assert parse_item("mps:4K").type == "4K"  # outside slurm.conf a suffix is no count


def test_strict_form_and_counts():
    assert parse_item("nic").strict() == "gres:nic:1"
    assert parse_item("gres/gpu:h100:02").strict() == "gres/gpu:h100:2"
    assert parse_item("gpu:a100:2(IDX:0-1)").strict("") == "gpu:a100:2"
    assert render_counts({("gpu", "h100"): 2, ("shard", ""): 160}) == "gpu:h100:2,shard:160"


def test_item_name_never_raises():
    assert item_name("gres/gpushare:mem=1G:2") == "gpushare"
    assert item_name("shard(IDX:0)") == "shard"
    assert item_name("") == ""


def test_empty_items_are_skipped_unless_refused():
    assert [it.name for it in parse("gpu:1,,nic:1,")] == ["gpu", "nic"]
    assert parse("") == ()
    with pytest.raises(GresSyntaxError, match="empty GRES item"):
        parse("gpu:1,,nic:1", allow_empty=False)


def test_an_item_that_is_only_a_prefix_is_an_empty_item():
    """``--gres=,,gpushare:mem=10G,,`` reaches job_submit as ``gres:,gres:,gres:gpushare:mem=10G,...``: it was
    refused with "cannot read the GRES item 'gres:'" (issue 26 D18); an empty item is skipped, as Slurm does."""
    for prefix in ("gres:", "gres/"):
        text = f"{prefix},{prefix},{prefix}gpushare:mem=10G,{prefix},{prefix}"
        assert [(it.name, it.type) for it in parse(text)] == [("gpushare", "mem=10G")]
    with pytest.raises(GresSyntaxError, match="empty GRES item"):
        parse("gres:,gres:gpu:1", allow_empty=False)


# --- refusals ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("text", [
    "gpu:a:b:c", "::1", "gpu::2", "gpu:", ":4", "g pu:1", "gpu:1(IDX:0", "gpu:1IDX:0)", "gpu:1()",
    "gpu(IDX:0):1", "gpu:1(a(b))", "gpu:1(IDX:0)x", "gpu:1:\u0661", "gpu:a b:1", "gres:gres:gpu:1:2",
    "gpu\n:1", "gpu,", "(IDX:0)",
])
def test_odd_input_is_refused_with_the_text(text):
    with pytest.raises(InputError) as err:
        parse(text, allow_empty=False)
    assert isinstance(err.value, ParseError) and err.value.hint


def test_a_third_field_that_is_no_count_says_so():
    with pytest.raises(GresSyntaxError) as err:
        parse_item("gres:gpushare:mem=10G:x")
    assert (err.value.part, err.value.value, err.value.item) == ("count", "x", "gres:gpushare:mem=10G:x")


def test_unicode_digits_are_no_count():
    """``int("\u0661")`` is 1: a grammar built on ``\\d`` and ``int`` would read a count that is not there."""
    assert parse_item("gpu:\u0661").type == "\u0661"
    with pytest.raises(GresSyntaxError):
        parse_item("gpu:a100:\u0661")


def test_bad_index_lists_fail_loudly():
    with pytest.raises(GresSyntaxError, match="device index"):
        parse_item("gpu:2(IDX:3-1)").indices  # noqa: B018


@pytest.mark.parametrize("fields", [
    {"name": ""}, {"name": "gpu:a"}, {"name": "gpu", "type": "a:b"}, {"name": "gpu", "type": "2"},
    {"name": "gpu", "count": -1}, {"name": "gpu", "detail": "a)"}, {"name": "gpu", "prefix": "tres/"},
])
def test_items_that_cannot_be_written_are_refused(fields):
    with pytest.raises(GresSyntaxError):
        GresItem(**fields)


# --- round trips ------------------------------------------------------------------------------------

_WORD = st.from_regex(r"[A-Za-z0-9_.-]{1,8}", fullmatch=True)
_TYPE = st.one_of(st.just(""), st.from_regex(r"[A-Za-z_.-][A-Za-z0-9_.=+-]{0,10}", fullmatch=True))
_DETAIL = st.one_of(
    st.just(""), st.just("IDX:N/A"),
    st.lists(st.integers(0, 64), min_size=1, max_size=5).map(lambda ids: "IDX:" + ",".join(map(str, sorted(set(ids))))),
    st.from_regex(r"S:[0-9](-[0-9])?", fullmatch=True),
    st.lists(st.from_regex(r"[0-9]{1,2}/[0-9]{1,3}", fullmatch=True), min_size=1, max_size=3).map(",".join),
)
_ITEM = st.builds(GresItem, name=_WORD, type=_TYPE, count=st.one_of(st.none(), st.integers(0, 10**6)),
                  detail=_DETAIL, prefix=st.sampled_from(["", "gres:", "gres/"]))


@given(_ITEM)
def test_an_item_reads_back_as_written(item):
    assert parse_item(item.text) == item
    assert render(parse(item.text)) == item.text


@given(st.lists(_ITEM, max_size=6))
def test_a_list_reads_back_as_written(items):
    text = render(items)
    assert parse(text) == tuple(items)
    assert render(parse(text)) == text


@given(st.text(alphabet=st.sampled_from("gpuresh:/0123,()IDX-N/A a"), max_size=30))
def test_any_text_reads_back_or_is_refused(text):
    try:
        items = parse(text)
    except ParseError:
        return
    again = parse(render(items))
    assert again == items


def test_shared_gres_detail_gives_counts_and_devices():
    # 23.11.2+: the job's GRES= detail and a node's GresUsed= give shards as allocated/available per device
    # (measured on 24.11.5: shard:10(10/80,0/80,...) for a job holding 10 shards of device 0)
    (it,) = parse("shard:10(10/80,0/80,0/80,5/80)")
    assert it.shares == ((10, 80), (0, 80), (0, 80), (5, 80)) and it.indices == (0, 3)
    assert parse_item("shard:h100_4g.40gb:0(0/0,0/0)").indices == ()
    assert parse_item("shard:10(IDX:0)").shares == () and parse_item("shard:10(IDX:0)").indices == (0,)
    assert parse_item("gpu:tesla:2(S:0-1)").shares == ()
    # 26.05: a device allocated whole as a GPU has no shard count (GresUsed=, measured on 26.05.5)
    (used,) = parse("shard:a100:5(-/80,-/80,0/80,5/80)")
    assert used.shares == ((None, 80), (None, 80), (0, 80), (5, 80)) and used.indices == (3,)
    with pytest.raises(GresSyntaxError, match="allocated/available"):
        parse_item("shard:1(1/80,x/80)").indices  # noqa: B018
