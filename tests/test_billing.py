"""TRESBillingWeights from machine descriptions, and the --check of installed ones (pure; the Slurm side is
tests/test_billing_slurm.py).

Expected values come from the hardware and Slurm's documented facts: an A100 80GB PCIe has 81920 MiB
(NVML, the recorded description), so 80 shards of 1 GiB and a shard weight of 1/80 = 0.0125; an H100's
MIG memory is 8 slices and its compute 7 (NVIDIA MIG user guide, "Supported MIG Profiles": 1g.10gb holds
1 of each, 4g.40gb 4 memory and 4 compute slices, 7g.80gb all); slurm.conf(5) TRESBillingWeights takes
decimals (``strtod``), never ``1/80``, and every TRES it names must be tracked.
"""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from slurm_gpushare.cli import main
from slurm_gpushare.errors import InputError
from slurm_gpushare.gresconf.billing import (
    BillingOptions,
    format_weight,
    parse_weights,
    partition_billing,
    truncation_note,
)
from slurm_gpushare.gresconf.check import lint_billing
from slurm_gpushare.gresconf.render import generate_node_gres
from slurm_gpushare.slurm.conf import parse_slurm_conf_gres
from slurm_gpushare_dev.cluster import packaged_machine

A100 = "8x-a100-nv12-bridge.json"
RTX = "8x-rtx4090-pcie.json"
MIG = "4x-h100-mig-mixed.json"
DATA = "slurm_gpushare/data/machines/"


def _node(filename: str, name: str):
    return generate_node_gres(packaged_machine(filename), name)


def test_a_shard_of_an_80_shard_gpu_bills_one_eightieth_of_the_gpu():
    part = partition_billing("a100", [_node(A100, "a100-nvb")])
    assert part.weights == (("GRES/gpu:a100", 1.0), ("GRES/shard", 0.0125))
    assert part.value == "GRES/gpu:a100=1,GRES/shard=0.0125"
    assert part.render() == "PartitionName=a100 Nodes=a100-nvb TRESBillingWeights=GRES/gpu:a100=1,GRES/shard=0.0125"
    # a GPU weighed by its shard count: one shard bills 1, which the integer billing TRES keeps
    part80 = partition_billing("a100", [_node(A100, "a100-nvb")], BillingOptions(gpu_weight=80))
    assert part80.value == "GRES/gpu:a100=80,GRES/shard=1"
    assert truncation_note(part80) is None
    note = truncation_note(part)
    assert note is not None and "GRES/shard bills 0.0125" in note and "--billing-gpu-weight 80 bills it 1" in note


def test_mig_devices_bill_their_share_of_memory_or_compute_slices():
    node = _node(MIG, "h100-mig")
    by_memory = dict(partition_billing("mig", [node]).weights)
    # 1g.10gb: 1 of 8 memory slices, 4g.40gb: 4 of 8; the whole H100s: 1; shards: 81559 MiB = 79 GiB shards
    assert by_memory == {"GRES/gpu:h100": 1.0, "GRES/gpu:h100_4g.40gb": 0.5, "GRES/gpu:h100_1g.10gb": 0.125,
                         "GRES/shard": 1 / 79}
    by_slices = dict(partition_billing("mig", [node], BillingOptions(mig_by="slices")).weights)
    assert by_slices["GRES/gpu:h100_1g.10gb"] == pytest.approx(1 / 7)
    assert by_slices["GRES/gpu:h100_4g.40gb"] == pytest.approx(4 / 7)
    # the untyped GRES/gpu is never weighed: a job is allocated gres/gpu and its typed TRES both
    assert "GRES/gpu" not in by_memory


def test_a_partition_mixing_shard_counts_bills_by_the_largest_and_says_so():
    part = partition_billing("mix", [_node(A100, "a100-nvb"), _node(RTX, "rtx4090-pcie")])
    # RTX 4090: 24564 MiB = 23 shards; A100: 80
    assert dict(part.weights)["GRES/shard"] == 1 / 80
    assert len(part.notes) == 1 and "23 on rtx4090-pcie, 80 on a100-nvb" in part.notes[0]
    assert part.render().startswith("# partition mix: GPUs with different shard counts")


def test_weights_are_written_as_decimals_that_read_back_exactly():
    for w in (1.0, 80.0, 0.0125, 1 / 23, 1 / 79, 1 / 7, 2.5):
        text = format_weight(w)
        assert "/" not in text and "e" not in text.lower() and float(text) == w
    assert format_weight(80.0) == "80" and format_weight(0.0125) == "0.0125"


def test_billing_options_refuse_nonsense():
    for bad in (0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(InputError, match="positive number"):
            BillingOptions(gpu_weight=bad)
    with pytest.raises(InputError, match="memory or slices"):
        BillingOptions(mig_by="sm")


def test_parse_weights_as_slurmctld_reads_them():
    assert parse_weights("CPU=1.0,Mem=0.25G,GRES/gpu=2.0") == [
        ("cpu", 1.0, "CPU=1.0"), ("mem", 0.25, "Mem=0.25G"), ("gres/gpu", 2.0, "GRES/gpu=2.0")]
    # a fraction is not a number to strtod: slurmctld stops
    assert parse_weights("GRES/shard=1/80")[0][1] is None
    assert parse_weights("GRES/shard")[0][1] is None


def _conf(partitions: str, tres: str = "gres/gpu,gres/gpu:h100,gres/gpu:h100_4g.40gb,gres/gpu:h100_1g.10gb,"
                                      "gres/shard") -> str:
    return ("AccountingStorageType=accounting_storage/slurmdbd\nGresTypes=gpu,shard\n"
            f"AccountingStorageTRES={tres}\n"
            "NodeName=h100-mig Gres=gpu:h100:2,gpu:h100_4g.40gb:2,gpu:h100_1g.10gb:6,shard:158\n" + partitions)


def _lint(text: str, node_file: str = MIG, name: str = "h100-mig"):
    slurm = parse_slurm_conf_gres(text, source="slurm.conf")
    return [(f.severity, f.where, f.message) for f in lint_billing(slurm, [_node(node_file, name)])]


def test_check_accepts_the_generated_weights():
    value = partition_billing("gpu", [_node(MIG, "h100-mig")]).value
    assert _lint(_conf(f"PartitionName=gpu Nodes=h100-mig TRESBillingWeights={value}\n")) == []
    # with another GPU weight, as long as the shares agree; PartitionName=DEFAULT lends its weights
    value = partition_billing("gpu", [_node(MIG, "h100-mig")], BillingOptions(gpu_weight=79)).value
    assert _lint(_conf(f"PartitionName=DEFAULT TRESBillingWeights={value}\nPartitionName=gpu Nodes=ALL\n")) == []


def test_check_finds_a_mig_slice_billed_as_a_whole_gpu_and_unbilled_shards():
    found = _lint(_conf("PartitionName=gpu Nodes=h100-mig TRESBillingWeights=CPU=0,GRES/gpu=2\n"))
    messages = [m for _s, _w, m in found]
    assert all(s == "warning" and w == "slurm.conf:5" for s, w, _m in found)
    assert "partition gpu: one h100_1g.10gb device bills 2, expected 0.25 (0.125 of a GPU, which bills 2)" in messages
    assert "partition gpu: one h100_4g.40gb device bills 2, expected 1 (0.5 of a GPU, which bills 2)" in messages
    assert any(m.startswith("partition gpu: a shard bills 0, expected 0.02531645569620253") for m in messages)


def test_check_warns_about_a_gpu_partition_without_weights():
    found = _lint(_conf("PartitionName=gpu Nodes=h100-mig Default=YES\nPartitionName=cpu Nodes=cpu[1-4]\n"))
    assert len(found) == 1 and found[0][0] == "warning"
    assert found[0][2].startswith("partition gpu has no TRESBillingWeights: its jobs are billed their CPUs")


def test_check_errors_on_weights_that_stop_slurmctld():
    found = _lint(_conf("PartitionName=gpu Nodes=h100-mig TRESBillingWeights=GRES/gpu:h100=1,GRES/shard=1/80,"
                        "GRES/gpu:h100_1g.10gb=0.125,GRES/gpu:h100_4g.40gb=0.5\n", tres="gres/gpu,gres/gpu:h100"))
    errors = [m for s, _w, m in found if s == "error"]
    assert errors == [
        "partition gpu: TRESBillingWeights item 'GRES/shard=1/80' is not <TRES>=<number>: slurmctld stops "
        "('failed to parse tres weights str')",
        "partition gpu: TRESBillingWeights names GRES/gpu:h100_1g.10gb, which is not tracked: slurmctld stops "
        "('TRES weight ... is not a configured TRES type')",
        "partition gpu: TRESBillingWeights names GRES/gpu:h100_4g.40gb, which is not tracked: slurmctld stops "
        "('TRES weight ... is not a configured TRES type')"]


def test_cli_prints_weights_per_partition(tmp_path):
    r = CliRunner().invoke(main, ["gres-conf", DATA + A100, DATA + MIG, "--slurm-version", "24.11",
                                  "--partition", "a100=a100-nvb", "--partition", "mig=h100-mig",
                                  "--billing-gpu-weight", "80"])
    assert r.exit_code == 0, r.output
    assert "PartitionName=a100 Nodes=a100-nvb TRESBillingWeights=GRES/gpu:a100=80,GRES/shard=1\n" in r.output
    assert ("PartitionName=mig Nodes=h100-mig TRESBillingWeights=GRES/gpu:h100=80,GRES/gpu:h100_4g.40gb=40,"
            "GRES/gpu:h100_1g.10gb=10,GRES/shard=1.0126582278481013\n") in r.output
    # every TRES a weight names is in AccountingStorageTRES
    tres = next(ln for ln in r.output.splitlines() if ln.startswith("AccountingStorageTRES=")).split("=", 1)[1]
    assert set(tres.split(",")) >= {"gres/gpu:a100", "gres/shard", "gres/gpu:h100", "gres/gpu:h100_4g.40gb",
                                    "gres/gpu:h100_1g.10gb"}


@pytest.mark.parametrize(("value", "says"), [
    ("a100", "is not NAME=NODES"), ("=a100-nvb", "is not NAME=NODES"), ("a100=gpu[1", "hostlist"),
    ("a100=gpu7", "gpu7 is not among the given machines")])
def test_cli_refuses_a_bad_partition(value, says):
    r = CliRunner().invoke(main, ["gres-conf", DATA + A100, "--slurm-version", "24.11", "--partition", value])
    assert r.exit_code != 0 and says in r.output, r.output


def test_check_reports_accounting_tres_without_the_shard_and_mig_tres(tmp_path):
    out = tmp_path / "gen"
    r = CliRunner().invoke(main, ["gres-conf", DATA + MIG, "--slurm-version", "24.11", "--output-dir", str(out)])
    assert r.exit_code == 0, r.output
    slurm_conf = tmp_path / "slurm.conf"
    text = (out / "slurm.conf.gres").read_text()
    old = next(ln for ln in text.splitlines() if ln.startswith("AccountingStorageTRES="))
    slurm_conf.write_text("AccountingStorageType=accounting_storage/slurmdbd\n"
                          + text.replace(old, "AccountingStorageTRES=gres/gpu,gres/gpu:h100"))
    r = CliRunner().invoke(main, ["gres-conf", DATA + MIG, "--slurm-version", "24.11", "--check",
                                  "--gres-conf", str(out / "gres.conf"), "--slurm-conf", str(slurm_conf)])
    assert r.exit_code == 1, r.output
    assert ("slurm.conf: AccountingStorageTRES lacks gres/gpu:h100_4g.40gb,gres/gpu:h100_1g.10gb,gres/shard: "
            "installed gres/gpu,gres/gpu:h100") in r.output
    assert "TRESBillingWeights names GRES/shard, which is not tracked: slurmctld stops" in r.output


def test_a_partition_of_whole_gpus_only_or_a_site_without_slurmdbd_gets_no_billing_warning():
    """Issue 28 item 6: the warning is about the price of a share (shards, MIG devices) against a whole GPU: a
    partition of nodes whose GPUs are only held whole gets none (whether GPUs weigh in billing is the site's own
    choice); without slurmdbd GRES weights would stop slurmctld, so --check never proposes them."""
    from slurm_gpushare.slurm.nodegres import GresOptions

    whole = generate_node_gres(packaged_machine(RTX), "rtx", GresOptions(shards=False))
    conf = ("AccountingStorageType=accounting_storage/slurmdbd\nGresTypes=gpu\nAccountingStorageTRES=gres/gpu,"
            "gres/gpu:rtx4090\nNodeName=rtx Gres=gpu:rtx4090:8\nPartitionName=gpu Nodes=rtx\n")
    slurm = parse_slurm_conf_gres(conf, source="slurm.conf")
    assert lint_billing(slurm, [whole]) == []
    shared = _node(RTX, "rtx")  # with shards: the warning stands
    assert [f.message.split(":")[0] for f in lint_billing(slurm, [shared])] == [
        "partition gpu has no TRESBillingWeights"]
    no_dbd = parse_slurm_conf_gres(conf.replace("accounting_storage/slurmdbd", "accounting_storage/none")
                                   .replace("AccountingStorageTRES=gres/gpu,gres/gpu:rtx4090\n", ""),
                                   source="slurm.conf")
    assert lint_billing(no_dbd, [shared]) == []
