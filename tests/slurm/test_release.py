"""slurm.release: the release read from Slurm's own version line and JSON meta block."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slurm_gpushare.errors import SlurmError
from slurm_gpushare.slurm.release import NEWEST, SUPPORTED, Release, missing, of_meta

DATA = Path(__file__).resolve().parent.parent / "data" / "slurm"


@pytest.mark.parametrize(("text", "want"), [
    ("slurm-wlm 22.05.8\n", Release(22, 5)), ("slurm 24.11.5", Release(24, 11)), ("26.05", Release(26, 5)),
    ("slurm 23.02.7-1", Release(23, 2)),
])
def test_release_parse(text, want):
    assert Release.parse(text) == want


def test_release_parse_refuses_text_without_a_version():
    with pytest.raises(SlurmError, match="no Slurm version in 'slurm'"):
        Release.parse("slurm")


def test_releases_order_and_print():
    assert Release(22, 5) < Release(23, 2) < Release(24, 11) < Release(26, 5)
    assert [str(r) for r in SUPPORTED] == ["22.05", "24.11", "26.05"]


def test_meta_of_22_05_and_of_newer_releases():
    # 22.05 (openapi/v0.0.38): meta.Slurm.version with numbers; 23.02+ (data_parser): meta.slurm, strings
    assert of_meta({"meta": {"Slurm": {"version": {"major": 22, "minor": 5, "micro": 8}}}}, "squeue --json") \
        == Release(22, 5)
    doc = json.loads((DATA / "26.05" / "sinfo.json").read_text())
    assert of_meta(doc, "sinfo --json") == Release(26, 5)


@pytest.mark.parametrize("doc", [{}, {"meta": {}}, {"meta": {"slurm": {"version": {"major": "x"}}}}, [], "x"])
def test_meta_missing_is_a_clear_error(doc):
    with pytest.raises(SlurmError, match="has no meta.slurm.version"):
        of_meta(doc, "sinfo --json")


def test_missing_field_of_a_future_release_says_upgrade():
    future = Release(NEWEST.major + 1, 5)
    err = missing(future, "sinfo --json", "sinfo[].gres.total")
    assert f"of Slurm {future} has no sinfo[].gres.total" in err.message
    assert "newer than 26.05" in err.message and err.hint == "upgrade slurm-gpushare"
    assert "newer" not in missing(NEWEST, "sinfo --json", "x").message


def test_one_list_of_supported_releases():
    """Issue 32 item 7: the releases the product says it supports (``SUPPORTED``), those the dev kit can run
    (its Debian suites: the host's and the roots') and those ``.ci/run`` tests (the host's 22.05 and its
    ``releases=(...)``) are one list, so a release added or dropped in one place and not the others fails here."""
    import re
    from pathlib import Path

    from slurm_gpushare_dev.release import SUITES

    ci = (Path(__file__).resolve().parents[2] / ".ci" / "run").read_text()
    m = re.search(r"^releases=\(([^)]*)\)", ci, re.M)
    assert m, ".ci/run names its releases in releases=(...)"
    tested = sorted({"22.05", *m.group(1).split()})  # the host (Debian 12) has 22.05
    assert [str(r) for r in SUPPORTED] == sorted(SUITES) == tested
    # each release a root runs has its own ports, in the test sessions and in the peer suite
    from slurm_gpushare_dev.peer import RELEASE_PORT_OFFSET
    from tests.conftest import _RELEASE_PORT_OFFSET

    assert sorted(RELEASE_PORT_OFFSET) == sorted(_RELEASE_PORT_OFFSET) == tested[1:]


def test_release_thresholds_live_in_the_release_module():
    """Issue 32 item 7: a threshold between releases is a named constant of slurm/release.py, never an inline
    ``Release(YY, MM)`` elsewhere in the product (the GRES option tables of slurm/gresrules.py excepted: a table
    of when each option appeared)."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "slurm_gpushare"
    inline = [f"{p.relative_to(root)}:{n}" for p in root.rglob("*.py")
              if p.name not in ("release.py", "gresrules.py")
              for n, line in enumerate(p.read_text().splitlines(), 1) if re.search(r"\bRelease\(\d", line)]
    assert inline == []
