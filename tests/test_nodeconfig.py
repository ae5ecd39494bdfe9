"""The node config (node.toml): strict and versioned."""

from importlib import resources
from pathlib import Path

import pytest

from slurm_gpushare.errors import ConfigError
from slurm_gpushare.hardware.machine import Machine
from slurm_gpushare.node.config import (
    NodeConfig,
    check_shard_unit,
    installed_shard_counts,
    load_node_config,
    parse_node_config,
    shard_unit_mismatch,
)
from slurm_gpushare.slurm.conf import GresConf, parse_gres_conf
from slurm_gpushare.slurm.nodegres import GresOptions, node_gres

EXAMPLE = Path(str(resources.files("slurm_gpushare") / "data" / "site" / "node.toml.example"))


def test_example_loads_with_the_defaults():
    assert load_node_config(EXAMPLE) == NodeConfig()


def test_values_and_templates():
    cfg = parse_node_config('version = 1\nrun_dir = "/r/{node}"\nshard_unit = "512M"\nmps_quit_timeout = 2\n'
                            '[mps_env]\nLD_LIBRARY_PATH = "/x"\n')
    assert cfg.run_dir_for("gpu01") == Path("/r/gpu01") and cfg.shard_unit_mib == 512
    assert cfg.mps_quit_timeout == 2.0 and cfg.mps_env == (("LD_LIBRARY_PATH", "/x"),)
    assert cfg.gpu_order == "gpushare" and parse_node_config('version = 1\ngpu_order = "all"\n').gpu_order == "all"
    assert cfg.mps_dir_size_mib == 64 and cfg.hook_timeout == 120.0
    assert parse_node_config("version = 1\nhook_timeout = 30\n").hook_timeout == 30.0
    assert (cfg.enforce, cfg.enforce_grace, cfg.enforce_for("any")) == ("kill", 3, "kill")
    warned = parse_node_config('version = 1\nenforce = "requeue"\n[enforce_partitions]\ndebug = "warn"\n')
    assert (warned.enforce_for("debug"), warned.enforce_for("gpu")) == ("warn", "requeue")
    assert cfg.gpu_memory_limit == "auto"
    assert parse_node_config('version = 1\ngpu_memory_limit = "off"\n').gpu_memory_limit == "off"
    assert [parse_node_config(f'version = 1\nmps_dir_size = "{v}"\n').mps_dir_size_mib for v in ("16M", "1G", "0")] \
        == [16, 1024, 0]
    assert cfg.device_dir_for("gpu01") == "/dev"
    two = parse_node_config('version = 1\nlow_priority_qos = ["preemptible", "scavenger"]\n')
    assert cfg.low_priority_qos == () and two.low_priority_qos == ("preemptible", "scavenger")
    assert parse_node_config('version = 1\ndevice_dir = "/x/dev/{node}"\n').device_dir_for("gpu01") == "/x/dev/gpu01"


@pytest.mark.parametrize("text, message", [
    ("version = 2\n", "version = 2 is not supported"),
    ("version = 1\nrundir = '/x'\n", "unknown key(s) rundir"),
    ("version = 1\nmps_quit_timeout = 'x'\n", "mps_quit_timeout has the wrong type"),
    ("version = 1\nmps_quit_timeout = 0\n", "out of range"),
    ("version = 1\nshard_unit = 'lots'\n", "not a memory size"),
    ("version = 1\n[mps_env]\nCUDA_MPS_PIPE_DIRECTORY = '/x'\n", "not CUDA_MPS_"),
    ("version = 1\ndrain_on_stuck_daemon = 1\n", "wrong type"),
    ("version = [\n", "not valid TOML"),
    ("version = 1\ngpu_order = 'ring'\n", "gpu_order = 'ring' is not a choice"),
    ("version = 1\nmps_dir_size = 64\n", "mps_dir_size has the wrong type"),
    ("version = 1\nhook_timeout = 0\n", "hook_timeout = 0 is out of range"),
    ("version = 1\nmps_dir_size = 'lots'\n", "mps_dir_size: 'lots' is not a memory size"),
    ("version = 1\nenforce = 'kil'\n", "enforce = 'kil' is not an action"),
    ("version = 1\nenforce_grace = 0\n", "enforce_grace = 0 is out of range (1-100 samples)"),
    ("version = 1\ngpu_memory_limit = 'on'\n", "gpu_memory_limit = 'on' is not a choice"),
    ("version = 1\nenforce_grace = 2.5\n", "enforce_grace has the wrong type"),
    ("version = 1\n[enforce_partitions]\ndebug = 'stop'\n", "enforce_partitions: debug must be"),
    ("version = 1\ndevice_dir = 'dev'\n", "device_dir = 'dev' is not an absolute path"),
    ("version = 1\nlow_priority_qos = 'preemptible'\n", "low_priority_qos has the wrong type"),
    ("version = 1\nlow_priority_qos = ['']\n", "low_priority_qos must be a list of QOS names"),
    ("version = 1\ndevice_dir = '/my dev'\n", "device_dir = '/my dev' is not an absolute path without blanks"),
])
def test_bad_files_name_the_problem(text, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_node_config(text, source="node.toml")


def test_missing_files(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_node_config(tmp_path / "nope.toml")


def test_a_missing_version_says_to_add_it():
    from slurm_gpushare.errors import ConfigError
    from slurm_gpushare.node.config import parse_node_config
    with pytest.raises(ConfigError, match="no version key") as err:
        parse_node_config('run_dir = "/run/x"\n')
    assert "version = 1" in str(err.value)


# --- the shard unit against the installed gres.conf ---------------------------------------------

MIXED = Machine.load(Path(__file__).resolve().parent.parent / "slurm_gpushare" / "data" / "machines"
                     / "4x-h100-mig-mixed.json")   # GPUs 0, 1 whole (81559 MiB), 2, 3 MIG


def _gres(*lines: str) -> GresConf:
    return parse_gres_conf("\n".join(lines) + "\n", source="gres.conf")


def test_the_generated_gres_conf_agrees_with_its_unit():
    for unit in (1024, 512, 2048, 4096):
        gres = node_gres(MIXED, "h100-mig", GresOptions(shard_unit_mib=unit))
        text = "\n".join(r.render("h100-mig") for r in gres.records)
        assert installed_shard_counts(parse_gres_conf(text, source="g"), "h100-mig") == {0: 81559 // unit,
                                                                                         1: 81559 // unit}
        assert shard_unit_mismatch(MIXED, unit, installed_shard_counts(parse_gres_conf(text, source="g"),
                                                                       "h100-mig")) is None


def test_a_unit_that_does_not_reproduce_the_counts_is_named_with_the_unit_gres_conf_implies():
    # gres.conf written with --shard-unit 512M (159 shards per 81559 MiB GPU), node.toml says 1G.
    problem = shard_unit_mismatch(MIXED, 1024, {0: 159, 1: 159})
    assert problem == ("node.toml shard_unit 1G does not reproduce the installed gres.conf: GPU 0 (81559M) "
                       "would have Count=79, gres.conf has Count=159; gres.conf implies shard_unit = \"512M\"")


def test_one_gpu_without_shard_lines_is_a_mismatch_but_no_shard_lines_at_all_is_no_shards():
    assert "GPU 1 (81559M) would have Count=79, gres.conf has none" in shard_unit_mismatch(MIXED, 1024, {0: 79})
    assert shard_unit_mismatch(MIXED, 1024, {}) is None


def test_counts_that_no_unit_reproduces_say_so():
    problem = shard_unit_mismatch(MIXED, 1024, {0: 79, 1: 10})
    assert problem.endswith("GPU 1 (81559M) would have Count=79, gres.conf has Count=10; "
                            "no shard unit gives these counts: regenerate gres.conf")


def test_installed_counts_by_device_minor_from_the_node_s_lines():
    conf = _gres("NodeName=other Name=shard Count=10 File=/dev/nvidia0",
                 "NodeName=h100-mig Name=shard Count=79 File=/dev/nvidia0",
                 "Name=shard Count=158 File=/dev/nvidia[1-2]",
                 "NodeName=h100-mig Name=gpu Type=h100 File=/dev/nvidia3",
                 "NodeName=h100-mig Name=shard Count=5")  # no File=: not attributable to a GPU
    assert installed_shard_counts(conf, "h100-mig") == {0: 79, 1: 79, 2: 79}


def test_check_shard_unit_raises_a_config_error_naming_both_files():
    conf = _gres("NodeName=h100-mig Name=shard Count=318 File=/dev/nvidia[0-1]")  # 159 each
    check_shard_unit(MIXED, "h100-mig", 512, conf)
    with pytest.raises(ConfigError, match="node.toml shard_unit 1G does not reproduce") as e:
        check_shard_unit(MIXED, "h100-mig", 1024, conf)
    assert e.value.source == "gres.conf"
    assert "regenerate gres.conf" in e.value.hint and "node.toml" in e.value.hint
