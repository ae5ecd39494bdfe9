"""The documentation stands alone: its links lead to files of the repository, and the tests it names exist."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "etc").glob("*.md"))]
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def test_every_relative_link_leads_to_a_file_of_the_repository():
    broken = []
    for doc in DOCS:
        for target in LINK.findall(doc.read_text()):
            if re.match(r"[a-z]+:", target):  # https:, mailto:
                continue
            if not (doc.parent / target).resolve().exists():
                broken.append(f"{doc.relative_to(ROOT)}: {target}")
    assert broken == []


def test_the_docs_cite_no_file_outside_the_repository():
    # the design notes the project started from are not part of the repository
    cited = [f"{doc.relative_to(ROOT)}: {m}" for doc in DOCS
             for m in re.findall(r"\.\./shared|DESIGN\.md|SLURM_FACTS\.md|STYLE\.md", doc.read_text())]
    assert cited == []


def test_every_test_named_in_the_security_page_exists():
    text = (ROOT / "docs" / "security.md").read_text()
    named = set(re.findall(r"`(test_[a-z0-9_]+)`", text))
    defined = {m for f in (ROOT / "tests").rglob("test_*.py")
               for m in re.findall(r"^def (test_\w+)", f.read_text(), re.M)}
    assert named and sorted(named - defined) == []


def test_the_code_cites_no_file_outside_the_repository():
    cited = [f"{f.relative_to(ROOT)}: {m}"
             for top in ("slurm_gpushare", "slurm_gpushare_dev", "tests", "benchmarks", "scripts")
             for f in sorted((ROOT / top).rglob("*")) if f.is_file() and f.suffix in ("", ".py", ".lua", ".sh")
             and "__pycache__" not in f.parts and f.name != "test_docs.py"
             for m in re.findall(r"\.\./shared|DESIGN\.md|SLURM_FACTS|STYLE\.md", f.read_text(errors="replace"))]
    assert cited == []
