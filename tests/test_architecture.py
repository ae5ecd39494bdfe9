"""The layering and import rules of STYLE.md, enforced: import-linter contracts, banned imports,
and "importing does nothing"."""

from __future__ import annotations

import os
import pkgutil
import shutil
import subprocess
import sys
from pathlib import Path

import slurm_gpushare

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def _lint_imports(cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(cwd))
    return subprocess.run([str(BIN / "lint-imports"), "--config", str(cwd / "setup.cfg"), "--no-cache"],
                          cwd=cwd, env=env, capture_output=True, text=True)


def test_layer_contracts_are_kept():
    proc = _lint_imports(ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "broken" in proc.stdout and " 0 broken" in proc.stdout


def test_layer_contracts_fail_when_a_lower_layer_imports_a_higher_one(tmp_path):
    shutil.copytree(ROOT / "slurm_gpushare", tmp_path / "slurm_gpushare",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "setup.cfg", tmp_path / "setup.cfg")
    machine = tmp_path / "slurm_gpushare" / "hardware" / "machine.py"
    machine.write_text(machine.read_text() + "\nimport slurm_gpushare.gresconf  # noqa: E402,F401\n")
    proc = _lint_imports(tmp_path)
    assert proc.returncode != 0
    assert "slurm_gpushare.hardware.machine -> slurm_gpushare.gresconf" in proc.stdout


def _modules() -> list[str]:
    # __main__ runs the command line when imported, by design
    return sorted(m.name for m in pkgutil.walk_packages(slurm_gpushare.__path__, "slurm_gpushare.")
                  if not m.name.endswith("__main__"))


def test_only_the_nvml_port_imports_pynvml():
    proc = subprocess.run([str(BIN / "ruff"), "check", "--select", "TID251", "--no-cache", "slurm_gpushare"],
                          cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_importing_any_module_does_nothing():
    # every module imports in a fresh interpreter without loading pynvml or touching SLURM_CONF
    code = (
        "import importlib, os, sys\n"
        f"mods = {_modules()!r}\n"
        "before = dict(os.environ)\n"
        "for m in mods: importlib.import_module(m)\n"
        "assert 'pynvml' not in sys.modules, 'pynvml imported at import time'\n"
        "assert dict(os.environ) == before, 'environment changed at import time'\n"
        "print(len(mods))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert int(proc.stdout) == len(_modules()) > 5
