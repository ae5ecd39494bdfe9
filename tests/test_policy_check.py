"""``slurm-gpushare policy check FILE``: validate a policy file and show what sample requests would get under it
and under the running one (issue #15 item 3), on the dev cluster's packaged machines with Slurm's text faked.

Expected answers come from the documented rules (docs/request-syntax.md, "What each request gets on the dev
cluster"): ``mem=10G`` in ``gpu`` is a ``1g.10gb`` slice with MIG first, 10 shards with MPS first; in ``pcie``
(RTX 4090 only) 10 shards, or a whole RTX 4090 where the partition allows only whole GPUs.
"""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from slurm_gpushare.cli import main
from slurm_gpushare.errors import InputError
from slurm_gpushare.slurm import commands
from slurm_gpushare.submit.policycheck import SampleRequest, compare, parse_requests
from slurm_gpushare.submit.policyfile import SitePolicy, parse_policy
from slurm_gpushare_dev.cluster import DEFAULT_NODES, packaged_machine
from tests.test_filterd import PARTS, fake_slurm, machines_dir  # noqa: F401  (a fixture)

NODES = {n: packaged_machine(f) for n, f in DEFAULT_NODES.items()}
NEW = 'version = 1\nmode_order = ["mps", "mig", "gpu"]\n[partitions.pcie]\nmodes = ["gpu"]\n'


@pytest.fixture
def machines(request):
    return request.getfixturevalue("machines_dir")  # tests/test_filterd.py's: the packaged machines


@pytest.fixture
def slurm_text(monkeypatch):
    sinfo, parts = fake_slurm(NODES, PARTS)()
    monkeypatch.setattr(commands, "sinfo_json", lambda: sinfo)
    monkeypatch.setattr(commands, "partitions_text", lambda: parts)
    return sinfo, parts


def test_the_built_in_requests_cover_every_partition_and_each_mig_size(machines, slurm_text):
    report = compare(SitePolicy(), SitePolicy(), machines, *slurm_text)
    asked = {(r.gres, r.partition) for r, _a, _b in report.rows}
    for part in PARTS:
        for gres in ("gpushare:mem=10G", "gpushare:mem=40G", "gpushare:mode=gpu:2", "shard:10"):
            assert (gres, part) in asked
    # h100-mig has 1g.10gb and 4g.40gb slices configured: mem=10G and mem=40G, each once per partition
    assert sum(1 for g, p in asked if p == "gpu") == len({g for g, p in asked if p == "gpu"})
    assert not report.changed and not report.settings()


def test_the_report_shows_each_changed_decision_and_setting(machines, slurm_text):
    report = compare(parse_policy(NEW, source="new.toml"), SitePolicy(), machines, *slurm_text)
    rows = {(r.gres, r.partition): (a, b) for r, a, b in report.rows}
    assert rows[("gpushare:mem=10G", "gpu")] == ("gpu:h100_1g.10gb:1 (mig)", "shard:10 (mps)")
    assert rows[("gpushare:mem=10G", "pcie")] == ("shard:10 (mps)", "gpu:rtx4090:1 (gpu)")
    assert rows[("gpushare:mem=40G", "pcie")][1].startswith("refused: mem=40G is more than the largest GPU")
    assert ("mode_order", '["mig", "mps", "gpu"]', '["mps", "mig", "gpu"]') in report.settings()
    text = report.render()
    assert text.startswith("new.toml: valid site policy\n")
    assert "  --gres=gpushare:mem=10G -p gpu\n    - gpu:h100_1g.10gb:1 (mig)\n    + shard:10 (mps)\n" in text


def test_a_new_shard_unit_is_decided_on_the_inventory_built_for_it(machines, slurm_text):
    """Slurm's GRES are those of 1 GiB shards: under a 2 GiB unit the nodes no longer match, and the report
    says so: each H100 80GB (81559 MiB) has 79 shards of 1 GiB and 39 of 2 GiB, 8 of them on h100-nvs."""
    report = compare(parse_policy('version = 1\nshard_unit = "2G"\n', source="new.toml"), SitePolicy(), machines,
                     *slurm_text)
    assert report.new_inventory.shard_unit_mib == 2048 and report.old_inventory.shard_unit_mib == 1024
    assert ("shard_unit", "1G", "2G") in report.settings()
    assert "shard_unit 2G does not match the shards Slurm has configured" in report.render()
    assert "node h100-nvs: Slurm has 632 shards, 2G shards would be 312" in report.render()


def test_a_partition_slurm_does_not_have_is_named_in_the_report(machines, slurm_text):
    # a typo ([partitions.pcei]) is a valid file, but its modes apply to no job: the admin must be told
    report = compare(parse_policy('version = 1\n[partitions.pcei]\nmodes = ["gpu"]\n', source="new.toml"),
                     SitePolicy(), machines, *slurm_text)
    text = report.render()
    assert text.startswith("new.toml: valid site policy\n")
    assert ("\n[partitions.pcei] names a partition Slurm does not have (partitions: gpu, pcie): its modes "
            "apply to no job\n") in text
    assert "does not have" not in compare(parse_policy(NEW, source="new.toml"), SitePolicy(), machines,
                                          *slurm_text).render()


def test_requests_file_lines():
    reqs = parse_requests("# mine\ngpushare:mem=10G -p pcie\n--gres=shard:4 --partition=gpu -N 2\n\n"
                          "--gres gpushare:mode=gpu:2 -pgpu --nodes=3  # three nodes\n", source="r.txt")
    assert reqs == [SampleRequest("gpushare:mem=10G", "pcie"), SampleRequest("shard:4", "gpu", 2),
                    SampleRequest("gpushare:mode=gpu:2", "gpu", 3)]
    assert reqs[0].tres_per_node == "gres:gpushare:mem=10G" and reqs[1].label == "--gres=shard:4 -p gpu -N 2"


@pytest.mark.parametrize("text, message", [
    ("gpushare:mem=10G --mem=4G\n", "option --mem=4G is not read here"),
    ("gpushare:mem=10G shard:2\n", "two GRES on one line"),
    ("-p gpu\n", "no GRES"),
    ("gpushare:mem=10G -N zero\n", "-N zero is not a node count"),
    ("# nothing\n", "the requests file holds no request"),
    ("gpushare:mem=10G -p\n", "-p has no value"),
])
def test_bad_requests_lines_name_the_line(text, message):
    with pytest.raises(InputError) as e:
        parse_requests(text, source="r.txt")
    assert e.value.message.startswith(message) and e.value.hint and e.value.source.startswith("r.txt")


def _check(*args):
    return CliRunner().invoke(main, ["policy", "check", *args], catch_exceptions=False)


def test_cli_valid_file_exit_0_against_the_running_one(tmp_path, machines, slurm_text):
    new, running = tmp_path / "new.toml", tmp_path / "running.toml"
    new.write_text(NEW)
    running.write_text("version = 1\n")
    reqs = tmp_path / "reqs"
    reqs.write_text("gpushare:mem=10G -p pcie\n")
    r = _check(str(new), "--against", str(running), "--machines", str(machines), "--requests", str(reqs))
    assert r.exit_code == 0, r.output
    assert f"compared with the running policy ({running})" in r.output
    assert "1 of 1 request(s) get something else" in r.output and "+ gpu:rtx4090:1 (gpu)" in r.output


@pytest.mark.parametrize("text, message", [
    ('version = 1\nmode_order = ["mps", "migs"]\n', "mode_order must list some of mig, mps, gpu"),
    ("version = 1\n[whole_gpu]\nthreshold = 2\n", "whole_gpu.threshold must be more than 0 and at most 1"),
    ("version = 2\n", "unsupported policy version 2"),
    ("version = 1\nmax_count = \n", "not valid TOML"),
])
def test_cli_invalid_file_exit_2_says_what_was_wrong_and_what_works(tmp_path, machines, slurm_text, text, message):
    f = tmp_path / "new.toml"
    f.write_text(text)
    r = CliRunner().invoke(main, ["policy", "check", str(f), "--machines", str(machines)])
    assert r.exit_code == 2, r.output
    assert r.output.startswith(f"slurm-gpushare: error: {f}: {message}"), r.output
    assert "(" in r.output and ("write" in r.output or "this slurm-gpushare reads" in r.output or "fix" in r.output)


def test_cli_a_bad_running_file_is_an_error_naming_it(tmp_path, machines, slurm_text):
    new, running = tmp_path / "new.toml", tmp_path / "running.toml"
    new.write_text(NEW)
    running.write_text("mode_order = []\n")
    r = CliRunner().invoke(main, ["policy", "check", str(new), "--against", str(running), "--machines",
                                  str(machines)])
    assert r.exit_code == 2 and "the running policy cannot be read to compare with" in r.output
    assert str(running) in r.output
