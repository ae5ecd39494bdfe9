"""scripts/peer-suite's parsing, selection and comparison (slurm_gpushare_dev/peer.py), without Slurm: the
runs against the dev cluster are the script itself (docs/development.md, "SchedMD's GPU tests")."""

from __future__ import annotations

import subprocess

import pytest

from slurm_gpushare.errors import ClusterError
from slurm_gpushare_dev.peer import (
    FAIL,
    PASS,
    SKIP,
    TIMEOUT,
    Outcome,
    Row,
    compare,
    format_table,
    order_key,
    parse_outcome,
    partitions_without,
    prepare_workdir,
    select_tests,
)

# lines as testsuite/expect/globals logs them (22.05), the first with the bracketed-paste escape a spawned
# shell leaves in front
FAILED = """\
\x1b[?2004l[2026-12-05 13:10:26.226] Fatal   The execution hostname () != requested hostname (h100-mig) \
(fail@globals:431,test1.85:145,test1.85:144)
==============================================================================
FAILURE             : test1.85
"""
SUBFAILED = """\
[2026-12-05 13:09:24.348] Error   Subtest 23 failed  : Verify 11.1 allocated TRES gres/gpu=1 \
(subfail@globals:596,subtest@globals:6465,test1.12:213)
[2026-12-05 13:09:24.366] Error   Subtest 26 failed  : Verify 11.2 allocated TRES gres/gpu=1 (subfail@globals:596)
FAILURE             : test1.12
"""
SKIPPED = """\
[2026-12-05 13:09:34.600] Warning Timeout waiting for file (/x/test1.14dir/step3) (wait_for_file@globals:2012)
[2026-12-05 13:09:49.511] Warning This test requires 3 or more identical GPU nodes (skip@globals:470,test39.2:40)
SKIPPED             : test39.2
"""


def test_exit_status_and_messages_make_the_outcome():
    assert parse_outcome(0, "SUCCESS : test39.1\n", 0.8) == Outcome(PASS, 0.8)
    assert parse_outcome(1, FAILED, 3.4) == Outcome(
        FAIL, 3.4, "The execution hostname () != requested hostname (h100-mig)")
    # no Fatal line: the first Error line, without its call chain
    assert parse_outcome(1, SUBFAILED, 15).reason == "Subtest 23 failed  : Verify 11.1 allocated TRES gres/gpu=1"
    # a skip says the test's own last warning
    assert parse_outcome(255, SKIPPED, 1) == Outcome(SKIP, 1, "This test requires 3 or more identical GPU nodes")
    assert parse_outcome(255, "", 1).reason == "(no message)"
    assert parse_outcome(0, "", 240.2, timed_out=True) == Outcome(TIMEOUT, 240.2, "no result within 240 s")
    other = parse_outcome(2, "spawn failed\ncan't find ./test\n", 0.1)
    assert other.result == "error" and other.failed and "exit 2" in other.reason and "./test" in other.reason
    assert not Outcome(SKIP, 1).failed and Outcome(TIMEOUT, 1).failed


def test_tests_are_selected_by_their_text_and_sorted_by_number(tmp_path):
    (tmp_path / "globals").write_text("gres gpu everywhere")
    (tmp_path / "test39.10").write_text("srun --gpus=1")
    (tmp_path / "test39.9").write_text("--GRES=gpu:1")
    (tmp_path / "test1.62").write_text("nothing of that kind")  # always run: the issue names it
    (tmp_path / "test1.1").write_text("srun hostname")
    (tmp_path / "test39.18.prog.c").write_text("cudaMalloc gpu")
    (tmp_path / "test7.17_configs").mkdir()
    assert select_tests(tmp_path) == ["test1.62", "test39.9", "test39.10"]
    assert select_tests(tmp_path, ["test1.1"]) == ["test1.1"]
    with pytest.raises(ClusterError, match="no such expect test: test9.9, globals"):
        select_tests(tmp_path, ["test9.9", "globals"])
    assert order_key("test1.12") == (1, 12)
    with pytest.raises(ValueError):
        order_key("test1.12.prog.c")


def test_the_workdir_is_a_configured_copy(tmp_path):
    suite = tmp_path / "cache" / "testsuite"
    (suite / "expect").mkdir(parents=True)
    (suite / "expect" / "globals").write_text("x")
    expect = prepare_workdir(suite, tmp_path / "work", tmp_path / "cluster" / "etc")
    assert (expect / "globals").read_text() == "x"
    assert (expect / "globals.local").read_text() == "set slurm_dir /usr\n"
    assert (expect.parent / "testsuite.conf").read_text() == (
        f"SlurmInstallDir=/usr\nSlurmConfigDir={tmp_path / 'cluster' / 'etc'}\n")
    assert not (suite / "expect" / "globals.local").exists()  # the cache stays as fetched
    (expect / "test1.1.input").write_text("scratch")
    expect = prepare_workdir(suite, tmp_path / "work", tmp_path / "cluster" / "etc")
    assert not (expect / "test1.1.input").exists()  # a fresh copy each run


def _scripted(results: dict[tuple[str, bool], list[str]]):
    """A run and a switch that answer from ``results``: (test, product?) -> results in order."""
    state = {"product": None}
    calls = []

    def switch(enabled: bool) -> None:
        calls.append(("switch", enabled))
        state["product"] = enabled

    def run(test: str) -> Outcome:
        calls.append((test, state["product"]))
        return Outcome(results[(test, state["product"])].pop(0), 1.0, "why")

    return run, switch, calls


def test_plain_then_product_and_a_difference_runs_again_both_ways():
    run, switch, calls = _scripted({
        ("t1", False): [PASS], ("t1", True): [PASS],
        ("t2", False): [SKIP],
        ("t3", False): [PASS, PASS], ("t3", True): [FAIL, FAIL],  # a regression
        ("t4", False): [PASS, PASS], ("t4", True): [TIMEOUT, PASS],  # once only: it does not count
        ("t5", False): [FAIL],  # fails on plain Slurm: it cannot pass plain and fail with the product
    })
    rows = compare(["t1", "t2", "t3", "t4", "t5"], run, switch)
    assert calls == [("switch", False), ("t1", False), ("t2", False), ("t3", False), ("t4", False), ("t5", False),
                     ("switch", True), ("t1", True), ("t3", True), ("t4", True),
                     ("t3", True), ("t4", True), ("switch", False), ("t3", False), ("t4", False)]
    by = {r.test: r for r in rows}
    assert [o.result for o in by["t2"].product] == []  # skipped plain: not run again
    assert [o.result for o in by["t5"].product] == []  # failed plain: not run with the product
    assert [r.test for r in rows if r.regression] == ["t3"]
    assert by["t4"].differs and not by["t4"].regression
    assert not by["t5"].differs and not by["t5"].regression
    table = format_table(rows, "title")
    assert ("| t3 | pass, pass | FAIL, FAIL | 2 | **passes plain, fails with the product**; again on rerun; why |"
            in table)
    assert "| t4 | pass, pass | timeout, pass | 2 | differed once, not again; why |" in table
    assert "| t2 | skip | - | 1 | why |" in table
    assert "| t5 | FAIL | - | 1 | fails on plain Slurm, not run with the product; why |" in table
    assert table.splitlines()[-1] == ("5 tests, 1 skipped on the dev cluster, 1 failed on plain Slurm, 3 run both "
                                      "ways; 2 differed; 1 pass plain and fail with the product")


MIG_NAMED = """\
[2026-12-05 14:22:50.100] Debug   CPUs per node is 64 (test39.6:127)
0: HOST:h100-mig CUDA_VISIBLE_DEVICES:0,1,MIG-00000000-0000-4000-8000-000200000002
[2026-12-05 14:22:50.477] Error   Invalid input (0,1,) (cuda_count@globals:5391,test39.6:144)
"""


def test_an_outcome_notes_a_mig_device_named_by_its_uuid():
    assert parse_outcome(1, MIG_NAMED, 1).mig_named
    assert not parse_outcome(1, FAILED, 1).mig_named
    assert not parse_outcome(1, "CUDA_VISIBLE_DEVICES:0,1\nMIG-x in some other line\n", 1).mig_named
    assert parse_outcome(1, "export CUDA_VISIBLE_DEVICES=MIG-3b0c\n", 1).mig_named


def _mig_scripted(results, without):
    run, switch, calls = _scripted(results)

    def run_named(test):
        o = run(test)
        o.mig_named = test.startswith("m")
        return o

    def without_mig(test):
        calls.append((test, "without MIG"))
        return Outcome(without[test].pop(0), 1.0, "why")

    return run_named, switch, without_mig, calls


def test_a_failure_naming_mig_uuids_is_explained_only_when_it_passes_without_the_mig_node():
    """On a real MIG node Slurm itself names MIG devices by UUID (AutoDetect=nvml sets UniqueId, which
    common_gres_set_env prints instead of the index); the dev cluster's static gres.conf cannot, so a test
    that failed with the product on a MIG device's UUID runs once more with the MIG nodes out of service:
    passing there explains it; failing there is a regression like any other."""
    run, switch, without_mig, calls = _mig_scripted({
        ("m1", False): [PASS], ("m1", True): [FAIL],  # UUIDs only: passes without the MIG node
        ("m2", False): [PASS, PASS], ("m2", True): [FAIL, FAIL],  # UUIDs, and fails without the MIG node too
        ("t3", False): [PASS, PASS], ("t3", True): [FAIL, FAIL],  # no UUID in sight: the usual rerun
    }, {"m1": [PASS], "m2": [FAIL]})
    rows = compare(["m1", "m2", "t3"], run, switch, without_mig=without_mig)
    assert calls == [("switch", False), ("m1", False), ("m2", False), ("t3", False),
                     ("switch", True), ("m1", True), ("m2", True), ("t3", True),
                     ("m1", "without MIG"), ("m2", "without MIG"),
                     ("m2", True), ("t3", True), ("switch", False), ("m2", False), ("t3", False)]
    by = {r.test: r for r in rows}
    assert not by["m1"].regression and by["m1"].differs
    assert by["m2"].regression and by["t3"].regression
    table = format_table(rows)
    assert ("| m1 | pass | FAIL | 2 | MIG devices named by UUID (as Slurm names them with AutoDetect=nvml); "
            "passes with the product with the MIG nodes out of the partitions; why |") in table
    assert "| m2 | pass, pass | FAIL, FAIL | 2 | **passes plain, fails with the product**; again on rerun; " in table
    assert table.splitlines()[-1].endswith("3 differed; 2 pass plain and fail with the product")


def test_the_cluster_is_quiet_before_each_run():
    """Each run starts with no job completing and no node COMPLETING, both ways: a test that reads the
    first idle node right after the previous test's last job must not see that job's Epilog."""
    from slurm_gpushare_dev.peer import wait_quiet

    answers = iter(["1\n", "", ""])
    states = iter(["idle+completing\nidle\n", "idle\nmixed\n"])
    seen = []

    def query(argv):
        seen.append(argv[0])
        return next(answers) if argv[0] == "squeue" else next(states)

    assert wait_quiet(query, limit=5, poll=0) is True
    assert seen == ["squeue", "squeue", "sinfo", "squeue", "sinfo"]
    assert wait_quiet(lambda argv: "7\n", limit=0.05, poll=0.01) is False  # gives up, the run goes on


def test_all_skipped_never_switches_the_product_on():
    run, switch, calls = _scripted({("t1", False): [SKIP]})
    assert [r.regression for r in compare(["t1"], run, switch)] == [False]
    assert calls == [("switch", False), ("t1", False)]
    assert not Row("t").differs and not Row("t").regression


def test_a_slurm_daemon_that_died_between_tests_is_started_again_and_said():
    """CI on 22.05: slurmd of h100-mig aborted inside Slurm (glibc "malloc(): unaligned tcache chunk detected" in
    nodelist_find, a core in log/) while a test ran; the next product switch waited 120 s for the node and the
    whole suite failed (exit 5). A daemon gone between tests is started again, and the suite says so."""
    from slurm_gpushare_dev.peer import revive

    class Cluster:
        def __init__(self):
            self.running = {"slurmctld": True, "slurmd-h100-mig": False, "slurmd-a100-nvb": True}
            self.ups = 0

        def daemons(self):
            return list(self.running)

        def alive(self, d):
            return self.running[d]

        def up(self, out=None):
            self.ups += 1
            self.running = dict.fromkeys(self.running, True)

    import io

    c, out = Cluster(), io.StringIO()
    assert revive(c, out=out) == ["slurmd-h100-mig"] and c.ups == 1
    assert "slurmd-h100-mig was not running" in out.getvalue() and "started again" in out.getvalue()
    assert revive(c, out=out) == [] and c.ups == 1  # all alive: nothing done


class FakeScontrol:
    """scontrol's answers for two partitions (the second only MIG nodes), and the updates asked of it."""

    def __init__(self, fail_on: str = ""):
        self.updates: list[list[str]] = []
        self.fail_on = fail_on

    def __call__(self, argv):
        if argv[:2] == ["show", "partition"]:
            out = ("PartitionName=gpu AllowGroups=ALL Default=YES Nodes=a100-nvb,h100-mig State=UP\n"
                   "PartitionName=mig AllowGroups=ALL Nodes=h100-mig State=UP\n"
                   "PartitionName=empty AllowGroups=ALL Nodes=(null) State=UP\n")
        elif argv[:2] == ["show", "hostnames"]:
            out = "\n".join(argv[2].split(",")) + "\n"
        else:
            self.updates.append(argv)
            if self.fail_on and self.fail_on in " ".join(argv):
                return subprocess.CompletedProcess(argv, 1, "", "slurm_update error: Invalid node name specified")
            out = ""
        return subprocess.CompletedProcess(argv, 0, out, "")


def test_the_mig_nodes_leave_every_partition_for_the_run_and_come_back():
    # 24.11's testsuite resumes each idle node before a test: a drain did not keep a test off the MIG node
    # (the 24.11 run of scripts/peer-suite), taking the node out of the partitions does
    fake = FakeScontrol()
    with partitions_without(["h100-mig"], {}, scontrol=fake):
        assert fake.updates == [["update", "partitionname=gpu", "nodes=a100-nvb"],
                                ["update", "partitionname=mig", "state=inactive"]]
    assert fake.updates[2:] == [["update", "partitionname=gpu", "nodes=a100-nvb,h100-mig"],
                                ["update", "partitionname=mig", "state=up"]]


def test_a_partition_scontrol_cannot_change_stops_the_run_and_restores_the_others():
    fake = FakeScontrol(fail_on="partitionname=mig state=inactive")
    ran = []
    with pytest.raises(ClusterError, match="Invalid node name"):
        with partitions_without(["h100-mig"], {}, scontrol=fake):
            ran.append(True)
    assert not ran
    assert fake.updates[-1] == ["update", "partitionname=gpu", "nodes=a100-nvb,h100-mig"]
