"""docs/install.md's command blocks marked ``sh test`` run as written, in one scratch directory, in the
page's order; those marked ``sh test-slurm`` run against the test session's dev cluster
(docs/development.md, "Tested command blocks")."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
INSTALL = ROOT / "docs" / "install.md"
FENCE = re.compile(r"^```([^\n]*)\n(.*?)^```$", re.M | re.S)
MARKERS = ("sh test", "sh test-slurm")


def blocks(text: str, marker: str) -> list[str]:
    """The bodies of the fenced blocks whose info string is exactly ``marker``."""
    return [body for info, body in FENCE.findall(text) if info.strip() == marker]


def run_block(body: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-euo", "pipefail", "-c", body], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    # the installation under test first on PATH: `slurm-gpushare` is its console script
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"}
    return {**env, **(extra or {})}


def test_the_extractor_takes_only_blocks_marked_exactly():
    text = "```sh test\necho a\n```\n```sh\nrm -rf /\n```\n```sh test-slurm\necho b\n```\n```sh testx\nx\n```\n"
    assert blocks(text, "sh test") == ["echo a\n"] and blocks(text, "sh test-slurm") == ["echo b\n"]


def test_every_marked_block_of_the_install_page_runs(tmp_path):
    text = INSTALL.read_text()
    marked = blocks(text, "sh test")
    assert len(marked) >= 5
    infos = {info.strip() for info, _ in FENCE.findall(text)}
    assert not {i for i in infos if i.startswith("sh test")} - set(MARKERS), "an unknown marker would never run"
    for body in marked:
        proc = run_block(body, tmp_path, _env())
        assert proc.returncode == 0, f"block:\n{body}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    # what the blocks installed names this installation's command
    prolog = (tmp_path / "stage/etc/slurm/gpushare/prolog.sh").read_text()
    assert f"exec {Path(sys.executable).parent}/slurm-gpushare hook prolog" in prolog


@pytest.mark.slurm
def test_every_slurm_block_of_the_install_page_runs_on_the_dev_cluster(cluster, tmp_path):
    marked = blocks(INSTALL.read_text(), "sh test-slurm")
    assert marked
    for body in marked:
        proc = run_block(body, tmp_path, _env({"SLURM_CONF": str(cluster.slurm_conf)}))
        assert proc.returncode == 0, f"block:\n{body}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
        assert "JobSubmitPlugins" in proc.stdout and "TaskProlog" in proc.stdout
        assert re.search(r"^Prolog(\[0\])? ", proc.stdout, re.M), proc.stdout
