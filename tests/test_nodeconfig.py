"""The node config (node.toml): strict and versioned."""

from pathlib import Path

import pytest

from slurm_gpushare.errors import ConfigError
from slurm_gpushare.node.config import NodeConfig, load_node_config, parse_node_config

EXAMPLE = Path(__file__).resolve().parent.parent / "etc" / "node.toml.example"


def test_example_loads_with_the_defaults():
    assert load_node_config(EXAMPLE) == NodeConfig()


def test_values_and_templates():
    cfg = parse_node_config('version = 1\nrun_dir = "/r/{node}"\nshard_unit = "512M"\nmps_quit_timeout = 2\n'
                            '[mps_env]\nLD_LIBRARY_PATH = "/x"\n')
    assert cfg.run_dir_for("gpu01") == Path("/r/gpu01") and cfg.shard_unit_mib == 512
    assert cfg.mps_quit_timeout == 2.0 and cfg.mps_env == (("LD_LIBRARY_PATH", "/x"),)


@pytest.mark.parametrize("text, message", [
    ("version = 2\n", "version = 2 is not supported"),
    ("version = 1\nrundir = '/x'\n", "unknown key(s) rundir"),
    ("version = 1\nmps_quit_timeout = 'x'\n", "mps_quit_timeout has the wrong type"),
    ("version = 1\nmps_quit_timeout = 0\n", "out of range"),
    ("version = 1\nshard_unit = 'lots'\n", "not a memory size"),
    ("version = 1\n[mps_env]\nCUDA_MPS_PIPE_DIRECTORY = '/x'\n", "not CUDA_MPS_"),
    ("version = 1\ndrain_on_stuck_daemon = 1\n", "wrong type"),
    ("version = [\n", "not valid TOML"),
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
