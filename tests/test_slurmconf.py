"""Tests of slurm_gpushare.slurm.conf: gres.conf and slurm.conf GRES parsing, hostlists, counts.

The real files are tests/data/gres (copied from ../machines/gres with their source headers). Two of
them are slurm.conf text (the upstream MIG example) or slurm.conf and gres.conf in one file, split
at their ``# --- gres.conf ---`` marker with line numbers kept.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from slurm_gpushare.errors import InputError, ParseError
from slurm_gpushare.hardware.machine import CpuLayout
from slurm_gpushare.slurm.conf import (
    GRES_CONF_KEYS,
    parse_count,
    parse_gres_conf,
    parse_gres_value,
    parse_slurm_conf_gres,
    replace_gres_lines,
    slurm_conf_settings,
)
from slurm_gpushare.slurm.gres import GresItem
from slurm_gpushare.slurm.hostlist import compress_hostlist, expand_hostlist, parse_id_list

GRES = Path(__file__).parent / "data" / "gres"

ALLZERO = "deepops-dgx-a100-cores-links-allzero.conf"
HYPERTHREAD = "deepops-dgx-a100-cpus-hyperthread.conf"
MIG = "slurm-docs-mig-typed-gres.conf"
MPS = "slurm-docs-mps-heterogeneous-counts.conf"
SHARD = "slurm-docs-shard-per-gpu.conf"


def read(name: str) -> str:
    return (GRES / name).read_text()


def split_sections(text: str) -> tuple[str, str]:
    """``(slurm.conf part, gres.conf part)`` of a combined file; other lines blanked, numbers kept."""
    lines = text.splitlines()
    cut = lines.index("# --- gres.conf ---")
    slurm = lines[:cut] + [""] * (len(lines) - cut)
    gres = [""] * cut + lines[cut:]
    return "\n".join(slurm) + "\n", "\n".join(gres) + "\n"


# --- the real files ---------------------------------------------------------------------------


def test_every_real_file_is_covered_here():
    assert sorted(p.name for p in GRES.iterdir()) == sorted([ALLZERO, HYPERTHREAD, MIG, MPS, SHARD])
    for p in GRES.iterdir():
        assert p.read_text().startswith("# source: "), p.name


def test_deepops_allzero_links_file():
    conf = parse_gres_conf(read(ALLZERO), source=ALLZERO)
    assert [e.line for e in conf.entries] == list(range(8, 16))
    assert conf.autodetect is None and conf.node_names == ()
    first, third = conf.entries[0], conf.entries[2]
    assert first.where == f"{ALLZERO}:8"
    assert (first.name, first.type, first.files, first.count) == ("gpu", "", ("/dev/nvidia0",), None)
    assert first.cores == tuple(range(48, 64)) and first.cores_key == "Cores"
    assert first.links == "-1,0,0,0,0,0,0,0"
    # kept as written: the empty field is the linter's business, not a parse error
    assert third.links == "0,0,-1,,0,0,0,0,0"
    assert conf.entries[7].cores == tuple(range(80, 96))
    assert [e.files[0] for e in conf.records_for(None)] == [f"/dev/nvidia{i}" for i in range(8)]


def test_deepops_hyperthread_file_keeps_the_cpus_alias():
    conf = parse_gres_conf(read(HYPERTHREAD), source=HYPERTHREAD)
    assert [e.line for e in conf.entries] == list(range(6, 14))
    e = conf.entries[0]
    assert e.cores_key == "CPUs"
    assert e.cores == (*range(48, 64), *range(176, 192))
    assert e.param("CPUs") == "48-63,176-191" and e.param("Cores") is None
    assert conf.entries[4].cores == (*range(112, 128), *range(240, 256))


def test_upstream_mps_example():
    conf = parse_gres_conf(read(MPS), source=MPS)
    assert conf.autodetect == "nvml"
    assert conf.entries[0].line == 10 and conf.entries[0].name == ""
    recs = conf.records_for(None)
    assert [(e.name, e.type, e.files, e.count, e.cores) for e in recs] == [
        ("gpu", "gtx1080", ("/dev/nvidia0",), None, (0, 1)),
        ("gpu", "gtx1070", ("/dev/nvidia1",), None, (0, 1)),
        ("gpu", "gtx1060", ("/dev/nvidia2",), None, (2, 3)),
        ("gpu", "gtx1050", ("/dev/nvidia3",), None, (2, 3)),
        ("mps", "", ("/dev/nvidia0",), 1300, None),
        ("mps", "", ("/dev/nvidia1",), 1200, None),
        ("mps", "", ("/dev/nvidia2",), 1100, None),
        ("mps", "", ("/dev/nvidia3",), 1000, None),
    ]
    assert [e.line for e in recs] == list(range(11, 19))
    assert [e.effective_count for e in recs] == [1, 1, 1, 1, 1300, 1200, 1100, 1000]


def test_upstream_mig_example_is_slurm_conf_with_mixed_case_gres_key():
    text = read(MIG)
    conf = parse_slurm_conf_gres(text, source=MIG)
    assert conf.gres_types == ("gpu",) and conf.gres_types_line == 8
    assert conf.accounting_tres == ("gres/gpu", "gres/gpu:a100", "gres/gpu:a100_3g.20gb")
    assert conf.accounting_tres_line == 7
    assert [n.name for n in conf.nodes] == [f"tux{i}" for i in range(1, 17)]
    tux7 = conf.node("tux7")
    assert tux7.where == f"{MIG}:9"
    assert tux7.gres == (GresItem("gpu", "a100", 1), GresItem("gpu", "a100_3g.20gb", 2))
    assert tux7.gres_counts == {("gpu", "a100"): 1, ("gpu", "a100_3g.20gb"): 2}
    assert tux7.layout is None
    # as gres.conf it is refused, naming the line and the key
    with pytest.raises(ParseError) as err:
        parse_gres_conf(text, source=MIG)
    assert err.value.source == f"{MIG}:7"
    assert "'AccountingStorageTRES'" in err.value.message


def test_upstream_shard_example_both_sections():
    slurm_text, gres_text = split_sections(read(SHARD))
    slurm = parse_slurm_conf_gres(slurm_text, source=SHARD)
    assert slurm.gres_types == ("gpu", "shard")
    assert slurm.node("tux16").gres == (GresItem("gpu", "", 2), GresItem("shard", "", 64))
    gres = parse_gres_conf(gres_text, source=SHARD)
    recs = gres.records_for("tux3")
    assert [(e.line, e.name, e.count) for e in recs if e.name == "shard"] == [
        (19, "shard", 8), (20, "shard", 8), (21, "shard", 8), (22, "shard", 8)]
    # the slurm.conf parser skips gres.conf lines, so the whole combined file reads the same
    assert parse_slurm_conf_gres(read(SHARD), source=SHARD) == slurm


# --- hostlists, counts, id lists --------------------------------------------------------------


@pytest.mark.parametrize("expr, names", [
    ("tux1", ("tux1",)),
    ("tux[1-3]", ("tux1", "tux2", "tux3")),
    ("node[1,3-5]", ("node1", "node3", "node4", "node5")),
    ("alpha,beta,gamma", ("alpha", "beta", "gamma")),
    ("lx[15,18],gpu1", ("lx15", "lx18", "gpu1")),
    ("linux[0008-0010]", ("linux0008", "linux0009", "linux0010")),
    ("rack[0-1]_blade[0-1]", ("rack0_blade0", "rack0_blade1", "rack1_blade0", "rack1_blade1")),
    ("/dev/nvidia[0-3]", ("/dev/nvidia0", "/dev/nvidia1", "/dev/nvidia2", "/dev/nvidia3")),
    ("/dev/nvidia[0,2-3]", ("/dev/nvidia0", "/dev/nvidia2", "/dev/nvidia3")),
    ("/dev/nvidia0,/dev/nvidia1", ("/dev/nvidia0", "/dev/nvidia1")),
])
def test_expand_hostlist(expr, names):
    assert expand_hostlist(expr) == names


@pytest.mark.parametrize("expr", ["tux[1-", "tux1]", "tux[3-1]", "tux[a-b]", "a,,b", "tux[]"])
def test_expand_hostlist_refuses_bad_expressions(expr):
    with pytest.raises(ParseError):
        expand_hostlist(expr)


@pytest.mark.parametrize("names, text", [
    ([f"tux{i}" for i in range(1, 17)], "tux[1-16]"),
    (["n1", "n3", "n4", "x"], "n[1,3-4],x"),
    (["n008", "n009"], "n[008-009]"),
    (["a100"], "a100"),
])
def test_compress_hostlist(names, text):
    assert compress_hostlist(names) == text
    assert expand_hostlist(text) == tuple(names)


@pytest.mark.parametrize("text, value", [
    ("0", 0), ("1300", 1300), ("4K", 4096), ("4k", 4096), ("2M", 2 * 1024**2), ("10G", 10 * 1024**3),
    ("1T", 1024**4), ("1P", 1024**5),
])
def test_count_suffixes(text, value):
    assert parse_count(text) == value


@pytest.mark.parametrize("text", ["", "G", "1.5G", "-1", "4X", "4 G"])
def test_bad_counts(text):
    with pytest.raises(ParseError):
        parse_count(text)


def test_id_lists():
    assert parse_id_list("0-2,5,7-8") == (0, 1, 2, 5, 7, 8)
    for bad in ("3-1", "a", "1,,2", "1-"):
        with pytest.raises(ParseError):
            parse_id_list(bad)


# --- gres.conf syntax -------------------------------------------------------------------------


def test_keys_are_case_insensitive_and_ranges_expanded():
    # the man page's own examples write "COREs="
    conf = parse_gres_conf("nodename=tux[0-2]  NAME=gpu type=tesla FILE=/dev/nvidia[0-1] COREs=0,1\n"
                           "NodeName=tux3 name=bandwidth Type=lustre count=4G flags=CountOnly\n", source="g")
    e, bw = conf.entries
    assert e.nodes == ("tux0", "tux1", "tux2") and e.files == ("/dev/nvidia0", "/dev/nvidia1")
    assert (e.name, e.type, e.cores, e.cores_key, e.devices) == ("gpu", "tesla", (0, 1), "Cores", 2)
    assert e.params == (("NodeName", "tux[0-2]"), ("Name", "gpu"), ("Type", "tesla"),
                        ("File", "/dev/nvidia[0-1]"), ("Cores", "0,1"))
    assert (bw.count, bw.flags) == (4 * 1024**3, ("CountOnly",))
    assert conf.node_names == ("tux0", "tux1", "tux2", "tux3")
    assert conf.records_for("tux1") == (e,) and conf.records_for("tux3") == (bw,)
    assert conf.records_for("tux9") == () and conf.records_for(None) == ()


def test_unknown_key_names_file_line_key_and_known_keys():
    with pytest.raises(ParseError) as err:
        parse_gres_conf("# header\nAutoDetect=off\nName=gpu File=/dev/nvidia0 Core=0-3\n", source="gres.conf")
    e = err.value
    assert e.source == "gres.conf:3"
    assert e.message == "unknown gres.conf key 'Core'"
    assert e.hint == "known keys, in any case: " + ", ".join(GRES_CONF_KEYS)
    assert str(e).startswith("gres.conf:3: unknown gres.conf key 'Core' (known keys, in any case: NodeName, Name,")


@pytest.mark.parametrize("line, message", [
    ("Name=gpu File", "'File' is not a Key=Value pair"),
    ("Name=gpu name=mps", "name= is given twice on one line"),
    ("Name=gpu Cores=0 CPUs=1", "CPUs= is given twice on one line"),
    ("Type=a100 File=/dev/nvidia0", "a gres.conf line needs Name= (or AutoDetect=)"),
    ("Name=gpu Count=lots", "count 'lots' is not a number"),
    ("Name=gpu File=/dev/nvidia[0-", "unbalanced brackets in hostlist '/dev/nvidia[0-'"),
    ("Name=gpu Cores=0-x", "'0-x' in '0-x' is not an id or an ascending range a-b"),
])
def test_gres_conf_syntax_errors_name_the_line(line, message):
    with pytest.raises(ParseError) as err:
        parse_gres_conf(f"AutoDetect=off\n\n{line}\n", source="g.conf")
    assert err.value.source == "g.conf:3"
    assert err.value.message == message


def test_comments_blank_lines_quotes_and_continuations():
    text = ("# comment\n\n   \nName=gpu File=/dev/nvidia0 # trailing comment Count=9\n"
            "Name=shard \\\n  Count=8 File=\"/dev/nvidia0\"\n")
    gpu, shard = parse_gres_conf(text, source="g").entries
    assert (gpu.line, gpu.count, gpu.files) == (4, None, ("/dev/nvidia0",))
    assert (shard.line, shard.count, shard.files) == (5, 8, ("/dev/nvidia0",))


def test_autodetect_global_and_per_node():
    # gres.conf(5) EXAMPLES: "Use NVML ... for all nodes except one"
    conf = parse_gres_conf("AutoDetect=nvml\nNodeName=tux3 AutoDetect=off Name=gpu File=/dev/nvidia[0-3]\n"
                           "NodeName=tux[0-7] AutoDetect=RSMI\n", source="g")
    assert conf.autodetect == "nvml"
    assert conf.autodetect_for("tux3") == "off"
    assert conf.autodetect_for("tux5") == "rsmi"
    assert conf.autodetect_for("tux9") == "nvml"
    assert conf.autodetect_for(None) == "nvml"
    assert [e.line for e in conf.records_for("tux3")] == [2]


def test_results_are_frozen():
    conf = parse_gres_conf("Name=gpu File=/dev/nvidia0\n", source="g")
    with pytest.raises(dataclasses.FrozenInstanceError):
        conf.entries[0].name = "mps"
    slurm = parse_slurm_conf_gres("NodeName=a Gres=gpu:1\n", source="s")
    with pytest.raises(dataclasses.FrozenInstanceError):
        slurm.nodes[0].gres = None


# --- slurm.conf -------------------------------------------------------------------------------


@pytest.mark.parametrize("value, specs", [
    ("gpu:a100:8,shard:640", (GresItem("gpu", "a100", 8), GresItem("shard", "", 640))),
    ("gpu:2", (GresItem("gpu", "", 2),)),
    ("gpu", (GresItem("gpu"),)),
    ("gpu:kepler", (GresItem("gpu", "kepler"),)),
    ("mps:4K", (GresItem("mps", "", 4096),)),
    ("bandwidth:lustre:no_consume:4G", (GresItem("bandwidth", "lustre", 4 * 1024**3, no_consume=True),)),
    ("gpu:tesla:2(S:0-1),gpu:kepler:2(S:0,1)",
     (GresItem("gpu", "tesla", 2, detail="S:0-1"), GresItem("gpu", "kepler", 2, detail="S:0,1"))),
    ("gpu:a100_3g.20gb:2", (GresItem("gpu", "a100_3g.20gb", 2),)),
])
def test_gres_value_grammar(value, specs):
    assert parse_gres_value(value) == specs


def test_empty_gres_items_are_skipped_as_slurmctld_skips_them():
    """slurmctld splits a node's Gres= with strtok_r (``_get_gres_cnt`` in src/common/gres.c at slurm-22-05-8-1),
    which passes over empty items: a trailing comma is accepted there, and aborted --check here (issue 28)."""
    want = (GresItem("gpu", "a100", 8), GresItem("shard", "", 640))
    assert parse_gres_value("gpu:a100:8,shard:640,") == want
    assert parse_gres_value(",gpu:a100:8,,shard:640") == want


@pytest.mark.parametrize("value", ["gpu:a:b:c:4", ":4", ","])
def test_bad_gres_values(value):
    with pytest.raises(ParseError):
        parse_gres_value(value)


def test_slurm_conf_defaults_layout_and_other_keys():
    text = """\
ClusterName=dev  # comment
Include /etc/slurm/nodes.conf
gresTYPES=gpu,shard
NodeName=DEFAULT Sockets=2 CoresPerSocket=64 ThreadsPerCore=2 RealMemory=1000000
nodename=dgx[01-02] NodeAddr=10.0.0.[1-2] gres=gpu:a100:8 Reason="two words"
NodeName=DEFAULT CoresPerSocket=32 Gres=gpu:1
NodeName=small CPUs=64 ThreadsPerCore=1
NodeName=board Boards=2 Sockets=2 CoresPerSocket=8
NodeName=plain CPUs=4
NodeName=dgx01 Gres=gpu:99
PartitionName=all Nodes=ALL Default=YES
"""
    conf = parse_slurm_conf_gres(text, source="slurm.conf")
    assert conf.gres_types == ("gpu", "shard") and conf.accounting_tres is None
    assert [n.name for n in conf.nodes] == ["dgx01", "dgx02", "small", "board", "plain"]
    dgx = conf.node("dgx02")
    assert dgx.line == 5 and dgx.gres_counts == {("gpu", "a100"): 8}
    assert dgx.layout == CpuLayout(2, 64, 2)
    assert conf.node("dgx01").gres_counts == {("gpu", "a100"): 8}  # the duplicate line is ignored
    # DEFAULT lines add to the earlier defaults: Sockets=2 stays, CoresPerSocket and Gres change
    small = conf.node("small")
    assert small.gres_counts == {("gpu", ""): 1}
    assert small.layout == CpuLayout(2, 32, 1)
    assert conf.node("board").layout == CpuLayout(4, 8, 2)  # Sockets is per board with Boards
    assert conf.node("plain").layout == CpuLayout(2, 32, 2)
    assert conf.node("nope") is None


def test_slurm_conf_layout_inferred_from_cpus_without_sockets():
    conf = parse_slurm_conf_gres("NodeName=n CPUs=256 CoresPerSocket=64 ThreadsPerCore=2\n"
                                 "NodeName=m CPUs=8\n", source="s")
    assert conf.node("n").layout == CpuLayout(2, 64, 2)
    assert conf.node("m").layout is None


def test_slurm_conf_errors_name_the_line():
    with pytest.raises(ParseError) as err:
        parse_slurm_conf_gres("GresTypes=gpu\nNodeName=n[1-2] Gres=gpu:a:b:c:1\n", source="slurm.conf")
    assert err.value.source == "slurm.conf:2"
    with pytest.raises(ParseError) as err:
        parse_slurm_conf_gres("NodeName=n1 Sockets=two\n", source="slurm.conf")
    assert (err.value.source, err.value.message) == ("slurm.conf:1", "Sockets=two is not a number")


@pytest.mark.parametrize("text, value, line, slurmdbd", [
    ("ClusterName=c\naccountingstoragetype=accounting_storage/slurmdbd\n", "accounting_storage/slurmdbd", 2, True),
    ("AccountingStorageType=accounting_storage/none\n", "accounting_storage/none", 1, False),
    ("ClusterName=c\n", None, None, False),  # the default is accounting_storage/none
])
def test_accounting_storage_type_says_whether_there_is_a_slurmdbd(text, value, line, slurmdbd):
    conf = parse_slurm_conf_gres(text, source="slurm.conf")
    assert (conf.accounting_storage_type, conf.accounting_storage_type_line) == (value, line)
    assert conf.slurmdbd is slurmdbd


def test_spaces_around_the_equals_sign_are_read_as_slurm_reads_them():
    """slurm.conf(5), gres.conf(5) and cgroup.conf(5) go through Slurm's parse_config.c, whose key-value pattern
    allows white space on both sides of ``=`` (``NodeName = gpu01``): such lines were skipped here, so a node or
    a ``ConstrainDevices = yes`` went unseen."""
    conf = parse_slurm_conf_gres("GresTypes = gpu,shard\nAccountingStorageType= accounting_storage/slurmdbd\n"
                                 "NodeName = gpu[01-02] Sockets =2 CoresPerSocket = 8 Gres = gpu:a100:4\n"
                                 'PartitionName = p Nodes = gpu[01-02] TRESBillingWeights = "GRES/gpu=1"\n',
                                 source="slurm.conf")
    assert conf.gres_types == ("gpu", "shard") and conf.slurmdbd
    assert [(n.name, n.sockets, n.cores_per_socket, n.gres) for n in conf.nodes] == [
        (name, 2, 8, (GresItem("gpu", "a100", 4),)) for name in ("gpu01", "gpu02")]
    assert [(p.name, p.nodes, p.billing_weights) for p in conf.partitions] == [("p", ("gpu01", "gpu02"),
                                                                               "GRES/gpu=1")]
    gres = parse_gres_conf("NodeName = gpu01 Name = gpu Type = a100 File = /dev/nvidia[0-3]\n", source="gres.conf")
    assert [(e.nodes, e.name, e.type, len(e.files)) for e in gres.entries] == [(("gpu01",), "gpu", "a100", 4)]
    assert [(k, v) for _, _, k, v in slurm_conf_settings("ConstrainDevices = yes\nX=1 Y =2\n",
                                                          source="cgroup.conf")] == [
        ("ConstrainDevices", "yes"), ("X", "1"), ("Y", "2")]


# --- the writers (mig apply rewrites one node's lines) ------------------------------------------------


def test_gres_lines_behind_an_include_are_refused():
    with pytest.raises(InputError, match="Include lines: h100-mig's lines may be in an included file"):
        replace_gres_lines("AutoDetect=off\nInclude /etc/slurm/gres.d/nodes.conf\n", "h100-mig", ["x"],
                           source="gres.conf")
    assert replace_gres_lines("AutoDetect=off\n", "h100-mig", ["NodeName=h100-mig Name=gpu"], source="g") == \
        "AutoDetect=off\n\nNodeName=h100-mig Name=gpu\n"


def test_gres_lines_of_a_hostlist_line_are_refused():
    with pytest.raises(InputError, match="names h100-mig among other nodes"):
        replace_gres_lines("NodeName=h100-mig,a100 Name=gpu File=/dev/nvidia0\n", "h100-mig", [], source="gres.conf")
