"""The man pages in the package (slurm_gpushare/data/man/) are those of today's commands, and roff reads them
without a warning."""

from __future__ import annotations

import shutil
import subprocess

import click
import pytest

from slurm_gpushare_dev.manpages import MAN_DIR, escape, man_pages


def test_the_packaged_pages_are_those_of_todays_commands():
    pages = man_pages()
    assert "slurm-gpushare.1" in pages and "slurm-gpushare-accounting-ingest.1" in pages
    on_disk = {p.name: p.read_text() for p in MAN_DIR.glob("*.1")}
    stale = sorted(n for n in pages.keys() | on_disk.keys() if pages.get(n) != on_disk.get(n))
    assert not stale, f"man pages out of date: {stale}; run scripts/make-man"


@pytest.mark.skipif(not shutil.which("groff"), reason="groff is not installed")
def test_roff_reads_every_page_without_a_warning():
    for page in sorted(MAN_DIR.glob("*.1")):
        proc = subprocess.run(["groff", "-man", "-ww", "-z", str(page)], capture_output=True, text=True)
        assert proc.returncode == 0 and not proc.stderr, (page.name, proc.stderr)


def test_help_text_that_roff_would_read_as_requests_or_escapes_is_escaped():
    text = escape("Reads C:\\dir\\x.\n.hidden starts a line\n'quoted' too\n\n\b\none  two\n   three\n\nafter")
    assert text.split("\n") == ["Reads C:\\edir\\ex.", "\\&.hidden starts a line", "\\&'quoted' too", "",
                                ".nf", "one  two", "   three", ".fi", "", "after"]

    @click.command()
    @click.option("--x", help=".dot first and a \\ backslash")
    def tool(x):
        """Line one.

        .TH would be a request here."""

    (page,) = man_pages(tool, "tool", version="9.9").values()
    assert "\n\\&.TH would be a request here." in page and "\\&.dot first and a \\e backslash" in page
    assert page.startswith('.TH "TOOL" "1" "9.9" "slurm-gpushare 9.9"')
