"""The site policy file (slurm_gpushare.submit.policyfile): versioned, strict, documented defaults."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import pytest

from slurm_gpushare.errors import ConfigError
from slurm_gpushare.submit.policyfile import SitePolicy, load_policy, parse_policy

EXAMPLE = Path(str(resources.files("slurm_gpushare") / "data" / "site" / "gpushare.toml.example"))


def test_example_file_loads_and_states_the_defaults():
    policy = load_policy(EXAMPLE)
    assert policy == SitePolicy(source=str(EXAMPLE))
    assert policy.source == str(EXAMPLE)


def test_example_partition_overrides_parse_when_uncommented():
    text = "\n".join(line[2:] if line.startswith(("# [partitions", "# modes")) else line
                     for line in EXAMPLE.read_text().splitlines())
    policy = parse_policy(text, source="example")
    assert policy.partitions == {"interactive": ("mig", "mps"), "training": ("gpu",)}


def test_example_documents_every_key():
    text = EXAMPLE.read_text()
    for key in ("version", "mode_order", "model_preference", "max_count", "police_direct", "shard_unit",
                "headroom", "[mig]", "enabled", "fit", "max_waste", "[whole_gpu]", "threshold", "[partitions.",
                "modes", "[jobstats]", "notes", "low_sm", "low_memory", "footer"):
        assert key in text, key


def test_defaults():
    p = SitePolicy()
    assert p.mode_order == ("mig", "mps", "gpu")
    assert (p.mig_enabled, p.mig_fit, p.mig_max_waste) == (True, "nominal", 0.5)
    assert (p.gpu_fit, p.whole_gpu_threshold) == ("nominal", 1.0)
    assert (p.model_preference, p.partitions, p.police_direct, p.max_count, p.shard_unit_mib) == (
        (), {}, True, 8, 1024)
    assert p.headroom == 0.2


def test_headroom_is_read_and_checked():
    assert parse_policy("version = 1\nheadroom = 0.5").headroom == 0.5
    assert parse_policy("version = 1\nheadroom = 0").headroom == 0
    with pytest.raises(ConfigError, match="headroom must be between 0 and 4"):
        parse_policy("version = 1\nheadroom = -0.1")
    with pytest.raises(ConfigError, match="headroom"):
        parse_policy("version = 1\nheadroom = 'lots'")


def test_jobstats_notes_are_read_and_checked():
    p = parse_policy('version = 1\n[jobstats]\nnotes = false\nlow_sm = 25\nlow_memory = 40.5\n'
                     'footer = "GPU efficiency: https://hpc.example.org/gpu"')
    assert (p.notes, p.notes_low_sm, p.notes_low_memory, p.notes_footer) == (
        False, 25, 40.5, "GPU efficiency: https://hpc.example.org/gpu")
    assert (SitePolicy().notes, SitePolicy().notes_low_sm, SitePolicy().notes_low_memory) == (True, 15.0, 50.0)
    for text, message in (("low_sm = 101", "jobstats.low_sm must be a percentage (0-100), not 101"),
                          ("low_memory = -1", "jobstats.low_memory must be a percentage (0-100), not -1"),
                          ("notes = 'yes'", "jobstats.notes must be true or false"),
                          ('footer = "a\\u001b[31mred"', "jobstats.footer must be one line of printable text"),
                          (f'footer = "{"x" * 301}"', "jobstats.footer must be one line of printable text of at "
                                                      "most 300 characters (it has 301)"),
                          ("colour = 1", "unknown key jobstats.colour")):
        with pytest.raises(ConfigError) as e:
            parse_policy(f"version = 1\n[jobstats]\n{text}")
        assert e.value.message.startswith(message), e.value.message


def test_only_version_is_required():
    assert parse_policy("version = 1") == SitePolicy(source="<policy>")


def test_every_key_is_read():
    p = parse_policy("""
version = 1
mode_order = ["mps", "gpu"]
model_preference = ["h100", "a100"]
max_count = 4
police_direct = false
shard_unit = "512M"
[mig]
enabled = false
fit = "exact"
max_waste = 0.25
[whole_gpu]
fit = "exact"
threshold = 0.75
[partitions.debug]
modes = ["mps"]
""", source="site.toml")
    assert p == SitePolicy(mode_order=("mps", "gpu"), model_preference=("h100", "a100"), max_count=4,
                           police_direct=False, shard_unit_mib=512, mig_enabled=False, mig_fit="exact",
                           mig_max_waste=0.25, gpu_fit="exact", whole_gpu_threshold=0.75,
                           partitions={"debug": ("mps",)}, source="site.toml")


def test_allowed_kinds():
    p = SitePolicy(partitions={"a": ("mig", "mps"), "b": ("mps", "gpu")})
    assert p.allowed_kinds(("gpu",)) == ("mig", "mps", "gpu")
    assert p.allowed_kinds(("a",)) == ("mig", "mps")
    assert p.allowed_kinds(("a", "b")) == ("mps",)
    assert SitePolicy(mig_enabled=False).allowed_kinds(("x",)) == ("mps", "gpu")


@pytest.mark.parametrize("text, message", [
    ("mode_order = ['mig']", "the policy file has no version"),
    ("version = 2", "unsupported policy version 2"),
    ("version = true", "unsupported policy version True"),
    ("version = '1'", "unsupported policy version '1'"),
    ("version = 1\nmax_cuont = 3", "unknown key max_cuont"),
    ("version = 1\n[mig]\nfitt = 'exact'", "unknown key mig.fitt"),
    ("version = 1\n[whole_gpu]\nthreshhold = 0.5", "unknown key whole_gpu.threshhold"),
    ("version = 1\n[partitions.gpu]\nmodes = ['mig']\norder = 1", "unknown key partitions.gpu.order"),
    ("version = 1\n[extra]\na = 1", "unknown key extra"),
    ("version = 1\nmax_count = '8'", "max_count must be a whole number, not str '8'"),
    ("version = 1\nmax_count = true", "max_count must be a whole number, not bool True"),
    ("version = 1\nmax_count = 2.5", "max_count must be a whole number, not float 2.5"),
    ("version = 1\nmax_count = 0", "max_count must be at least 1, not 0"),
    ("version = 1\npolice_direct = 1", "police_direct must be true or false, not int 1"),
    ("version = 1\nmode_order = 'mig'", "mode_order must be a list of strings, not str 'mig'"),
    ("version = 1\nmode_order = ['mig', 'fast']", "mode_order must list some of mig, mps, gpu, each once"),
    ("version = 1\nmode_order = ['mig', 'mig']", "mode_order must list some of mig, mps, gpu, each once"),
    ("version = 1\nmode_order = []", "mode_order must list some of mig, mps, gpu, each once"),
    ("version = 1\nmodel_preference = [1]", "model_preference must be a list of strings"),
    ("version = 1\nshard_unit = 'lots'", "shard_unit: 'lots' is not a memory size"),
    ("version = 1\nshard_unit = 1024", "shard_unit = 1024 has no unit"),
    ("version = 1\nmig = 3", "mig must be a table, not int 3"),
    ("version = 1\n[mig]\nenabled = 'yes'", "mig.enabled must be true or false, not str 'yes'"),
    ("version = 1\n[mig]\nfit = 'loose'", "mig.fit must be one of nominal, exact, not 'loose'"),
    ("version = 1\n[mig]\nmax_waste = 1.5", "mig.max_waste must be between 0 and 1, not 1.5"),
    ("version = 1\n[mig]\nmax_waste = 'half'", "mig.max_waste must be a number, not str 'half'"),
    ("version = 1\n[whole_gpu]\nfit = 'close'", "whole_gpu.fit must be one of nominal, exact, not 'close'"),
    ("version = 1\n[whole_gpu]\nthreshold = 0", "whole_gpu.threshold must be more than 0 and at most 1, not 0.0"),
    ("version = 1\n[whole_gpu]\nthreshold = 1.2", "whole_gpu.threshold must be more than 0 and at most 1"),
    ("version = 1\n[partitions.gpu]\nmodes = []", "partitions.gpu.modes must list some of mig, mps, gpu, not []"),
    ("version = 1\n[partitions.gpu]\nmodes = ['whole']", "partitions.gpu.modes must list some of mig, mps, gpu"),
    ("version = 1\n[partitions.gpu]\n", "partitions.gpu has no modes"),
    ("version = 1\npartitions = 3", "partitions must be a table, not int 3"),
    ("version = 1\n[partitions]\ngpu = 3", "partitions.gpu must be a table, not int 3"),
    ("version = = 1", "not valid TOML"),
])
def test_strict_errors_name_the_key_and_the_file(text, message):
    with pytest.raises(ConfigError) as e:
        parse_policy(text, source="/etc/slurm/gpushare/gpushare.toml")
    assert e.value.message.startswith(message), e.value.message
    assert e.value.source == "/etc/slurm/gpushare/gpushare.toml"
    assert str(e.value).startswith("/etc/slurm/gpushare/gpushare.toml: ")


def test_unknown_key_hint_lists_the_known_keys():
    with pytest.raises(ConfigError) as e:
        parse_policy("version = 1\n[mig]\nfitt = 'exact'")
    assert e.value.hint == "known keys in [mig]: enabled, fit, max_waste"


def test_load_policy_missing_file(tmp_path):
    with pytest.raises(ConfigError) as e:
        load_policy(tmp_path / "nope.toml")
    assert "cannot read the policy file" in e.value.message
    assert e.value.source == str(tmp_path / "nope.toml")


def test_load_policy_reads_a_file(tmp_path):
    f = tmp_path / "gpushare.toml"
    f.write_text('version = 1\nmode_order = ["mps"]\n')
    assert load_policy(f).mode_order == ("mps",)


def test_invalid_policy_values_are_refused_in_code_too():
    with pytest.raises(ConfigError):
        SitePolicy(mig_fit="roughly")
