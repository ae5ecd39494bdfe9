"""slurm_gpushare_dev.release: which Slurm a command runs, and the root filesystems of other releases."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from slurm_gpushare.errors import ClusterError
from slurm_gpushare_dev import release as rel

PROJECT = Path(__file__).resolve().parent.parent


def test_release_of_version_lines():
    assert rel.release_of("slurm-wlm 22.05.8") == "22.05"
    assert rel.release_of("slurm 26.05.5\n") == "26.05"
    with pytest.raises(ClusterError, match="no Slurm version"):
        rel.release_of("command not found")


def test_unsupported_release_names_the_supported_ones():
    with pytest.raises(ClusterError) as e:
        rel.check_release("23.11")
    assert "23.11 is not a release" in e.value.message and e.value.hint == "use one of 22.05, 24.11, 26.05"


def test_inside_a_root_only_its_own_release_runs(monkeypatch):
    monkeypatch.setenv(rel.IN_ROOT_ENV, "24.11")
    assert rel.needs_root("24.11") is False
    with pytest.raises(ClusterError, match="runs in the Slurm 24.11 root; it cannot run Slurm 26.05"):
        rel.needs_root("26.05")


def test_host_release_needs_no_root(monkeypatch):
    monkeypatch.delenv(rel.IN_ROOT_ENV, raising=False)
    host = rel.host_release()
    if host is None:
        pytest.skip("no Slurm on this host")
    assert rel.needs_root(host) is False and rel.needs_root(None) is False
    assert all(rel.needs_root(r) for r in rel.SUITES if r != host)


def test_mirror_from_apt_sources(tmp_path, monkeypatch):
    monkeypatch.delenv("GPUSHARE_DEBIAN_MIRROR", raising=False)
    deb822 = tmp_path / "debian.sources"
    deb822.write_text("Types: deb\n# http://snapshot.example/archive/debian/x\nURIs: http://mirror.example/debian/\n"
                      "Suites: bookworm\n\nTypes: deb\nURIs: http://mirror.example/debian-security\n")
    legacy = tmp_path / "sources.list"
    legacy.write_text("deb [arch=amd64] http://old.example/debian bookworm main\n")
    security_only = tmp_path / "sec.list"
    security_only.write_text("deb http://security.example/debian-security bookworm-security main\n")
    assert rel.debian_mirror([deb822, legacy]) == "http://mirror.example/debian"
    assert rel.debian_mirror([tmp_path / "missing", legacy]) == "http://old.example/debian"
    assert rel.debian_mirror([security_only]) == rel.DEFAULT_MIRROR
    monkeypatch.setenv("GPUSHARE_DEBIAN_MIRROR", "http://env.example/debian")
    assert rel.debian_mirror([deb822]) == "http://env.example/debian"


def test_root_key_follows_what_it_is_built_from(tmp_path):
    a = rel.ReleaseRoot("24.11", tmp_path, "http://a.example/debian")
    assert a.path == tmp_path / f"24.11-{a.key}" and a.built() is None
    assert rel.ReleaseRoot("24.11", tmp_path, "http://b.example/debian").key != a.key
    assert rel.ReleaseRoot("26.05", tmp_path, "http://a.example/debian").key != a.key
    assert a.venv_dir(PROJECT) != a.venv_dir(tmp_path)  # one venv per checkout


def test_enter_command_shares_the_paths(tmp_path):
    root = rel.ReleaseRoot("26.05", tmp_path, "http://a.example/debian")
    argv = root.command(["sinfo", "-V"], cwd="/tmp", project=PROJECT)
    assert argv[:4] == ["unshare", "--mount", "--propagation", "private"]
    assert argv[-7:] == [str(root.path), str(PROJECT), str(root.venv_dir(PROJECT)), "/tmp", "26.05", "sinfo", "-V"]


def _built(release: str) -> rel.ReleaseRoot:
    root = rel.ReleaseRoot.for_release(release)
    if root.built() is None:
        if os.environ.get("GPUSHARE_REQUIRE_ROOTS") == "1":
            pytest.fail(f"GPUSHARE_REQUIRE_ROOTS=1 but the Slurm {release} root is not built ({root.path})")
        pytest.skip(f"the Slurm {release} root is not built (scripts/test --slurm {release} builds it)")
    return root


@pytest.mark.parametrize("release", ["24.11", "26.05"])
def test_a_command_in_a_root_runs_that_release_on_the_same_paths(release, tmp_path):
    if os.environ.get(rel.IN_ROOT_ENV) or os.geteuid() != 0:
        pytest.skip("runs from the host, as root")
    root = _built(release)
    mark = tmp_path / "mark"
    mark.write_text("host\n")
    proc = subprocess.run([sys.executable, "-m", "slurm_gpushare_dev.release", "run", "--slurm", release, "--",
                           "sh", "-c", f'slurmctld -V; cat {mark}; pwd; echo "$GPUSHARE_SLURM_RELEASE"; '
                           '.venv/bin/python -c "import slurm_gpushare, sys; print(slurm_gpushare.__file__)"'],
                          cwd=PROJECT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("slurm") and rel.release_of(lines[0]) == release
    assert lines[1:4] == ["host", str(PROJECT), release]
    assert lines[4] == str(PROJECT / "slurm_gpushare" / "__init__.py")
    # nothing stays mounted on the host once the command is done
    assert str(root.path) not in Path("/proc/self/mounts").read_text()
