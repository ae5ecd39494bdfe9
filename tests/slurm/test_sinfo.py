"""``sinfo --json`` of every release read as one node list (slurm_gpushare.slurm.sinfo), from real outputs.

tests/data/slurm/<release>/sinfo.json: ``sinfo --json`` of the default dev cluster (4 nodes; partitions
gpu, nomig, pcie), captured on 22.05.8, 24.11.5 and 26.05.5; ``sinfo-drained.json``: the same with
h100-nvs drained (``scontrol update nodename=h100-nvs state=drain``).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slurm_gpushare.errors import SlurmError
from slurm_gpushare.slurm.sinfo import SinfoNode, load_piecewise, sinfo_nodes

DATA = Path(__file__).resolve().parent.parent / "data" / "slurm"
RELEASES = ("22.05", "24.11", "26.05")

GRES = {
    "a100-nvb": "gpu:a100:8(S:0-1),shard:a100:640(S:0-1)",
    "h100-mig": "gpu:h100:2(S:0),gpu:h100_4g.40gb:2(S:1),gpu:h100_1g.10gb:6(S:1),shard:h100:158(S:0),"
                "shard:h100_4g.40gb:0(S:1),shard:h100_1g.10gb:0(S:1)",
    "h100-nvs": "gpu:h100:8(S:0-1),shard:h100:632(S:0-1)",
    "rtx4090-pcie": "gpu:rtx4090:8(S:0-1),shard:rtx4090:184(S:0-1)",
}
PARTITIONS = {"a100-nvb": ("gpu", "nomig"), "h100-mig": ("gpu",), "h100-nvs": ("gpu", "nomig"),
              "rtx4090-pcie": ("gpu", "nomig", "pcie")}


def read(release: str, name: str = "sinfo.json") -> str:
    return (DATA / release / name).read_text()


@pytest.mark.parametrize("release", RELEASES)
def test_every_release_reads_as_the_same_nodes(release):
    nodes = sinfo_nodes(read(release))
    assert [n.name for n in nodes] == sorted(GRES)
    assert {n.name: n.gres for n in nodes} == GRES
    assert {n.name: n.partitions for n in nodes} == PARTITIONS


@pytest.mark.parametrize("release", ("22.05", "24.11"))
def test_state_and_its_flags(release):
    nodes = {n.name: n for n in sinfo_nodes(read(release, "sinfo-drained.json"))}
    assert nodes["h100-nvs"].state == "idle+drain"
    assert nodes["a100-nvb"].state == "idle"


def test_a_node_completing_keeps_both_states():
    """26.05 capture: a100-nvb was finishing a job (``["IDLE", "COMPLETING"]``)."""
    nodes = {n.name: n for n in sinfo_nodes(read("26.05"))}
    assert nodes["a100-nvb"].state == "idle+completing"


def test_an_entry_for_several_nodes_gives_each_of_them():
    """sinfo groups nodes that would print on one line (src/sinfo/sinfo.c _match_node_data): one entry."""
    doc = json.loads(read("26.05"))
    entry = next(e for e in doc["sinfo"] if e["nodes"]["nodes"] == ["h100-nvs"])
    entry["nodes"]["nodes"] = ["h100-nvs", "gpu[01-02]"]
    nodes = {n.name: n for n in sinfo_nodes(json.dumps(doc))}
    assert nodes["gpu02"] == SinfoNode("gpu02", GRES["h100-nvs"], (entry["partition"]["name"],), "idle")
    assert nodes["h100-nvs"].partitions == ("gpu", "nomig")


@pytest.mark.parametrize("release, drop, field", [
    ("22.05", "nodes", "'nodes'"),
    ("26.05", "sinfo", "'sinfo'"),
])
def test_a_missing_list_names_the_release_and_the_field(release, drop, field):
    doc = json.loads(read(release))
    del doc[drop]
    with pytest.raises(SlurmError, match=rf"of Slurm {release} has no top-level {field} list"):
        sinfo_nodes(json.dumps(doc))


def test_a_missing_entry_field_names_it():
    doc = json.loads(read("24.11"))
    del doc["sinfo"][3]["gres"]
    with pytest.raises(SlurmError, match=r"Slurm 24\.11 has no sinfo\[3\]\.gres\.total"):
        sinfo_nodes(json.dumps(doc))


def test_a_newer_release_without_the_field_says_so():
    doc = json.loads(read("26.05"))
    doc["meta"]["slurm"]["version"] = {"major": "27", "minor": "05", "micro": "0"}
    del doc["sinfo"][0]["partition"]
    with pytest.raises(SlurmError, match=r"Slurm 27\.05 is newer than 26\.05"):
        sinfo_nodes(json.dumps(doc))


def test_output_without_meta_or_not_json_is_refused():
    with pytest.raises(SlurmError, match="no meta.slurm.version"):
        sinfo_nodes('{"nodes": []}')
    with pytest.raises(SlurmError, match="not JSON"):
        sinfo_nodes("sinfo: error: ...")


_JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
                     lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=4), kids, max_size=4),
                     max_leaves=20)


@given(doc=st.dictionaries(st.text(max_size=6), _JSON, max_size=5), indent=st.sampled_from([None, 0, 2]),
       cut=st.integers(min_value=0, max_value=400))
def test_reading_sinfo_piecewise_gives_what_json_gives_and_its_errors(doc, indent, cut):
    """The top-level lists read element by element (the filter service's refresh thread then never holds the
    interpreter lock for one long decode) give the very value ``json.loads`` gives; text cut short (not
    JSON) raises the error ``json.loads`` raises."""
    text = json.dumps(doc, indent=indent)
    assert load_piecewise(text) == json.loads(text)
    short = text[:cut]
    try:
        expected = json.loads(short)
    except ValueError as e:
        with pytest.raises(ValueError, match=re.escape(str(e))):
            load_piecewise(short)
    else:
        assert load_piecewise(short) == expected
