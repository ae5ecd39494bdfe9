"""mig plan: the model tables, geometry enumeration (against a brute force written from the rules), the
objective on small demands with answers worked out by hand, the property that every planned geometry is
accepted by the fake NVML, the demand sources and the command line.

The rules the brute force is written from (docs/mig.md, "The rules"; NVIDIA MIG user guide, "Getting
Started with MIG", ``nvidia-smi mig -lgipp``): a GPU instance takes one of its profile's placements
(start, size in memory slices); no two instances share a memory slice; a profile has at most
``max_instances`` instances.
"""

from __future__ import annotations

import itertools
import json
import math
import socket
from collections import Counter
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurm_gpushare.accounting.record import UsageRecord
from slurm_gpushare.accounting.store import Store
from slurm_gpushare.cli import main
from slurm_gpushare.errors import InputError, ParseError
from slurm_gpushare.hardware.fake import FakeNvml
from slurm_gpushare.hardware.machine import Gpu, Machine, MigProfile, nominal_gpu_mib, nominal_profile_mib
from slurm_gpushare.hardware.migtables import mig_table, mig_tables, table_for_gpu
from slurm_gpushare.hardware.nvidia_smi import parse_mig_profiles
from slurm_gpushare.mig.demand import Request, demand_from_store, read_demand_file
from slurm_gpushare.mig.geometry import enumerate_geometries
from slurm_gpushare.mig.output import layout_document, mig_parted_config, planned_machine, summary, summary_document
from slurm_gpushare.mig.plan import Weights, candidate, evaluate, plan_layout

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(__file__).parent / "data"
PACKAGED = ROOT / "slurm_gpushare" / "data" / "machines"
G = 1024


def table_machine(key: str, gpus: int = 1, *, hostname: str = "n1", mig_enabled: bool = False) -> Machine:
    t = mig_table(key)
    return Machine(hostname=hostname, gpus=tuple(
        Gpu(index=i, minor=i, name=f"NVIDIA {key}", memory_mib=t.memory_gib * G, mig_enabled=mig_enabled,
            mig_profiles=t.profiles) for i in range(gpus)))


#: every recorded model: the packaged tables, and the profiles of packaged machine descriptions
RECORDED = {key: t.profiles for key, t in mig_tables().items()}
RECORDED.update({f"{p.name}:gpu{g.index}": g.mig_profiles for p in sorted(PACKAGED.glob("*.json"))
                 for g in Machine.load(p).gpus if g.mig_profiles})


# --- the tables -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("key", "recording"), [("a100-40gb", "a100-pcie-40gb-lgip.txt"),
                                                ("h100-80gb", "h100-sxm5-80gb-x4-lgip.txt"),
                                                ("h200-141gb", "h200-141gb-lgip.txt")])
def test_recorded_tables_are_the_recorded_lgip_output(key, recording):
    # the tables marked "recorded" hold what the nvidia-smi parser reads from the recording
    parsed = parse_mig_profiles((DATA / "mig" / recording).read_text(), source=recording)[0]
    assert mig_table(key).profiles == parsed
    assert mig_table(key).memory_source.startswith("recorded")


# Rows of ``nvidia-smi mig -lgip`` NVIDIA published for GPUs no whole output is known of: GiB column and SMs
# (gpu-operator pull request 900 and mig-parted pull request 101: H100 NVL; mig-parted pull requests 166 and 187:
# B200, whose 1g.23gb showed 22.00 GiB with one driver and 20.50 with a later one; mig-parted issue 227: GB200).
PUBLISHED = {
    "h100-94gb": {"1g.12gb": (10.75, 16), "1g.12gb+me": (10.75, 16), "1g.24gb": (21.62, 26), "2g.24gb": (21.62, 32),
                  "3g.47gb": (46.38, None)},
    "b200-180gb": {"1g.23gb": (20.50, 18), "1g.23gb+me": (20.50, 18), "1g.45gb": (44.25, 30), "2g.45gb": (44.25, 36)},
    "gb200-186gb": {"1g.23gb": (22.00, 18), "1g.23gb+me": (22.00, 18), "1g.47gb": (45.50, 32), "2g.47gb": (45.50, 38)},
}


@pytest.mark.parametrize("key", sorted(PUBLISHED))
def test_partial_tables_hold_the_published_rows_and_never_more_than_a_slice_holds(key):
    """Issue 28 item 7: a table carries the sizes NVML reports where they were published. A row without one takes
    the size of a published row with as many memory slices (4g and 3g share 4 of 8), else an estimate below what
    the slice holds: the name's size times the smallest share a published row of that GPU holds."""
    t = mig_table(key)
    assert t.memory_source.startswith("partial")
    by_name = {p.name: p for p in t.profiles}
    for name, (gib, sm) in PUBLISHED[key].items():
        assert by_name[name].memory_mib == round(gib * 1024), name
        if sm is not None:
            assert by_name[name].sm_count == sm, name
    worst = min(gib * 1024 / nominal_profile_mib(by_name[n]) for n, (gib, _sm) in PUBLISHED[key].items())
    for p in t.profiles:
        if p.name in PUBLISHED[key]:
            assert p.name not in t.estimated
        elif p.name in t.estimated:
            assert p.memory_mib == math.floor(nominal_profile_mib(p) * worst), p.name
        else:  # derived: a published row with the same memory slices
            twin = next(by_name[n] for n in PUBLISHED[key] if by_name[n].placements[0][1] == p.placements[0][1])
            assert p.memory_mib == twin.memory_mib, p.name
        assert p.memory_mib < nominal_profile_mib(p), p.name
    assert t.estimated  # the 7g rows at least: no published size
    assert "7g." in t.estimated[-1]


def test_every_table_follows_the_slice_layout_of_the_guide():
    for key, t in mig_tables().items():
        four = key.startswith("a30")
        assert (t.memory_slices, t.compute_slices) == ((4, 4) if four else (8, 7)), key
        for p in t.profiles:
            assert p.name.startswith(f"{p.slices}g."), (key, p.name)
            # as many instances as placements, except the one media-extension instance
            assert p.max_instances == (1 if "+me" in p.name else len(p.placements)), (key, p.name)
            # nominal, published or estimated memory: at most the name's size, at most 12 % below it (16 GiB for
            # an H200's 1g.18gb)
            named = int(p.name.split(".")[1].split("gb")[0]) * G
            assert 0.88 * named <= p.memory_mib <= named, (key, p.name)


@pytest.mark.parametrize(("name", "mib", "key"), [
    ("NVIDIA A100-SXM4-40GB", 40960, "a100-40gb"), ("NVIDIA A100 80GB PCIe", 81920, "a100-80gb"),
    ("NVIDIA A30", 24576, "a30-24gb"), ("NVIDIA H100 80GB HBM3", 81559, "h100-80gb"),
    ("NVIDIA H100 NVL", 95830, "h100-94gb"), ("NVIDIA H200", 143771, "h200-141gb"),
    ("NVIDIA B200", 183359, "b200-180gb"), ("NVIDIA GB200", 189471, "gb200-186gb")])
def test_gpus_find_their_table_by_name_and_memory(name, mib, key):
    assert table_for_gpu(Gpu(index=0, minor=0, name=name, memory_mib=mib)).key == key


def test_no_table_for_a_gpu_without_mig():
    assert table_for_gpu(Gpu(index=0, minor=0, name="NVIDIA GeForce RTX 4090", memory_mib=24564)) is None
    with pytest.raises(InputError, match="no MIG profile table for GPU model 'a100'") as e:
        mig_table("a100")
    assert "a100-80gb" in e.value.hint


# --- enumeration ----------------------------------------------------------------------------------


def brute_force(profiles: tuple[MigProfile, ...]) -> tuple[set[tuple[str, ...]], int]:
    """Multisets and placed sets from the rules alone: every subset of (profile, placement) items."""
    items = [(p, s, n) for p in profiles for s, n in p.placements]
    multisets: set[tuple[str, ...]] = set()
    placed = 0
    for k in range(1, 9):
        for combo in itertools.combinations(items, k):
            slices = [sl for _p, s, n in combo for sl in range(s, s + n)]
            if len(slices) != len(set(slices)):
                continue
            counts = Counter(p.name for p, _s, _n in combo)
            if any(counts[p.name] > p.max_instances for p in profiles):
                continue
            placed += 1
            multisets.add(tuple(sorted(counts.elements())))
    return multisets, placed


@pytest.mark.parametrize("key", sorted(mig_tables()))
def test_enumeration_finds_exactly_what_the_rules_allow(key):
    profiles = mig_table(key).profiles
    e = enumerate_geometries(profiles)
    found = [tuple(sorted(p.profile.name for p in g.instances)) for g in e.geometries]
    multisets, placed = brute_force(profiles)
    assert len(found) == len(set(found))
    assert set(found) == multisets
    assert e.placed_sets == placed


def test_enumeration_by_hand_on_the_a100_80gb():
    found = {tuple(sorted(g.counts.items())) for g in enumerate_geometries(mig_table("a100-80gb").profiles).geometries}
    assert (("3g.40gb", 1), ("4g.40gb", 1)) in found          # 4 + 4 memory slices, 3 + 4 compute
    assert (("3g.40gb", 2),) in found
    assert (("1g.10gb", 7),) in found and (("1g.10gb", 8),) not in found  # 1g starts at 0-6 only
    assert (("7g.80gb", 1),) in found and not any(n == "7g.80gb" and len(f) > 1 for f in found for n, _ in f)
    assert (("1g.10gb+me", 2),) not in found                   # one media extension per GPU
    assert (("2g.20gb", 3), ("1g.20gb", 1)) in found or (("1g.20gb", 1), ("2g.20gb", 3)) in found
    assert sum(1 for f in found if {n for n, _ in f} == {"1g.10gb"}) == 7


@pytest.mark.parametrize("key", sorted(RECORDED))
def test_the_fake_nvml_accepts_every_geometry_in_its_order(key):
    profiles = RECORDED[key]
    for g in enumerate_geometries(profiles).geometries:
        nvml = FakeNvml(Machine(hostname="n1", gpus=(Gpu(index=0, minor=0, name="NVIDIA GPU", memory_mib=81920,
                                                         mig_enabled=True, mig_profiles=profiles),)))
        with nvml:
            for p in g.instances:
                inst = nvml.create_gpu_instance(0, p.profile.profile_id, p.start)
                assert inst.start == p.start
            assert len(nvml.gpu_instances(0)) == len(g.instances)


# --- the objective, by hand -----------------------------------------------------------------------


def test_one_40g_and_three_10g_requests_fill_an_a100_exactly():
    # 3g.40gb at slices 4-7 and 4x 1g.10gb at 0-3 cover all 8 memory and 7 compute slices: nothing is
    # stranded; 4g.40gb + 3x 1g.10gb would leave memory slice 7 (10G) uncovered
    plan = plan_layout([table_machine("a100-80gb")], [Request(40 * G, 1), Request(10 * G, 3)])
    assert plan.gpus[0].choice.geometry.counts == {"1g.10gb": 4, "3g.40gb": 1}
    assert plan.planned.stranded_mem_mib == 0 and plan.planned.stranded_slices == 0
    assert plan.planned.served == 4 and plan.planned.objective == 0


def test_a_whole_gpu_request_keeps_one_gpu_mig_off():
    plan = plan_layout([table_machine("a100-80gb", 2)], [Request(0, 1, whole=True), Request(10 * G, 7)])
    assert sorted(p.choice.geometry is None for p in plan.gpus) == [False, True]
    # the 7 requests of 10G on one GPU: 7x 1g.10gb leave memory slice 7 (10G); any other 7 slots strand 10G too
    assert plan.planned.served == 8 and plan.planned.stranded_mem_mib == 10 * G
    assert plan.planned.objective == pytest.approx(10 / 80)


def test_an_sm_share_needs_its_compute_slices():
    # sm=50 on 7 slices: ceil(3.5) = 4 slices, a 4g; 35G stranded inside it; the rest of the GPU covered
    plan = plan_layout([table_machine("a100-80gb")], [Request(5 * G, 1, sm_percent=50)])
    g = plan.gpus[0].choice.geometry
    assert "4g.40gb" in g.counts and g.memory_slices_used == 8 and g.compute_slices_used == 7
    assert plan.planned.stranded_mem_mib == 35 * G and plan.planned.objective == pytest.approx(35 / 80)


def test_a_request_larger_than_any_slice_keeps_the_gpu_whole():
    plan = plan_layout([table_machine("a100-80gb")], [Request(50 * G, 1)])
    assert plan.gpus[0].choice.geometry is None
    assert plan.planned.stranded_mem_mib == 30 * G and plan.planned.unserved_mem_mib == 0


def test_the_whole_gpu_weight_decides_between_one_job_and_seven():
    # one whole-GPU job and seven of 10G on one A100. MIG off serves the whole job, the seven wait:
    # 4 * 7 * 1/7 = 4.0 (each 10G asks 1/8 of the memory but 1 of 7 compute slices). 7x 1g.10gb serves the
    # seven and strands slice 7: 4 * 1 + 10/80 = 4.125 by default, 1 + 10/80 = 1.125 with --weight-whole 1
    m = [table_machine("a100-80gb")]
    d = [Request(0, 1, whole=True), Request(10 * G, 7)]
    default = plan_layout(m, d)
    assert default.gpus[0].choice.geometry is None and default.planned.objective == pytest.approx(4.0)
    light = plan_layout(m, d, weights=Weights(whole=1))
    assert light.gpus[0].choice.geometry is not None and light.planned.served == 7
    assert light.planned.objective == pytest.approx(1.125)


def test_today_is_judged_by_the_same_numbers():
    m = Machine.load(PACKAGED / "4x-h100-mig-mixed.json")
    plan = plan_layout([m], [Request(10 * G, 8), Request(0, 1, whole=True)])
    # GPUs 2 and 3 run 4g.40gb + 3x 1g.10gb today: memory slice 7 of each uncovered (2x 10G), and of the 8
    # requests of 10G six go to the 1g slices, one to the 4g slices (30G each stranded) ... by the objective
    assert plan.today.stranded_mem_mib > plan.planned.stranded_mem_mib
    assert plan.planned.objective <= plan.today.objective
    assert [p.today.label for p in plan.gpus][2:] == ["4g.40gb + 3x 1g.10gb"] * 2


def test_mig_off_gpus_without_a_table_stay_whole():
    m = Machine.load(PACKAGED / "8x-rtx4090-pcie.json")
    with pytest.raises(InputError, match="no MIG-capable GPU to plan: NVIDIA GeForce RTX 4090") as e:
        plan_layout([m], [Request(10 * G, 1)])
    assert "a100-80gb" in e.value.hint


def test_bad_fit_weights_and_empty_demand_are_refused():
    m = [table_machine("a100-80gb")]
    with pytest.raises(InputError, match="unknown fit"):
        plan_layout(m, [Request(G, 1)], fit="loose")
    with pytest.raises(InputError, match="--weight-memory -1"):
        plan_layout(m, [Request(G, 1)], weights=Weights(memory=-1))
    with pytest.raises(InputError, match="the demand is empty"):
        plan_layout(m, [])
    with pytest.raises(InputError, match="the smallest request asks 90G, the largest GPU holds 80G") as e:
        plan_layout(m, [Request(90 * G, 1), Request(100 * G, 2)])
    assert "units" in e.value.hint


# --- the property: every planned geometry is accepted by the fake NVML -------------------------


requests = st.lists(st.one_of(
    st.builds(Request, mem_mib=st.integers(1, 200 * G), weight=st.floats(0.1, 12),
              sm_percent=st.one_of(st.none(), st.integers(1, 100))),
    st.builds(Request, mem_mib=st.just(0), weight=st.floats(0.1, 3), whole=st.just(True))), min_size=1, max_size=5)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(key=st.sampled_from(sorted(RECORDED)), gpus=st.integers(1, 3), demand=requests,
       fit=st.sampled_from(["nominal", "exact"]))
def test_every_planned_geometry_is_accepted_by_the_fake_nvml(key, gpus, demand, fit):
    profiles = RECORDED[key]
    mib = max(nominal_profile_mib(p) for p in profiles)
    machine = Machine(hostname="n1", gpus=tuple(Gpu(index=i, minor=i, name="NVIDIA GPU", memory_mib=mib,
                                                    mig_profiles=profiles) for i in range(gpus)))
    capacity = nominal_gpu_mib(mib) if fit == "nominal" else mib
    if not any(r.whole or r.mem_mib <= capacity for r in demand):
        with pytest.raises(InputError, match="nothing in the demand fits a GPU here"):
            plan_layout([machine], demand, fit=fit)
        return
    plan = plan_layout([machine], demand, fit=fit)
    layout = layout_document(plan)["nodes"]["n1"]["gpus"]
    target = planned_machine(machine, plan)
    nvml = FakeNvml(Machine(hostname="n1", gpus=tuple(
        Gpu(index=i, minor=i, name="NVIDIA GPU", memory_mib=mib, mig_enabled=True, mig_profiles=profiles)
        for i in range(gpus))))
    with nvml:
        for g in layout:
            for inst in g["instances"]:
                nvml.create_gpu_instance(g["index"], inst["profile_id"], inst["start"])
            live = [(i.profile, i.start) for i in nvml.gpu_instances(g["index"])]
            assert sorted(live) == sorted((i.profile, i.start) for i in target.gpus[g["index"]].mig_instances)
    # never worse than today (all MIG off), and for one GPU no candidate is better (exact)
    assert plan.planned.objective <= plan.today.objective + 1e-9
    if gpus == 1:
        g = plan.gpus[0].gpu
        ref_mib = nominal_gpu_mib(g.memory_mib) if fit == "nominal" else g.memory_mib
        ref_slices = max(p.slices for p in profiles)
        best = min(evaluate([candidate(g, geo, fit)], demand, Weights(), ref_mib, ref_slices).objective
                   for geo in [None, *enumerate_geometries(profiles).geometries])
        assert plan.planned.objective == pytest.approx(best, abs=1e-9)


# --- demand ---------------------------------------------------------------------------------------


def record(**kw) -> UsageRecord:
    base = dict(job_id="42", user="alice", account="physics", partition="gpu", node="n1", gpu_index=0,
                gpu_uuid="GPU-0", gpu_model="a100", gpu_memory_mib=81920, mode="mig", share="1g.10gb",
                mem_asked_mib=10 * G, sm_asked_percent=None, mem_granted_mib=10 * G, start=1000, end=2000,
                exit_state="COMPLETED", exit_code="0:0")
    base.update(kw)
    return UsageRecord(**base)


def test_demand_from_the_store_weighs_run_time_in_the_period(tmp_path):
    with Store(tmp_path / "a.db") as store:
        store.add([record(job_id="1"),                                          # 1000-2000: half of 0-2000
                   record(job_id="2", start=0, end=2000, mem_asked_mib=20 * G),  # all of it
                   record(job_id="3", mode="gpu", share="", mem_asked_mib=None, start=0, end=500),
                   record(job_id="4", partition="other")])
        d = demand_from_store(store, partitions=("gpu",), since=0, until=2000)
        assert {(r.label(), r.weight) for r in d} == {("10G", 0.5), ("20G", 1.0), ("gpu", 0.25)}
        with pytest.raises(InputError, match="no accounting records of partition.s. nope"):
            demand_from_store(store, partitions=("nope",))


def test_demand_files_csv_and_json(tmp_path):
    f = tmp_path / "d.csv"
    f.write_text("# sizes seen last month\nmem,count,sm\n10G,6,\n20G,2,30\ngpu,1,\n10240M,1,\n")
    d = read_demand_file(f)
    assert {(r.mem_mib, r.weight, r.sm_percent, r.whole) for r in d} == {
        (10 * G, 7.0, None, False), (20 * G, 2.0, 30, False), (0, 1.0, None, True)}
    j = tmp_path / "d.json"
    j.write_text(json.dumps({"requests": [{"mem": "10G", "count": 6}, {"gpu": True, "count": 1}]}))
    assert {(r.mem_mib, r.weight, r.whole) for r in read_demand_file(j)} == {(10 * G, 6.0, False), (0, 1.0, True)}


@pytest.mark.parametrize(("text", "message"), [
    ("mem,count\n10G,six\n", "d.txt:2: count 'six' is not a number"),
    ("10G,6,120\n", "d.txt:1: sm 120 is outside 1-100"),
    ("10G\n", "d.txt:1: 1 columns, expected 2 or 3"),
    ("ten,1\n", "d.txt:1: mem: 'ten' is not a memory size"),
    ("0M,1\n", "d.txt:1: mem: '0M' is less than 1 MiB"),
    # a bare number was read as MiB: 10 meant 10 GiB to whoever wrote it, and the plan was 1000x off
    ("10,6\n", "d.txt:1: mem '10' has no unit: write 10G (GiB) or 10M (MiB)"),
    ('{"requests": [{"mem": 10, "count": 6}]}', "requests[0]: mem 10 has no unit"),
    ("10G,0\n", "count '0' must be above 0"),
    ("# nothing\n", "holds no request"),
    ('{"requests": [{"mem": "10G"}]}', "requests[0]: each request has count"),
    ('{"request": []}', 'a JSON demand file is {"requests"'),
])
def test_malformed_demand_files_are_named(tmp_path, text, message):
    f = tmp_path / "d.txt"
    f.write_text(text)
    with pytest.raises(ParseError) as e:
        read_demand_file(f)
    assert message in str(e.value)


DEEP = 100_000


@pytest.mark.parametrize(("name", "text", "message"), [
    # JSON by the first character or by the name: a truncated document is not read as CSV rows
    ("d.txt", "[1,2", "d.txt: not valid JSON: line 1 column 5 (Expecting ',' delimiter)"),
    ("d.json", '{"requests": [\n{"mem": "10G" "count": 1}]}',
     "d.json: not valid JSON: line 2 column 15 (Expecting ',' delimiter)"),
    ("d.json", "10G,1\n", "d.json: not valid JSON: line 1 column 3 (Extra data)"),
    # nested deeper than the parser goes: one error, no RecursionError
    ("d.json", '{"requests": ' + "[" * DEEP + "]" * DEEP + "}", "d.json: JSON nested too deeply"),
    ("d.txt", "[" * DEEP + "]" * DEEP, "d.txt: JSON nested too deeply"),
    # a CSV field past the csv module's limit: one error, no _csv.Error
    ("d.csv", "x" * 200_000 + ",1\n", "d.csv:1: not a CSV row (field larger than field limit (131072))"),
    # a count is a number, never a boolean (true would be taken as 1)
    ("d.json", '{"requests": [{"mem": "10G", "count": true}]}', "d.json: requests[0]: count True is not a number"),
    ("d.json", '{"requests": [{"gpu": true, "count": false}]}', "d.json: requests[0]: count False is not a number"),
])
def test_demand_files_that_are_not_what_they_seem_are_one_parse_error(tmp_path, name, text, message):
    f = tmp_path / name
    f.write_text(text)
    with pytest.raises(ParseError) as e:
        read_demand_file(f)
    assert str(e.value).startswith(message), str(e.value)
    assert "\n" not in str(e.value)


def test_a_mem_error_names_the_value_once(tmp_path):
    f = tmp_path / "d.csv"
    f.write_text("0M,1\n")
    with pytest.raises(ParseError) as e:
        read_demand_file(f)
    assert str(e.value).count("mem") == 1, str(e.value)


# --- the command line -----------------------------------------------------------------------------


def _run(*args):
    return CliRunner().invoke(main, ["mig", "plan", *args])


def test_cli_writes_files_that_parse_and_check(tmp_path):
    demand = tmp_path / "demand.csv"
    demand.write_text("mem,count\n8G,9\n10G,3\ngpu,1\n")
    out = tmp_path / "plan"
    r = _run(str(PACKAGED / "4x-h100-mig-mixed.json"), "--demand", str(demand), "--output-dir", str(out),
             "--slurm-version", "24.11")
    assert r.exit_code == 0, r.output
    assert "stranded memory" in r.output and "today:" in r.output and "plan:" in r.output
    doc = yaml.safe_load((out / "mig-parted.yaml").read_text())
    assert doc["version"] == "v1" and list(doc["mig-configs"]) == ["gpushare-h100-mig"]
    devices = []
    for entry in doc["mig-configs"]["gpushare-h100-mig"]:
        assert set(entry) <= {"devices", "mig-enabled", "mig-devices"} and isinstance(entry["mig-enabled"], bool)
        assert ("mig-devices" in entry) == entry["mig-enabled"]
        assert all(isinstance(n, int) and n > 0 for n in entry.get("mig-devices", {}).values())
        devices += entry["devices"]
    assert sorted(devices) == [0, 1, 2, 3]
    layout = json.loads((out / "layout.json").read_text())
    planned = Machine.load(out / "h100-mig.planned.json")
    for g in layout["nodes"]["h100-mig"]["gpus"]:
        assert [(i["profile"], i["start"]) for i in g["instances"]] == \
            [(i.profile, i.start) for i in planned.gpus[g["index"]].mig_instances]
    # the gres.conf and slurm.conf lines pass the gres-conf check against the planned machine
    slurm_conf = tmp_path / "slurm.conf"
    slurm_conf.write_text("AccountingStorageType=accounting_storage/slurmdbd\n"
                          + (out / "slurm.conf.gres").read_text())
    check = CliRunner().invoke(main, ["gres-conf", str(out / "h100-mig.planned.json"), "--check", "--gres-conf",
                                      str(out / "gres.conf"), "--slurm-conf", str(slurm_conf), "--slurm-version",
                                      "24.11", "--partition", "gpu=h100-mig"])
    assert check.exit_code == 0 and "match the hardware" in check.output, check.output


def test_cli_json_is_the_plan_the_text_and_the_layout_file_give(tmp_path):
    demand = tmp_path / "demand.csv"
    demand.write_text("mem,count\n8G,9\n10G,3\ngpu,1\n")
    args = [str(PACKAGED / "4x-h100-mig-mixed.json"), "--demand", str(demand)]
    text = _run(*args)
    r = _run(*args, "--format", "json", "--output-dir", str(tmp_path / "plan"), "--slurm-version", "24.11")
    assert r.exit_code == 0 and text.exit_code == 0, r.output
    doc = json.loads(r.stdout)  # what --output-dir did goes to stderr
    assert doc["layout"] == json.loads((tmp_path / "plan" / "layout.json").read_text())
    assert [(g["node"], g["gpu"]) for g in doc["gpus"]] == [("h100-mig", i) for i in range(4)]
    assert {d["request"] for d in doc["demand"]} == {"8G", "10G", "gpu"}
    for name in ("today", "plan"):
        block = text.output.split(f"\n{name}:\n", 1)[1]
        mib = int(block.split("stranded memory", 1)[1].split("(", 1)[1].split(" MiB", 1)[0])
        assert round(doc[name]["stranded_mem_mib"]) == mib
        assert doc[name]["queue_wait"]["jobs"] == doc["queue_wait_trace"]["jobs"] > 0
    for g in doc["gpus"]:
        assert f"{g['today']}" in text.output and f"{g['plan']}" in text.output
    assert doc["queue_wait_trace"]["source"] == "poisson"


def test_cli_reads_the_gpus_through_the_nvml_port(tmp_path, monkeypatch):
    # the probe path (NVML port, here the fake): GPUs with MIG on report their profiles, those with MIG off
    # none (as NVML), which then take their model's table; the plan is the one of the description
    demand = tmp_path / "demand.csv"
    demand.write_text("8G,9\n10G,3\ngpu,1\n")
    monkeypatch.setenv("GPUSHARE_NVML", f"fake:{PACKAGED / '4x-h100-mig-mixed.json'}")
    probed = _run("--demand", str(demand))
    monkeypatch.delenv("GPUSHARE_NVML")
    described = _run(str(PACKAGED / "4x-h100-mig-mixed.json"), "--demand", str(demand))
    assert probed.exit_code == 0 and described.exit_code == 0, probed.output + described.output
    host = socket.gethostname().split(".")[0]  # a probe names the node after this host
    assert [" ".join(line.split()).replace(host, "h100-mig", 1) for line in probed.output.splitlines()] == \
        [" ".join(line.split()) for line in described.output.splitlines()]
    assert "geometries: h100-80gb: " in probed.output


def test_cli_dry_run_writes_nothing(tmp_path):
    demand = tmp_path / "demand.csv"
    demand.write_text("10G,3\n")
    r = _run("--model", "h200-141gb", "--gpus", "2", "--demand", str(demand), "--output-dir", str(tmp_path / "o"),
             "--dry-run", "--slurm-version", "24.11")
    assert r.exit_code == 0, r.output
    assert "dry run: would write mig-parted.yaml" in r.output and not (tmp_path / "o").exists()


def test_cli_plans_from_the_store(tmp_path):
    db = tmp_path / "a.db"
    with Store(db) as store:
        store.add([record(job_id=str(i), mem_asked_mib=6 * G, start=0, end=3600) for i in range(5)])
    r = _run("--model", "a100-80gb", "--store", str(db), "--partition", "gpu", "--since", "@0", "--until", "@3600")
    assert r.exit_code == 0, r.output
    # five jobs of 6G that each ran the whole hour: five at once, all of them held by slices
    assert "6G x5.00" in r.output and "served            5.00 of 5.00" in r.output


@pytest.mark.parametrize(("args", "message"), [
    (["--model", "a100-80gb"], "give the demand either from the store"),
    (["--model", "a100-81gb", "--demand", "D"], "no MIG profile table for GPU model 'a100-81gb'"),
    ([str(PACKAGED / "8x-rtx4090-pcie.json"), "--demand", "D"], "no MIG-capable GPU to plan"),
    (["--model", "a100-80gb", "--demand", "D", "--since", "now-1days"], "--partition, --since and --until go with"),
    (["--model", "a100-80gb", "--store", "nope.db"], "--store nope.db: no accounting database at nope.db"),
    (["--model", "a30-24gb", "--demand", "BAD"], "count 'x' is not a number"),
])
def test_cli_bad_input_is_one_clear_line(tmp_path, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "D").write_text("10G,1\n")
    (tmp_path / "BAD").write_text("10G,x\n")
    r = _run(*args)
    assert r.exit_code == 2, r.output
    assert message in r.output


def _many_gpus(tmp_path, indices, minors) -> Path:
    data = json.loads((PACKAGED / "4x-h100-mig-mixed.json").read_text())
    gpu = data["gpus"][0]
    data["gpus"] = [dict(gpu, index=i, minor=m) for i, m in zip(indices, minors, strict=True)]
    data["links"], data["nics"] = [], []
    f = tmp_path / "many.json"
    f.write_text(json.dumps(data))
    return f


@pytest.mark.parametrize(("indices", "minors", "message"), [
    # 250 GPUs, 125 indices given twice: each named once, sorted, the first ten and how many more
    ([i // 2 for i in range(250)], list(range(250)),
     "duplicate GPU indices 0, 1, 2, 3, 4, 5, 6, 7, 8, 9 and 115 more (each GPU has its own; regenerate the "
     "description with 'slurm-gpushare inventory')"),
    (list(range(250)), [7] * 249 + [3],
     "duplicate GPU minor numbers 7 (each GPU has its own; regenerate the description with "
     "'slurm-gpushare inventory')"),
])
def test_cli_duplicate_gpus_are_named_once_each(tmp_path, indices, minors, message):
    r = _run(str(_many_gpus(tmp_path, indices, minors)), "--demand", str(tmp_path / "D"))
    assert r.exit_code == 2, r.output
    assert r.output.strip() == f"slurm-gpushare: error: {tmp_path / 'many.json'}: {message}", r.output


@pytest.mark.parametrize(("machine", "demand", "message"), [
    ("[" * DEEP + "]" * DEEP, "10G,1\n", "deep.json: JSON nested too deeply"),
    (None, '{"requests": ' + "[" * DEEP + "]" * DEEP + "}", "deep-demand.json: JSON nested too deeply"),
    (None, "[" * DEEP, "deep-demand.json: JSON nested too deeply"),
])
def test_cli_deeply_nested_files_are_one_line_and_exit_2(tmp_path, machine, demand, message):
    m = tmp_path / "deep.json"
    if machine is not None:
        m.write_text(machine)
    d = tmp_path / "deep-demand.json"
    d.write_text(demand)
    r = _run(str(m) if machine is not None else str(PACKAGED / "4x-h100-mig-mixed.json"), "--demand", str(d))
    assert r.exit_code == 2, (r.output, r.exception)
    assert len(r.output.strip().splitlines()) == 1 and message in r.output, r.output


def test_mig_parted_config_groups_gpus_with_one_geometry():
    plan = plan_layout([table_machine("a100-80gb", 4)], [Request(10 * G, 21), Request(0, 1, whole=True)])
    cfg = mig_parted_config(plan)["mig-configs"]["gpushare-n1"]
    assert sorted(d for e in cfg for d in e["devices"]) == [0, 1, 2, 3]
    keys = [(e["mig-enabled"], tuple(sorted(e.get("mig-devices", {}).items()))) for e in cfg]
    assert len(keys) == len(set(keys))  # one entry per geometry
    by_gpu = {p.gpu.index: p.choice.geometry for p in plan.gpus}
    for e in cfg:
        for d in e["devices"]:
            assert (by_gpu[d].counts if by_gpu[d] is not None else None) == e.get("mig-devices")
    assert [e["devices"] for e in cfg if not e["mig-enabled"]] == [[next(i for i, g in by_gpu.items() if g is None)]]
    assert math.isclose(plan.planned.served, 22)


def test_fit_exact_refuses_a_gpu_whose_profiles_come_from_a_nominal_table():
    """Issue 28 item 7: ``fit=exact`` counts what a slice really holds, and a nominal table only has the size in the
    profile name (an A100 80GB's "1g.10gb" holds less than 10 GiB): the plan would put requests on slices that
    cannot hold them. Refused, naming the GPU's table, the largest shortfall among the published rows and what would
    work; a recorded table (H100 80GB) and a GPU with its own profiles plan as before."""
    a100 = Machine(hostname="n1", gpus=(Gpu(index=0, minor=0, name="NVIDIA A100-SXM4-80GB", memory_mib=81920),))
    demand = [Request(10 * G, 1.0)]
    assert table_for_gpu(a100.gpus[0]).memory_source.startswith("nominal")
    with pytest.raises(InputError, match=r"fit exact: GPU 0 of n1 \(NVIDIA A100-SXM4-80GB\) has only the nominal "
                                         r"MIG table a100-80gb") as e:
        plan_layout([a100], demand, fit="exact")
    assert "up to 11.1% less in this package's recorded rows: h200-141gb's 1g.18gb holds 16.00 GiB" in str(e.value)
    assert "mig -lgip" in e.value.hint and "--fit nominal" in e.value.hint
    assert plan_layout([a100], demand, fit="nominal").gpus  # nominal: as the table says
    h100 = Machine(hostname="n2", gpus=(Gpu(index=0, minor=0, name="NVIDIA H100 80GB HBM3", memory_mib=81559),))
    assert table_for_gpu(h100.gpus[0]).memory_source.startswith("recorded")
    assert plan_layout([h100], [Request(9 * G, 1.0)], fit="exact").gpus


def test_fit_exact_plans_a_partial_table_by_its_published_sizes_and_says_which_are_estimated():
    """Issue 28 item 7: an H100 NVL's 1g.12gb holds 10.75 GiB (published -lgip), so an exact plan puts 11G requests
    on 1g.24gb slices, where the nominal plan puts them on 1g.12gb; the B200 rows without a published size are
    named in the plan's notes, in the text and in JSON."""
    nvl = Machine(hostname="n1", gpus=(Gpu(index=0, minor=0, name="NVIDIA H100 NVL", memory_mib=95830),))
    demand = [Request(11 * G, 4.0)]
    exact = plan_layout([nvl], demand, fit="exact").gpus[0].choice.geometry.counts
    nominal = plan_layout([nvl], demand, fit="nominal").gpus[0].choice.geometry.counts
    assert exact.get("1g.24gb", 0) + exact.get("2g.24gb", 0) >= 1 and "1g.12gb" not in exact, exact
    assert nominal.get("1g.12gb", 0) >= 4, nominal
    b200 = Machine(hostname="n2", gpus=(Gpu(index=0, minor=0, name="NVIDIA B200", memory_mib=183359),))
    plan = plan_layout([b200], [Request(20 * G, 1.0)], fit="exact")
    assert plan.notes == ("b200-180gb: no published size for 3g.90gb, 4g.90gb, 7g.180gb: planned at 89.1% of the size "
                          "in the name (the smallest share a published row of this GPU holds; the real slice holds "
                          "more)",)
    assert "note: b200-180gb: no published size for 3g.90gb" in summary(plan)
    assert summary_document(plan)["notes"] == list(plan.notes)
    assert plan_layout([b200], [Request(20 * G, 1.0)], fit="nominal").notes == ()


def test_fit_exact_with_model_judges_the_table_it_plans_with(tmp_path):
    """``mig plan --model KEY --fit exact`` plans GPUs whose profiles are the table's own: a nominal table is
    refused and a partial one names its estimated rows, as for a GPU with MIG off (it planned the A100 80GB's
    nominal sizes as exact, silently)."""
    demand = tmp_path / "d.csv"
    demand.write_text("20G,3\n40G,2\n")
    r = _run("--model", "a100-80gb", "--gpus", "1", "--demand", str(demand), "--fit", "exact")
    assert r.exit_code == 2 and "has only the nominal MIG table a100-80gb" in r.output, r.output
    r = _run("--model", "b200-180gb", "--gpus", "1", "--demand", str(demand), "--fit", "exact")
    assert r.exit_code == 0 and "note: b200-180gb: no published size for 3g.90gb" in r.output, r.output
    r = _run("--model", "h200-141gb", "--gpus", "1", "--demand", str(demand), "--fit", "exact")
    assert r.exit_code == 0 and "note:" not in r.output, r.output  # a recorded table: nothing to say


def test_a_partial_table_naming_an_unknown_profile_is_a_clear_error(monkeypatch):
    """A packaged partial table whose ``recorded`` list names no profile of it fails with its key and the names,
    also under ``python -O`` (an assert was all there was)."""
    from slurm_gpushare.hardware import migtables

    profiles = list(mig_table("b200-180gb").profiles)
    with pytest.raises(InputError, match=r"MIG table b200-180gb: 'recorded' names 1g\.99gb, which it has no "
                                         r"profile of"):
        migtables._fill_partial("b200-180gb", profiles, {"1g.23gb", "1g.99gb"})
