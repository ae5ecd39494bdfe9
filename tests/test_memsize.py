"""Memory sizes and the shard unit (slurm_gpushare.memsize).

The shard unit is written in three places that must agree: the site policy (``shard_unit`` in
gpushare.toml), node.toml (``shard_unit``) and ``slurm-gpushare gres-conf --shard-unit``. Each form
is checked through all three: the same MiB when accepted, the same message when refused.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from slurm_gpushare.cli import main
from slurm_gpushare.errors import ConfigError, InputError
from slurm_gpushare.memsize import format_mib, parse_mib, parse_shard_unit
from slurm_gpushare.node.config import parse_node_config
from slurm_gpushare.submit.policyfile import parse_policy

A100_JSON = str(Path(__file__).parent.parent / "slurm_gpushare" / "data" / "machines" / "8x-a100-nv12-bridge.json")


def _policy(text: str) -> int:
    return parse_policy(f"version = 1\nshard_unit = {text!r}\n", source="gpushare.toml").shard_unit_mib


def _node(text: str) -> int:
    return parse_node_config(f"version = 1\nshard_unit = {text!r}\n", source="node.toml").shard_unit_mib


def _cli(text: str) -> int:
    r = CliRunner().invoke(main, ["gres-conf", A100_JSON, "--shard-unit", text])
    if r.exit_code != 0:
        raise InputError(r.output.strip())
    m = re.search(r"\(shard unit (\w+)\)", r.output)
    assert m, r.output
    return parse_shard_unit(m.group(1))


ACCEPTED = [("1G", 1024), ("1024M", 1024), ("512M", 512), ("2G", 2048), ("1GiB", 1024), ("1gb", 1024),
            ("0.5G", 512), ("1048576K", 1024), (" 4G ", 4096), ("80G", 81920)]


@pytest.mark.parametrize("text, mib", ACCEPTED)
def test_the_policy_node_toml_and_gres_conf_agree_on_every_accepted_form(text, mib):
    assert parse_shard_unit(text) == mib
    assert (_policy(text), _node(text), _cli(text)) == (mib, mib, mib)


REFUSED = [
    ("1", "shard_unit: '1' has no unit (write 1G or 1024M"),          # was 1 MiB in the policy, 1 GiB in node.toml
    ("1024", "shard_unit: '1024' has no unit (write 1G or 1024M"),
    ("lots", "shard_unit: 'lots' is not a memory size"),
    ("", "shard_unit: '' is not a memory size"),
    ("-1G", "shard_unit: '-1G' is not a memory size"),
    ("0G", "shard_unit: '0G' is less than 1 MiB"),
    ("512K", "shard_unit: '512K' is less than 1 MiB"),
    ("1.3G", "shard_unit: '1.3G' is not a whole number of MiB"),
    ("1536K", "shard_unit: '1536K' is not a whole number of MiB"),
    ("17T", "shard_unit: '17T' is more than 16T"),
]


@pytest.mark.parametrize("text, message", REFUSED)
def test_the_policy_node_toml_and_gres_conf_refuse_the_same_forms_with_one_message(text, message):
    with pytest.raises(InputError) as parsed:
        parse_shard_unit(text)
    assert message in str(parsed.value)
    for read, what in ((_policy, "shard_unit"), (_node, "shard_unit"), (_cli, "--shard-unit")):
        with pytest.raises((ConfigError, InputError)) as e:
            read(text)
        assert message.replace("shard_unit:", f"{what}:") in str(e.value), (read.__name__, str(e.value))


def test_a_bare_number_is_refused_in_node_toml_not_read_as_gib():
    with pytest.raises(ConfigError, match="has no unit"):
        _node("1")


def test_a_bare_number_is_refused_in_the_policy_not_read_as_mib():
    with pytest.raises(ConfigError, match="has no unit"):
        _policy("1")


@pytest.mark.parametrize("text, default_unit, mib", [("10G", "M", 10240), ("80", "G", 80 * 1024),
                                                      ("80", "M", 80), ("1.5T", None, 1536 * 1024)])
def test_parse_mib(text, default_unit, mib):
    assert parse_mib(text, default_unit=default_unit) == mib


# 0 read "0T" (0 is a multiple of every unit): jobstats showed an idle job's peak as "0T"
@pytest.mark.parametrize("mib, text", [(10240, "10G"), (81559, "81559M"), (1024 * 1024, "1T"), (0, "0G")])
def test_format_mib_is_exact(mib, text):
    assert format_mib(mib) == text


@pytest.mark.parametrize("value", ["1", "1024", "0.5"])
def test_an_unquoted_number_says_to_write_a_quoted_size(value):
    # TOML `shard_unit = 1` is an integer: the message says what to write, in both files alike
    for parse, source in ((parse_node_config, "node.toml"), (parse_policy, "gpushare.toml")):
        with pytest.raises(ConfigError) as e:
            parse(f"version = 1\nshard_unit = {value}\n", source=source)
        assert e.value.message == f"shard_unit = {value} has no unit"
        assert e.value.hint == 'write shard_unit = "1G" or "1024M" (a quoted size; K, M, G and T are base 1024)'
