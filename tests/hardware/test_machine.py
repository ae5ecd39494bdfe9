"""The machine description's MIG profile names: one rule to read and write them (:class:`ProfileName`), which
every reader of a profile name uses (nvidia-smi -lgip rows, GRES type names, the nominal size)."""

from __future__ import annotations

import pytest

from slurm_gpushare.errors import ParseError
from slurm_gpushare.gresconf.detected import split_type
from slurm_gpushare.hardware.machine import MigProfile, ProfileName, nominal_profile_mib


@pytest.mark.parametrize("name, parsed", [
    ("1g.10gb", ProfileName(1, 10)),
    ("1g.10gb+me", ProfileName(1, 10, None, "+me")),
    ("1g.23gb-me", ProfileName(1, 23, None, "-me")),
    ("1g.24gb+gfx", ProfileName(1, 24, None, "+gfx")),
    ("7g.80gb", ProfileName(7, 80)),
    ("1c.3g.40gb", ProfileName(3, 40, 1)),
])
def test_a_profile_name_reads_and_writes_back_as_it_was(name, parsed):
    assert ProfileName.parse(name) == parsed and str(parsed) == name


@pytest.mark.parametrize("name", ["", "0g.10gb", "1g.10", "1g.gb", "g.10gb", "1g.10gb ", "MIG 1g.10gb", "١g.10gb",
                                  "1G.10GB", "1g.10gb+", "4g.40gb+ME"])
def test_what_is_not_a_profile_name_is_refused(name):
    with pytest.raises(ParseError, match="is not a MIG profile name"):
        ProfileName.parse(name, source="t:1")


def test_every_reader_of_a_profile_name_uses_the_one_rule():
    """The nominal size took the text between the last '.' and a '+' ('1g.23gb-me' read as no size: the real
    memory was used); the GRES type reader and -lgip's reader each had a regex of their own."""
    profile = MigProfile(name="1g.23gb-me", profile_id=47, slices=1, memory_mib=22912, max_instances=7)
    assert nominal_profile_mib(profile) == 23 * 1024
    assert nominal_profile_mib(MigProfile(name="odd", profile_id=1, slices=1, memory_mib=999, max_instances=1)) == 999
    assert split_type("nvidia_b200_1g.23gb-me") == ("b200", "1g.23gb-me")
    assert split_type("h100_1c.3g.40gb") == ("h100", "1c.3g.40gb")
