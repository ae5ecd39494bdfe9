"""The one grammar of id lists (``0-3,6``): CPU lists, gres.conf ``Cores=``, ``IDX:``, hostlist brackets and
GPU indices all read through :mod:`slurm_gpushare.rangelist`, with one message."""

from __future__ import annotations

import pytest

from slurm_gpushare.cli.gpusets import parse_gpu_list
from slurm_gpushare.errors import InputError, ParseError
from slurm_gpushare.hardware.nvidia_smi import parse_cpu_list
from slurm_gpushare.rangelist import MAX_IDS, parse_range_list, parse_ranges
from slurm_gpushare.slurm.hostlist import expand_hostlist, parse_id_list


def test_ids_and_ranges_in_the_order_written():
    assert parse_ranges("0-3,6") == [(0, 3), (6, 6)]
    assert parse_range_list("0-3,6") == [0, 1, 2, 3, 6]
    assert parse_range_list("6, 0-1 ,1") == [6, 0, 1, 1]  # order and repeats are the caller's to judge
    assert parse_range_list("007") == [7]


@pytest.mark.parametrize("text", ["", "1,", ",1", "1-", "-1", "3-1", "a", "1-2-3", "1 2", "0x1", "+1"])
def test_what_is_not_an_id_list_is_refused_naming_the_item(text):
    with pytest.raises(ParseError, match="is not a CPU id or an ascending range a-b") as e:
        parse_range_list(text, what="CPU id", example="0-55", source="f:3")
    assert e.value.source == "f:3" and e.value.hint == "e.g. 0-55"


@pytest.mark.parametrize("text", ["٣", "1-٣", "１", "²"])
def test_digits_of_other_scripts_are_no_ids_for_any_reader(text):
    """re's \\d took them (CPU list '٣' read as CPU 3, GPU list '１' as GPU 1): no kernel or Slurm writes them."""
    for read in (parse_range_list, parse_id_list, parse_cpu_list, lambda t: parse_gpu_list(t, "--free"),
                 lambda t: expand_hostlist(f"n[{t}]")):
        with pytest.raises(InputError):
            read(text)


def test_a_list_of_more_than_max_ids_is_refused_before_it_is_built():
    """'0-99999999' built a list of a hundred million CPU ids."""
    assert len(parse_range_list(f"0-{MAX_IDS - 1}")) == MAX_IDS
    with pytest.raises(ParseError, match=f"more than {MAX_IDS}"):
        parse_range_list(f"0-{MAX_IDS - 1},{MAX_IDS}")
    with pytest.raises(ParseError, match=f"more than {MAX_IDS}"):
        parse_cpu_list("0-99999999")


def test_every_reader_says_the_same_about_the_same_bad_item():
    said = []
    for read in (parse_id_list, parse_cpu_list, lambda t: parse_gpu_list(t, "--free"),
                 lambda t: expand_hostlist(f"n[{t}]")):
        with pytest.raises(InputError) as e:
            read("0-x")
        said.append(e.value.message)
    assert all("'0-x' in '0-x' is not a" in m and "or an ascending range a-b" in m for m in said), said
    # what each caller keeps its own: sorted and unique, the order given, a repeated GPU refused
    assert parse_id_list("5,0-2,1") == (0, 1, 2, 5) and parse_cpu_list("5,0-2,1") == (0, 1, 2, 5)
    assert parse_gpu_list("5,0-2", "--free") == [5, 0, 1, 2]
    with pytest.raises(InputError, match="names a GPU twice"):
        parse_gpu_list("0-2,1", "--free")
    assert parse_cpu_list("N/A") == () == parse_cpu_list(" ")


def test_a_bad_hostlist_bracket_names_the_hostlist_in_its_message_not_its_source():
    """The hostlist went into the error's source, which the gres.conf and inventory readers replace with the file
    and line: their message then no longer said which hostlist was wrong."""
    with pytest.raises(ParseError) as e:
        expand_hostlist("/dev/nvidia[1-0]")
    assert e.value.source is None and "in hostlist '/dev/nvidia[1-0]'" in e.value.message, e.value
    with pytest.raises(ParseError, match="names more than .* ids"):
        parse_range_list(f"0-{MAX_IDS}", what="GPU index")
